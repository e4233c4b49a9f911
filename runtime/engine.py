"""The runtime's front door: start, advance, decide, cancel, recover.

An :class:`Engine` is cheap and holds no run state of its own: any number of engines in
any number of processes can serve the same database. What one process learns (a decision
it recorded, a request it opened) it announces to local listeners so it can act at once;
other processes find the same facts by polling the database.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from approvald.runtime import prefix
from approvald.runtime.agent import Registry
from approvald.runtime.audit import AuditKey, AuditTrail
from approvald.runtime.clock import Clock, SystemClock
from approvald.runtime.decide import Actor, Decider, Decision, Verdict
from approvald.runtime.directory import Directory, StaticDirectory
from approvald.runtime.errors import ApprovaldError, DecisionRefused, NotFound, PayloadTooLarge
from approvald.runtime.expiry import Expiry
from approvald.runtime.external import ExternalRequests, is_external
from approvald.runtime.gate import Gate
from approvald.runtime.ids import TokenSigner, lease_id, new_id, owner_is_dead, worker_id
from approvald.runtime.intake import Intake
from approvald.runtime.ledger import Ledger
from approvald.runtime.metrics import DecidedRuns, Meter
from approvald.runtime.outcomes import Outcome
from approvald.runtime.runner import Runner
from approvald.runtime.standing import StandingApprovals
from approvald.runtime.state import FINAL_STATUSES, RunState, UserMessage
from approvald.runtime.tools import Tool
from approvald.runtime.tracing import Tracer
from approvald.runtime.transcript import build_state, encode
from approvald.runtime.urgency import Urgency
from approvald.store.db import Database
from approvald.store.records import ApprovalRecord, RunRecord
from approvald.store.repos import Tx

log = logging.getLogger("approvald.engine")


@dataclass(frozen=True)
class EngineConfig:
    lease_ttl: timedelta = timedelta(seconds=30)
    max_payload_bytes: int = 256 * 1024


class Engine:
    def __init__(self, db: Database, registry: Registry, *, clock: Clock | None = None,
                 config: EngineConfig | None = None, directory: Directory | None = None,
                 signer: TokenSigner | None = None, owner: str | None = None,
                 require_tokens: bool = False, audit_key: AuditKey | None = None) -> None:
        self.db = db
        self.registry = registry
        self.clock: Clock = clock or SystemClock()
        self.config = config or EngineConfig()
        self.directory: Directory = directory or StaticDirectory(registry.policy.groups)
        self.intake = Intake(lambda: registry.policy, self.directory)  # every face's way in
        self.signer = signer
        self.require_tokens = require_tokens
        self.owner = owner or worker_id()
        self.audit = AuditTrail(audit_key)  # chained with a key kept outside the database
        self.ledger = Ledger(db, self.clock, max_result_bytes=self.config.max_payload_bytes,
                             lease_ttl=self.config.lease_ttl)
        self.gate = Gate(self)
        self.decider = Decider(self)
        self.standing = StandingApprovals(self)
        self.runner = Runner(self)
        self.expiry = Expiry(self)
        self.urgency = Urgency()  # decided runs go before background deliveries
        self.meter = Meter()  # what the process reports about itself (serve exports it)
        self.decided_runs = DecidedRuns()  # click -> tool start, measured in-process
        self.tracer = Tracer()  # spans of steps, calls and decisions (serve may export them)
        self._ready_listeners: list[Callable[[str], None]] = []
        self._opened_listeners: list[Callable[[str], None]] = []
        self._outbox_listeners: list[Callable[[], None]] = []
        # a worker here that advances a run decided here under the lease the decision took
        self._taker: Callable[[str, str], None] | None = None
        self.external = ExternalRequests(self)  # calls HTTP API callers run themselves

    # -- local notifications ------------------------------------------------------------
    def take_decided(self, fn: Callable[[str, str], None] | None) -> None:
        """``fn(run_id, lease_id)`` advances a run this process decided, under the lease
        its decision took in the same transaction (a running resume worker registers
        this, and None when it stops)."""
        self._taker = fn

    @property
    def takes_decided(self) -> bool:
        return self._taker is not None

    def on_ready(self, fn: Callable[[str], None]) -> None:
        """Call ``fn(run_id)`` when this process learns a run can be advanced."""
        self._ready_listeners.append(fn)

    def on_opened(self, fn: Callable[[str], None]) -> None:
        """Call ``fn(approval_id)`` when this process opens an approval request."""
        self._opened_listeners.append(fn)

    def on_outbox(self, fn: Callable[[], None]) -> None:
        """Call ``fn()`` when this process has committed outbox rows (deliver them now)."""
        self._outbox_listeners.append(fn)

    def notify_outbox(self) -> None:
        for fn in self._outbox_listeners:
            fn()

    def notify_ready(self, run_id: str) -> None:
        for fn in self._ready_listeners:
            fn(run_id)

    def notify_opened(self, approval_id: str) -> None:
        for fn in self._opened_listeners:
            fn(approval_id)

    async def note_policy(self) -> bool:
        """Record the policy file this process loaded as the one in force, and audit the
        change when it differs from the last one recorded (invariant 18: an auditor can say
        which policy governed each decision). True when it changed."""
        policy = self.registry.policy
        async with self.db.read() as tx:
            if await tx.policy.current() == policy.digest:
                return False  # the common case: no write at all

        async def write(tx: Tx) -> bool:
            now = self.clock.now()
            before = await tx.policy.replace(digest=policy.digest,
                                             source=policy.source or "(none)", now=now)
            if before == policy.digest:
                return False
            self.audit.record(tx, at=now, action="policy_loaded", actor=f"process:{self.owner}",
                              via="runtime",
                              details={"digest": policy.digest, "previous": before,
                                       "source": policy.source or None,
                                       "tools": sorted(policy.tools)})
            return True

        return await self.db.transact(write, what="the policy in force")

    # -- helpers ----------------------------------------------------------------------
    def check_payload(self, text: str, *, what: str) -> None:
        size = len(text.encode())
        if size > self.config.max_payload_bytes:
            raise PayloadTooLarge(
                f"{what} is {size} bytes, over the {self.config.max_payload_bytes}-byte cap")

    def button_token(self, a: ApprovalRecord) -> str | None:
        """The token a card showing ``a``'s current arguments carries (None: no signer)."""
        if self.signer is None:
            return None
        return self.signer.token(a.id, a.token_nonce, a.effective_digest)

    async def tool_for(self, a: ApprovalRecord) -> Tool:
        """The tool an approval is about (looked up through the run's agent)."""
        async with self.db.read() as tx:
            run = await tx.runs.get(a.run_id)
        if run is None:
            raise NotFound(f"no run {a.run_id}", run_id=a.run_id)
        name = run.agent
        if is_external(run.id):  # a call its caller runs: no agent defines the tool
            return await self.external.tool(run.id)
        tool = self.registry.get(name).tool(a.tool)
        if tool is None:
            raise NotFound(f"agent {name!r} no longer defines tool {a.tool!r}",
                           approval_id=a.id, run_id=a.run_id)
        return tool

    async def resolve_run(self, run_id: str) -> RunRecord:
        """A run by id or unambiguous id prefix (see :func:`runtime.prefix.resolve`)."""
        async with self.db.read() as tx:
            return await prefix.resolve("run", run_id, tx.runs.get, tx.runs.find,
                                        field="run_id")

    # -- runs ---------------------------------------------------------------------------
    async def start_run(self, agent: str, task: str, *, requested_by: str,
                        claim: str | None = None) -> str:
        """Create a run (status ``running``) with the task as its first message. With
        ``claim`` (a :func:`runtime.ids.lease_id` of this process) the new run is leased to
        the caller in the same transaction, so no worker's poll claims it before the caller
        advances it with ``advance(run_id, claim=claim)``."""
        a = self.registry.get(agent)
        self.check_payload(task, what="the task")
        run_id = new_id()
        now = self.clock.now()
        async with self.db.write() as tx:
            await tx.runs.create(run_id=run_id, agent=a.name, task=task,
                                 requested_by=requested_by,
                                 instructions_version=a.instructions_version, now=now)
            nxt = await tx.events.append(run_id, 0, 0, [encode(UserMessage(content=task))])
            await tx.runs.update(run_id, next_seq=nxt)
            if claim is not None:
                await tx.runs.acquire_lease(run_id, owner=claim, now=now,
                                            until=now + self.config.lease_ttl)
        return run_id

    async def advance(self, run_id: str, *, stop: asyncio.Event | None = None,
                      stale_owners: tuple[str, ...] = (), claim: str | None = None) -> Outcome:
        """Drive the run until it completes, fails, pauses, or ``stop`` is set (``claim``:
        the lease id the caller already holds the run under: a worker's poll claimed it,
        see ``RunsRepo.claim_runnable``, or :meth:`start_run` leased it)."""
        try:
            outcome = await self.runner.advance(run_id, stop=stop, stale_owners=stale_owners,
                                                claim=claim)
        finally:
            self.urgency.end(run_id)
        if outcome.status == "awaiting_approval":
            for approval_id in getattr(outcome, "approval_ids", ()):
                self.notify_opened(approval_id)
        return outcome

    async def run(self, agent: str, task: str, *, requested_by: str) -> Outcome:
        claim = lease_id(self.owner)  # the run is ours from the start: no poll takes it
        run_id = await self.start_run(agent, task, requested_by=requested_by, claim=claim)
        return await self.advance(run_id, claim=claim)

    async def state(self, run_id: str) -> RunState:
        async with self.db.read() as tx:
            run = await tx.runs.get(run_id)
            if run is None:
                raise NotFound(f"no run {run_id}", run_id=run_id)
            events = await tx.events.load(run_id)
            executions = await tx.executions.for_run(run_id)
        return build_state(run, events, executions)

    async def cancel(self, run_id: str, *, actor: Actor, reason: str | None = None) -> str:
        """Cancel a run: at once if no worker is mid-step, else at its next step boundary
        (where the worker ends it instead of opening any request). Either way who asked,
        when and why is audited.

        Returns ``cancelled`` or ``cancel_requested``.
        """
        reason = (reason or "").strip() or None
        stale = tuple(await self.stale_owners())

        async def work(tx: Tx) -> str:
            now = self.clock.now()
            run = await tx.runs.get_locked(run_id)  # the one lock order: run first
            if run is None:
                raise NotFound(f"no run {run_id}", run_id=run_id)
            if run.status in FINAL_STATUSES:
                raise ApprovaldError(f"run {run_id} is already {run.status}", run_id=run_id)
            error = f"cancelled by {actor.id}" + (f": {reason}" if reason else "")
            details = {"was": run.status, "step": run.step, "reason": reason}
            if await tx.runs.cancel_if_idle(run_id, now=now, error=error, by=actor.id,
                                            reason=reason, stale_owners=stale):
                await self.gate.cancel_pending(tx, run_id, actor=actor.id, via=actor.via,
                                               reason=reason)
                self.audit.record(tx, at=now, action="cancelled", actor=actor.id,
                                  via=actor.via, run_id=run_id, details=details)
                return "cancelled"
            await tx.runs.request_cancel(run_id, by=actor.id, reason=reason, now=now)
            self.audit.record(tx, at=now, action="cancel_requested", actor=actor.id,
                              via=actor.via, run_id=run_id,
                              details={**details, "worker": run.lease_owner})
            return "cancel_requested"

        result = await self.db.transact(work, what=f"cancel of run {run_id}")
        if result == "cancelled":
            self.notify_outbox()
        return result

    async def stale_owners(self) -> list[str]:
        """Lease and claim holders that ran on this host and whose process is gone."""
        async with self.db.read() as tx:
            owners = set(await tx.runs.lease_owners()) | set(await tx.outbox.claimers())
        return sorted(o for o in owners
                      if not o.startswith(self.owner) and owner_is_dead(o))

    async def recover(self, *, limit: int = 1000) -> list[Outcome]:
        """Advance every run left ``running`` without a live worker (expired or dead lease)."""
        stale = tuple(await self.stale_owners())
        async with self.db.read() as tx:
            runs = await tx.runs.runnable(now=self.clock.now(), limit=limit, stale_owners=stale)
        outcomes = []
        for run in runs:
            outcomes.append(await self.advance(run.id, stale_owners=stale))
        return outcomes

    # -- approvals ----------------------------------------------------------------------
    async def decide(self, approval_id: str, *, actor: Actor, verdict: Verdict,
                     reason: str | None = None, args: Any = None, token: str | None = None,
                     expect_digest: str | None = None) -> Decision:
        """Record a decision (see :class:`runtime.decide.Decider`); wakes the run if ready."""
        deciding = object()
        since, rank = self.urgency.begin_answer(deciding)
        started = time.monotonic()
        with self.tracer.span("approval.decision", approval_id=approval_id, verdict=verdict,
                              actor=actor.id, via=actor.via) as span:
            try:
                decision = await self.decider.decide(approval_id, actor=actor, verdict=verdict,
                                                     reason=reason, args=args, token=token,
                                                     expect_digest=expect_digest,
                                                     since=rank,
                                                     trace=self.tracer.traceparent())
            except DecisionRefused as refused:
                span.set(outcome=f"refused:{refused.reason}")
                self.meter.decision(f"refused:{refused.reason}", time.monotonic() - started)
                raise
            finally:
                self.urgency.end(deciding)
            a = decision.approval
            span.set(approval_id=a.id, outcome=decision.outcome, run_id=a.run_id,
                     run_ready=decision.run_ready)
            if decision.final:  # request -> decision, recorded now that it is over
                self.tracer.interval("approval.wait", start=a.requested_at,
                                     end=a.decided_at or self.clock.now(), approval_id=a.id,
                                     run_id=a.run_id, kind=a.kind, tool=a.tool,
                                     outcome=decision.outcome)
            if decision.run_ready:  # its resumed steps, here, go on in this trace
                self.tracer.remember(a.run_id)
        self.meter.decision(decision.outcome, time.monotonic() - started)
        self.notify_outbox()  # the card update
        if decision.run_ready:
            # until its next tool call starts, in its turn: the click's
            self.urgency.begin(decision.approval.run_id, since=since)
            self.decided_runs.decided(decision.approval.run_id)
            if decision.claim is not None and self._taker is not None:
                self._taker(decision.approval.run_id, decision.claim)  # leased to us
            else:
                self.notify_ready(decision.approval.run_id)
        return decision
