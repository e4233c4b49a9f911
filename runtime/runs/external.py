"""Requests for calls their callers run themselves: the runtime half of the HTTP API.

An agent written in any language asks approvald about one exact call (a tool name and its
arguments), waits for the answer, runs the call itself if it was approved, and reports
what came of it. approvald decides, remembers and audits; it never runs the call.

Representation: each request is a run of agent ``external:<token name>`` in status ``external``
(while it is open, and once approved until the caller reports), whose id starts with ``x``
(other run ids are hex). Nothing advances such a run: the worker claims only ``running`` runs,
and a decision wakes only an ``awaiting_approval`` one. Its approval is an ordinary approval of
an ordinary run, opened by :meth:`runtime.requests.gate.Gate.insert_approval`: the card goes
through the outbox, reminders, expiry and escalation come from the sweep, a click or the CLI
decides by the same compare-and-set, and the audit log chains it all. The ``external_requests``
row beside the run holds what is the caller's: its token, the idempotency key, the policy name
the call was resolved under (by the intake, from the token's source: never named by the caller),
the webhook URL, and its report. The report is a row of the execution ledger (``<id>:call``) and
an ``executed`` audit entry, so the audit export shows requested, approved and executed with the
exact arguments.

Telling the caller: every transition of a request is audited, and the transaction that
audited an entry that may have ended a request, whichever path made it, also queues a
``request.decided`` outbox row (:meth:`ExternalRequests.follow`, worked out from the entries:
no read, no other statement). The drain hands that row to the runtime itself
(:meth:`ExternalRequests.deliver`), which, in a transaction of its own, queues the decision
webhook once the request is final (a face's outbox row, retried with backoff until
delivered) and ends the run unless the call was approved: a crash between the decision's
commit and that follow-up loses nothing (the row is there), a repeat of it tells nobody
twice (``mark_decided`` is a compare-and-set), and nothing in it runs in, or can roll back,
the transaction that decided. Long polls in this process wake after the decision's commit
(every decision path then notifies the outbox listeners: the document is the approval's);
other replicas hear through :meth:`on_decided` listeners (``serve`` forwards them by
PostgreSQL NOTIFY); failing both, waiters poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Literal

from approvald.runtime.approvals.standing import StandingApprovals
from approvald.runtime.kernel import binding
from approvald.runtime.kernel.canonical import call_digest, canonical_json, compact_json, sha256_hex
from approvald.runtime.kernel.clock import Clock
from approvald.runtime.kernel.collect import ACTOR as WINDOW_ACTOR
from approvald.runtime.kernel.collect import REASON as WINDOW_CLOSED
from approvald.runtime.kernel.collect import collectable, why_not
from approvald.runtime.kernel.errors import ApprovaldError, InvalidArguments, NotFound
from approvald.runtime.kernel.ids import is_external, new_request_id
from approvald.runtime.kernel.limits import PayloadCap
from approvald.runtime.kernel.signals import Signals
from approvald.runtime.kernel.vocabulary import OutcomeName, outcome_of, policy_outcome_value
from approvald.runtime.policies.intake import (
    EXTERNAL_AGENT,
    Intake,
    IntakeError,
    Source,
    Tighten,
    check_json,
    json_text,
    requester,
)
from approvald.runtime.policies.policy import ApprovalPolicy, CallPolicy, PolicyFile, PolicyKind
from approvald.runtime.policies.sensitive import paths_text, sensitive_of_snapshot
from approvald.runtime.policies.tools import Tool, ToolIdentity, asked_identity, identity_change
from approvald.runtime.record.audit import AuditTrail, Entry, result_excerpt
from approvald.runtime.record.outbox_kinds import (
    REQUEST_DECIDED,
    WEBHOOK,
    Payload,
    RequestDecided,
    Webhook,
    payload_of,
    queue,
)
from approvald.runtime.requests.api_tokens import allows, token_tools
from approvald.runtime.requests.gate import Gate, shadow_details
from approvald.store.db import Database
from approvald.store.errors import KeyTaken
from approvald.store.records import (
    ApprovalRecord,
    ExecutionRecord,
    OutboxRecord,
    RunRecord,
    paths_of,
)
from approvald.store.repos import Tx
from approvald.store.repos.external import (
    NO_CHECKS,
    Answered,
    Checks,
    ExternalRecord,
    Reported,
    TokenRecord,
)
from approvald.store.repos.runs import as_inserted, new_run
from approvald.store.repos.standing import StandingRecord

AGENT_PREFIX = EXTERNAL_AGENT  # the agent of an external request's run: external:<token name>
STATUS = "external"  # its run's status while open, or approved and not yet reported
CALL_ID = "call"  # the one call of the run: its ledger key is <id>:call
VIA = "http_api"
# bytes of a request's tool name: an MCP gateway's read is named by its URI (resource:URI),
# which the caller chooses; within a PostgreSQL index entry (standing approvals are indexed
# by tool and by subject)
TOOL_LIMIT = 2048
MAX_WAIT = 60.0  # s a long poll may hold a request
POLL = 1.0  # s between a waiter's looks at the database when nothing woke it
MAX_CODE = 3000  # characters of a packet's code (a command, a file's content) kept
OPEN = frozenset({"pending", "superseded"})  # an approval that is not the answer yet
TOOL_ACTOR = "system:tool-identity"  # who cancels an approval whose tool changed since
TOOL_CHANGED = "tool_changed"  # the stable code of a call refused for it
# the entries that may end a request's approval (the rest leave it open, or are not about
# one: "requested", "voted", "edited", "refused", "reminded", "escalated"...); a cancel with
# no approval is its run's, cancelled after its approval
ENDING = frozenset({"approved", "denied", "redirected", "expired", "cancelled"})
KEPT = 10_000  # requests whose call this process started as it made them, kept for the report


class ExternalError(ApprovaldError):
    """A request the API cannot honour. ``code`` is stable: ``invalid_request``,
    ``tool_not_allowed``, ``idempotency_conflict``, ``not_approved``, ``cancelled``,
    ``digest_mismatch``, ``already_reported``, ``already_started``, ``tool_changed``."""

    def __init__(self, message: str, *, code: str, **fields: Any) -> None:
        super().__init__(message, **fields)
        self.code = code


@dataclass(frozen=True)
class NewRequest:
    """What a caller asks: approve this exact call (which it will run itself)."""

    tool: str
    args: dict[str, Any]
    requested_by: str
    packet: Mapping[str, Any] = field(default_factory=dict)  # doing, why, impact, evidence
    # stricter than the operator's policy, never looser (the intake checks each field)
    tighten: Tighten | None = None
    idempotency_key: str | None = None
    webhook_url: str | None = None
    # what the tool's server says of it (an MCP tool's annotations), for the policy's rules
    annotations: Mapping[str, Any] | None = None
    # a caller that runs the call as soon as it may (a coding assistant's hook): when the
    # policy allows it at once, its start (the execution ledger's intent row, owned by
    # this) is recorded in the transaction that makes the request, as :meth:`start`
    # would record it next (see :func:`started_at_once`). Not part of the fingerprint:
    # who would run the call does not change what is asked
    start_owner: str | None = None
    # the identity of the tool the caller will run the call on, when it knows one (an MCP
    # server's tool: its listed entry's digest): the approval binds it, and :meth:`start`
    # refuses to start the call on a tool of another identity. Not part of the fingerprint:
    # a call retried after its tool changed joins its open request, whose approval is
    # then refused at its start (the request cancelled, the call asked afresh)
    identity: ToolIdentity | None = None
    # what must still hold for the request to be made or found, checked by the statement
    # that inserts or looks it up (the caller read it from memory): another token live (a
    # person's bearer token), the face's form not switched off. Not part of the fingerprint
    checks: Checks = NO_CHECKS
    # the call's digest (:func:`~runtime.kernel.canonical.call_digest` of ``tool`` and
    # ``args``) when the caller computed it already (a hook's join key is made of it): not
    # computed again. None: computed from them. Not part of the fingerprint
    digest: str | None = None

    def fingerprint(self) -> str:
        """What a retry must repeat exactly to be the same request."""
        return sha256_hex(canonical_json({
            "tool": self.tool, "args": self.args, "requested_by": self.requested_by,
            "packet": dict(self.packet),
            "tighten": None if self.tighten is None
            else self.tighten.model_dump(mode="json", exclude_none=True),
            "webhook_url": self.webhook_url}))


@dataclass(frozen=True)
class Report:
    """What came of an approved call, by the caller that ran it."""

    status: Literal["succeeded", "failed"]
    args_digest: str  # of the arguments it ran: the approved (effective) ones
    result: Any = None
    error: str | None = None
    # the arguments the caller says ran, where it reports after the fact what another
    # program ran (a coding assistant's PostToolUse): recorded as what ran, and a
    # difference from the approved arguments flagged, not refused (it happened)
    ran: dict[str, Any] | None = None

    def fingerprint(self) -> str:
        return sha256_hex(canonical_json({"status": self.status, "args_digest": self.args_digest,
                                          "result": self.result, "error": self.error,
                                          **({"ran": self.ran} if self.ran is not None
                                             else {})}))


class CallerTool(Tool):
    """An external request's tool as the decision path sees it (an edit is checked here).

    approvald knows no schema for it: an edit is any JSON object, judged by the rules of
    the operator's policy for the request's source and tool, which is why this tool is
    named by its policy name (``api:TOKEN/TOOL``) and carries the file's default.
    """

    def __init__(self, tool: str, policy_name: str, kind: PolicyKind,
                 approval: ApprovalPolicy) -> None:
        async def run_by_its_caller() -> None:
            raise ApprovaldError(f"{tool} is run by its caller, never by approvald")

        super().__init__(run_by_its_caller, name=policy_name, permission="execute",
                         description=f"{tool}, run by the caller that asked",
                         policy=kind, approval=approval)
        self.tool = tool

    def json_schema(self) -> dict[str, Any]:
        return {"type": "object"}

    def validate(self, arguments: Any) -> dict[str, Any]:
        if not isinstance(arguments, dict):
            raise InvalidArguments(f"arguments for {self.tool} must be a JSON object",
                                   errors=[{"loc": [], "msg": "expected an object"}])
        try:
            check_json(arguments, "args")
        except IntakeError as exc:
            raise InvalidArguments(str(exc), errors=[
                {"loc": [exc.field], "msg": str(exc).removeprefix(f"{exc.field}: ")}]) from None
        return dict(arguments)


def started_at_once(req: NewRequest, doc: Mapping[str, Any], new: bool) -> bool:
    """Whether :meth:`ExternalRequests.create` recorded the start of ``req``'s call (its
    ``start_owner``'s) when it made request ``doc``: a new request the policy allowed at
    once. The caller runs the call now, with no :meth:`ExternalRequests.start` of its own."""
    return new and req.start_owner is not None and doc["status"] == "approved" \
        and doc["approval_id"] is None


@dataclass(frozen=True, slots=True)
class _Kept:
    """What this process wrote of a request whose call's start it recorded as it made it
    (the policy allowed it at once, :func:`started_at_once`): all the call's report needs
    to know of it, so that the report reads nothing (its statements check that it still
    holds: :class:`~store.repos.external.Reported`)."""

    token_id: str
    tool: str
    args: str  # as recorded (compact JSON)
    digest: str
    sensitive: str | None
    started_at: datetime
    owner: str
    agent: str

    def row(self) -> _KeptRow:
        """Its fields as a plain tuple, as :class:`ExternalRequests` keeps it: strings and
        a datetime only, so the cyclic collector stops tracking the tuple the first time
        it looks at it. Kept as this instance, each of the up to :data:`KEPT` requests kept
        was one more object every full collection walked, as long as it was kept: a
        stall of ``serve``'s one event loop that grew with them (issue 50)."""
        return (self.token_id, self.tool, self.args, self.digest, self.sensitive,
                self.started_at, self.owner, self.agent)


_KeptRow = tuple[str, str, str, str, str | None, datetime, str, str]


@dataclass(frozen=True)
class _Opened:
    """What the transaction that made a request did: the approval it opened (None: none),
    the document when the policy answered at once (as committed: no read needed), whether
    it queued outbox rows (a card, a webhook) that deliveries must hear of, and what a
    call started with its request leaves for its report."""

    approval_id: str | None
    doc: dict[str, Any] | None
    queued: bool
    kept: _Kept | None = None


def current(approvals: Sequence[ApprovalRecord]) -> ApprovalRecord | None:
    """The request's live approval: the last of its escalation chain."""
    live = [a for a in approvals if a.status != "superseded"] or list(approvals)
    return live[-1] if live else None


async def _lock_own(tx: Tx, token: TokenRecord,
                    request_id: str) -> tuple[ExternalRecord, RunRecord]:
    """``token``'s request ``request_id`` and its run, locked (the one lock order: run
    first; the run read as it is locked, since nobody changes it while the lock is held)
    for a start or a report; NotFound unless ``token`` made it."""
    run = await tx.runs.get_locked(request_id)
    rec = await tx.external.lock(request_id)
    if rec is None or run is None or rec.token_id != token.id:
        raise NotFound(f"no request {request_id}")
    return rec, run


async def _live_approval(tx: Tx, rec: ExternalRecord) -> ApprovalRecord | None:
    """The live approval of request ``rec``: none for a request the policy answered at
    once (``auto``, ``forbidden``: nothing is ever asked about it), so none is read."""
    if rec.kind != "approve_before":
        return None
    return current(await tx.approvals.for_run(rec.id))


def _paths(rec: ExternalRecord, a: ApprovalRecord | None) -> str | None:
    """The declared paths of ``rec``'s call, as recorded (JSON): its request's, or those
    the intake resolved when the policy answered at once."""
    if a is not None:
        return paths_text(sensitive_of_snapshot(a.policy))
    return rec.sensitive


def _iso(t: datetime | None) -> str | None:
    return None if t is None else t.isoformat()


def document(rec: ExternalRecord, run: RunRecord, a: ApprovalRecord | None,
             execution: ExecutionRecord | None, *,
             args: dict[str, Any] | None = None) -> dict[str, Any]:
    """The request and its decision, as the caller reads it and as webhooks send it.

    ``effective_args`` are what an approval covers (an approver's edit, if any): the caller
    must run exactly those, and report ``effective_digest``. Digests are shown as bindings
    (``runtime/kernel/binding.py``), never as plain hashes of the arguments.
    """
    if args is None:  # (given: the arguments ``rec.args`` was just encoded from)
        args = json.loads(rec.args)
    shown = binding.shown(rec.digest)
    doc: dict[str, Any] = {
        "id": rec.id, "tool": rec.tool, "args": args, "args_digest": shown,
        "policy": rec.policy_name, "requested_by": run.requested_by,
        "created_at": _iso(rec.created_at), "approval_id": None, "expires_at": None,
        "effective_args": args, "effective_digest": shown, "edited": False,
        "edited_by": None, "decision": None, "result": None,
    }
    if a is None:  # the policy answered at once
        doc["status"] = "forbidden" if rec.kind == "forbidden" else "approved"
        doc["outcome"] = policy_outcome_value(rec.kind)
        doc["decision"] = {"verdict": rec.kind, "decided_by": "policy", "decided_via": "policy",
                           "decided_at": _iso(rec.created_at), "reason": rec.reason}
    else:
        doc.update(status=a.status, outcome=outcome_of(a).value, approval_id=a.id,
                   expires_at=_iso(a.expires_at), effective_args=a.effective_args(),
                   effective_digest=binding.shown(a.effective_digest),
                   edited=a.edited_args is not None, edited_by=a.edited_by)
        if a.status not in OPEN:
            doc["decision"] = {"verdict": a.verdict, "decided_by": a.decided_by,
                               "decided_via": a.decided_via, "decided_at": _iso(a.decided_at),
                               "reason": a.reason, "approvals": a.approve_count,
                               "quorum": a.quorum}
    if run.status == "cancelled" and doc["status"] == "approved":
        # approved, then cancelled before its call was reported: it must not run now
        doc["status"] = doc["outcome"] = OutcomeName.CANCELLED.value
        doc["decision"] = {**(doc["decision"] or {}), "verdict": "cancel",
                           "decided_by": run.cancel_requested_by, "decided_via": "cancel",
                           "decided_at": _iso(run.updated_at), "reason": run.cancel_reason}
    if execution is not None and execution.finished_at is not None:
        doc["result"] = {"status": execution.status, "result": execution.result_value(),
                         "error": execution.error,
                         "args_digest": binding.shown(execution.args_digest),
                         "reported_at": _iso(execution.finished_at)}
    return doc


def _reported(given: str, digest: str) -> bool:
    """Whether a caller's ``args_digest`` names the arguments with ``digest``: their
    binding, as its documents show it, or their plain digest, as earlier versions showed
    it (the caller sent those arguments: nothing is given away)."""
    return len(given) == 64 and binding.matches(given, digest, plain=True)


def _text(value: Any, limit: int) -> str | None:
    if value is None:
        return None
    text = value if isinstance(value, str) else compact_json(value)
    return text if len(text) <= limit else text[:limit] + "…"


class _Taken(KeyTaken):
    """Another create won this idempotency key first, or the token was revoked meanwhile
    (the transaction rolls back)."""


class ExternalRequests:
    """Create, read, wait for and report on external requests (see the module docstring)."""

    def __init__(self, db: Database, clock: Clock, audit: AuditTrail, intake: Intake,
                 gate: Gate, standing: StandingApprovals, signals: Signals, cap: PayloadCap,
                 policy: Callable[[], PolicyFile]) -> None:
        self.db = db
        self.clock = clock
        self.audit = audit
        self.intake = intake
        self.gate = gate
        self.standing = standing
        self.signals = signals
        self.cap = cap
        self.policy = policy  # the policy file in force (its digest is audited)
        self._events: dict[str, asyncio.Event] = {}
        self._waiters: dict[str, int] = {}
        self._decided: list[str] = []  # decided in this process, to announce after commit
        self._listeners: list[Callable[[str], None]] = []
        # requests whose call this process started as it made them, until reported (each
        # as its plain tuple, which the cyclic collector leaves alone: _Kept.row)
        self._kept: OrderedDict[str, _KeptRow] = OrderedDict()

    # -- create -------------------------------------------------------------------------
    async def create(self, token: TokenRecord, req: NewRequest, *,
                     fresh: bool = False) -> tuple[dict[str, Any], bool]:
        """Open a request (or find the one this idempotency key already made): (its
        document, whether it is new). A retry must repeat the request exactly. The policy
        is the operator's for the token's source and the tool (:mod:`runtime.policies.intake`).
        ``fresh``: the caller has just looked and found no request under this idempotency
        key (a caller face's search for its call's first open generation), so it is not
        looked up again first; one made meanwhile is still found, by the insert's
        conflict on the key."""
        source = Source.of_credential(token.name)
        req, args_text = self._check(token, source, req)
        fingerprint = req.fingerprint()
        if req.idempotency_key is not None and not fresh:
            found = await self._made(token, req.idempotency_key, fingerprint, req.checks)
            if found is not None:
                return found, False
        chosen = self.intake.resolve(source, req.tool, req.args, annotations=req.annotations)
        if req.tighten is not None:
            chosen = await self.intake.tighten(chosen, req.tighten)
        # a live standing approval for this source's tool, in this band, may answer it
        standing = await self.standing.candidate(
            source, req.requested_by, req.tool, req.args, chosen) \
            if chosen.kind == "approve_before" else None
        request_id = new_request_id()
        # an answer at once with no webhook to queue is its rows and its two entries: on
        # PostgreSQL one statement, sent alone (a transaction if it wrote nothing)
        write = self.db.transact_one if chosen.kind != "approve_before" \
            and (req.webhook_url or token.webhook_url) is None else self.db.transact
        try:
            opened = await write(
                lambda tx: self._open(tx, token, source, req, args_text, chosen,
                                      request_id, fingerprint, standing),
                what="external request")
        except KeyTaken:
            # its key taken meanwhile, or the token revoked or the face switched off
            found = None if req.idempotency_key is None else await self._made(
                token, req.idempotency_key, fingerprint, req.checks)
            if found is None:
                raise ExternalError(f"token {token.name} was revoked, or its face switched "
                                    "off, meanwhile: nothing was asked",
                                    code="unauthorized") from None
            return found, False
        if opened.kept is not None:
            self._kept[request_id] = opened.kept.row()
            while len(self._kept) > KEPT:
                self._kept.popitem(last=False)
        if opened.approval_id is not None:
            self.signals.notify_opened(opened.approval_id)
        if opened.queued:  # nothing to deliver, nobody waiting: an answer given at once
            self.signals.notify_outbox()
        if opened.doc is not None:
            return opened.doc, True
        return await self.get(token, request_id), True

    def _check(self, token: TokenRecord, source: Source,
               req: NewRequest) -> tuple[NewRequest, str]:
        """Bound what the caller gave, before anything is read or written; the request
        with its requester in the one form identities are compared in, and its arguments'
        compact JSON (as stored)."""
        if not req.tool or len(req.tool.encode()) > TOOL_LIMIT:
            raise ExternalError(f"tool is 1 to {TOOL_LIMIT} bytes (UTF-8)",
                                code="invalid_request")
        if req.idempotency_key is not None and not 1 <= len(req.idempotency_key) <= 200:
            raise ExternalError("idempotency_key is 1-200 characters", code="invalid_request")
        if not allows(token, req.tool):
            raise ExternalError(
                f"token {token.name} may not ask about {req.tool} (it may ask about: "
                f"{', '.join(token_tools(token) or ['nothing'])}; the operator grants tools "
                "with `approvald tokens create NAME --tools ...`)", code="tool_not_allowed")
        args = json_text(req.args, "args")  # stored as it is checked: encoded once
        self.cap.check(args, what="the arguments")
        if req.packet:  # (none: "{}", within every cap and depth)
            self.cap.check(json_text(dict(req.packet), "packet"), what="the packet")
        # a caller's claim of who asked must be a Slack user, to be compared with who
        # approves; without one, the request is the source's own (``api:<token>``)
        own = req.requested_by == f"{source.kind}:{source.name}"
        who = req.requested_by if own else requester(req.requested_by,
                                                     strict=source.kind == "api")
        return (req if who == req.requested_by else replace(req, requested_by=who)), args

    async def _made(self, token: TokenRecord, key: str, fingerprint: str,
                    checks: Checks = NO_CHECKS) -> dict[str, Any] | None:
        async with self.db.read() as tx:
            rec = await tx.external.by_key(token.id, key, checks)
        if rec is None:
            return None
        if rec.fingerprint != fingerprint:
            raise ExternalError(
                f"idempotency_key {key!r} already made request {rec.id} with other contents; "
                "a retry must repeat the request exactly (or use a new key)",
                code="idempotency_conflict", run_id=rec.id)
        return await self.get(token, rec.id)

    @staticmethod
    def _task(source: Source, req: NewRequest) -> str:
        """The request's task (its run's, its packet's, its ``requested`` entry's)."""
        return _text(req.packet.get("task"), 500) or f"{req.tool}, asked by {source.label}"

    def _packet(self, token: TokenRecord, source: Source, req: NewRequest,
                chosen: CallPolicy, name: str) -> dict[str, Any]:
        """The decision packet the card shows (a request the policy answers at once shows
        none: only its task is recorded); everything in it is the caller's text (cards
        escape it), except ``why`` when the caller gave none."""
        p = req.packet
        evidence = []
        for item in p.get("evidence") or ():
            if isinstance(item, Mapping):
                source_, detail = item.get("source"), item.get("detail")
            else:
                source_, detail = None, item
            evidence.append({"tool": _text(source_, 60) or "evidence", "call_id": "",
                             "result": _text(detail, 400) or ""})
        return {
            "agent": source.agent,
            "task": self._task(source, req),
            "requested_by": req.requested_by,
            "doing": _text(p.get("doing"), 3000)
            or f"{source.label} wants to run {req.tool} (it runs the call itself once "
               "approved).",
            # what the call runs or writes, shown verbatim under doing (a shell command)
            **({"code": _text(p["code"], MAX_CODE)} if p.get("code") else {}),
            "evidence": evidence[:10],
            "impact": _text(p.get("impact"), 1000),
            "risk": chosen.approval.risk,
            "why": _text(p.get("why"), 1000) or chosen.approval.why
            or (f"{req.tool} needs approval under the operator's policy for {name}."
                if chosen.entry is not None else
                f"The policy file does not name {req.tool} ({name}): every call of it is "
                "asked about, under the operator's default."),
            "description": _text(p.get("description"), 1000)
            or f"{req.tool}, run by the caller {token.name}",
            "via": source.via,
        }

    async def _open(self, tx: Tx, token: TokenRecord, source: Source, req: NewRequest,
                    args_text: str, chosen: CallPolicy, request_id: str, fingerprint: str,
                    standing: StandingRecord | None) -> _Opened:
        now = self.clock.now()
        name = source.policy_name(req.tool)
        kind = "auto" if chosen.kind == "notify_after" else chosen.kind
        # the card's packet, for a request that asks; one answered at once records its task
        packet = self._packet(token, source, req, chosen, name) \
            if kind == "approve_before" else None
        agent = source.agent
        task = self._task(source, req) if packet is None else packet["task"]
        inserted = new_run(run_id=request_id, agent=agent, task=task,
                           requested_by=req.requested_by, instructions_version=source.via,
                           now=now, status=STATUS)
        run = as_inserted(inserted)
        digest = req.digest or call_digest(req.tool, req.args)
        values: dict[str, Any] = dict(
            id=request_id, token_id=token.id, idempotency_key=req.idempotency_key,
            fingerprint=fingerprint, tool=req.tool, args=args_text,
            digest=digest, policy_name=name, kind=kind, reason=chosen.reason,
            webhook_url=req.webhook_url or token.webhook_url, created_at=now,
            sensitive=paths_text(chosen.approval.sensitive))
        if packet is not None:
            if not await tx.external.add_with_run(inserted, req.checks, **values):
                raise _Taken
            if standing is not None and await self.standing.use(
                    tx, standing, run=run, call_id=CALL_ID, tool=req.tool, args=req.args,
                    policy=chosen.approval, packet=packet, identity=req.identity) is not None:
                # approved as it was made (revoked meanwhile: asked below)
                return _Opened(None, None, queued=True)
            return _Opened(await self.gate.insert_approval(
                tx, run=run, call_id=CALL_ID, kind="tool_call", tool=req.tool, args=req.args,
                policy=chosen.approval, rung=0, packet=packet, shadow=chosen.shadow,
                identity=req.identity), None, queued=True)
        # the policy answers at once: audited as a request and its answer by the policy
        rule = {"rule": chosen.approval.rule} if chosen.approval.rule else {}
        self.audit.record(
            tx, at=now, action="requested", actor=f"agent:{agent}", via=source.via,
            run_id=request_id, digest=digest,
            details={"kind": "tool_call", "tool": req.tool, "args": req.args, "call_id": CALL_ID,
                     "requested_by": req.requested_by, "task": task, "policy": name,
                     "policy_file": self.policy().digest,
                     "answer": chosen.kind, **rule, **shadow_details(chosen.shadow)},
            sensitive=chosen.approval.sensitive)
        self.audit.record(
            tx, at=now, action="denied" if kind == "forbidden" else "approved",
            actor="system:policy", via="policy", run_id=request_id, digest=digest,
            details={"tool": req.tool, "args": req.args, "policy": name,
                     "answer": chosen.kind, "reason": chosen.reason, **rule,
                     "outcome": policy_outcome_value(chosen.kind)},
            sensitive=chosen.approval.sensitive)
        intent = kept = None
        if kind == "forbidden":  # over as it is made: its run inserted completed
            result = compact_json({"status": "forbidden", "reason": chosen.reason})
            inserted = {**inserted, "status": "completed", "result": result}
            run = replace(run, status="completed", result=result)
        elif req.start_owner is not None:  # the caller runs it now: its start, recorded
            intent = {"run_id": request_id, "call_id": CALL_ID, "step": 0, "tool": req.tool,
                      "args_digest": digest, "status": "started", "attempts": 1,
                      "started_at": now, "owner": req.start_owner, "heard_at": now,
                      "sensitive": values["sensitive"]}
            kept = _Kept(token.id, req.tool, values["args"], digest, values["sensitive"], now,
                         req.start_owner, agent)
        # the request, its run and its start: inserted now (SQLite), or by the statement
        # that chains its two audit entries (PostgreSQL: one statement for all), only
        # while its token is live
        answered = Answered(inserted, values, intent, req.checks)
        added = await tx.external.add_answered(answered)
        if added is False:
            raise _Taken
        if added is None:
            self.audit.ride(tx, answered)
        # the request as inserted (its other columns start empty), not read back
        rec = ExternalRecord(**values, decided_approval=None, result_digest=None,
                             reported_at=None)
        doc = document(rec, run, None, None, args=req.args)
        if rec.webhook_url is not None:
            await self._queue_webhook(tx, rec, doc, now)
        return _Opened(None, doc, queued=rec.webhook_url is not None, kept=kept)

    # -- read and wait ------------------------------------------------------------------
    async def get(self, token: TokenRecord, request_id: str) -> dict[str, Any]:
        """The request's document; NotFound unless ``token`` made it. An approval nobody
        collected within its window is closed first (:mod:`runtime.kernel.collect`): every poll,
        retry, join and resume reads the request through here, so none of them sees it
        approved once its window closed."""
        async with self.db.read(snapshot=True) as tx:
            rec = await tx.external.get(request_id)
            if rec is None or rec.token_id != token.id:
                raise NotFound(f"no request {request_id}")
            run = await tx.runs.get(request_id)
            a = await _live_approval(tx, rec)
            execution = await tx.executions.get(request_id, CALL_ID)
        assert run is not None
        if run.status == STATUS and execution is None and not collectable(a, self.clock.now()):
            await self.db.transact(lambda tx: self._close_window(tx, request_id),
                                   what=f"window of request {request_id}")
            return await self.get(token, request_id)
        return document(rec, run, a, execution)

    async def _close_window(self, tx: Tx, request_id: str) -> bool:
        """Cancel request ``request_id`` if its approved call was not collected within its
        window and nothing started it (its run locked first, the one lock order): audited
        as a cancel by :data:`runtime.kernel.collect.ACTOR`, its caller told by the same path as
        any cancel, and the request over (the same call made again is asked afresh).
        True if it was closed here."""
        run = await tx.runs.get_locked(request_id)
        a = current(await tx.approvals.for_run(request_id))
        return await self._close_locked(tx, run, a)

    async def _close_locked(self, tx: Tx, run: RunRecord | None, a: ApprovalRecord | None,
                            started: Callable[[], Awaitable[ExecutionRecord | None]]
                            | None = None) -> bool:
        """:meth:`_close_window` for a run already read under its lock in this transaction
        and its request's live approval (``a``): neither is read again (nobody changes
        them while the run's lock is held). ``started``: how the call's execution row is
        read, when the caller needs it too (read once)."""
        now = self.clock.now()
        if run is None or run.status != STATUS or a is None or collectable(a, now):
            return False
        request_id = run.id
        execution = await started() if started is not None else \
            await tx.executions.get(request_id, CALL_ID)
        if execution is not None:
            return False
        return await self._cancel_uncollected(
            tx, run, a, actor=WINDOW_ACTOR, why=why_not(a), code=WINDOW_CLOSED,
            window_closed_at=a.expires_at.isoformat())

    async def _cancel_uncollected(self, tx: Tx, run: RunRecord, a: ApprovalRecord, *,
                                  actor: str, why: str, code: str, **details: Any) -> bool:
        """Cancel ``run``'s request, approved by ``a`` but whose call must not run (nothing
        started it; its run locked by the caller): audited as a cancel by ``actor`` with
        the stable ``code``, its caller told by the same path as any cancel, and the
        request over (the same call made again is asked afresh). True if cancelled here."""
        now = self.clock.now()
        if not await tx.runs.cancel_if_idle(run.id, now=now, by=actor, reason=why,
                                            error=f"cancelled by {actor}: {why}"):
            return False
        await tx.external.mark_answered(run.id, now=now)
        self.audit.record(tx, at=now, action="cancelled", actor=actor,
                          via=Source.of_run(run.agent).via, run_id=run.id,
                          details={"was": STATUS, "reason": why, "code": code,
                                   "approval_id": a.id, "tool": a.tool, **details})
        return True

    async def wait(self, token: TokenRecord, request_id: str, *, seconds: float,
                   stop: asyncio.Event | None = None) -> dict[str, Any]:
        """The document once the request is decided, or as it stands after ``seconds``
        (at most :data:`MAX_WAIT`), or when ``stop`` is set. A long poll: the request's
        waiters are woken by a decision (see the module docstring), else look every
        :data:`POLL` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, min(seconds, MAX_WAIT))
        with self._waiting(request_id):
            while True:
                event = self._events.setdefault(request_id, asyncio.Event())  # before reading
                doc = await self.get(token, request_id)
                left = deadline - loop.time()
                if doc["status"] != "pending" or left <= 0 or (stop and stop.is_set()):
                    return doc
                waits = [asyncio.ensure_future(event.wait())]
                if stop is not None:
                    waits.append(asyncio.ensure_future(stop.wait()))
                try:
                    await asyncio.wait(waits, timeout=min(left, POLL),
                                       return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for w in waits:
                        w.cancel()
                    await asyncio.gather(*waits, return_exceptions=True)

    @contextlib.contextmanager
    def _waiting(self, request_id: str) -> Iterator[None]:
        self._waiters[request_id] = self._waiters.get(request_id, 0) + 1
        try:
            yield
        finally:
            self._waiters[request_id] -= 1
            if not self._waiters[request_id]:
                del self._waiters[request_id]
                self._events.pop(request_id, None)

    def wake(self, request_id: str) -> None:
        """Something about ``request_id`` was committed: its waiters here look again."""
        event = self._events.pop(request_id, None)
        if event is not None:
            event.set()

    def on_decided(self, fn: Callable[[str], None]) -> None:
        """Call ``fn(request_id)`` after this process committed a request's decision."""
        self._listeners.append(fn)

    def announce(self) -> None:
        decided, self._decided = self._decided, []
        for request_id in dict.fromkeys(decided):
            self.wake(request_id)
            for fn in self._listeners:
                fn(request_id)

    # -- what a caller's calls were told ---------------------------------------------------
    async def answered(self, token: TokenRecord, request_id: str) -> datetime | None:
        """When a call was first told that ``token``'s request ``request_id`` ended without
        its call running (None: not yet)."""
        async with self.db.read() as tx:
            rec = await tx.external.get(request_id)
        if rec is None or rec.token_id != token.id:
            raise NotFound(f"no request {request_id}")
        return rec.answered_at

    async def mark_answered(self, token: TokenRecord, request_id: str) -> None:
        """Note that a call was told the request's final answer (denied, expired...): the
        call that waited for it has its answer, and the same call made later is asked
        about again (the first telling counts; later ones change nothing)."""

        async def work(tx: Tx) -> None:
            rec = await tx.external.get(request_id)
            if rec is None or rec.token_id != token.id:
                raise NotFound(f"no request {request_id}")
            await tx.external.mark_answered(request_id, now=self.clock.now())

        await self.db.transact(work, what=f"answer of request {request_id}")

    async def refused(self, token: TokenRecord, *, tool: str, reason: str, message: str,
                      actor: str, request_id: str | None = None,
                      details: Mapping[str, Any] | None = None) -> None:
        """Audit a call a face refused with no decision behind the refusal (still waiting
        for its decision at the face's budget, the face switched off, its start refused):
        every refusal has its entry (``refused``, with ``reason`` a stable code)."""
        source = Source.of_credential(token.name)

        async def work(tx: Tx) -> None:
            self.audit.record(
                tx, at=self.clock.now(), action="refused", actor=actor, via=source.via,
                run_id=request_id,
                details={"tool": tool, "policy": source.policy_name(tool), "reason": reason,
                         "message": message[:500], **(details or {})})

        await self.db.transact(work, what=f"refusal of a {tool} call")

    # -- start (optional) -----------------------------------------------------------------
    async def start(self, token: TokenRecord, request_id: str, *, args_digest: str,
                    owner: str, identity: ToolIdentity | None = None) -> None:
        """Record that the caller is about to run the approved call (the execution ledger's
        intent row, before the call), so that a caller that dies mid-call leaves "outcome
        unknown" behind, never "did not run". Optional: a report without it is recorded
        as one finished row. Refused (``already_started``, with the earlier attempt's
        owner and start) when an attempt was recorded before, and as :meth:`report` would
        refuse (``not_approved``, ``digest_mismatch``, ``already_reported``).

        ``identity``: that of the tool the caller would run the call on now (an MCP
        server's tool as it lists it now; :data:`runtime.policies.tools.GONE` if it no longer
        does). When the approval bound another identity (the tool changed since it was
        asked about), the call is not started: the request is cancelled (audited, actor
        :data:`TOOL_ACTOR`, code :data:`TOOL_CHANGED`, both identities recorded and
        exported as bindings), and refused with ``tool_changed``; the same call made
        again is asked afresh. A caller's tool has no declared versions: any change asks
        again."""
        changed: list[str] = []

        async def work(tx: Tx) -> bool:
            now = self.clock.now()
            rec, run = await _lock_own(tx, token, request_id)
            if rec.result_digest is not None:
                raise ExternalError(f"request {request_id} was already reported",
                                    code="already_reported", run_id=request_id)
            a = await _live_approval(tx, rec)
            if await self._close_locked(tx, run, a):
                return False  # committed, then refused below
            status = a.status if a is not None else \
                "forbidden" if rec.kind == "forbidden" else "approved"
            if status != "approved" or run.status != STATUS:
                why = status if status != "approved" else run.status
                raise ExternalError(f"request {request_id} is {why}: only an approved call "
                                    "that is still open runs",
                                    code="cancelled" if why == "cancelled" else "not_approved",
                                    run_id=request_id)
            digest = a.effective_digest if a is not None else rec.digest
            if not _reported(args_digest, digest):
                raise ExternalError(
                    f"args_digest {args_digest[:64]!r} is not the approved arguments' "
                    f"{binding.shown(digest)}: run exactly effective_args",
                    code="digest_mismatch", run_id=request_id)
            asked = asked_identity(a) if a is not None else None
            what = identity_change(asked, identity)
            if what is not None and a is not None and asked is not None \
                    and identity is not None \
                    and await tx.executions.get(request_id, CALL_ID) is None:
                why = (f"{rec.tool} changed since the call was approved: {what}. The call "
                       "did not run; make it again to be asked afresh")
                # (digests here, bindings wherever the entry leaves the database); the run
                # is open and locked here, so this cancels it; never started either way
                await self._cancel_uncollected(
                    tx, run, a, actor=TOOL_ACTOR, why=why, code=TOOL_CHANGED,
                    approved_identity=asked.digest(), current_identity=identity.digest())
                changed[:] = [why, what]
                return False
            if not await tx.executions.record_intent(run_id=request_id, call_id=CALL_ID,
                                                     step=0, tool=rec.tool, digest=digest,
                                                     now=now, owner=owner,
                                                     sensitive=_paths(rec, a)):
                earlier = await tx.executions.get(request_id, CALL_ID)
                assert earlier is not None
                raise ExternalError(
                    f"request {request_id}'s call was already started at "
                    f"{earlier.started_at.isoformat()} by {earlier.owner or 'its caller'}",
                    code="already_started", run_id=request_id, owner=earlier.owner,
                    started_at=earlier.started_at.isoformat())
            return True

        if not await self.db.transact(work, what=f"start of request {request_id}"):
            if changed:
                raise ExternalError(f"request {request_id} was approved, but {changed[0]}",
                                    code=TOOL_CHANGED, run_id=request_id, reason=TOOL_CHANGED,
                                    why=changed[1])
            raise self._window_closed(request_id)

    @staticmethod
    def _window_closed(request_id: str) -> ExternalError:
        return ExternalError(f"request {request_id} was approved, but its call was not "
                             "collected before the request's window closed: it is cancelled "
                             "and must not run (make the call again to be asked afresh)",
                             code="cancelled", run_id=request_id, reason=WINDOW_CLOSED)

    # -- report -------------------------------------------------------------------------
    async def report(self, token: TokenRecord, request_id: str,
                     rep: Report) -> tuple[dict[str, Any], bool]:
        """Record what came of the approved call: (the document, whether this report is
        new). Once only; the same report again is answered as before, another refused."""
        new = await self.record_report(token, request_id, rep)
        return await self.get(token, request_id), new

    async def record_report(self, token: TokenRecord, request_id: str, rep: Report) -> bool:
        """:meth:`report`, without reading the document back (a caller face that ran the
        call itself already knows what it tells its client): whether the report is new."""
        result_text = compact_json(rep.result)
        self.cap.check(result_text, what="the result")
        fingerprint = rep.fingerprint()
        row = self._kept.pop(request_id, None)
        kept = None if row is None else _Kept(*row)
        if kept is not None and kept.token_id == token.id \
                and _reported(rep.args_digest, kept.digest) \
                and (rep.ran is None or call_digest(kept.tool, rep.ran) == kept.digest):
            try:  # on PostgreSQL one statement, sent alone (a transaction if it wrote nothing)
                return await self.db.transact_one(
                    lambda tx: self._report_kept(tx, request_id, kept, rep, result_text,
                                                 fingerprint),
                    what=f"report on request {request_id}")
            except KeyTaken:
                pass  # it changed since (reported, taken, gone): read, as any report is

        async def work(tx: Tx) -> bool | None:
            now = self.clock.now()
            rec, run = await _lock_own(tx, token, request_id)
            if rec.result_digest is not None:
                if rec.result_digest == fingerprint:
                    return False
                raise ExternalError(f"request {request_id} already has a report, with another "
                                    "result: a call is reported once", code="already_reported",
                                    run_id=request_id)
            a = await _live_approval(tx, rec)
            read: list[ExecutionRecord | None] = []

            async def execution() -> ExecutionRecord | None:  # read once, if at all here
                if not read:
                    read.append(await tx.executions.get(request_id, CALL_ID))
                return read[0]

            if await self._close_locked(tx, run, a, execution):
                return None  # nothing started it in its window: committed, then refused
            status = a.status if a is not None else \
                "forbidden" if rec.kind == "forbidden" else "approved"
            if status != "approved":
                raise ExternalError(f"request {request_id} is {status}: only an approved call "
                                    "runs, so only it is reported", code="not_approved",
                                    run_id=request_id)
            started = await execution()
            if run.status != STATUS and started is None:
                # closed (cancelled) before its call started: nothing can have run under it;
                # a call started before the cancel did run, and its report is still taken
                raise ExternalError(f"request {request_id} is {run.status}: its call was never "
                                    "started, so there is nothing to report",
                                    code="cancelled" if run.status == "cancelled"
                                    else "not_approved", run_id=request_id)
            digest = a.effective_digest if a is not None else rec.digest
            args = a.effective_args() if a is not None else json.loads(rec.args)
            if not _reported(rep.args_digest, digest):
                raise ExternalError(
                    f"args_digest {rep.args_digest[:64]!r} is not the approved arguments' "
                    f"{binding.shown(digest)}: run exactly effective_args, and report their "
                    "effective_digest", code="digest_mismatch", run_id=request_id)
            failed = rep.status == "failed"
            ran_digest = digest if rep.ran is None else call_digest(rec.tool, rep.ran)
            mismatch = ran_digest != digest
            if started is not None:  # its intent, recorded by start(): the result completes it
                await tx.executions.record_result(
                    run_id=request_id, call_id=CALL_ID, status=rep.status, result=result_text,
                    error_class="ReportedByCaller" if failed else None, error=rep.error,
                    now=now, latency_ms=(now - started.started_at).total_seconds() * 1000,
                    digest=ran_digest if mismatch else None)
            else:
                await tx.executions.record_done(
                    run_id=request_id, call_id=CALL_ID, step=0, tool=rec.tool, digest=ran_digest,
                    started_at=now, now=now, owner=None, status=rep.status,
                    result=result_text, error_class="ReportedByCaller" if failed else None,
                    error=rep.error, latency_ms=None, sensitive=_paths(rec, a))
            await tx.external.set_reported(request_id, result_digest=fingerprint, now=now)
            # what the caller says ran; where that is not what was approved, both, flagged
            told: dict[str, Any] = {"args": args}
            if mismatch:
                told = {"args": rep.ran, "args_mismatch": True, "effective_args": args,
                        "effective_digest": digest}
            self.audit.record(
                tx, at=now, action="executed", actor=f"agent:{run.agent}",
                via=Source.of_run(run.agent).via,
                run_id=request_id, approval_id=a.id if a is not None else None,
                digest=ran_digest,
                details={"tool": rec.tool, **told, "status": rep.status,
                         "idempotency_key": f"{request_id}:{CALL_ID}",
                         "result": result_excerpt(result_text), "error": rep.error,
                         "reported_by": run.agent},
                # the paths resolved when the call was made, asked about or not
                sensitive=paths_of(_paths(rec, a)))
            if run.status != STATUS:  # reported after a cancel: the run stays cancelled
                return True
            await tx.runs.update(request_id, expect_status=[STATUS],
                                 status="failed" if failed else "completed",
                                 result=None if failed else result_text,
                                 error=(rep.error or "the caller reported a failure")[:4000]
                                 if failed else None, updated_at=now)
            return True

        new = await self.db.transact(work, what=f"report on request {request_id}")
        if new is None:
            raise self._window_closed(request_id)
        return new

    async def _report_kept(self, tx: Tx, request_id: str, kept: _Kept, rep: Report,
                           result_text: str, fingerprint: str) -> bool:
        """:meth:`record_report`'s work for a call this process started with its request
        (``kept``), reading nothing: the request is an auto one (nothing asked, no
        approval, no window), its call started by ``kept.owner`` at ``kept.started_at``
        with the arguments ``kept.digest`` names (the caller's digest checked against
        it). Its statements check what reads would have (:class:`~store.repos.external.
        Reported`): unreported, still ``token``'s, its intent row still started and
        ``kept.owner``'s, else :class:`~store.errors.KeyTaken` (rolled back, the report
        read as any is); the run ends unless it was cancelled since (a call started
        before a cancel did run: its report is taken, the run stays cancelled)."""
        now = self.clock.now()
        failed = rep.status == "failed"
        rows = Reported(
            request_id=request_id, token_id=kept.token_id, call_id=CALL_ID, owner=kept.owner,
            open=STATUS, request={"result_digest": fingerprint, "reported_at": now},
            execution={"status": rep.status, "result": result_text,
                       "error_class": "ReportedByCaller" if failed else None,
                       "error": rep.error, "finished_at": now,
                       "latency_ms": (now - kept.started_at).total_seconds() * 1000},
            run={"status": "failed" if failed else "completed",
                 "result": None if failed else result_text,
                 "error": (rep.error or "the caller reported a failure")[:4000]
                 if failed else None, "updated_at": now})
        done = await tx.external.report_kept(rows)
        if done is False:
            raise _Taken
        if done is None:
            self.audit.ride(tx, rows)
        self.audit.record(
            tx, at=now, action="executed", actor=f"agent:{kept.agent}",
            via=Source.of_run(kept.agent).via, run_id=request_id, approval_id=None,
            digest=kept.digest,
            details={"tool": kept.tool, "args": json.loads(kept.args), "status": rep.status,
                     "idempotency_key": f"{request_id}:{CALL_ID}",
                     "result": result_excerpt(result_text), "error": rep.error,
                     "reported_by": kept.agent},
            sensitive=paths_of(kept.sensitive))
        return True

    # -- decisions, whichever path made them --------------------------------------------
    kinds = frozenset({REQUEST_DECIDED})  # the outbox rows this part delivers itself

    def follow(self, entries: Sequence[Entry]) -> list[tuple[Payload, str]]:
        """The ``request.decided`` rows the transaction that audited ``entries`` queues:
        one for each caller's request an entry may have ended (an audit follower: it reads
        nothing). Its waiters here look again once that transaction commits."""
        rows: list[tuple[Payload, str]] = []
        seen: set[tuple[str, str | None]] = set()
        for entry in entries:
            run_id, approval_id = entry.run_id, entry.approval_id
            # (an answer at once, no approval behind it, is told by its two fields alone)
            if not run_id or entry.action not in ENDING \
                    or (approval_id is None and entry.action != "cancelled") \
                    or not is_external(run_id) or (run_id, approval_id) in seen:
                continue
            seen.add((run_id, approval_id))
            # the webhook's group: it follows this row, after those told before it
            rows.append((RequestDecided(run_id, approval_id), f"{WEBHOOK}:{run_id}"))
            self._decided.append(run_id)
        return rows

    async def deliver(self, row: OutboxRecord) -> dict[str, Any]:
        """Follow up a ``request.decided`` row, in a transaction of its own (the request's
        run locked first, the one lock order): if its request is final and not yet told,
        queue its webhook and end its run unless the call was approved."""
        told = payload_of(row)
        assert isinstance(told, RequestDecided)
        run_id, approval_id = told.run_id, told.approval_id

        async def work(tx: Tx) -> bool:
            await tx.runs.lock(run_id)
            if approval_id is None:
                return await self._cancelled(tx, run_id)
            return await self._decided_in(tx, run_id, approval_id)

        queued = await self.db.transact(work, what=f"decision of request {run_id}")
        if queued:
            self.signals.notify_outbox()  # its webhook
        return {"told": queued}

    async def _decided_in(self, tx: Tx, run_id: str, approval_id: str) -> bool:
        a = await tx.approvals.get(approval_id)
        if a is None or a.status in OPEN or not await tx.external.mark_decided(run_id, a.id):
            return False
        rec = await tx.external.get(run_id)
        run = await tx.runs.get(run_id)
        if rec is None or run is None:
            return False
        now = self.clock.now()
        if a.status != "approved":  # the call will not run: the request is over
            await tx.runs.update(run_id, expect_status=[STATUS], status="completed",
                                 result=compact_json({"status": a.status, "reason": a.reason,
                                                      "by": a.decided_by}),
                                 updated_at=now)
        await self._queue_webhook(tx, rec, document(rec, run, a, None), now)
        return rec.webhook_url is not None

    async def _cancelled(self, tx: Tx, run_id: str) -> bool:
        """A request cancelled after its approval (a pending one is told through its
        approval's own ``cancelled`` entry): its caller learns it must not run the call."""
        run = await tx.runs.get(run_id)
        rec = await tx.external.get(run_id)
        a = current(await tx.approvals.for_run(run_id))
        if run is None or rec is None or run.status != "cancelled" \
                or (a is not None and a.status != "approved") \
                or not await tx.external.mark_decided(run_id, "cancelled"):
            return False
        await self._queue_webhook(tx, rec, document(rec, run, a, None), self.clock.now())
        return rec.webhook_url is not None

    async def _queue_webhook(self, tx: Tx, rec: ExternalRecord, doc: dict[str, Any],
                             now: datetime) -> None:
        if rec.webhook_url is None:
            return
        await queue(tx, Webhook(run_id=rec.id, token_id=rec.token_id, url=rec.webhook_url,
                                event="decision", document=doc),
                    group_key=f"{WEBHOOK}:{rec.id}", now=now)
