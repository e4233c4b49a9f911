"""Silence never approves: expire, escalate and remind, by compare-and-set.

The sweep is the source of truth: it finds overdue approvals and due reminders in the
database and settles them. Scheduler jobs (:mod:`runtime.scheduler`) only make it prompt.
Expiry races clicks through the same conditional UPDATE, so exactly one outcome wins.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from runtime.audit import Entry
from runtime.canonical import compact_json
from runtime.gate import CARD_UPDATE, REMINDER, first_reminder
from runtime.policy import ApprovalPolicy
from store.records import ApprovalRecord
from store.repos import Tx

if TYPE_CHECKING:
    from runtime.engine import Engine


@dataclass
class SweepResult:
    expired: list[str] = field(default_factory=list)
    escalated: list[tuple[str, str]] = field(default_factory=list)  # (old, new)
    reminded: list[str] = field(default_factory=list)
    runs_ready: set[str] = field(default_factory=set)

    def merge(self, other: SweepResult) -> None:
        self.expired += other.expired
        self.escalated += other.escalated
        self.reminded += other.reminded
        self.runs_ready |= other.runs_ready


class Expiry:
    def __init__(self, engine: Engine) -> None:
        self.e = engine

    async def sweep(self, *, limit: int = 5000, batch: int = 250,
                    only: Sequence[str] | None = None) -> SweepResult:
        """Settle everything overdue as of the clock's now (or just the ids in ``only``).

        A sweep claims its work a batch at a time (``ApprovalsRepo.claim_overdue``):
        requests another replica's sweep is settling at that moment are passed over, so
        replicas sweeping together split the work instead of queueing on the same rows.
        ``only`` (a job for requests due now) waits for the rows it names instead: it is
        there to settle them promptly, and a holder of their run may not be settling them.
        """
        now = self.e.clock.now()
        result = SweepResult()
        if only is None:
            await self._claim_and_settle(now, limit, batch, result)
        due = list(only or ())
        for i in range(0, len(due), batch):
            chunk = due[i:i + batch]

            async def settle(tx: Tx, chunk: Sequence[str] = chunk) -> SweepResult:
                return await self.settle_overdue(tx, chunk, now=now)

            result.merge(await self.e.db.transact(settle, what="expiry sweep"))
        await self._remind(now, limit, result, only)
        self.announce(result)
        return result

    def announce(self, result: SweepResult) -> None:
        """Tell this process's listeners what a committed settlement changed."""
        for run_id in result.runs_ready:
            self.e.notify_ready(run_id)
        for _old, new in result.escalated:
            self.e.notify_opened(new)
        if result.expired or result.escalated or result.reminded:
            self.e.notify_outbox()
        if result.expired:
            self.e.meter.expired(len(result.expired))
        if result.escalated:
            self.e.meter.escalated(len(result.escalated))
        if result.reminded:
            self.e.meter.reminded(len(result.reminded))

    async def _claim_and_settle(self, now: datetime, limit: int, batch: int,
                                result: SweepResult) -> None:
        """Claim and settle overdue requests, ``batch`` per transaction, until a claim
        comes back short (nothing left that nobody else holds) or ``limit`` is reached."""
        left = limit
        while left > 0:
            size = min(batch, left)

            async def settle(tx: Tx, size: int = size) -> tuple[int, SweepResult]:
                claimed = await tx.approvals.claim_overdue(now=now, limit=size)
                settled = SweepResult()  # the claim holds the runs' rows and the requests'
                await self._settle(tx, await tx.approvals.expire_batch(claimed, now=now),
                                   now, settled)
                return len(claimed), settled

            n, settled = await self.e.db.transact(settle, what="expiry sweep")
            result.merge(settled)
            left -= n
            if n < size:
                return

    async def settle_overdue(self, tx: Tx, ids: Sequence[str], *, now: datetime) -> SweepResult:
        """In ``tx``: expire (compare-and-set) those of ``ids`` still pending and overdue,
        then escalate them or wake their runs. The caller announces the result after commit.
        """
        result = SweepResult()
        await tx.runs.lock_many(await tx.approvals.run_ids(ids))  # the one lock order
        expired = await tx.approvals.expire_batch(ids, now=now)
        await self._settle(tx, expired, now, result)
        return result

    async def _settle(self, tx: Tx, expired: list[ApprovalRecord], now: datetime,
                      result: SweepResult) -> None:
        """Escalate or finally expire a batch that just lost its compare-and-set to silence."""
        entries: list[Entry] = []
        cards: list[tuple[str, str, str]] = []
        finals: list[ApprovalRecord] = []
        for a in expired:
            cards.append((CARD_UPDATE, a.id, compact_json({"approval_id": a.id})))
            policy = ApprovalPolicy.from_snapshot(a.policy)
            if a.kind == "tool_call" and a.rung + 1 < policy.rungs:
                await self._escalate(tx, a, policy, now, result)
                continue
            finals.append(a)
            entries.append(Entry(
                at=now, action="expired", actor="system:expiry", via="scheduler",
                run_id=a.run_id, approval_id=a.id, digest=a.effective_digest,
                details={"tool": a.tool, "args": a.effective_args(), "rung": a.rung}))
            result.expired.append(a.id)
        self.e.audit.record_many(tx, entries)
        await tx.outbox.add_many(cards, now=now)
        run_ids = list(dict.fromkeys(a.run_id for a in finals))
        idle = await tx.approvals.runs_without_pending(run_ids, kind="tool_call")
        result.runs_ready.update(await tx.runs.wake(idle, now=now))

    async def _escalate(self, tx: Tx, a: ApprovalRecord, policy: ApprovalPolicy, now: datetime,
                        result: SweepResult) -> None:
        """Replace ``a`` with a request to the next rung of the ladder (new id, new token)."""
        old = await tx.approvals.transition(a.id, to="superseded", from_=("expired",))
        assert old is not None
        # the next rung is asked about the arguments as they stand (a proposed edit
        # included); the original ones stay on the superseded request and in the audit log
        new_id = await self.e.gate.insert_approval(
            tx, run=None, call_id=a.call_id, kind=a.kind, tool=a.tool,
            args=a.effective_args(), policy=policy, rung=a.rung + 1,
            packet=json.loads(a.packet), supersedes=a)
        self.e.audit.record(tx, at=now, action="superseded", actor="system:expiry",
                            via="scheduler", run_id=a.run_id, approval_id=a.id,
                            digest=a.effective_digest,
                            details={"tool": a.tool, "superseded_by": new_id})
        self.e.audit.record(tx, at=now, action="escalated", actor="system:expiry",
                            via="scheduler", run_id=a.run_id, approval_id=new_id,
                            digest=a.effective_digest,
                            details={"tool": a.tool, "from": a.id, "rung": a.rung + 1,
                                     "approvers": policy.rung(a.rung + 1)[0]})
        result.escalated.append((a.id, new_id))

    async def _remind(self, now: datetime, limit: int, result: SweepResult,
                      only: Sequence[str] | None) -> None:
        async with self.e.db.read() as tx:
            due = await tx.approvals.due_for_reminder(now, limit, only=only)
        for a in due:
            policy = ApprovalPolicy.from_snapshot(a.policy)
            ttl = a.expires_at - a.requested_at
            if a.kind != "tool_call":
                ttl = policy.ttl
            nxt = first_reminder(policy, a.requested_at, ttl, a.reminders_sent + 1)
            async with self.e.db.write() as tx:
                if not await tx.approvals.advance_reminder(a.id, sent=a.reminders_sent,
                                                           next_at=nxt):
                    continue  # another replica sent it
                await tx.outbox.add(
                    kind=REMINDER, group_key=a.id,
                    payload=compact_json({"approval_id": a.id, "n": a.reminders_sent + 1}),
                    now=now)
                self.e.audit.record(tx, at=now, action="reminded", actor="system:expiry",
                                    via="scheduler", run_id=a.run_id, approval_id=a.id,
                                    digest=a.effective_digest,
                                    details={"tool": a.tool, "n": a.reminders_sent + 1,
                                             "expires_at": a.expires_at.isoformat()})
            result.reminded.append(a.id)
