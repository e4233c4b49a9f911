"""Draining the outbox: deliver each row once, in order per group, until its time is up.

Rows were committed with the state they describe, so nothing is delivered about a thing
the database does not hold, and a crash between commit and delivery loses nothing: the
row is still pending and the next drain (in any process) delivers it. Later rows of a
group wait for its head, so a card is never updated before it is posted.

Waiting is not failing. When the far side says "not now, try in N seconds" (Slack's
``Retry-After``), the row waits exactly that long and the wait is counted apart from
failures (``waits``). Other failures (5xx, the network, a revoked token) back off
exponentially with jitter, up to a cap. A row gives up by time, never by count: once its
``give_up_at`` has passed (see :func:`give_up_time`; for an approval card, no later than
the request's expiry), a row that still cannot be delivered is parked as ``dead``, as is
one the far side can never accept (:class:`Undeliverable`). A dead row is logged and
reported through the outbox itself (a :data:`DEAD_REPORT` row written in the transaction
that parks it), so ops learns what is missing and how to re-drive it
(``approvald outbox retry ID``).

When mail can be sent, a card Slack does not take reaches its approvers by mail instead
(:meth:`OutboxDrain._mail_instead`): once it is given up as dead, or, with
``DrainConfig.mail_fallback_after``, once it is still undelivered that long after its
request was made (Slack down, erroring, unreachable). Either way the request is mailed at
most once, only while it is open, never when its policy mailed it already, and audited
(``mailed_instead``).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol, runtime_checkable

from approvald.runtime.kernel.canonical import compact_json
from approvald.runtime.kernel.clock import Clock
from approvald.runtime.kernel.failpoints import failpoint
from approvald.runtime.kernel.owners import Owners
from approvald.runtime.kernel.periodic import repeat
from approvald.runtime.kernel.urgency import Urgency
from approvald.runtime.policies.policy import ApprovalPolicy
from approvald.runtime.record.audit import AuditTrail
from approvald.runtime.record.outbox_kinds import (
    APPROVAL_KINDS,
    CARD_POST,
    CARD_UPDATE,
    DEAD_REPORT,
    REMINDER,
    DeadReport,
    RequestMail,
    RetryLater,
    Route,
    Undeliverable,
    mail_group,
    mailed,
    queue,
)
from approvald.store.db import Database
from approvald.store.records import OutboxRecord
from approvald.store.repos import Tx

log = logging.getLogger("approvald.outbox")

WINDOW = timedelta(hours=24)  # how long a row that is not about a live request keeps trying
# what a deliverer raises (declared with the kinds, in the outbox's contract)
__all__ = ["WINDOW", "Deliverer", "DrainConfig", "OutboxDrain", "RetryLater", "Undeliverable",
           "deadline", "give_up_time"]


class Deliverer(Protocol):
    """Turns one outbox row into an effect in the outside world; returns what to remember."""

    async def deliver(self, row: OutboxRecord) -> dict[str, Any] | None: ...


@runtime_checkable
class ReadsAhead(Protocol):
    """A deliverer that reads what a batch of rows needs once, before they are delivered
    one by one (``prepare``: the Slack face's card views, one read a batch, not a row)."""

    async def prepare(self, rows: Sequence[OutboxRecord]) -> None: ...


@dataclass(frozen=True)
class DrainConfig:
    batch: int = 50
    claim_ttl: timedelta = timedelta(seconds=60)
    window: timedelta = WINDOW  # the give-up window of rows not bound to a request's expiry
    backoff: float = 1.0  # seconds before the first retry after a failure; doubles each time
    max_backoff: float = 300.0
    stale_check: float = 5.0  # seconds between looks for dead claimers
    gather: float = 0.02  # after a wake, let a burst of rows pile up, then send as a batch
    # how long rows queued here defer to decided runs on their way to a tool, counted from
    # the wake-up that announced them (not from each batch: in a burst of clicks something
    # always presses, and per-batch patience let the cards trail the burst by seconds)
    patience: float = 0.1
    # a batch's writes (its claim, its marks) queue in the store as if for someone who
    # began waiting this long after its rows were announced: behind the decided runs of
    # everyone who clicked before that, ahead of later ones and of ordinary writes (in a
    # burst the ordinary line holds every run's later steps, which kept cards back)
    lag: float = 0.1
    busy_batch: int = 25  # rows per batch while decided runs are still pressing
    # a card that is given up while its request is open mails the request to its approvers
    # instead (serve sets it when it can send mail)
    mail_fallback: bool = False
    # with mail_fallback: a card still undelivered this long after its request was made
    # (Slack unreachable or erroring) mails the request too, without waiting for it to die
    mail_fallback_after: timedelta | None = None


def give_up_time(row: OutboxRecord, expires_at: datetime | None,
                 window: timedelta = WINDOW, *, decided: bool = False) -> datetime:
    """When to stop trying to deliver ``row``; ``expires_at`` is its request's expiry
    (for the approval kinds; None when there is no such request), ``decided`` whether
    that request is closed (decided, expired, cancelled) by now.

    A deadline stored on the row wins. A card post or a reminder is pointless once its
    request has expired, so it gives up then. A card update draws the request as it
    stands: for an open request it keeps trying until the request expires, and at least
    ``window`` after it was queued; for a closed one (a decision or an expiry should
    still reach the card) ``window`` after it was queued. Anything else (notices, audit
    heads, dead-delivery reports, rows written before deadlines existed) gives up
    ``window`` after it was queued.
    """
    if row.give_up_at is not None:
        return row.give_up_at
    default = row.created_at + window
    if expires_at is None:
        return default
    if row.kind in (CARD_POST, REMINDER):
        return expires_at
    if row.kind == CARD_UPDATE and not decided:
        return max(expires_at, default)
    return default


async def deadline(tx: Tx, row: OutboxRecord, window: timedelta = WINDOW) -> datetime:
    """:func:`give_up_time`, reading the request's expiry when the row is about one."""
    if row.give_up_at is None and row.kind in APPROVAL_KINDS:
        approval_id = row.payload_value().get("approval_id")
        a = await tx.approvals.get(str(approval_id)) if approval_id else None
        if a is not None:
            return give_up_time(row, a.expires_at, window, decided=a.status != "pending")
    return give_up_time(row, None, window)


class OutboxDrain:
    """Delivers committed outbox rows (cards, updates, reminders, webhooks), each group in
    order, each row until it is delivered or dead."""

    def __init__(self, db: Database, clock: Clock, owners: Owners, urgency: Urgency,
                 deliverer: Deliverer, config: DrainConfig | None = None, *,
                 audit: AuditTrail | None = None, own: Route | None = None) -> None:
        self.db = db
        # the runtime's own rows (outbox_kinds.RUNTIME_KINDS): delivered here, not by a face
        self.own = own
        self.audit = audit
        self.clock = clock
        self.owners = owners
        self.urgency = urgency
        self.deliverer = deliverer
        # what the deliverer reads ahead for a batch (see ReadsAhead), when it does
        self._prepare = deliverer.prepare if isinstance(deliverer, ReadsAhead) else None
        self.config = config or DrainConfig()
        self._wake = asyncio.Event()
        # when rows not yet claimed were first announced (urgency's monotonic clock)
        self._woken: float | None = None

    def wake(self) -> None:
        """Drain now rather than at the next poll (a local commit added rows)."""
        if self._woken is None:
            self._woken = self.urgency.now()
        self._wake.set()

    async def drain_once(self) -> int:
        """Deliver every due group head once; returns how many rows were delivered.

        Groups are independent, so their heads go out concurrently; within a group the
        next row becomes the head only after this one is delivered. Heads are selected
        and claimed in one write, passing over those another replica is claiming (see
        ``OutboxRepo.claim_heads``), and marked delivered in one write: each ONE
        statement on PostgreSQL, sent alone (``Database.write_one``: no BEGIN and COMMIT
        around it). With several replicas each drain claims what is due when it wakes,
        so the same rows go out in more, smaller batches than with one (issue 50): each
        costs its two statements, not seven (an empty claim one, not three).

        Decided runs on their way to a tool go first (see :mod:`runtime.kernel.urgency`),
        within bounds counted from when the rows were announced (:meth:`wake`): a batch
        waits for them at most ``patience`` after that, and its writes queue in the store
        as if for someone who began waiting ``lag`` after it. So under a stream of clicks
        a card trails its click by about ``patience`` plus its own delivery, where a
        patience per batch, and writes in the ordinary line behind every run's later
        steps, made the cards trail the whole burst.
        """
        delivered = 0
        # dead claimers, looked up at most every few seconds (only takeovers need them)
        stale = await self.owners.stale(within=self.config.stale_check)
        config = self.config
        # when the last batch's rows were announced: the rows it left (a full batch) or
        # freed in their groups are its work too, for one more batch; after that, rows
        # nobody announced (a poll's, a backlog's) count from now, so a stream of them
        # still defers to decided runs
        last: float | None = None
        while True:
            announced = self._woken is not None
            woken = self._woken if announced else last
            if woken is None:
                woken = self.urgency.now()
            quiet = await self.urgency.settle(
                max(0.0, woken + config.patience - self.urgency.now()))
            self._woken = None  # rows announced from here on are the next batch's
            rank = woken + config.lag
            now = self.clock.now()
            limit = config.batch if quiet else config.busy_batch
            with self.urgency.waits(rank):
                async with self.db.write_one() as tx:
                    mine = await tx.outbox.claim_heads(
                        owner=self.owners.owner, now=now, until=now + config.claim_ttl,
                        limit=limit, stale_owners=stale)
            if not mine:
                return delivered
            last = woken if announced else None
            if self._prepare is not None:
                try:
                    await self._prepare(mine)
                except Exception:  # each row is then delivered as if nothing was read ahead
                    log.warning("outbox: reading ahead for %d row(s) failed", len(mine),
                                exc_info=True)
            results = await asyncio.gather(*(self._one(row) for row in mine))
            done = [(row.id, res) for row, (ok, res) in zip(mine, results, strict=True) if ok]
            if done:
                failpoint("after_post_before_mark")
                with self.urgency.waits(rank):
                    async with self.db.write_one() as tx:
                        await tx.outbox.delivered_many(done, owner=self.owners.owner,
                                                       now=self.clock.now())
            delivered += len(done)
            if not done:
                return delivered

    async def _one(self, row: OutboxRecord) -> tuple[bool, str | None]:
        """Deliver one claimed row: (delivered, result JSON); failures are recorded here."""
        try:
            route = self.own if self.own is not None and row.kind in self.own.kinds \
                else self.deliverer
            result = await route.deliver(row)
        except RetryLater as exc:
            await self._failed(row, str(exc), after=exc.after)
            return False, None
        except Undeliverable as exc:
            await self._failed(row, str(exc), undeliverable=True)
            return False, None
        except Exception as exc:
            await self._failed(row, f"{type(exc).__name__}: {exc}")
            return False, None
        return True, None if result is None else compact_json(result)

    def _backoff(self, row: OutboxRecord) -> float:
        """Seconds to the next try after a failure: doubling per failure (waits do not
        count), jittered so replicas spread apart, never above the cap."""
        failures = max(1, row.attempts + 1 - row.waits)  # row.attempts is from before the claim
        delay = self.config.backoff * 2.0 ** min(failures - 1, 32)
        return float(min(self.config.max_backoff, delay * (0.8 + 0.4 * random.random())))

    async def _failed(self, row: OutboxRecord, error: str, *, after: float | None = None,
                      undeliverable: bool = False) -> None:
        """Record a try that did not deliver: wait, back off, or (past its deadline, or
        never deliverable) park the row as dead and queue a report about it, atomically."""
        config = self.config
        waited = after is not None and not undeliverable
        async with self.db.write() as tx:
            now = self.clock.now()
            give_up = await deadline(tx, row, config.window)
            dead = undeliverable or now >= give_up
            if dead:
                retry_at = now
            elif waited:
                retry_at = now + timedelta(seconds=max(0.0, after or 0.0))
            else:  # the last try falls on the deadline, so giving up is not late
                retry_at = min(now + timedelta(seconds=self._backoff(row)), give_up)
            fallback = self._fallback_due(row)
            if fallback is not None and not dead and not waited and now < fallback:
                retry_at = min(retry_at, fallback)  # a try then sees it is time to mail
            if not await tx.outbox.failed(row.id, owner=self.owners.owner, error=error,
                                          retry_at=retry_at, give_up_at=give_up, dead=dead,
                                          waited=waited):
                return  # another worker took the row over; its try is the one that counts
            if dead and row.kind != DEAD_REPORT:  # a report that dies is only logged
                await queue(tx, self._report(row, error, waited),
                            group_key=f"{DEAD_REPORT}:{row.id}", now=now,
                            give_up_at=now + config.window)
            mailing = False
            if dead and row.kind == CARD_POST and config.mail_fallback:
                mailing = await self._mail_instead(tx, row, now, because="card_dead",
                                                   error=error)
            elif fallback is not None and now >= fallback:
                mailing = await self._mail_instead(tx, row, now, because="slack_unreachable",
                                                   error=error)
        if mailing:
            self.wake()  # the mail goes now, not at the next poll
        attempts, waits = row.attempts + 1, row.waits + waited
        if dead:
            log.error("outbox %d (%s%s) is dead after %d attempt(s) and %d wait(s)%s: %s; "
                      "re-drive it with `approvald outbox retry %d`", row.id, row.kind,
                      _subject(row), attempts, waits,
                      "" if undeliverable else f", gave up at {give_up.isoformat()}", error,
                      row.id)
            if row.kind != DEAD_REPORT:
                self.wake()
        elif waited:
            # the first wait says Slack is pushing back; the rest would only be noise
            log.log(logging.INFO if row.waits == 0 else logging.DEBUG,
                    "outbox %d (%s) waits %.0f s as asked: %s", row.id, row.kind, after, error)
        else:
            log.warning("outbox %d (%s) failed (attempt %d), next try %s, gives up at %s: %s",
                        row.id, row.kind, attempts, retry_at.isoformat(),
                        give_up.isoformat(), error)

    def _fallback_due(self, row: OutboxRecord) -> datetime | None:
        """When a card post still undelivered mails its request (None: never for it)."""
        after = self.config.mail_fallback_after
        if row.kind != CARD_POST or not self.config.mail_fallback or after is None:
            return None
        return row.created_at + after  # the card is queued with its request

    async def _mail_instead(self, tx: Tx, row: OutboxRecord, now: datetime, *,
                            because: str, error: str) -> bool:
        """A card nobody sees: mail its request to the approvers while it is open, once
        (unless its policy had it mailed already), in the transaction that records the
        card's failed try, and audit it. True if the mail was queued."""
        approval_id = row.payload_value().get("approval_id")
        a = await tx.approvals.get(str(approval_id)) if approval_id else None
        if a is None or a.status != "pending" or now >= a.expires_at \
                or "email" in ApprovalPolicy.from_snapshot(a.policy).channels:
            return False
        if await mailed(tx, [a.id]):
            return False  # mailed already (or on its way)
        await queue(tx, RequestMail(a.id, fallback=True), group_key=mail_group(a.id), now=now,
                    give_up_at=a.expires_at)
        if self.audit is not None:
            self.audit.record(tx, at=now, action="mailed_instead", actor="system:outbox",
                              via="email", run_id=a.run_id, approval_id=a.id,
                              digest=a.effective_digest,
                              details={"tool": a.tool, "because": because,
                                       "card_outbox_id": row.id,
                                       "card_queued_at": row.created_at.isoformat(),
                                       "error": error[:300]})
        if because == "card_dead":
            log.warning("approval %s: its card was given up; mailing the request to its "
                        "approvers instead", a.id)
        else:
            log.warning("approval %s: Slack has not taken its card since %s (%s); mailing "
                        "the request to its approvers", a.id, row.created_at.isoformat(),
                        error[:200])
        return True

    @staticmethod
    def _report(row: OutboxRecord, error: str, waited: bool) -> DeadReport:
        payload = row.payload_value()
        about = {key: payload[key] for key in ("approval_id", "run_id", "call_id")
                 if isinstance(payload.get(key), str)}
        return DeadReport(outbox_id=row.id, dead_kind=row.kind, attempts=row.attempts + 1,
                          waits=row.waits + waited, error=error[:500], **about)

    async def run(self, stop: asyncio.Event, *, interval: float = 1.0) -> None:
        """Drain until ``stop`` is set: at every wake-up, and every ``interval`` seconds."""
        await repeat(self.drain_once, stop=stop, every=interval, what="outbox drain",
                     wake=self._wake, settle=self.config.gather, pace=self.owners.pace)


def _subject(row: OutboxRecord) -> str:
    """", approval X" / ", run X": what a row is about, for log lines."""
    try:
        payload = row.payload_value()
    except ValueError:
        return ""
    for key in ("approval_id", "run_id", "outbox_id"):
        if key in payload:
            return f", {key.removesuffix('_id')} {payload[key]}"
    return ""
