"""The MCP Tasks extension (``io.modelcontextprotocol/tasks``, 2026-07-28) on the HTTP
gateway: a gated call from a client that declares the extension is answered at once with a
task, which the client polls (``tasks/get``) until the request is decided and the approved
call has run.

A task is an external request: its state lives in the database, so any replica answers a
``tasks/get`` for any task, and a poll after the approval runs the call (at most once, the
execution ledger's compare-and-set deciding where). Task ids are the request's id and a
MAC under the deployment's secret over the gateway, the bearer token and the request: only
the token that made a task can see or cancel it, and no id is guessed into another's.
``tasks/cancel`` cancels a request still waiting for its decision (audited, as the token's
person); ``tasks/update`` has nothing to take (a gateway's task never asks the client for
input) and is acknowledged, as the extension says.

Every ``tasks/*`` method is answered only to a client that declared the extension on that
request (else error -32021, Missing Required Client Capability, naming it, and nothing is
done: a cancel does not cancel), and only when its ``Mcp-Name`` header, if sent, is the
task's id (else -32020, HeaderMismatch): :func:`admitted`.

Statuses: ``working`` while the request waits (its message says where it can be decided),
``completed`` once it is over, with the server's result, or a tool error (``isError``)
saying why nothing ran (denied with the reason, expired, redirected); ``cancelled`` for a
request cancelled before its decision. ``lastUpdatedAt`` is when the task last changed:
the request's creation, its decision, or, for a call that ran, when its result was
recorded.
"""

from __future__ import annotations

import hashlib
import hmac
from datetime import datetime
from typing import Any

import mcp_types as types
from approvald.bot.mcp.gateway import Gateway, Ran, Refused
from approvald.bot.mcp.upstream import Upstream, error_result
from approvald.runtime import OPEN, Actor, ApprovaldError
from approvald.store.repos.external import TokenRecord
from mcp import MCPError
from mcp.server.context import ServerRequestContext
from mcp.shared.inbound import decode_header_value
from pydantic import ConfigDict, Field, ValidationError

EXTENSION = "io.modelcontextprotocol/tasks"
POLL_MS = 2000  # how often a client is asked to poll a working task


class TaskParams(types.RequestParams):
    """``tasks/get``, ``tasks/update`` and ``tasks/cancel``'s params."""

    model_config = ConfigDict(populate_by_name=True, extra="allow")

    task_id: str = Field(alias="taskId", min_length=1, max_length=200)


def declared(ctx: ServerRequestContext[Any]) -> bool:
    """Did this request's client declare the Tasks extension?"""
    caps = ctx.session.client_capabilities
    return bool(caps and caps.extensions and EXTENSION in caps.extensions)


def admitted(ctx: ServerRequestContext[Any], params: TaskParams | None) -> None:
    """Refuse a ``tasks/*`` request before it does anything: -32021 from a client that did
    not declare the extension (the extension's MUST), -32020 when its ``Mcp-Name`` header
    names another task than its ``taskId`` (SEP-2243's routing headers)."""
    if not declared(ctx):
        raise MCPError(types.MISSING_REQUIRED_CLIENT_CAPABILITY,
                       f"{ctx.method} needs the {EXTENSION} extension, which this request "
                       "did not declare", {"requiredCapabilities": {"extensions":
                                                                     {EXTENSION: {}}}})
    headers = getattr(ctx.request, "headers", None)
    raw = headers.get("mcp-name") if headers is not None else None
    if params is not None and raw is not None and decode_header_value(raw) != params.task_id:
        raise MCPError(types.HEADER_MISMATCH, f"the Mcp-Name header does not name the task "
                       f"of this {ctx.method} request (its taskId)")


class TaskIds:
    """A task's id: its request's, and a MAC binding it to one gateway and one token."""

    def __init__(self, secret: str, gateway: str) -> None:
        self.key = hashlib.sha256(f"approvald mcp tasks\0{secret}".encode()).digest()
        self.gateway = gateway

    def _mac(self, token: TokenRecord, rid: str) -> str:
        text = f"{self.gateway}\0{token.id}\0{rid}".encode()
        return hmac.new(self.key, text, hashlib.sha256).hexdigest()[:32]

    def make(self, token: TokenRecord, rid: str) -> str:
        return f"{rid}.{self._mac(token, rid)}"

    def request_of(self, token: TokenRecord, task_id: str) -> str:
        rid, _, mac = task_id.rpartition(".")
        if not rid or not hmac.compare_digest(mac, self._mac(token, rid)):
            raise MCPError(types.INVALID_PARAMS, f"no task {task_id[:80]!r} for this token")
        return rid


def _ms(a: str | None, b: str | None) -> int | None:
    if not a or not b:
        return None
    return max(0, int((datetime.fromisoformat(b) - datetime.fromisoformat(a))
                      .total_seconds() * 1000))


def _result(record: Any) -> dict[str, Any]:
    """A CallToolResult's wire form from what the ledger kept of it."""
    try:
        result = types.CallToolResult.model_validate(record)
    except ValidationError:  # kept truncated: say so in a text result
        result = types.CallToolResult(content=[types.TextContent(
            type="text", text=f"the result, as approvald recorded it: {record}"[:4000])])
    return result.model_dump(by_alias=True, exclude_none=True, mode="json")


class Tasks:
    """Tasks for one HTTP gateway's calls."""

    def __init__(self, ids: TaskIds, upstream: Upstream) -> None:
        self.ids = ids
        self.upstream = upstream

    async def created(self, gateway: Gateway, token: TokenRecord,
                      pending: Refused) -> dict[str, Any]:
        """The CreateTaskResult for a call whose request is waiting for its decision."""
        assert pending.request_id is not None
        state = await self.state(gateway, token, pending.request_id)
        return {**state, "resultType": "task"}

    async def get(self, gateway: Gateway, token: TokenRecord,
                  params: TaskParams) -> dict[str, Any]:
        return await self.state(gateway, token, self.ids.request_of(token, params.task_id))

    async def cancel(self, gateway: Gateway, token: TokenRecord,
                     params: TaskParams) -> dict[str, Any]:
        rid = self.ids.request_of(token, params.task_id)
        doc = await gateway.e.request_document(await gateway.token(), rid)
        if doc["status"] in OPEN:
            try:
                await gateway.e.cancel(rid, actor=Actor(gateway.requested_by, "mcp"),
                                       reason=f"cancelled by its MCP client (token "
                                              f"{token.name}, tasks/cancel)")
            except ApprovaldError:
                pass  # decided meanwhile: its task says how
        return {}

    async def update(self, gateway: Gateway, token: TokenRecord,
                     params: TaskParams) -> dict[str, Any]:
        self.ids.request_of(token, params.task_id)  # a task of this token's, or an error
        return {}  # a gateway's task never waits for input: nothing is outstanding

    def _task(self, token: TokenRecord, rid: str, doc: dict[str, Any]) -> dict[str, Any]:
        """The fields every state of the task has; it was last updated when its call's
        result was recorded, else when its request was decided, else made."""
        updated = ((doc.get("result") or {}).get("reported_at")
                   or (doc.get("decision") or {}).get("decided_at") or doc["created_at"])
        return {"taskId": self.ids.make(token, rid), "createdAt": doc["created_at"],
                "lastUpdatedAt": updated, "ttlMs": _ms(doc["created_at"], doc.get("expires_at")),
                "pollIntervalMs": POLL_MS}

    async def state(self, gateway: Gateway, token: TokenRecord, rid: str) -> dict[str, Any]:
        """The task of request ``rid`` as it stands (a DetailedTask); an approved call
        nobody has run yet is run now."""
        own = await gateway.token()
        doc = await gateway.e.request_document(own, rid)
        task = self._task(token, rid, doc)
        if doc["status"] in OPEN:
            return {**task, "status": "working",
                    "statusMessage": await gateway.progress(doc)}
        if doc["status"] != "approved":  # the task's call has its answer
            message = (await gateway.answer(own, doc)).message
            if doc["status"] == "cancelled":
                return {**task, "status": "cancelled", "statusMessage": message}
            return {**task, "status": "completed", "statusMessage": message,
                    "result": error_result(message).model_dump(
                        by_alias=True, exclude_none=True, mode="json")}
        if doc["result"] is not None:  # run (here or by another replica): its result
            return {**task, "status": "completed", "result": _result(doc["result"]["result"])}
        outcome = await gateway.collect(own, str(doc["tool"]), doc,
                                        self.upstream.forward(str(doc["tool"])),
                                        self.upstream.identify(str(doc["tool"])))
        # it changed as it ran: its last update is when its result was recorded
        task = self._task(token, rid, await gateway.e.request_document(own, rid))
        if isinstance(outcome, Ran) and isinstance(outcome.value, MCPError):
            text = f"{doc['tool']} failed: {outcome.value.message}"
            return {**task, "status": "completed", "statusMessage": text,
                    "result": error_result(text).model_dump(by_alias=True, exclude_none=True,
                                                            mode="json")}
        if isinstance(outcome, Ran):
            value: types.CallToolResult = outcome.value
            return {**task, "status": "completed",
                    "result": value.model_dump(by_alias=True, exclude_none=True, mode="json")}
        return {**task, "status": "completed", "statusMessage": outcome.message,
                "result": error_result(outcome.message).model_dump(
                    by_alias=True, exclude_none=True, mode="json")}
