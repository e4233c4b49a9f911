"""Silence never approves: expire, escalate and remind, by compare-and-set.

The sweep is the source of truth: it finds overdue approvals and due reminders in the
database and settles them. Scheduler jobs (:mod:`runtime.runs.scheduler`) only make it prompt.
Expiry races clicks through the same conditional UPDATE, so exactly one outcome wins.

One request that cannot be settled (a stored ladder whose next rung ends past any date, a
snapshot nobody can read) never holds back the others: a batch that fails because of its
data is settled again one request per transaction, and a request that fails alone is
isolated: logged once with its id, audited (``failed``, saying what failed) and settled
the safe way, expired as if ``on_expire`` were cancel (silence never approves), so it
cannot fail every sweep after it. An outage of the database is not a request's fault: it
fails the sweep, which the next interval tries again.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from approvald.runtime.kernel.clock import Clock
from approvald.runtime.kernel.metrics import Meter
from approvald.runtime.kernel.signals import Signals
from approvald.runtime.kernel.vocabulary import OutcomeName
from approvald.runtime.policies.policy import ApprovalPolicy
from approvald.runtime.policies.tools import asked_identity
from approvald.runtime.record.audit import AuditTrail, Entry
from approvald.runtime.record.outbox_kinds import (
    CardUpdate,
    OutcomeMail,
    Payload,
    Reminder,
    ReminderMail,
    mail_group,
    mailed,
    queue,
    queue_many,
    tell_mailed,
)
from approvald.runtime.requests.gate import Gate, first_reminder
from approvald.runtime.requests.packet import card_posted
from approvald.store.db import Database, is_store_failure
from approvald.store.records import ApprovalRecord
from approvald.store.repos import Tx

log = logging.getLogger("approvald.expiry")
ACTOR, VIA = "system:expiry", "scheduler"
# what the audit says became of a request the sweep could not settle
EXPIRED_INSTEAD = ("expired as if on_expire were cancel: the request could not be escalated "
                   "or settled as its policy says, and silence never approves")
NO_MORE_REMINDERS = "no more reminders; the request stays open until it expires"


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
    """Settles what is overdue: expiry (cancel, or escalate to the next rung) and reminders.
    Silence never approves."""

    def __init__(self, db: Database, clock: Clock, audit: AuditTrail, gate: Gate,
                 meter: Meter, signals: Signals) -> None:
        self.db = db
        self.clock = clock
        self.audit = audit
        self.gate = gate
        self.meter = meter
        self.signals = signals

    async def sweep(self, *, limit: int = 5000, batch: int = 250,
                    only: Sequence[str] | None = None) -> SweepResult:
        """Settle everything overdue as of the clock's now (or just the ids in ``only``).

        A sweep claims its work a batch at a time (``ApprovalsRepo.claim_overdue``):
        requests another replica's sweep is settling at that moment are passed over, so
        replicas sweeping together split the work instead of queueing on the same rows.
        ``only`` (a job for requests due now) waits for the rows it names instead: it is
        there to settle them promptly, and a holder of their run may not be settling them.
        """
        now = self.clock.now()
        result = SweepResult()
        try:
            if only is None:
                await self._claim_and_settle(now, limit, batch, result)
            due = list(only or ())
            for i in range(0, len(due), batch):
                chunk = due[i:i + batch]

                async def settle(tx: Tx, chunk: Sequence[str] = chunk) -> SweepResult:
                    return await self.settle_overdue(tx, chunk, now=now)

                try:
                    result.merge(await self.db.transact(settle, what="expiry sweep"))
                except Exception as exc:
                    if is_store_failure(exc):
                        raise
                    await self._one_by_one(chunk, now, exc, result)
            await self._remind(now, limit, result, only)
        finally:  # what committed is told, even when an outage stops the rest
            self.announce(result)
        return result

    def announce(self, result: SweepResult) -> None:
        """Tell this process's listeners what a committed settlement changed."""
        for run_id in result.runs_ready:
            self.signals.notify_ready(run_id)
        for _old, new in result.escalated:
            self.signals.notify_opened(new)
        if result.expired or result.escalated or result.reminded:
            self.signals.notify_outbox()
        if result.expired:
            self.meter.expired(len(result.expired))
        if result.escalated:
            self.meter.escalated(len(result.escalated))
        if result.reminded:
            self.meter.reminded(len(result.reminded))

    async def _claim_and_settle(self, now: datetime, limit: int, batch: int,
                                result: SweepResult) -> None:
        """Claim and settle overdue requests, ``batch`` per transaction, until a claim
        comes back short (nothing left that nobody else holds) or ``limit`` is reached."""
        left = limit
        while left > 0:
            size = min(batch, left)
            claimed: list[str] = []

            async def settle(tx: Tx, size: int = size,
                             claimed: list[str] = claimed) -> tuple[int, SweepResult]:
                claimed[:] = await tx.approvals.claim_overdue(now=now, limit=size)
                settled = SweepResult()  # the claim holds the runs' rows and the requests'
                await self._settle(tx, await tx.approvals.expire_batch(claimed, now=now),
                                   now, settled)
                return len(claimed), settled

            try:
                n, settled = await self.db.transact(settle, what="expiry sweep")
            except Exception as exc:
                if not claimed or is_store_failure(exc):
                    raise
                n = len(claimed)
                await self._one_by_one(claimed, now, exc, result)
            else:
                result.merge(settled)
            left -= n
            if n < size:
                return

    async def _one_by_one(self, ids: Sequence[str], now: datetime, failure: Exception,
                          result: SweepResult) -> None:
        """A batch failed on its data (``failure``): settle each of ``ids`` in a transaction
        of its own, and isolate those that fail alone."""
        if len(ids) == 1:
            await self._isolate(ids[0], now, failure, result)
            return
        log.warning("an expiry batch of %d requests failed (%s); settling them one by one",
                    len(ids), type(failure).__name__)
        for approval_id in ids:
            async def settle(tx: Tx, approval_id: str = approval_id) -> SweepResult:
                return await self.settle_overdue(tx, [approval_id], now=now)

            try:
                result.merge(await self.db.transact(
                    settle, what=f"expiry of approval {approval_id}"))
            except Exception as exc:
                if is_store_failure(exc):
                    raise
                await self._isolate(approval_id, now, exc, result)

    async def _isolate(self, approval_id: str, now: datetime, failure: Exception,
                       result: SweepResult) -> None:
        """Settle a request that could not be settled as its policy says: expired, as if
        ``on_expire`` were cancel, with a ``failed`` entry saying what went wrong."""
        error = _describe(failure)
        log.error("approval %s could not be settled at its expiry (%s); %s", approval_id,
                  error, EXPIRED_INSTEAD, exc_info=failure)

        async def expire(tx: Tx) -> SweepResult:
            settled = SweepResult()
            await tx.runs.lock_many(await tx.approvals.run_ids([approval_id]))
            for a in await tx.approvals.expire_batch([approval_id], now=now):
                self.audit.record(
                    tx, at=now, action="failed", actor=ACTOR, via=VIA, run_id=a.run_id,
                    approval_id=a.id, digest=a.effective_digest,
                    details={"tool": a.tool, "rung": a.rung, "during": "expiry",
                             "error": error, "outcome": EXPIRED_INSTEAD})
                self.audit.record(
                    tx, at=now, action="expired", actor=ACTOR, via=VIA, run_id=a.run_id,
                    approval_id=a.id, digest=a.effective_digest,
                    details={"tool": a.tool, "args": _args(a), "rung": a.rung,
                             "on_expire": "cancel", "because": "failed"})
                await queue(tx, CardUpdate(a.id), group_key=a.id, now=now)
                await tell_mailed(tx, [a.id], now)
                settled.expired.append(a.id)
                idle = await tx.approvals.runs_without_pending([a.run_id], kind="tool_call")
                settled.runs_ready.update(await tx.runs.wake(idle, now=now))
            return settled

        try:
            result.merge(await self.db.transact(expire, what=f"isolating approval {approval_id}"))
        except Exception as exc:
            if is_store_failure(exc):
                raise
            log.exception("approval %s could not be expired either; the next sweep tries again",
                          approval_id)

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
        cards: list[tuple[Payload, str]] = []
        finals: list[ApprovalRecord] = []
        # those mailed get a follow-up in their thread; an escalation of one is mailed too
        was_mailed = await mailed(tx, [a.id for a in expired if a.kind == "tool_call"])
        for approval_id in sorted(await mailed(tx, sorted(was_mailed), given_up=False)):
            cards.append((OutcomeMail(approval_id), mail_group(approval_id)))
        for a in expired:
            cards.append((CardUpdate(a.id), a.id))
            policy = ApprovalPolicy.from_snapshot(a.policy)
            if a.kind == "tool_call" and a.rung + 1 < policy.rungs:
                await self._escalate(tx, a, policy, now, result, mail=a.id in was_mailed)
                continue
            finals.append(a)
            entries.append(Entry(
                at=now, action="expired", actor="system:expiry", via="scheduler",
                run_id=a.run_id, approval_id=a.id, digest=a.effective_digest,
                details={"tool": a.tool, "args": a.effective_args(), "rung": a.rung,
                         "outcome": OutcomeName.EXPIRED.value, **card_posted(a)}))
            result.expired.append(a.id)
        self.audit.record_many(tx, entries)
        await queue_many(tx, cards, now=now)
        run_ids = list(dict.fromkeys(a.run_id for a in finals))
        idle = await tx.approvals.runs_without_pending(run_ids, kind="tool_call")
        result.runs_ready.update(await tx.runs.wake(idle, now=now))

    async def _escalate(self, tx: Tx, a: ApprovalRecord, policy: ApprovalPolicy, now: datetime,
                        result: SweepResult, *, mail: bool = False) -> None:
        """Replace ``a`` with a request to the next rung of the ladder (new id, new token);
        ``mail``: ``a`` was mailed, so the new rung's approvers are mailed too."""
        old = await tx.approvals.transition(a.id, to="superseded", from_=("expired",))
        assert old is not None
        # the next rung is asked about the arguments as they stand (a proposed edit
        # included); the original ones stay on the superseded request and in the audit log
        new_id = await self.gate.insert_approval(
            tx, run=None, call_id=a.call_id, kind=a.kind, tool=a.tool,
            args=a.effective_args(), policy=policy, rung=a.rung + 1,
            packet=json.loads(a.packet), supersedes=a, mail=mail, identity=asked_identity(a))
        self.audit.record(tx, at=now, action="superseded", actor="system:expiry",
                            via="scheduler", run_id=a.run_id, approval_id=a.id,
                            digest=a.effective_digest,
                            details={"tool": a.tool, "superseded_by": new_id,
                                     "outcome": OutcomeName.ESCALATED.value,
                                     **card_posted(a)})
        self.audit.record(tx, at=now, action="escalated", actor="system:expiry",
                            via="scheduler", run_id=a.run_id, approval_id=new_id,
                            digest=a.effective_digest,
                            details={"tool": a.tool, "from": a.id, "rung": a.rung + 1,
                                     "approvers": policy.rung(a.rung + 1)[0]})
        result.escalated.append((a.id, new_id))

    async def _remind(self, now: datetime, limit: int, result: SweepResult,
                      only: Sequence[str] | None) -> None:
        async with self.db.read() as tx:
            due = await tx.approvals.due_for_reminder(now, limit, only=only)
        for a in due:
            try:
                await self._remind_one(a, now, result)
            except Exception as exc:
                if is_store_failure(exc):
                    raise
                await self._stop_reminding(a, now, exc)

    async def _remind_one(self, a: ApprovalRecord, now: datetime, result: SweepResult) -> None:
        policy = ApprovalPolicy.from_snapshot(a.policy)
        ttl = a.expires_at - a.requested_at
        if a.kind != "tool_call":
            ttl = policy.ttl
        nxt = first_reminder(policy, a.requested_at, ttl, a.reminders_sent + 1)
        async with self.db.write() as tx:
            if not await tx.approvals.advance_reminder(a.id, sent=a.reminders_sent,
                                                       next_at=nxt):
                return  # another replica sent it
            n = a.reminders_sent + 1
            await queue(tx, Reminder(a.id, n), group_key=a.id, now=now)
            if a.kind == "tool_call" and await mailed(tx, [a.id], given_up=False):  # mail too
                await queue(tx, ReminderMail(a.id, n), group_key=mail_group(a.id), now=now,
                            give_up_at=a.expires_at)
            self.audit.record(tx, at=now, action="reminded", actor=ACTOR, via=VIA,
                                run_id=a.run_id, approval_id=a.id,
                                digest=a.effective_digest,
                                details={"tool": a.tool, "n": a.reminders_sent + 1,
                                         "expires_at": a.expires_at.isoformat(),
                                         "to": a.approvers_value()})
        result.reminded.append(a.id)

    async def _stop_reminding(self, a: ApprovalRecord, now: datetime, failure: Exception) -> None:
        """A reminder that cannot be worked out: no more reminders for this request (its
        expiry still comes), with a ``failed`` entry saying why."""
        error = _describe(failure)
        log.error("approval %s: its reminder could not be sent (%s); %s", a.id, error,
                  NO_MORE_REMINDERS, exc_info=failure)
        try:
            async with self.db.write() as tx:
                if await tx.approvals.stop_reminders(a.id, sent=a.reminders_sent):
                    self.audit.record(
                        tx, at=now, action="failed", actor=ACTOR, via=VIA, run_id=a.run_id,
                        approval_id=a.id, digest=a.effective_digest,
                        details={"tool": a.tool, "during": "reminder",
                                 "n": a.reminders_sent + 1, "error": error,
                                 "outcome": NO_MORE_REMINDERS})
        except Exception as exc:
            if is_store_failure(exc):
                raise
            log.exception("approval %s: its reminders could not be stopped either; the next "
                          "sweep tries again", a.id)


def _describe(exc: BaseException) -> str:
    """The failure in one bounded line, for the audit log and the log."""
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:300]


def _args(a: ApprovalRecord) -> dict[str, Any] | None:
    """The request's arguments, or None if even they cannot be read."""
    try:
        return a.effective_args()
    except ValueError:
        return None
