"""The agent loop: one step = model call, the step's tool calls, then ONE checkpoint.

A worker advances a run only while it holds the run's lease. Everything it needs is
loaded from the store, so any process can pick a run up where another left it: after a
crash, a redeploy, or an approval that arrived days later.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from approvald.runtime.approvals.standing import StandingApprovals
from approvald.runtime.kernel.canonical import call_digest, compact_json
from approvald.runtime.kernel.clock import Clock
from approvald.runtime.kernel.collect import ACTOR as WINDOW_ACTOR
from approvald.runtime.kernel.collect import REASON as WINDOW_CLOSED
from approvald.runtime.kernel.collect import collectable, why_not
from approvald.runtime.kernel.errors import (
    DigestMismatch,
    InvalidArguments,
    LeaseLost,
    ModelError,
    ModelUnavailable,
    NotFound,
    StateVersionError,
)
from approvald.runtime.kernel.failpoints import failpoint
from approvald.runtime.kernel.handoff import LeasedRuns
from approvald.runtime.kernel.limits import PayloadCap
from approvald.runtime.kernel.metrics import DecidedRuns, Meter
from approvald.runtime.kernel.outcomes import (
    Busy,
    Cancelled,
    Completed,
    Failed,
    NeedsAttention,
    Outcome,
    Paused,
    Waiting,
    Yielded,
)
from approvald.runtime.kernel.signals import Signals
from approvald.runtime.kernel.urgency import Urgency
from approvald.runtime.policies.intake import Intake, Source
from approvald.runtime.policies.policy import CallPolicy, Shadow
from approvald.runtime.policies.sensitive import mask_args
from approvald.runtime.policies.tools import ToolContext, asked_identity
from approvald.runtime.record.audit import AuditTrail
from approvald.runtime.record.ledger import (
    Deferred,
    Executed,
    Ledger,
    OutcomeUnknown,
    Recorded,
    Settle,
    WaitForAttempt,
    audit_execution,
    needs_intent,
    observation_of,
)
from approvald.runtime.record.outbox_kinds import Notice, RunWaiting, queue
from approvald.runtime.record.sealing import DataKeyError
from approvald.runtime.record.state import (
    FINAL_STATUSES,
    AssistantMessage,
    ModelStep,
    RunState,
    ToolCall,
    ToolMessage,
)
from approvald.runtime.record.tracing import Steps, Tracer, model_name
from approvald.runtime.record.transcript import build_state, encode
from approvald.runtime.requests.gate import Gate, GateRequest, build_packet, shadow_details
from approvald.runtime.requests.packet import sensitive_paths
from approvald.runtime.runs.agent import Agent, Registry, definition_changed
from approvald.store.db import Database
from approvald.store.records import ApprovalRecord, ExecutionRecord, RunRecord
from approvald.store.repos import Tx
from approvald.store.repos.runs import CancelRequest

log = logging.getLogger("approvald.runner")
# how a run ended: `serve` logs it; a command that prints the outcome itself silences this
# logger, so a failure is said once
outcome_log = logging.getLogger("approvald.outcomes")
Extra = Callable[[Tx], Awaitable[None]]
MAX_FAILURES = 5  # consecutive errors before a run is ended instead of retried (invariant 15)
BACKOFF = timedelta(seconds=2)  # after the first error; doubles, jittered
MAX_BACKOFF = timedelta(minutes=5)
SLOT_WAIT = (0.5, 2.0)  # seconds a run over its agent's max_concurrent_runs waits for a slot


def backoff(failures: int, *, base: timedelta = BACKOFF, cap: timedelta = MAX_BACKOFF,
            jitter: float = 0.2) -> timedelta:
    """Exponential backoff with jitter: ``base * 2**(failures-1)``, capped."""
    delay = min(cap.total_seconds(), base.total_seconds() * 2.0 ** max(failures - 1, 0))
    return timedelta(seconds=delay * (1 - jitter + 2 * jitter * random.random()))


class _Throttled(Exception):
    """The agent's model calls per minute are used up: wait ``seconds``."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"{seconds:.1f}s")
        self.seconds = seconds


@dataclass
class _Pending:
    """What a step produced before its checkpoint."""

    messages: list[tuple[Any, bool]] = field(default_factory=list)  # (message, ledger_ref)
    gates: list[GateRequest] = field(default_factory=list)
    waiting: list[ApprovalRecord] = field(default_factory=list)
    unknown: list[tuple[ToolCall, ExecutionRecord, dict[str, Any], str]] = field(
        default_factory=list)  # (call, record, args, what reconcile said)
    # approved calls this release cannot run: (call, its approval, why), asked about
    cannot: list[tuple[ToolCall, ApprovalRecord, str]] = field(default_factory=list)
    wait: WaitForAttempt | None = None  # an earlier attempt may still be running
    # the step's fresh model reply (and its step), journaled with the step's first side
    # effect (then None); its text is made only then (issue 50: a step whose calls write
    # no intent, a final answer, journals nothing)
    reply: tuple[int, AssistantMessage] | None = None

    def journal(self) -> str | None:
        """The journal text of the step's reply, if it is not journaled yet."""
        if self.reply is None:
            return None
        step, fresh = self.reply
        return compact_json({"step": step, "reply": fresh.model_dump(mode="json")})
    # results the ledger left to this step's checkpoint (``Ledger.execute(defer=True)``)
    settles: list[Settle] = field(default_factory=list)
    notify: bool = False  # the checkpoint adds outbox rows: wake the drain after it
    # approved calls resumed after their window closed (not run): audited at the checkpoint
    lapsed: list[tuple[ToolCall, ApprovalRecord]] = field(default_factory=list)


class _Live:
    """The in-memory view of a run while this worker holds its lease."""

    def __init__(self, run: RunRecord, state: RunState,
                 executions: dict[str, ExecutionRecord],
                 approvals: list[ApprovalRecord], owner: str) -> None:
        self.owner = owner  # this attempt's lease id
        self.released = [False]  # set once a checkpoint gave the lease back
        self.run = run
        self.state = state
        self.seq = run.next_seq
        self.step = run.step
        self.executions = executions
        self.by_call: dict[str, ApprovalRecord] = {}
        self.questions: dict[str, ApprovalRecord] = {}
        self.cannot: dict[str, ApprovalRecord] = {}  # "cannot run" questions, by call
        for a in approvals:  # ordered by requested_at: later rungs overwrite earlier
            kinds = {"tool_call": self.by_call, "cannot_run": self.cannot}
            kinds.get(a.kind, self.questions)[a.call_id] = a
        self.inflight: dict[str, Any] | None = json.loads(run.inflight) if run.inflight else None
        self.call_ids = state.call_ids()  # kept up to date, so a step costs O(1) in history


class Runner:
    """Drives runs step by step: the model's reply, each call (run, refused, or left
    waiting for a person), one checkpoint per step."""

    def __init__(self, db: Database, clock: Clock, audit: AuditTrail, registry: Registry,
                 intake: Intake, gate: Gate, standing: StandingApprovals, ledger: Ledger,
                 cap: PayloadCap, signals: Signals, urgency: Urgency, tracer: Tracer,
                 meter: Meter, decided_runs: DecidedRuns, *, owner: str,
                 lease_ttl: timedelta, leased: LeasedRuns | None = None) -> None:
        self.db = db
        self.leased = leased or LeasedRuns()  # run rows this process's decisions leased
        self.clock = clock
        self.audit = audit
        self.registry = registry
        self.intake = intake
        self.gate = gate
        self.standing = standing
        self.ledger = ledger
        self.cap = cap
        self.signals = signals
        self.urgency = urgency
        self.tracer = tracer
        self.meter = meter
        self.decided_runs = decided_runs
        self.owner = owner
        self.lease_ttl = lease_ttl

    # -- entry -----------------------------------------------------------------------
    async def advance(self, run_id: str, *, stop: asyncio.Event | None = None,
                      stale_owners: tuple[str, ...] = (), claim: str | None = None) -> Outcome:
        """Take the run's lease and drive it until it completes, fails, pauses, or ``stop``
        is set. ``claim``: the lease id under which the caller already holds the run (a
        worker's poll claimed it, or ``start_run`` leased it); the run goes on under it.

        What the worker is given to drive a run (:class:`runtime.runs.worker.Advance`), and
        what the front door's ``advance`` does: the run presses no more once this returns,
        and the requests it opened are announced to this process's listeners."""
        try:
            outcome = await self._advance(run_id, stop=stop, stale_owners=stale_owners,
                                          claim=claim)
        finally:
            self.urgency.end(run_id)
            # a decision's mark goes when its call starts; a run that went on without
            # starting one (a denial) gives it back here, not at ``keep`` entries later
            self.decided_runs.forget(run_id)
        if outcome.status == "awaiting_approval":
            for approval_id in getattr(outcome, "approval_ids", ()):
                self.signals.notify_opened(approval_id)
        return outcome

    async def _advance(self, run_id: str, *, stop: asyncio.Event | None,
                       stale_owners: tuple[str, ...], claim: str | None) -> Outcome:
        now = self.clock.now()
        # one lease id per attempt, not per process: two tasks of one process (a worker
        # and a CLI command, say) must not both believe they hold the run
        owner = claim or f"{self.owner}/{secrets.token_hex(3)}"
        queued: Outcome | None = None
        got = await self._claimed(run_id, claim) if claim is not None else None
        if got is None:
            # a decided run's person waits on its lease: it queues by when they began
            with self.urgency.waits(self.urgency.since(run_id)):
                async with self.db.write() as tx:
                    lease = await tx.runs.acquire_lease(run_id, owner=owner, now=now,
                                                        until=now + self.lease_ttl,
                                                        stale_owners=stale_owners)
                    got = lease.run if lease is not None else None
                    if got is not None:
                        queued = await self._over_limit(tx, got, owner, now)
            if got is None:
                return await self._not_ours(run_id)
            if lease is not None and lease.taken_over:
                self.meter.lease_taken_over(1)
            if queued is not None:
                return queued
        released = [False]
        try:
            async with self._heartbeat(run_id, owner) as lost:
                with self.tracer.steps(run_id) as steps:
                    return await self._drive(got, owner, stop or asyncio.Event(), lost,
                                             released, steps)
        except LeaseLost as exc:
            log.warning("run %s: %s; backing off", run_id, exc)
            return Busy(run_id, "running", holder=None)
        except DataKeyError:
            # the operator's to fix (a sealed value and no data key to open it): the run
            # stays exactly as it was, its lease released, not counted as a failure
            raise
        except Exception as exc:
            if released[0]:
                raise
            released[0] = True
            return await self._poisoned(got, owner, exc)
        finally:
            if not released[0]:
                with contextlib.suppress(Exception):
                    async with self.db.write() as tx:
                        await tx.runs.release_lease(run_id, owner=owner)

    async def _claimed(self, run_id: str, claim: str) -> RunRecord | None:
        """The run, if the lease the caller claimed it under (a poll's claim, a decision's,
        ``start_run``'s) is still its lease and nothing else needs checking in a write
        transaction (its agent has no concurrency limit); else None: acquire it anew.
        A decision here that leased it handed its row on (runtime.kernel.handoff): not read."""
        run = self.leased.take(claim, now=self.clock.now(), fresh_for=self.lease_ttl / 2)
        if run is None or run.id != run_id:
            async with self.db.read() as tx:
                run = await tx.runs.get(run_id)
        if run is None or run.status != "running" or run.lease_owner != claim:
            return None
        try:
            limited = self.registry.for_run(run).max_concurrent_runs is not None
        except NotFound:
            limited = False  # the step will find out, and fail the run properly
        return None if limited else run

    async def _not_ours(self, run_id: str) -> Outcome:
        """Why the lease was not taken: the run is not running, or someone else holds it."""
        async with self.db.read() as tx:
            run = await tx.runs.get(run_id)
            approvals = await tx.approvals.for_run(run_id) if run else []
        if run is None:
            raise NotFound(f"no run {run_id}", run_id=run_id)
        if run.status != "running":
            return status_outcome(run, approvals)
        if run.wait_until is not None and run.wait_until > self.clock.now():
            return Waiting(run_id, run.status, until=run.wait_until,
                           reason=run.wait_reason or "")
        return Busy(run_id, run.status, holder=run.lease_owner)

    @contextlib.asynccontextmanager
    async def _heartbeat(self, run_id: str, owner: str) -> AsyncIterator[asyncio.Event]:
        """Keep the lease alive during long tool calls; flag it once it cannot be kept.

        A renewal that fails (a locked database, a pool timeout) is retried; only when the
        lease could have expired since the last good renewal, or someone else holds it,
        is ``lost`` set, and the worker then stops before any further side effect (the
        ledger re-checks the lease with every intent). Nothing raised here ever replaces
        the outcome of the run's step.
        """
        lost = asyncio.Event()
        ttl = self.lease_ttl.total_seconds()
        interval = ttl / 3

        async def renew() -> bool:
            now = self.clock.now()
            async with self.db.write() as tx:
                ok = await tx.runs.renew_lease(run_id, owner=owner, now=now,
                                               until=now + self.lease_ttl)
                if ok:  # the attempt in flight, if any, was heard from
                    await tx.executions.heard(run_id, owner=owner, now=now)
            return ok

        async def beat(last_ok: float) -> None:
            while True:
                try:
                    ok = await renew()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    if time.monotonic() - last_ok >= ttl * 0.9:  # it may have lapsed now
                        log.error("run %s: lease renewal keeps failing (%s: %s); stopping "
                                  "before any further side effect", run_id,
                                  type(exc).__name__, exc)
                        lost.set()
                        return
                    log.warning("run %s: lease renewal failed (%s: %s); retrying", run_id,
                                type(exc).__name__, exc)
                    await asyncio.sleep(min(interval, 1.0))
                    continue
                if not ok:
                    lost.set()
                    return
                last_ok = time.monotonic()
                await asyncio.sleep(interval)

        # the first renewal is a timer, its task made only if it fires: most advances end
        # well before it, and need no task of their own (issue 50)
        loop = asyncio.get_running_loop()
        began = time.monotonic()
        started: list[asyncio.Task[None]] = []
        timer = loop.call_later(interval, lambda: started.append(loop.create_task(beat(began))))
        try:
            yield lost
        finally:
            timer.cancel()
            for task in started:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task

    # -- limits, waits and poison ----------------------------------------------------------
    async def _over_limit(self, tx: Tx, run: RunRecord, owner: str,
                          now: datetime) -> Outcome | None:
        """Queue the run (a short wait) if its agent already runs ``max_concurrent_runs``."""
        try:
            agent = self.registry.for_run(run)
        except NotFound:
            return None  # the step will find out, and fail the run properly
        limit = agent.max_concurrent_runs
        if limit is None:
            return None
        # the agent's limits row serialises the count across processes (after the run row)
        await tx.limits.lock(f"runs:{agent.name}", tokens=0.0, now=now)
        busy = await tx.runs.count_leased(agent.name, now=now, excluding=run.id)
        if busy < limit:
            return None
        until = now + timedelta(seconds=random.uniform(*SLOT_WAIT))
        reason = f"queued: {busy} runs of {agent.name} are in progress (max {limit})"
        await tx.runs.park(run.id, owner=owner, until=until, reason=reason,
                           failures=run.failures, now=now)
        return Waiting(run.id, "running", until=until, reason=reason)

    async def _take_model_call(self, agent: Agent) -> None:
        """One of the agent's model calls per minute, shared by every process through the
        database (a token bucket); raises :class:`_Throttled` when there is none left."""
        rate = agent.model_calls_per_minute
        if rate is None:
            return
        per_second = rate / 60.0
        key = f"model:{agent.name}"
        async with self.db.write() as tx:
            now = self.clock.now()
            tokens, since = await tx.limits.lock(key, tokens=float(rate), now=now)
            tokens = min(float(rate), tokens + max((now - since).total_seconds(), 0.0)
                         * per_second)
            if tokens >= 1.0:
                await tx.limits.set(key, tokens=tokens - 1.0, now=now)
                return
            await tx.limits.set(key, tokens=tokens, now=now)
        raise _Throttled((1.0 - tokens) / per_second)

    async def _park(self, live: _Live, *, until: datetime, reason: str,
                    failures: int) -> Outcome:
        """Give the lease back and leave the run waiting until ``until`` (still running);
        the first wait of a spell is told in the run's thread."""
        async with self.db.write() as tx:
            now = self.clock.now()
            if not await tx.runs.park(live.run.id, owner=live.owner, until=until,
                                      reason=reason, failures=failures, now=now):
                raise LeaseLost(f"lost the lease on run {live.run.id}", run_id=live.run.id)
            if failures <= 1 and live.run.wait_until is None:
                await self._tell_waiting(tx, live.run.id, until, reason, now, seq=live.seq)
        live.released[0] = True
        if failures <= 1 and live.run.wait_until is None:
            self.signals.notify_outbox()
        log.info("run %s waits until %s: %s", live.run.id, until.isoformat(), reason)
        return Waiting(live.run.id, "running", until=until, reason=reason)

    @staticmethod
    async def _tell_waiting(tx: Tx, run_id: str, until: datetime, reason: str,
                            now: datetime, *, seq: int) -> None:
        # ``seq``: the run's events before it are told first (in its thread, where they
        # happened before the wait)
        await queue(tx, RunWaiting(run_id=run_id, until=until.isoformat(),
                                   reason=reason[:1000], seq=seq),
                    group_key=run_id, now=now)

    async def _poisoned(self, run: RunRecord, owner: str, exc: Exception) -> Outcome:
        """An error that retrying the same way may not fix: back off, and after
        ``MAX_FAILURES`` in a row end the run (``needs_attention`` when a person can fix
        the cause by redeploying, else ``failed``), recorded, audited and told."""
        failures = run.failures + 1
        error = f"{type(exc).__name__}: {exc}"[:2000]
        now = self.clock.now()
        log.error("run %s: attempt %d of %d failed: %s", run.id, failures, MAX_FAILURES,
                  error, exc_info=failures == 1)
        async with self.db.write() as tx:
            if failures < MAX_FAILURES:
                until = now + backoff(failures)
                reason = f"retrying after an error ({failures} of {MAX_FAILURES}): {error}"
                await tx.runs.park(run.id, owner=owner, until=until, failures=failures,
                                   reason=reason, now=now)
                if failures == 1:
                    await self._tell_waiting(tx, run.id, until, reason, now,
                                             seq=run.next_seq)
                return Waiting(run.id, "running", until=until, reason=error)
            # an agent no longer deployed, or state from a newer approvald: a person can
            # fix the cause and resume the run; anything else ends it as failed
            fixable = isinstance(exc, NotFound | StateVersionError)
            status = "needs_attention" if fixable else "failed"
            ended = f"gave up after {failures} attempts: {error}"
            await tx.runs.end(run.id, owner=owner, status=status, error=ended, now=now)
            await self.gate.cancel_pending(tx, run.id, actor="system:runtime", via="runtime",
                                        reason=ended)
            self.audit.record(tx, at=now, action=status, actor="system:runtime", via="runtime",
                           run_id=run.id, details={"error": error, "attempts": failures})
        self.signals.notify_outbox()
        if status == "failed":
            return Failed(run.id, "failed", error=ended)
        return NeedsAttention(run.id, "needs_attention", reason=ended)

    # -- the loop ----------------------------------------------------------------------
    async def _load(self, run: RunRecord, owner: str) -> _Live:
        # no snapshot needed: we hold the lease, so only we write this run's events and
        # ledger rows, and a ledger row is always committed before the event naming it
        async with self.db.read() as tx:
            events, executions, approvals = await tx.events.state(run.id)
        return _Live(run, build_state(run, events, executions), executions, approvals, owner)

    async def _drive(self, run: RunRecord, owner: str, stop: asyncio.Event,
                     lost: asyncio.Event, released: list[bool], steps: Steps) -> Outcome:
        run_id = run.id
        live = await self._load(run, owner)  # acquire_lease took it only if ``running``
        live.released = released
        # the release the run started on while it is registered, else the current one:
        # each approved call is checked against its tools before it runs (_handle_call)
        agent = self.registry.for_run(live.run)
        if live.run.instructions_version != agent.instructions_version:
            log.warning("%s", definition_changed(live.run, agent))
        if live.run.cancel_requested:
            return await self._cancel(live)
        while True:
            if lost.is_set():
                raise LeaseLost(f"lost the lease on run {run_id}", run_id=run_id)
            if stop.is_set():
                return Yielded(run_id, "running")
            calls = live.state.unresolved_calls()
            steps.next(run_id=run_id, agent=agent.name,
                       step=live.step if calls else live.step + 1, resumed=bool(calls))
            pending = _Pending()
            fresh: AssistantMessage | None = None
            if not calls:
                if live.step >= agent.max_steps:
                    return await self._fail(
                        live, f"stopped after {agent.max_steps} steps without a final answer")
                try:
                    fresh = await self._next_reply(live, agent)
                except ModelUnavailable as exc:  # waiting is not failing (invariant 14)
                    failures = live.run.failures + 1
                    wait = (timedelta(seconds=exc.retry_after) if exc.retry_after is not None
                            else backoff(failures))
                    return await self._park(live, until=self.clock.now() + wait,
                                            failures=failures,
                                            reason=f"model unavailable: {exc}")
                except _Throttled as exc:
                    return await self._park(
                        live, until=self.clock.now() + timedelta(seconds=exc.seconds),
                        failures=live.run.failures,
                        reason=f"model calls per minute of {agent.name} used up")
                except ModelError as exc:
                    return await self._fail(live, f"model error: {exc}")
                except LeaseLost:
                    raise
                except Exception as exc:  # a broken model adapter must not wedge the run
                    outcome_log.exception("run %s: the model raised", run_id)
                    return await self._fail(
                        live, f"model error: {type(exc).__name__}: {exc}")
                live.step += 1
                pending.messages.append((fresh, False))
                if live.inflight is None:  # else it is the journaled reply already
                    pending.reply = (live.step, fresh)
                if not fresh.tool_calls:
                    await self._checkpoint(live, pending, status="completed",
                                           result=fresh.content or "", release=True)
                    return Completed(run_id, "completed", result=fresh.content or "")
                calls = list(fresh.tool_calls)
            for i, call in enumerate(calls):
                try:
                    await self._handle_call(live, agent, call, pending,
                                            last=i == len(calls) - 1)
                except DigestMismatch as exc:
                    return await self._fail(live, str(exc))
            outcome = await self._settle_step(live, pending)
            if outcome is not None:
                return outcome

    async def _next_reply(self, live: _Live, agent: Agent) -> AssistantMessage:
        """The step's model reply: the journaled one if a crash interrupted this step."""
        inflight = live.inflight
        if inflight is not None and inflight.get("step") == live.step + 1:
            return AssistantMessage.model_validate(inflight["reply"])
        await self._take_model_call(agent)
        name = model_name(agent.model)
        with self.tracer.span("model.call", run_id=live.run.id, agent=agent.name,
                                model=name,
                                instructions_version=live.run.instructions_version):
            began = time.monotonic()
            reply = await agent.model.complete(instructions=agent.instructions,
                                               messages=live.state.messages,
                                               tools=agent.tool_specs())
            latency_ms = (time.monotonic() - began) * 1000.0
        failpoint("mid_model_call")
        usage = reply.usage
        meta = ModelStep(at=self.clock.now(), latency_ms=round(latency_ms, 3), model=name,
                         instructions_version=(
                             None if agent.instructions_version == live.run.instructions_version
                             else agent.instructions_version),
                         input_tokens=usage.input_tokens if usage else None,
                         output_tokens=usage.output_tokens if usage else None,
                         cost_usd=usage.cost_usd if usage else None)
        seen = live.call_ids
        calls: list[ToolCall] = []
        for i, c in enumerate(reply.tool_calls):
            cid = c.id
            if not cid or cid in seen or len(cid) > 96 or not cid.isprintable():
                cid = f"call_{live.step + 1}_{i}"
            seen.add(cid)
            calls.append(ToolCall(id=cid, name=c.name, arguments=c.arguments))
        return AssistantMessage(content=reply.content, tool_calls=calls, meta=meta)

    async def _standing(self, live: _Live, pending: _Pending, call: ToolCall, tool: Any,
                        args: dict[str, Any], chosen: CallPolicy) -> ApprovalRecord | None:
        """A gated call a standing approval covers: its approved request, written (with the
        standing approval's compare-and-set, under our lease, the step's model reply
        journaled with it) before the call runs; None: the call needs a request of its own."""
        found = await self.standing.candidate(Source.of_run(live.run.agent),
                                           live.run.requested_by, tool.name, args, chosen)
        if found is None:
            return None
        packet = build_packet(_transcript(live, pending), call, tool, args, chosen.approval,
                              live.run)
        approved: list[ApprovalRecord] = []

        async def use(tx: Tx) -> None:
            now = self.clock.now()
            if not await tx.runs.renew_lease(live.run.id, owner=live.owner, now=now,
                                             until=now + self.lease_ttl,
                                             journal=pending.journal()):
                raise LeaseLost(f"lost the lease on run {live.run.id}", run_id=live.run.id)
            done = await self.standing.use(tx, found, run=live.run, call_id=call.id,
                                        tool=tool.name, args=args, policy=chosen.approval,
                                        packet=packet, identity=tool.identity())
            approved[:] = [done] if done is not None else []

        await self.db.transact(use, what=f"standing approval use for {call.id}")
        if not approved:
            return None  # revoked, expired or granted again since it was read: it asks
        pending.reply = None  # journaled with the use
        live.by_call[call.id] = approved[0]
        return approved[0]

    async def _handle_call(self, live: _Live, agent: Agent, call: ToolCall,
                           pending: _Pending, *, last: bool) -> None:
        """Process one call: run it, refuse it, or leave it waiting for a human.

        The result of the step's last call, and of any idempotent call, is left to the
        step's checkpoint (which follows at once) instead of a commit of its own; a
        non-idempotent call that more calls follow has its result committed before the
        next one starts, so a crash there never leaves an earlier call unknown.
        """

        def observe(content: Any, *, ledger_ref: bool = False) -> None:
            pending.messages.append(
                (ToolMessage(call_id=call.id, name=call.name, content=content), ledger_ref))

        found = agent.tool(call.name)
        # the stored request decides (invariant 12): once an approval exists for this call,
        # its status alone says what happens, whatever the policy file says today; a call
        # with a ledger row ran under the rules of its time and is settled from the ledger
        approval = live.by_call.get(call.id)
        if found is None and approval is None:
            observe({"status": "error", "error": f"unknown tool {call.name!r}",
                     "available": [t.name for t in agent.tools]})
            return
        existing = live.executions.get(call.id)
        _link_decision(self.tracer, approval)
        kind: str
        shadow: tuple[Shadow, ...] = ()
        if approval is not None:
            if approval.status == "pending":
                pending.waiting.append(approval)
                return
            if approval.status != "approved":
                observe(_refusal(approval))
                return
            if existing is None and not collectable(approval, self.clock.now()):
                # the one window rule (runtime.kernel.collect): resumed after its request's window
                # closed, the approved call does not run; the model reads why
                observe({"status": "expired", "reason": why_not(approval)})
                pending.lapsed.append((call, approval))
                return
            kind = "approve_before"
            args = approval.effective_args()
            paths: Sequence[str] = sensitive_paths(approval)
            if (approval.tool != call.name
                    or call_digest(call.name, args) != approval.effective_digest):
                raise DigestMismatch(
                    f"approval {approval.id} does not match call {call.id}: refusing to execute",
                    run_id=live.run.id, approval_id=approval.id)
            if existing is not None and existing.status in ("succeeded", "failed"):
                if found is None:  # it ran on an earlier release: its result stands
                    observe(observation_of(existing), ledger_ref=True)
                    return
            elif self._not_runnable(live, agent, call, approval, args, pending, observe,
                                    existing):
                return
        else:
            tool = found
            assert tool is not None  # (an unknown tool with no request was answered above)
            try:
                args = tool.validate(call.arguments)
                self.cap.check(compact_json(args), what=f"arguments of {tool.name}")
            except InvalidArguments as exc:
                observe({"status": "invalid_arguments", "errors": exc.errors})
                return
            except Exception as exc:  # PayloadTooLarge
                observe({"status": "error", "error": str(exc)})
                return
            chosen = self.intake.resolve(Source("agent", agent.name), tool.name, args,
                                      declared=(tool.policy, tool.approval))
            kind = chosen.kind
            shadow = chosen.shadow  # recorded with the call, enforced nowhere
            paths = chosen.approval.sensitive  # resolved once, recorded with the call
            if existing is None and kind == "forbidden":
                observe({"status": "forbidden", "reason": chosen.reason})
                return
            if existing is None and kind == "approve_before":
                approval = await self._standing(live, pending, call, tool, args, chosen)
                if approval is None:
                    pending.gates.append(GateRequest(call=call, tool=tool, args=args,
                                                     policy=chosen.approval, shadow=shadow))
                    return

        tool = found
        assert tool is not None  # an approved call whose tool is gone was asked about above
        digest = approval.effective_digest if approval else call_digest(call.name, args)
        question = live.questions.get(call.id)
        _link_decision(self.tracer, question)
        # a person's "retry" sanctions exactly the attempt after the one they were asked about
        sanctioned = bool(question and existing and _sanctions(question, existing))
        if existing is not None and existing.status in ("started", "unknown") and question:
            if question.status == "pending":
                pending.unknown.append((call, existing, args, ""))
                return

        async def after_result(tx: Tx, rec: Recorded) -> None:
            # every execution is audited, whether or not anyone was asked (issue 48)
            audit_execution(self.audit, tx, at=self.clock.now(),
                            approval_id=approval.id if approval is not None else None,
                            rec=rec, tool=tool.name, digest=digest, args=args, policy=kind,
                            sensitive=paths, noted=shadow_details(shadow))
            if kind == "notify_after":
                # ``seq``: the call's result is told at or after it, and the notice is
                # told after the result
                await queue(tx, Notice(run_id=live.run.id, call_id=call.id, args=args,
                                       seq=live.seq, sensitive=list(paths)),
                            group_key=live.run.id, now=self.clock.now())

        ctx = ToolContext(run_id=live.run.id, call_id=call.id,
                          idempotency_key=f"{live.run.id}:{call.id}",
                          requested_by=live.run.requested_by, agent=agent.name, clock=self.clock)
        # a decision that resumed this run has reached its call: it presses no more, but
        # its person still waits on the call's start (its intent write, in the ledger)
        waiting = self.urgency.since(live.run.id)
        self.urgency.end(live.run.id)
        since = self.decided_runs.reached(live.run.id)
        if since is not None:
            self.meter.tool_started(since)
        defer = last or tool.idempotent
        intent = needs_intent(tool, existing, defer=defer)  # (else the journal goes unused)
        with self.tracer.span("tool.call", run_id=live.run.id, tool=tool.name, call_id=call.id,
                           idempotency_key=ctx.idempotency_key, policy=kind,
                           approval_id=approval.id if approval else None) as span, \
                self.urgency.waits(waiting):
            result = await self.ledger.execute(
                tool=tool, ctx=ctx, step=live.step, args=args, digest=digest,
                existing=existing, owner=live.owner,
                journal=pending.journal() if intent else None,
                after_result=after_result, retry_sanctioned=sanctioned,
                defer=defer, sensitive=paths,
            )
            span.set(status=_call_status(result))
        if intent:
            pending.reply = None  # journaled (or the step's calls were recorded before)
        if isinstance(result, Executed) and result.settle is not None:
            pending.settles.append(result.settle)
            pending.notify = pending.notify or kind == "notify_after"
        elif kind == "notify_after" and isinstance(result, Executed) and not result.reused:
            self.signals.notify_outbox()  # the notice
        if isinstance(result, OutcomeUnknown):
            pending.unknown.append((call, result.record, args, result.reconcile))
            return
        if isinstance(result, WaitForAttempt):
            pending.wait = result
            return
        if approval is not None and approval.edited_args is not None:
            # the model is told what ran, but not a sensitive value (one an approver
            # typed, say): the arguments masked as people see them
            observe({"status": "executed_with_edits",
                     "arguments": mask_args(args, sensitive_paths(approval)),
                     "edited_by": approval.edited_by or approval.decided_by,
                     "result": result.observation})
        else:
            observe(result.observation, ledger_ref=True)

    @staticmethod
    def _not_runnable(live: _Live, agent: Agent, call: ToolCall, approval: ApprovalRecord,
                      args: dict[str, Any], pending: _Pending,
                      observe: Callable[[Any], None],
                      existing: ExecutionRecord | None) -> bool:
        """An approved call this release cannot run (its tool is gone, or its schema no
        longer accepts exactly the approved arguments) is never run nor silently turned
        into an error: a person is asked (``cannot_run``), and their answer decides. True
        when the call is settled here (asked about, or answered)."""
        question = live.cannot.get(call.id)
        if question is not None and question.status != "pending":
            # "replan" (or an abort that lost to nothing: the run is ending anyway)
            reason = json.loads(question.packet).get("reason") or question.reason or ""
            observe({"status": "not_executed", "reason": reason})
            return True
        if question is not None:  # still waiting for its answer
            pending.cannot.append((call, approval, ""))
            return True
        why = agent.cannot_run(call.name, args, asked_identity(approval))
        if why is None:
            return False
        if existing is not None:  # an earlier release started it: it may have happened
            why += (f" (an earlier attempt started at {existing.started_at.isoformat()} and "
                    f"its outcome is unknown: check under idempotency key "
                    f"{existing.idempotency_key} before re-planning)")
        pending.cannot.append((call, approval, why))
        return True

    async def _settle_step(self, live: _Live, pending: _Pending) -> Outcome | None:
        """Checkpoint the step; pause or stop if it left calls waiting on humans.

        A cancel requested while the step ran wins at this boundary: the step's results are
        recorded, but no request is opened for a run that will not go on.
        """
        run_id = live.run.id
        if pending.unknown or pending.cannot:
            async def ask(tx: Tx) -> None:
                for call, rec, args, said in pending.unknown:
                    if call.id in live.questions and live.questions[call.id].status == "pending":
                        continue
                    agent = self.registry.for_run(live.run)
                    tool = agent.tool(call.name)
                    assert tool is not None
                    await tx.executions.mark_unknown(run_id=run_id, call_id=call.id)
                    await self.gate.open_question(tx, live.run, call, tool, rec, args,
                                               said or "the tool has no reconcile hook")
                for call, approval, why in pending.cannot:
                    if why:  # (else its question is open already)
                        await self.gate.open_cannot_run(tx, live.run, call, approval, why)
            if await self._checkpoint(live, pending, status="needs_attention", extra=ask,
                                      release=True):
                return self._cancelled(live)
            self.signals.notify_outbox()
            if pending.unknown:
                call = pending.unknown[0][0]
                return NeedsAttention(run_id, "needs_attention", call_id=call.id,
                                      reason=f"outcome of {call.name} ({call.id}) is unknown")
            call, _, why = pending.cannot[0]
            q = live.cannot.get(call.id)
            if not why and q is not None:
                why = json.loads(q.packet).get("reason") or ""
            outcome_log.warning("run %s needs attention: %s", run_id, why)
            return NeedsAttention(run_id, "needs_attention", call_id=call.id, reason=why)
        if pending.gates or pending.waiting:
            opened: list[str] = []
            transcript = _transcript(live, pending)

            async def request(tx: Tx) -> None:
                opened[:] = await self.gate.open_requests(tx, live.run, transcript, live.step,
                                                       pending.gates)
            if await self._checkpoint(live, pending, status="awaiting_approval", extra=request,
                                      release=True):
                return self._cancelled(live)
            failpoint("after_commit_before_post")
            self.signals.notify_outbox()
            ids = tuple(opened) + tuple(a.id for a in pending.waiting)
            return Paused(run_id, "awaiting_approval", approval_ids=ids)
        if await self._checkpoint(live, pending):
            return self._cancelled(live)
        if pending.wait is not None:  # the step's other results are in; this call waits
            return await self._park(live, until=pending.wait.until, reason=pending.wait.reason,
                                    failures=live.run.failures)
        return None

    async def _checkpoint(self, live: _Live, pending: _Pending, *, status: str = "running",
                          result: str | None = None, error: str | None = None,
                          extra: Extra | None = None, release: bool = False) -> bool:
        """ONE transaction: the step's new events, the run row, the results the ledger
        left to it, and ``extra`` writes.

        If a cancel was requested and the run would go on (or wait), the same transaction
        ends it instead: ``extra`` is skipped, pending requests are closed, the cancel is
        audited under the name of whoever asked. Returns True when that happened.
        Retried from the start if the database rolled it back (tool results are in it).
        """
        failpoint("before_checkpoint")
        now = self.clock.now()
        events = [encode(m, ledger_ref=ref) for m, ref in pending.messages]

        # the step's first deferred result of a call with an intent row: written by the
        # checkpoint's own statement where the database can (issue 50)
        fold = next((s for s in pending.settles
                     if isinstance(s, Deferred) and s.row is not None), None)

        async def write(tx: Tx, fold: Deferred | None = None) -> CancelRequest:
            # the events and the run row in one statement where the database can
            req = await tx.runs.checkpoint_with_events(
                live.run.id, owner=live.owner, first_seq=live.seq, step=live.step,
                events=events, status=status, now=now, lease_until=now + self.lease_ttl,
                release=release, result=result, error=error,
                settled=None if fold is None else fold.row)
            if req is None:
                raise LeaseLost(f"lost the lease on run {live.run.id}", run_id=live.run.id)
            if fold is not None and req.settled is not None:
                if not req.settled:  # (as the result's own write would have found)
                    raise LeaseLost(f"call {fold.row and fold.row.call_id} was settled by "
                                    "someone else while it ran", run_id=live.run.id)
                fold.folded(tx)  # its write now records only what follows it
            return req

        async def work(tx: Tx) -> CancelRequest:
            req = await write(tx, fold)
            for settle in pending.settles:
                await settle(tx)
            for call, a in pending.lapsed:
                self.audit.record(tx, at=now, action="refused", actor=WINDOW_ACTOR,
                                  via="runtime", run_id=live.run.id, approval_id=a.id,
                                  details={"tool": a.tool, "call_id": call.id,
                                           "reason": WINDOW_CLOSED, "message": why_not(a)})
            if req.requested and status not in FINAL_STATUSES:
                await self._cancel_in(tx, live, req.by, req.reason, was=status)
            elif extra is not None:
                await extra(tx)
            return req

        try:
            if (status in FINAL_STATUSES and extra is None and not pending.settles
                    and not pending.lapsed):
                # the run's last step: its events and its row are all it writes, and a
                # cancel asked for now changes nothing (it has ended): one write, on
                # PostgreSQL sent in autocommit (issue 50)
                async with self.db.write_one() as tx:
                    req = await write(tx)
            else:
                req = await self.db.transact(work, what=f"checkpoint of run {live.run.id}")
        except LeaseLost:
            await self._settle_alone(pending.settles)
            raise
        asked = req.requested  # (its flag read, not its __bool__: no call)
        cancelled = asked and status not in FINAL_STATUSES
        if pending.settles:
            failpoint("after_result")
        if pending.notify:
            self.signals.notify_outbox()
        failpoint("after_checkpoint")
        if release or cancelled:
            live.released[0] = True
        live.seq += len(events)
        live.inflight = None
        for m, _ in pending.messages:  # a journaled reply's ids too, not only fresh ones
            if isinstance(m, AssistantMessage):
                live.call_ids.update(c.id for c in m.tool_calls)
        live.state.messages.extend(m for m, _ in pending.messages)
        now_status = "cancelled" if cancelled else status
        if live.released[0]:
            # the run is no longer this worker's: its caller returns at once and reads
            # nothing of the record again but its id (no copy of it for its last step,
            # where the status always changes; issue 50)
            return cancelled
        if live.run.cancel_requested != asked or live.run.status != now_status:
            # (most steps change neither: no copy of the run's record for them)
            live.run = replace(live.run, cancel_requested=asked, status=now_status)
        return cancelled

    async def _settle_alone(self, settles: list[Settle]) -> None:
        """The lease was lost at the checkpoint, but the step's calls did run: record
        their results anyway, each on its own (one another process settled first stays)."""
        for settle in settles:
            try:
                await self.db.transact(settle, what="a result after a lost lease")
            except LeaseLost:
                pass
            except Exception:
                log.exception("could not record a result after losing the lease")

    async def _cancel_in(self, tx: Tx, live: _Live, by: str | None, reason: str | None, *,
                         was: str) -> None:
        """End the run as cancelled inside the checkpoint's transaction (its row is locked)."""
        now = self.clock.now()
        who = by or "system:runtime"
        await tx.runs.update(live.run.id, status="cancelled", lease_owner=None,
                             lease_expires_at=None, inflight=None, updated_at=now,
                             error=f"cancelled by {who}" + (f": {reason}" if reason else ""))
        await self.gate.cancel_pending(tx, live.run.id, actor=who, via="runtime", reason=reason)
        self.audit.record(tx, at=now, action="cancelled", actor=who, via="runtime",
                       run_id=live.run.id,
                       details={"was": was, "step": live.step, "reason": reason,
                                "at_step_boundary": True})

    def _cancelled(self, live: _Live) -> Outcome:
        self.signals.notify_outbox()  # card updates of the requests it closed
        return Cancelled(live.run.id, "cancelled")

    async def _fail(self, live: _Live, error: str) -> Outcome:
        outcome_log.error("run %s failed: %s", live.run.id, error)
        if await self._checkpoint(live, _Pending(), status="failed", error=error, release=True):
            return self._cancelled(live)
        return Failed(live.run.id, "failed", error=error)

    async def _cancel(self, live: _Live) -> Outcome:
        """The run was flagged before this worker took it: an empty checkpoint ends it."""
        await self._checkpoint(live, _Pending(), release=True)
        return self._cancelled(live)


def status_outcome(run: RunRecord, approvals: list[ApprovalRecord]) -> Outcome:
    """The outcome describing a run that is not ``running`` (nothing to advance)."""
    if run.status == "completed":
        return Completed(run.id, run.status, result=run.result)
    if run.status == "failed":
        return Failed(run.id, run.status, error=run.error or "")
    if run.status == "cancelled":
        return Cancelled(run.id, run.status)
    pending = [a for a in approvals if a.status == "pending"]
    if run.status == "needs_attention":
        q = next((a for a in pending if a.kind in ("outcome_unknown", "cannot_run")), None)
        reason = "outcome unknown"
        if q is not None and q.kind == "cannot_run":
            reason = json.loads(q.packet).get("reason") or "an approved call cannot run"
        return NeedsAttention(run.id, run.status, call_id=q.call_id if q else "",
                              reason=reason)
    return Paused(run.id, run.status,
                  approval_ids=tuple(a.id for a in pending if a.kind == "tool_call"))


def _sanctions(question: ApprovalRecord, rec: ExecutionRecord) -> bool:
    """Does this answered question sanction running ``rec``'s call once more? Only a
    "retry" about exactly the attempt ``rec`` records (a question from before attempts
    were noted: only if it was answered after that attempt started)."""
    if question.status != "approved" or question.verdict != "retry":
        return False
    attempt = json.loads(question.packet).get("attempt")
    if isinstance(attempt, int):
        return attempt == rec.attempts
    return question.decided_at is not None and question.decided_at >= rec.started_at


def _call_status(result: Executed | OutcomeUnknown | WaitForAttempt) -> str:
    """What a ``tool.call`` span says became of the call."""
    if isinstance(result, OutcomeUnknown):
        return "outcome_unknown"
    if isinstance(result, WaitForAttempt):
        return "waiting_for_attempt"
    seen = result.observation
    failed = isinstance(seen, dict) and seen.get("status") == "error" and "error_class" in seen
    return ("reused_" if result.reused else "") + ("failed" if failed else "succeeded")


def _transcript(live: _Live, pending: _Pending) -> list[Any]:
    return [*live.state.messages, *(m for m, _ in pending.messages)]


def _link_decision(tracer: Tracer, approval: ApprovalRecord | None) -> None:
    """The step resolving a decided call links the span that decided it, when another
    process (or an earlier life of this one) recorded the decision with tracing on: the
    call's request, or the answer to a question about its unknown outcome."""
    if approval is not None and approval.status != "pending" and approval.decision_trace:
        tracer.link(approval.decision_trace, approval_id=approval.id)


def _refusal(approval: ApprovalRecord) -> dict[str, Any]:
    """The tool result a model reads when its gated call did not run."""
    if approval.status == "denied":
        return {"status": "denied", "reason": approval.reason or "", "by": approval.decided_by}
    if approval.status == "redirected":  # not this call: the approver's guidance instead
        return {"status": "redirected", "guidance": approval.reason or "",
                "by": approval.decided_by}
    if approval.status == "expired":
        return {"status": "expired"}
    return {"status": approval.status}


