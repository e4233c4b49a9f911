"""What the HTTP API accepts and answers, as pydantic models, and the OpenAPI document
built from their JSON schemas (served at ``/v1/openapi.json``)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from approvald.bot import claude_code as hook
from approvald.runtime import (
    CALL,
    MAX_DURATION,
    SIGNATURE_HEADER,
    TOOL_CALL,
    WORDS,
    ApprovaldError,
    check_webhook_url,
    external,
)
from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_SECONDS = int(MAX_DURATION.total_seconds())


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Evidence(_In):
    """One piece of evidence on the card: where it comes from, and what it says."""

    source: str | None = Field(None, max_length=60)
    detail: Any = None


class Packet(_In):
    """What the approvers read on the card besides the exact arguments (all optional)."""

    task: str | None = Field(None, max_length=500, description="what the agent was asked to do")
    doing: str | None = Field(None, max_length=3000, description="what this call does")
    why: str | None = Field(None, max_length=1000, description="why it is needed")
    impact: str | None = Field(None, max_length=1000, description="what it changes")
    description: str | None = Field(None, max_length=1000, description="what the tool is")
    evidence: list[str | Evidence] = Field(default_factory=list, max_length=10)


# a positive duration of whole days, hours, minutes and seconds, each at most once and in
# that order ("2h", "1h30m", "45s"); the digits are bounded so that every value the pattern
# admits is one parse_duration accepts (999d + 9999h + 999999m + 99999999s < 3650d)
_D, _H = r"[1-9][0-9]{0,2}d\s*", r"[1-9][0-9]{0,3}h\s*"
_M, _S = r"[1-9][0-9]{0,5}m\s*", r"[1-9][0-9]{0,7}s\s*"
DURATION = (rf"^\s*({_D}({_H})?({_M})?({_S})?|{_H}({_M})?({_S})?|{_M}({_S})?|{_S})$")
# a Slack user id, or a mention of one: "U024BE7LH", "u024be7lh", "<@U024BE7LH|dana>"
USER_ID = r"^\s*([UuWw][A-Za-z0-9_]{2,30}|<@[UuWw][A-Za-z0-9_]{2,30}(\|[^>]*)?>)\s*$"
APPROVER_ID = r"^\s*([UuWwSs][A-Za-z0-9_]{2,30}|<@[UuWw][A-Za-z0-9_]{2,30}(\|[^>]*)?>" \
              r"|<!subteam\^[Ss][A-Za-z0-9_]{2,30}(\|[^>]*)?>)\s*$"


# an http(s) URL with a host name or IPv4 address and an optional port
WEBHOOK_URL = (r"^https?://[A-Za-z0-9][A-Za-z0-9.-]{0,252}"
               r"(:([0-9]{1,4}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]"
               r"|6553[0-5]))?([/?#].*)?$")


class Tighten(_In):
    """Stricter than the operator's policy for this tool, never looser: each field must be
    at least as strict as the policy's, or the request is refused (422,
    ``looser_than_policy``). The policy itself is the operator's (the policy file's entry
    for ``api:<token>/<tool>``, or its default), never the caller's."""

    approvers: list[Annotated[str, Field(pattern=APPROVER_ID)]] | None = Field(
        None, min_length=1, max_length=50,
        description="fewer approvers, drawn from the policy's (Slack user or group ids)")
    quorum: int | None = Field(None, ge=1, le=20,
                               description="more approvals than the policy's quorum")
    ttl: Annotated[str, Field(pattern=DURATION, max_length=60)] | \
        Annotated[int, Field(ge=1, le=MAX_SECONDS)] | None = Field(
        None, description="a shorter wait than the policy's: '10m', '2h', or seconds")
    edits: Literal["propose"] | None = Field(
        None, description="an approver's edit is a proposal someone else must approve")
    max_standing: Annotated[str, Field(pattern=r"^\s*0\s*$|" + DURATION,
                                       max_length=60)] | None = Field(
        None, description="a shorter longest standing approval ('0': none)")
    risk: Literal["low", "medium", "high"] | None = Field(
        None, description="a higher risk than the policy's")


class CreateRequest(_In):
    """Ask for approval of one exact call, which the caller runs itself once approved.

    Which policy applies is the operator's choice, not the caller's: the policy file's
    entry for ``api:<token name>/<tool>`` (or a glob matching it), else its default, which
    asks. The token must have been granted the tool (``tokens create --tools``)."""

    tool: str = Field(min_length=1, max_length=100, pattern=r"^[^\x00-\x1f\x7f]+$")
    args: dict[str, Any] = Field(description="the exact arguments (their digest is bound)")
    packet: Packet | None = None
    tighten: Tighten | None = None
    requested_by: str | None = Field(None, max_length=200, pattern=USER_ID,
                                     description="the Slack user who asked (who then cannot "
                                                 "approve their own request); default: "
                                                 "the token itself")
    idempotency_key: str | None = Field(
        None, min_length=1, max_length=200,
        description="a retried create with this key returns the same request (200, not 201)")
    webhook_url: str | None = Field(None, max_length=2000, pattern=WEBHOOK_URL,
                                    description="where its decision is POSTed (default: "
                                                "the token's)")

    @field_validator("webhook_url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is None:
            return None
        try:
            return check_webhook_url(v)
        except ApprovaldError as exc:
            raise ValueError(str(exc)) from None


BOUND = ("the arguments' binding: HMAC-SHA-256 of their digest under the deployment's "
         "binding key (64 hex characters), never a plain hash of them")


class ReportResult(_In):
    """What came of running the approved call."""

    status: Literal["succeeded", "failed"]
    args_digest: str = Field(pattern="^[0-9a-f]{64}$",
                             description="effective_digest of the request: the arguments run "
                                         "(their plain SHA-256 digest, as earlier versions "
                                         "showed it, is taken too)")
    result: Any = None
    error: str | None = Field(None, max_length=4000)


class Decision(BaseModel):
    verdict: str | None = Field(description="approve, deny, edit, redirect, … or the "
                                            "policy's answer: auto, forbidden")
    decided_by: str | None
    decided_via: str | None
    decided_at: str | None
    reason: str | None = Field(description="why it was denied (a redirect's guidance)")
    approvals: int | None = None
    quorum: int | None = None


class Result(BaseModel):
    status: Literal["succeeded", "failed"]
    result: Any
    error: str | None
    args_digest: str = Field(description=BOUND)
    reported_at: str


class RequestDocument(BaseModel):
    """A request and its decision. Run ``effective_args`` (an approver may have edited
    them) and report ``effective_digest``."""

    id: str
    tool: str
    args: dict[str, Any]
    args_digest: str = Field(description=BOUND)
    policy: str | None
    requested_by: str
    created_at: str
    status: str = Field(description="pending, approved, denied, expired, cancelled, "
                                    "redirected or forbidden")
    outcome: str = Field(description=(
        "what became of the request, named as every view of approvald names it: "
        + ", ".join(w.name.value for w in WORDS.values() if w.kinds & {TOOL_CALL, CALL})
        + " (status is where it stands: an approval with edits, or by a standing "
          "approval, is status approved)"))
    approval_id: str | None
    expires_at: str | None
    effective_args: dict[str, Any]
    effective_digest: str = Field(description=BOUND)
    edited: bool
    edited_by: str | None
    decision: Decision | None
    result: Result | None


class ErrorDetail(BaseModel):
    code: str
    message: str


class ErrorBody(BaseModel):
    error: ErrorDetail


class ForbiddenDocument(RequestDocument):
    """A call the policy forbids: its document, and the reason as an error."""

    error: ErrorDetail


_MODELS: tuple[type[BaseModel], ...] = (CreateRequest, ReportResult, RequestDocument,
                                        ForbiddenDocument, ErrorBody)


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(name: str, description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": _ref(name)}}}


def _errors(*codes: int) -> dict[str, Any]:
    what = {400: "malformed JSON or parameters", 401: "a missing, unknown or revoked token",
            403: "the token is scoped to another face (a hook's token calls its hook only, "
                 "an API token no hook)",
            404: "no such request (for this token)",
            409: "a conflict with what is recorded, or a tighten the operator's policy "
                 "cannot satisfy",
            413: "the body (or its arguments or result) is too large",
            422: "a well-formed body the request cannot be made from (a tighten field "
                 "looser than the operator's policy, a number JSON cannot round-trip, JSON "
                 "nested too deep)",
            503: "approvald did not answer in time (a PostToolUse not recorded)"}
    return {str(c): _json("ErrorBody", what[c]) for c in codes}


def openapi(server: str | None = None) -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``/v1``."""
    schemas: dict[str, Any] = {}
    for model in _MODELS:
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
    rid = {"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": "approvald HTTP API", "version": "1",
                 "description": "Approval requests for calls their callers run themselves: "
                                "ask, wait for a human decision in Slack, run the approved "
                                "arguments, report what came of them."},
        "security": [{"bearer": []}],
        "paths": {
            "/v1/requests": {"post": {
                "operationId": "createRequest", "summary": "Ask for approval of one call",
                "requestBody": {"required": True, "content": {
                    "application/json": {"schema": _ref("CreateRequest")}}},
                "responses": {
                    "201": _json("RequestDocument", "created (approved at once if the policy "
                                                    "says auto, else pending)"),
                    "200": _json("RequestDocument", "made before with this idempotency_key"),
                    "403": {"description": "the policy forbids this call (its document), or "
                                           "the token may not ask about this tool, or the "
                                           "tighten is looser than the policy, or the token "
                                           "is scoped to a hook (an error)",
                            "content": {"application/json": {"schema": {"anyOf": [
                                _ref("ForbiddenDocument"), _ref("ErrorBody")]}}}},
                    **_errors(400, 401, 409, 413, 422)}}},
            "/v1/requests/{id}": {"get": {
                "operationId": "getRequest", "summary": "A request and its decision",
                "parameters": [rid],
                "responses": {"200": _json("RequestDocument", "the request"),
                              **_errors(401, 403, 404)}}},
            "/v1/requests/{id}/decision": {"get": {
                "operationId": "waitForDecision",
                "summary": "Long poll until the request is decided",
                "parameters": [rid, {"name": "wait", "in": "query", "required": False,
                                     "description": f"seconds to wait (at most "
                                                    f"{external.MAX_WAIT:g})",
                                     "schema": {"type": "number", "minimum": 0,
                                                "maximum": external.MAX_WAIT,
                                                "default": min(30, external.MAX_WAIT)}}],
                "responses": {"200": _json("RequestDocument",
                                           "decided, or still pending when the wait ran out"),
                              **_errors(400, 401, 403, 404)}}},
            "/v1/requests/{id}/result": {"post": {
                "operationId": "reportResult", "summary": "Report what running it did (once)",
                "parameters": [rid],
                "requestBody": {"required": True, "content": {
                    "application/json": {"schema": _ref("ReportResult")}}},
                "responses": {"201": _json("RequestDocument", "recorded"),
                              "200": _json("RequestDocument", "the same report, recorded "
                                                              "before"),
                              **_errors(400, 401, 403, 404, 409, 413, 422)}}},
            "/v1/hooks/claude-code": {"post": {
                "operationId": "claudeCodeHook",
                "summary": "Claude Code's HTTP hook (PreToolUse, PostToolUse): a token made "
                           "with --face hook:claude-code",
                "description": "The body is the hook's event JSON; a PreToolUse is answered "
                               "200 with hookSpecificOutput (permissionDecision allow or deny, "
                               "and updatedInput when an approver edited the input), a deny "
                               "too when the event cannot be read or decided (too large, "
                               "nested too deep, not UTF-8, a wait out of range, a database "
                               "that fails or does not answer), within wait + "
                               f"{hook.HTTP_MARGIN:g} seconds; a PostToolUse is recorded as "
                               "the call's execution (204). Only a missing, revoked or other "
                               "face's token is refused (401, 403). Set the hook's onFailure "
                               "to block: a non-2xx or late answer otherwise lets the call go "
                               "ahead.",
                "parameters": [{"name": "wait", "in": "query", "required": False,
                                "description": "seconds a PreToolUse waits for a decision "
                                               "before it is denied as still waiting",
                                "schema": {"type": "number", "minimum": 0,
                                           "maximum": hook.MAX_HTTP_WAIT,
                                           "default": hook.DEFAULT_WAIT}}],
                "requestBody": {"required": True, "content": {
                    "application/json": {"schema": {"type": "object"}}}},
                "responses": {"200": {"description": "the PreToolUse decision",
                                      "content": {"application/json": {
                                          "schema": {"type": "object"}}}},
                              "204": {"description": "the PostToolUse was recorded"},
                              **_errors(400, 401, 403, 413, 503)}}},
            "/v1/openapi.json": {"get": {
                "operationId": "openapi", "summary": "This document", "security": [],
                "responses": {"200": {"description": "OpenAPI 3.1",
                                      "content": {"application/json": {
                                          "schema": {"type": "object"}}}}}}},
        },
        "webhooks": {"decision": {"post": {
            "summary": "A request was decided (sent to its webhook URL, retried until a 2xx)",
            "parameters": [
                {"name": SIGNATURE_HEADER, "in": "header", "required": True,
                 "description": "t=<unix time>,v1=<hex HMAC-SHA256 of '<t>.' + body under the "
                                "token's webhook secret>", "schema": {"type": "string"}},
                {"name": "X-Approvald-Delivery", "in": "header", "required": True,
                 "description": "the same on every try of one delivery: deduplicate on it",
                 "schema": {"type": "string"}}],
            "requestBody": {"content": {"application/json": {"schema": _ref(
                "RequestDocument")}}},
            "responses": {"200": {"description": "received (any 2xx)"}}}}},
        "components": {"schemas": schemas, "securitySchemes": {
            "bearer": {"type": "http", "scheme": "bearer",
                       "description": "a token from `approvald tokens create NAME`"}}},
    }
    if server:
        doc["servers"] = [{"url": server}]
    return doc
