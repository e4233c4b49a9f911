"""Each tool call through the MCP gateway, as an external request (no MCP in this module).

A call is an external request of :mod:`runtime.external` made under approvald's own
credential for the gateway, ``mcp.<name>`` (its run's agent is ``external:mcp.<name>``; no
bearer token exists for it, and an operator's token is never taken for it). Its source is
``mcp:<name>``: the intake answers it with the operator's policy for ``mcp:<name>/<tool>``
(a ``[tools]`` entry or a glob, with its rules on arguments), and a tool the file does not
name gets the file's ``[default]``, which always asks: silence never lets a call through,
and an agent's tool of the same name lends it nothing. What the request says decides what
runs: an approved call is forwarded with its effective (possibly edited) arguments, its
intent recorded before and its result after (the execution ledger's ``<request id>:call``,
an ``executed`` audit entry), so ``approvald audit export`` shows requested, approved and
executed.

Idempotency. MCP request ids are per connection and a client's retry gets a new one, so
the key is derived from the call itself: ``mcp:<digest of tool and arguments>:<n>``. The
first request for a call is generation 0; generation n+1 is made only once generation n
is over (denied, expired, executed, cancelled...). So a retried call, or the same call
from a second client of the same gateway, while its request is open joins that request
(one card, one decision) instead of asking twice; once a call has run, the same call
again is a new request and is asked about again. An approved call is executed by one
task per process, shielded from the client's cancellation; callers that join it get its
result. A call another process started and never reported is "outcome unknown": it is
never re-run; a person cancels its request (``approvald runs cancel ID``) to ask afresh.
An approval nobody collected before its request's window closed is not used later: that
request is cancelled (audited) and the call is asked about again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, Literal, TypeVar

from approvald.runtime.api_tokens import check_name, own_credential
from approvald.runtime.canonical import call_digest, compact_json
from approvald.runtime.decide import Actor
from approvald.runtime.engine import Engine
from approvald.runtime.errors import ApprovaldError, PayloadTooLarge
from approvald.runtime.external import CALL_ID, ExternalError, NewRequest, Report
from approvald.runtime.ids import lease_id
from approvald.runtime.intake import Source
from approvald.runtime.state import FINAL_STATUSES
from approvald.store.repos.external import TokenRecord

log = logging.getLogger("approvald.mcp")

TOKEN_PREFIX = "mcp."
KEY_PREFIX = "mcp:"
ACTOR = "system:mcp-gateway"
VIA = "mcp"  # the face the audit log names for the gateway's requests and reports
OPEN = frozenset({"pending", "superseded"})
HEARTBEAT = 10.0  # s between "still waiting" signals to the client (and looks at expiry)
KEEP_RAN = 256  # finished calls whose results late joiners in this process still get
RESULT_SUMMARY = 4000  # characters of a result too large to record whole

T = TypeVar("T")


class GatewayOff(ApprovaldError):
    """The gateway's token was revoked: it lets nothing through."""


@dataclass(frozen=True)
class Refused:
    """The call did not run (or its outcome is unknown): what the client is told."""

    status: str  # forbidden, denied, expired, redirected, cancelled, unknown, ran, off
    message: str
    request_id: str | None = None


@dataclass(frozen=True)
class Ran(Generic[T]):
    """What came of a forwarded call: the client's answer and what the ledger keeps."""

    value: T
    status: Literal["succeeded", "failed"]
    record: Any  # JSON
    error: str | None = None


Forward = Callable[[dict[str, Any]], Awaitable[Ran[T]]]
Waiting = Callable[[dict[str, Any]], Awaitable[None]]


def idempotency_key(digest: str, generation: int) -> str:
    return f"{KEY_PREFIX}{digest}:{generation}"


def _when(text: str | None) -> str:
    return text or "?"


def refusal(doc: dict[str, Any]) -> Refused:
    """What the client is told about a request that ended without running its call."""
    status, rid = str(doc["status"]), str(doc["id"])
    d = doc.get("decision") or {}
    by, reason = d.get("decided_by") or "?", d.get("reason")
    tool = doc["tool"]
    if status == "forbidden":
        text = f"approvald refused {tool}: {reason or 'forbidden by policy'}"
    elif status == "denied":
        text = f"approvald: {tool} was denied by {by}" + (f": {reason}" if reason else "")
    elif status == "redirected":
        text = f"approvald: {tool} did not run; {by} redirected it: {reason or ''}"
    elif status == "expired":
        text = (f"approvald: {tool} did not run; its approval request expired unanswered "
                f"at {_when(doc.get('expires_at'))}")
    elif status == "cancelled":
        text = f"approvald: {tool} did not run; its approval request was cancelled"
        if reason:
            text += f": {reason}"
    else:
        text = f"approvald: {tool} did not run (request {status})"
    return Refused(status, f"{text} (request {rid}). Nothing was executed.", rid)


class Gateway:
    """The approvald side of one ``mcp-proxy``: gate, forward, record.

    ``name`` names the gateway (its token is ``mcp.<name>``), ``requested_by`` who the
    requests are made for (a Slack user id: that person may not approve their own calls),
    ``server`` how the wrapped server was started (shown on cards); ``slack`` whether
    Slack is configured (its progress says where a request can be decided).
    """

    def __init__(self, engine: Engine, *, name: str, requested_by: str, server: str,
                 heartbeat: float = HEARTBEAT, slack: bool = False) -> None:
        self.e = engine
        self.slack = slack
        self.name = name
        self.token_name = check_name(TOKEN_PREFIX + name)
        self.source = Source("mcp", name)
        self.requested_by = requested_by
        self.server = server[:300]
        self.heartbeat = heartbeat
        self.owner = engine.owner
        self.descriptions: dict[str, str] = {}  # tool -> its description, for cards
        self._cursor: dict[str, int] = {}  # digest -> the first generation maybe open
        self._inflight: dict[str, asyncio.Task[Ran[Any] | Refused]] = {}
        # finished here, newest last: callers that join late get the same answer
        self._ran: OrderedDict[str, asyncio.Task[Ran[Any] | Refused]] = OrderedDict()

    # -- the token ----------------------------------------------------------------------
    async def token(self) -> TokenRecord:
        """The gateway's credential, made on first use (audited). Revoking it (``approvald
        tokens revoke mcp.NAME``) switches the gateway off: it raises :class:`GatewayOff`.
        No bearer token exists for it (the HTTP API refuses every ``mcp.`` name), and an
        operator's token is never taken for it."""
        found = await own_credential(self.e.db, self.e.clock, self.e.audit, self.source)
        if found.revoked_at is not None:
            raise GatewayOff(f"the MCP gateway {self.name} is switched off: its token "
                             f"{self.token_name} was revoked by {found.revoked_by}")
        return found

    # -- one call -----------------------------------------------------------------------
    async def call(self, tool: str, args: dict[str, Any], forward: Forward[T], *,
                   waiting: Waiting | None = None) -> Ran[T] | Refused:
        """Gate one call of ``tool``; forward it (at most once) if it may run."""
        try:
            token = await self.token()
        except GatewayOff as exc:
            return Refused("off", f"approvald: {exc}. Nothing was executed.")
        doc = await self._request(token, tool, args)
        rid = str(doc["id"])
        while doc["status"] in OPEN:
            doc = await self._wait(token, doc, waiting)
        if doc["status"] != "approved":
            return refusal(doc)
        task = self._inflight.get(rid) or self._ran.get(rid)
        if task is None:
            if await self._run_status(rid) in FINAL_STATUSES:
                return await self._closed(token, tool, rid)
            # looked up again with no await before it is set: one task per request here
            task = self._inflight.get(rid) or self._ran.get(rid)
            if task is None:
                task = asyncio.ensure_future(self._execute(token, tool, doc, forward))
                self._inflight[rid] = task
                task.add_done_callback(self._done)
        # the client may give up waiting; the call, once started, still finishes and is
        # recorded (a cancelled forward would leave its outcome unknown)
        out: Ran[T] | Refused = await asyncio.shield(task)
        return out

    def _done(self, task: asyncio.Task[Any]) -> None:
        for rid, t in list(self._inflight.items()):
            if t is task:  # callers that join it late still get its result
                del self._inflight[rid]
                self._ran[rid] = task
                while len(self._ran) > KEEP_RAN:
                    self._ran.popitem(last=False)
        if not task.cancelled() and task.exception() is not None:
            log.warning("a forwarded call broke off, its outcome unknown: %r", task.exception())

    async def _closed(self, token: TokenRecord, tool: str, rid: str) -> Refused:
        doc = await self.e.external.get(token, rid)
        if doc["result"] is not None:
            return Refused("ran", f"approvald: request {rid} for {tool} already ran, for "
                           "another call of this gateway, which received its result "
                           f"({doc['result']['status']}). It was not run again.", rid)
        return Refused("cancelled", f"approvald: {tool} did not run; request {rid} was "
                       "closed before its approved call started. Nothing was executed.", rid)

    def _not_started(self, tool: str, rid: str, exc: ExternalError) -> Refused:
        if exc.code == "already_started":
            return Refused(
                "unknown",
                f"approvald: request {rid} for {tool} was approved and its call started at "
                f"{_when(exc.fields.get('started_at'))} by {exc.fields.get('owner') or '?'}, "
                "which has not recorded what came of it: the call may still be running, or "
                "its process stopped mid-call. approvald never runs such a call again. If it "
                f"did not happen, `approvald runs cancel {rid}` and call the tool again.", rid)
        return Refused("cancelled", f"approvald: {tool} did not run: {exc} (request {rid}). "
                       "Nothing was executed.", rid)

    async def _execute(self, token: TokenRecord, tool: str, doc: dict[str, Any],
                       forward: Forward[T]) -> Ran[T] | Refused:
        """Record the intent, forward the approved call with its effective arguments, then
        report what came of it."""
        rid = str(doc["id"])
        try:
            await self.e.external.start(token, rid, args_digest=doc["effective_digest"],
                                        owner=lease_id(self.owner))
        except ExternalError as exc:
            return self._not_started(tool, rid, exc)
        # an exception here (the server gone mid-call, a cancellation at shutdown) is left
        # unreported on purpose: the intent row stays "started", outcome unknown
        ran = await forward(dict(doc["effective_args"]))
        await self._report(token, rid, doc, ran.status, ran.record, ran.error)
        return ran

    async def _report(self, token: TokenRecord, rid: str, doc: dict[str, Any], status: str,
                      record: Any, error: str | None) -> None:
        status_: Literal["succeeded", "failed"] = \
            "failed" if status == "failed" else "succeeded"
        rep = Report(status_, doc["effective_digest"], record, error)
        try:
            try:
                await self.e.external.report(token, rid, rep)
            except PayloadTooLarge:
                text = compact_json(record)
                rep = Report(status_, doc["effective_digest"],
                             {"truncated": True, "chars": len(text),
                              "start": text[:RESULT_SUMMARY]}, error)
                await self.e.external.report(token, rid, rep)
        except Exception:  # the client still gets its answer; the log says what is missing
            log.exception("could not record the result of request %s: its ledger row stays "
                          "'started' (outcome unknown)", rid)

    # -- the request a call joins or makes ----------------------------------------------
    async def _request(self, token: TokenRecord, tool: str,
                       args: dict[str, Any]) -> dict[str, Any]:
        digest = call_digest(tool, args)
        n = self._cursor.get(digest)
        if n is None:
            n = await self._first_open(token, digest)
        while True:
            req = self._new_request(tool, args, idempotency_key(digest, n))
            try:
                doc, new = await self.e.external.create(token, req)
            except ExternalError as exc:
                # same key, other contents (the tool's description changed meanwhile):
                # still the same call, so join its request
                if exc.code != "idempotency_conflict" or exc.run_id is None:
                    raise
                doc, new = await self.e.external.get(token, exc.run_id), False
            if new or not await self._over(doc):
                self._cursor[digest] = n
                return doc
            n += 1

    async def _first_open(self, token: TokenRecord, digest: str) -> int:
        """The first generation of this call that may still be open: requests are made in
        order, each once the one before is over, so only the last can be open. Galloping
        search for the first free key (a few lookups, however often the call was made)."""
        async def made(n: int) -> bool:
            async with self.e.db.read() as tx:
                return await tx.external.by_key(token.id, idempotency_key(digest, n)) is not None

        if not await made(0):
            return 0
        lo, hi = 0, 1
        while await made(hi):
            lo, hi = hi, hi * 2
        while hi - lo > 1:  # made(lo), not made(hi)
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if await made(mid) else (lo, mid)
        return lo

    async def _over(self, doc: dict[str, Any]) -> bool:
        """Whether a request no longer stands for a call waiting to run."""
        status = doc["status"]
        if status in OPEN:
            return False
        if status != "approved" or doc["result"] is not None:
            return True
        rid = str(doc["id"])
        if await self._run_status(rid) in FINAL_STATUSES:
            return True
        if rid in self._inflight or doc["approval_id"] is None:
            return False
        async with self.e.db.read() as tx:
            started = await tx.executions.get(rid, CALL_ID)
        if started is not None:  # running elsewhere, or its outcome is unknown: not over
            return False
        # an approval nobody collected is usable only until its request's window closed;
        # after that the request is cancelled (audited) and the call is asked about again
        expires = doc.get("expires_at")
        if expires is None or datetime.fromisoformat(expires) > self.e.clock.now():
            return False
        with contextlib.suppress(ApprovaldError):  # or it was closed meanwhile: over too
            await self.e.cancel(rid, actor=Actor(ACTOR, VIA),
                                reason="approved, but no MCP client collected the approval "
                                       "before the request's window closed")
        return await self._run_status(rid) in FINAL_STATUSES

    async def _run_status(self, rid: str) -> str:
        async with self.e.db.read() as tx:
            run = await tx.runs.get(rid)
        return run.status if run is not None else "cancelled"

    def _new_request(self, tool: str, args: dict[str, Any], key: str) -> NewRequest:
        """The request for one call; everything in it is the same for every retry of it
        (the idempotency key's fingerprint). Its policy is the operator's for
        ``mcp:<gateway>/<tool>`` (the intake resolves it), never an agent's tool's."""
        packet: dict[str, Any] = {
            "task": f"{tool}, called through the MCP gateway {self.name}",
            "doing": f"An MCP client of the gateway {self.name} calls {tool} on the MCP "
                     f"server `{self.server}`. approvald forwards the call, with the "
                     "arguments approved, once it is approved.",
            "description": self.descriptions.get(tool) or f"{tool}, a tool of the MCP "
                                                          f"server {self.name}",
        }
        return NewRequest(tool=tool, args=args, requested_by=self.requested_by,
                          packet=packet, idempotency_key=key)

    # -- waiting for the decision -------------------------------------------------------
    async def _wait(self, token: TokenRecord, doc: dict[str, Any],
                    waiting: Waiting | None) -> dict[str, Any]:
        """One heartbeat of waiting: the document once decided, or as it stands. A request
        past its expiry is settled here too (expired, or escalated to the next rung) by
        the sweep's own compare-and-set, should no ``serve`` be sweeping."""
        if waiting is not None:
            await waiting(doc)
        expires = doc.get("expires_at")
        if expires is not None and doc["approval_id"] is not None \
                and datetime.fromisoformat(expires) <= self.e.clock.now():
            await self.e.expiry.sweep(only=[str(doc["approval_id"])])
        return await self.e.external.wait(token, str(doc["id"]), seconds=self.heartbeat)


    async def progress(self, doc: dict[str, Any]) -> str:
        """One line about a request waiting for a decision, saying where it can be
        decided now: its card in Slack only once that card is posted."""
        approval_id = doc.get("approval_id")
        posted = False
        if approval_id:
            async with self.e.db.read() as tx:
                a = await tx.approvals.get(str(approval_id))
            posted = a is not None and bool(a.channel and a.message_ts)
        return describe(doc, in_slack=posted, slack=self.slack)


def describe(doc: dict[str, Any], *, in_slack: bool = False, slack: bool = False) -> str:
    """One line about a request waiting for a decision (for progress messages):
    ``in_slack``, its card is posted; else ``slack``, Slack is configured (the card is
    not out yet); else Slack is not configured. The commands decide it in every case."""
    approval_id = doc.get("approval_id")
    cli = (f"`approvald approvals approve {approval_id}` (or deny)" if approval_id
           else "`approvald approvals approve ID`")
    if in_slack:
        where = f"in Slack (or with {cli} or the HTTP API)"
    elif slack:
        where = f"(its card is not in Slack yet: decide with {cli} or the HTTP API)"
    else:
        where = f"(Slack is not configured: decide with {cli} or the HTTP API)"
    return (f"waiting for approval {where}: request {doc['id']}"
            + (f", expires {doc['expires_at']}" if doc.get("expires_at") else ""))
