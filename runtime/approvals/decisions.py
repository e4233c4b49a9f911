"""The front door of a decision, for every face: the click, the CLI, the HTTP API's own
answers, a batch, a standing approval's grant. It records the decision through
:class:`runtime.approvals.decide.Decider` (one transaction), then traces and measures it, and tells
this process what it made ready: the card update to deliver, and the run to advance (by
the worker that took its lease in the same transaction, else whoever listens)."""

from __future__ import annotations

import time
from typing import Any

from approvald.runtime.approvals.decide import Actor, Decider, Decision, Verdict
from approvald.runtime.kernel.clock import Clock
from approvald.runtime.kernel.errors import DecisionRefused
from approvald.runtime.kernel.metrics import DecidedRuns, Meter
from approvald.runtime.kernel.signals import Signals
from approvald.runtime.kernel.urgency import Urgency
from approvald.runtime.record.tracing import Tracer
from approvald.store.records import ApprovalRecord


class Decisions:
    def __init__(self, decider: Decider, clock: Clock, signals: Signals, urgency: Urgency,
                 tracer: Tracer, meter: Meter, decided_runs: DecidedRuns) -> None:
        self.decider = decider
        self.clock = clock
        self.signals = signals
        self.urgency = urgency
        self.tracer = tracer
        self.meter = meter
        self.decided_runs = decided_runs

    async def get(self, approval_id: str) -> ApprovalRecord:
        return await self.decider.get(approval_id)

    async def decide(self, approval_id: str, *, actor: Actor, verdict: Verdict,
                     reason: str | None = None, args: Any = None, token: str | None = None,
                     expect_digest: str | None = None) -> Decision:
        """Record a decision (see :meth:`runtime.approvals.decide.Decider.decide`); wakes the run if
        it is ready."""
        deciding = object()
        since, rank = self.urgency.begin_answer(deciding)
        started = time.monotonic()
        with self.tracer.span("approval.decision", approval_id=approval_id, verdict=verdict,
                              actor=actor.id, via=actor.via) as span:
            try:
                # the decider's request is held open until this commits: its writes
                # go first, by ``rank``
                with self.urgency.waits(rank):
                    decision = await self.decider.decide(
                        approval_id, actor=actor, verdict=verdict, reason=reason, args=args,
                        token=token, expect_digest=expect_digest)
            except DecisionRefused as refused:
                span.set(outcome=f"refused:{refused.reason}")
                self.meter.decision(f"refused:{refused.reason}", time.monotonic() - started)
                raise
            finally:
                self.urgency.end(deciding)
            a = decision.approval
            span.set(approval_id=a.id, run_id=a.run_id,
                     outcome="repeated" if decision.repeated else decision.outcome,
                     run_ready=decision.run_ready)
            if decision.final:  # request -> decision, recorded now that it is over
                self.tracer.interval("approval.wait", start=a.requested_at,
                                     end=a.decided_at or self.clock.now(), approval_id=a.id,
                                     run_id=a.run_id, kind=a.kind, tool=a.tool,
                                     outcome=decision.outcome)
            if decision.run_ready:  # its resumed steps, here, go on in this trace
                self.tracer.remember(a.run_id)
        self.meter.decision("repeated" if decision.repeated else decision.outcome,
                            time.monotonic() - started)
        self.signals.notify_outbox()  # the card update
        if decision.run_ready:
            # until its next tool call starts, in its turn: the click's
            self.urgency.begin(a.run_id, since=since)
            self.decided_runs.decided(a.run_id)
            self.signals.decided(a.run_id, decision.claim)
        return decision
