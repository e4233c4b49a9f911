"""Each tool call through the MCP gateway, as an external request (no MCP in this module).

A call is an external request of :mod:`runtime.runs.external` made under approvald's own
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
A call the policy allows at once has its start recorded with its request, in one write
(:attr:`runtime.runs.external.NewRequest.start_owner`), and is run here; its report is
one write too, from what that write left in memory. The same call made meanwhile in this
process waits until that request is made and its call taken (:meth:`Gateway._turn`), then
joins it: it is never refused as started elsewhere by a call running here.
An approval nobody collected before its request's window closed is not used later: that
request is cancelled (audited) and the call is asked about again.

The tool's identity. A tool call's request records the identity of the upstream tool it
asks about (:func:`bot.mcp.upstream.identity`: a digest of its ``tools/list`` entry), and an
approved call is started only on a tool of that identity: before it is forwarded, the
gateway lists the server's tools again and hands the tool's identity now to the start
(:meth:`runtime.runs.external.ExternalRequests.start`). A server that changed the tool since (its
input schema, description, output schema or annotations) gets no old approval applied to
the new tool: the request is cancelled (audited, ``tool_changed``), the client is told, and
the same call made again is asked afresh, about the tool as it is now.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

from approvald.runtime import (
    FINAL_STATUSES,
    HEARTBEAT,
    OPEN,
    TOOL_CHANGED,
    CallerGate,
    CallerOff,
    Engine,
    ExternalError,
    NewRequest,
    PayloadTooLarge,
    Refused,
    Report,
    Source,
    ToolIdentity,
    call_digest,
    canonical_json,
    compact_json,
    lease_id,
    mask_text,
    refusal,
    sha256_hex,
    time_or_unknown,
)
from approvald.runtime import CallerWaiting as Waiting
from approvald.store.repos.external import Checks, TokenRecord

log = logging.getLogger("approvald.mcp")

TOKEN_PREFIX = "mcp."
ACTOR = "system:mcp-gateway"
VIA = "mcp"  # the face the audit log names for the gateway's requests and reports
KEEP_RAN = 256  # finished calls whose results late joiners in this process still get
# what a start says of a request answered at once whose run is over (ran or cancelled)
CLOSED = frozenset({"already_reported", "not_approved", "cancelled"})
RESULT_SUMMARY = 4000  # characters of a result too large to record whole

T = TypeVar("T")
GatewayOff = CallerOff  # the gateway's token was revoked: it lets nothing through
__all__ = ["Forward", "Gateway", "GatewayOff", "Ran", "Refused", "refusal"]


@dataclass(frozen=True)
class Ran(Generic[T]):
    """What came of a forwarded call: the client's answer and what the ledger keeps."""

    value: T
    status: Literal["succeeded", "failed"]
    record: Any  # JSON
    error: str | None = None


Forward = Callable[[dict[str, Any]], Awaitable[Ran[T]]]
# the identity of the upstream tool as its server lists it now
# (runtime.policies.tools.GONE: no more)
Identify = Callable[[], Awaitable[ToolIdentity]]


class Gateway(CallerGate):
    """The approvald side of one ``mcp-proxy``: gate, forward, record.

    ``name`` names the gateway (its token is ``mcp.<name>``), ``requested_by`` who the
    requests are made for (a Slack user id: that person may not approve their own calls),
    ``server`` how the wrapped server was started (shown on cards).
    """

    actor = ACTOR
    client = "MCP client"

    def __init__(self, engine: Engine, *, name: str, requested_by: str, server: str,
                 heartbeat: float = HEARTBEAT, bearer: str | None = None,
                 bearer_token: TokenRecord | None = None) -> None:
        super().__init__(engine, Source("mcp", name), requested_by=requested_by,
                         heartbeat=heartbeat)
        self.what = f"MCP gateway {name}"
        self.server = server[:300]
        # over HTTP: the bearer token whose holder makes the calls. Its calls are its own:
        # the same call from another token's holder is another request (theirs, for the
        # person their token was made for), never a join of this one
        self.bearer = bearer
        # that token as found live (kept in memory by serve): each request's statements
        # check it is still live, and a call it can no longer make forgets it
        self.bearer_token = bearer_token
        self.descriptions: dict[str, str] = {}  # tool -> its description, for cards
        # tool -> what its server says of it (readOnlyHint...): read by rules, never trusted
        self.annotations: dict[str, dict[str, Any]] = {}
        # tool -> its identity as its server listed it, which its requests bind
        self.identities: dict[str, ToolIdentity] = {}
        self._inflight: dict[str, asyncio.Task[Ran[Any] | Refused]] = {}
        # finished here, newest last: callers that join late get the same answer
        self._ran: OrderedDict[str, asyncio.Task[Ran[Any] | Refused]] = OrderedDict()
        # call key -> a call of it making or finding its request here (see _turn)
        self._making: dict[str, asyncio.Future[None]] = {}

    def running_here(self, rid: str) -> bool:
        return rid in self._inflight

    # -- one call -----------------------------------------------------------------------
    def call_key(self, tool: str, args: dict[str, Any], call: str | None = None) -> str:
        """The tool and its arguments (and over HTTP, the bearer token) make one call."""
        digest = super().call_key(tool, args, call)
        if self.bearer is None:
            return digest
        return sha256_hex(canonical_json({"bearer": self.bearer, "call": digest}))

    async def call(self, tool: str, args: dict[str, Any], forward: Forward[T], *,
                   waiting: Waiting | None = None, budget: float | None = None,
                   identify: Identify | None = None) -> Ran[T] | Refused:
        """Gate one call of ``tool``; forward it (at most once) if it may run. ``budget``:
        the seconds it waits for a decision, after which it answers that the request is
        still waiting (the same call made again joins it); None, until decided.
        ``identify``: the tool's identity now, asked before an approved call is forwarded
        (see the module docstring); None for what has no identity (a resource, a prompt).

        The gateway's credential is taken from memory once found live: the request's
        statements check it again, and when they find it revoked it is read again (and
        the gateway is found switched off: nothing is executed). A call the policy allows
        at once has its start recorded with its request (one write) and is run here."""
        # the call's digest and key, worked out once: its request carries both
        call = call_digest(tool, args)
        key = self.call_key(tool, args, call)
        await self._turn(key)  # a client that gives up while it waits has asked nothing
        # once its turn is taken the request is made shielded from the client's
        # cancellation: a start recorded with it is a call this process runs, never one
        # left "started" by a client that gave up (the task is made before any await)
        # (allowed at once, its start recorded with its request: run in that same task)
        opened = await asyncio.shield(self._open(key, call, tool, args, forward))
        if not isinstance(opened, tuple):  # refused, or run here
            return opened
        token, doc = opened
        rid = str(doc["id"])
        loop = asyncio.get_running_loop()
        deadline = None if budget is None else loop.time() + max(0.0, budget)
        while doc["status"] in OPEN:
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                return await self.refused(token, tool, Refused(
                    "pending", f"approvald: {tool} was not run yet: it is "
                    f"{await self.progress(doc)}. Make the same call again to join that "
                    "request and get its result.", rid))
            doc = await self._wait(token, doc, waiting, left)
        if doc["status"] != "approved":
            return await self.answer(token, doc)
        out = await self.collect(token, tool, doc, forward, identify)
        if isinstance(out, Refused):  # not run, with no decision behind it: audited
            await self.refused(token, tool, out)
        return out

    async def _open(self, key: str, call: str, tool: str, args: dict[str, Any],
                    forward: Forward[T]
                    ) -> tuple[TokenRecord, dict[str, Any]] | Ran[T] | Refused:
        """The request call ``key`` (digest ``call``) joins or makes; or why nothing was
        asked; or, when the policy allowed it at once (its start recorded with the
        request), what came of running it here, in this same task (the caller's shield's:
        issue 50, a second task and its hand-over were a turn of the event loop and about
        60 Python calls a call). Called with the call's turn taken (:meth:`_turn`), which
        it gives back once this task is registered as running it: the same call made
        meanwhile in this process then finds the request with the task running it, and
        joins it."""
        try:
            try:
                token = await self.token(kept=True)
                doc, started = await self._request(token, tool, args, key=key, call=call)
            except CallerOff as exc:
                return Refused("off", f"approvald: {exc}. Nothing was executed.")
            except ExternalError as exc:
                if exc.code != "unauthorized":
                    raise
                self.e.forget_kept()
                try:
                    token = await self.token()
                    doc, started = await self._request(token, tool, args, key=key, call=call)
                except CallerOff as off:
                    return Refused("off", f"approvald: {off}. Nothing was executed.")
                except ExternalError as again:
                    if again.code != "unauthorized" or self.bearer_token is None:
                        raise
                    self.e.forget_caller(self.bearer_token)  # revoked since it was kept
                    return Refused("unauthorized", f"approvald: the bearer token "
                                   f"{self.bearer} was revoked. Nothing was executed.")
            if started:  # registered before another call of it looks: it joins this task
                self._running(str(doc["id"]), asyncio.current_task())
        finally:
            self._making.pop(key).set_result(None)
        if started:
            return await self._execute(token, tool, doc, forward, started=True)
        return token, doc

    async def _turn(self, key: str) -> None:
        """Take call ``key``'s turn to make or find its request here (:meth:`_open` gives
        it back): the same call made meanwhile waits, then finds that request with the
        task running it (and joins it), never racing it to the request or taking a start
        it would have to refuse as already started."""
        while (busy := self._making.get(key)) is not None:
            await asyncio.wait([busy])  # (a waiter cancelled does not cancel it)
        self._making[key] = asyncio.get_running_loop().create_future()

    def _run_here(self, token: TokenRecord, tool: str, doc: dict[str, Any],
                  forward: Forward[T], identify: Identify | None = None) -> asyncio.Task[Any]:
        """The task that runs request ``doc``'s call here, registered (with no await
        before it) so that callers of the same call join it."""
        task = asyncio.ensure_future(self._execute(token, tool, doc, forward, identify))
        self._running(str(doc["id"]), task)
        return task

    def _running(self, rid: str, task: asyncio.Task[Any] | None) -> None:
        """``task`` runs request ``rid``'s call here: callers of the same call join it."""
        assert task is not None  # (a coroutine of a task: _open runs in the caller's shield)
        self._inflight[rid] = task
        task.add_done_callback(self._done)

    async def collect(self, token: TokenRecord, tool: str, doc: dict[str, Any],
                      forward: Forward[T],
                      identify: Identify | None = None) -> Ran[T] | Refused:
        """Run approved request ``doc``'s call here (at most once: a call running or run in
        this process is joined; one started elsewhere is not run again), on the tool it
        was asked about only (``identify``: see :meth:`call`)."""
        rid = str(doc["id"])
        task = self._inflight.get(rid) or self._ran.get(rid)
        if task is None:
            # a request answered at once (nothing asked, no tool to list first) is not
            # read first: its start refuses it as closed, which is answered the same way
            if doc["approval_id"] is not None \
                    and await self._run_status(rid) in FINAL_STATUSES:
                return await self._closed(token, tool, rid)
            # looked up again with no await before it is set: one task per request here
            task = self._inflight.get(rid) or self._ran.get(rid) \
                or self._run_here(token, tool, doc, forward, identify)
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
            log.warning("a forwarded call broke off, its outcome unknown: %s",
                        mask_text(repr(task.exception())))

    async def _closed(self, token: TokenRecord, tool: str, rid: str) -> Refused:
        doc = await self.e.request_document(token, rid)
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
                f"{time_or_unknown(exc.fields.get('started_at'))} by "
                f"{exc.fields.get('owner') or '?'}, "
                "which has not recorded what came of it: the call may still be running, or "
                "its process stopped mid-call. approvald never runs such a call again. If it "
                f"did not happen, `approvald runs cancel {rid}` and call the tool again.", rid)
        if exc.code == TOOL_CHANGED:
            return Refused(
                "cancelled", f"approvald: {tool} did not run: the MCP server {self.name} "
                f"changed the tool since the call was approved ({exc.fields.get('why')}), so "
                "the approval, given for the tool as it was, does not apply to it. Make the "
                f"same call again to be asked afresh (request {rid}). Nothing was executed.",
                rid)
        return Refused("cancelled", f"approvald: {tool} did not run: {exc} (request {rid}). "
                       "Nothing was executed.", rid)

    async def _execute(self, token: TokenRecord, tool: str, doc: dict[str, Any],
                       forward: Forward[T], identify: Identify | None = None, *,
                       started: bool = False) -> Ran[T] | Refused:
        """Record the intent (on the tool as its server lists it now, when a person
        approved it), forward the approved call with its effective arguments, then report
        what came of it. ``started``: the intent was recorded with the request (the
        policy allowed the call at once)."""
        rid = str(doc["id"])
        if not started:
            # a policy's answer at once judged no tool definition: nothing to compare
            now = await identify() \
                if identify is not None and doc["approval_id"] is not None else None
            try:
                await self.e.start_request(token, rid, args_digest=doc["effective_digest"],
                                           owner=lease_id(self.owner), identity=now)
            except ExternalError as exc:
                if doc["approval_id"] is None and exc.code in CLOSED:
                    return await self._closed(token, tool, rid)  # see collect()
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
                await self.e.record_request_report(token, rid, rep)
            except PayloadTooLarge:
                text = compact_json(record)
                rep = Report(status_, doc["effective_digest"],
                             {"truncated": True, "chars": len(text),
                              "start": text[:RESULT_SUMMARY]}, error)
                await self.e.record_request_report(token, rid, rep)
        except Exception:  # the client still gets its answer; the log says what is missing
            log.exception("could not record the result of request %s: its ledger row stays "
                          "'started' (outcome unknown)", rid)

    # -- the request ---------------------------------------------------------------------
    def _new_request(self, tool: str, args: dict[str, Any], key: str,
                     digest: str | None = None) -> NewRequest:
        """The request for one call; everything in it is the same for every retry of it
        (the idempotency key's fingerprint). Its policy is the operator's for
        ``mcp:<gateway>/<tool>`` (the intake resolves it), never an agent's tool's."""
        over = f" over HTTP with token `{self.bearer}`" if self.bearer else ""
        kind, _, named = tool.partition(":")
        does = {"resource": f"reads the resource {named}",
                "prompt": f"gets the prompt {named}"}.get(kind, f"calls {tool}")
        packet: dict[str, Any] = {
            "task": f"{tool}, called through the MCP gateway {self.name}"
                    + (f" (token {self.bearer})" if self.bearer else ""),
            "doing": f"An MCP client of the gateway {self.name} {does}{over} on the "
                     f"MCP server `{self.server}`. approvald forwards the request, with the "
                     "arguments approved, once it is approved.",
            "description": self.descriptions.get(tool) or f"{tool}, a tool of the MCP "
                                                          f"server {self.name}",
        }
        live = (self.bearer_token.id,) if self.bearer_token is not None else ()
        # allowed at once, the call runs now, here: its start is recorded with its request
        return NewRequest(tool=tool, args=args, requested_by=self.requested_by,
                          packet=packet, idempotency_key=key,
                          annotations=self.annotations.get(tool),
                          identity=self.identities.get(tool), checks=Checks(live=live),
                          start_owner=lease_id(self.owner), digest=digest)
