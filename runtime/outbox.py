"""Draining the outbox: deliver each row once, in order per group, retrying with backoff.

Rows were committed with the state they describe, so nothing is delivered about a thing
the database does not hold, and a crash between commit and delivery loses nothing: the
row is still pending and the next drain (in any process) delivers it. A delivery that
fails is retried with backoff (or after the ``Retry-After`` the far side asked for);
later rows of the same group wait, so a card is never updated before it is posted.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol

from runtime.canonical import compact_json
from runtime.errors import ApprovaldError
from runtime.failpoints import failpoint
from runtime.periodic import repeat
from store.records import OutboxRecord

if TYPE_CHECKING:
    from runtime.engine import Engine

log = logging.getLogger("approvald.outbox")


class RetryLater(ApprovaldError):
    """The far side is busy or down; try this row again after ``after`` seconds (if given)."""

    def __init__(self, message: str, *, after: float | None = None) -> None:
        super().__init__(message)
        self.after = after


class Undeliverable(ApprovaldError):
    """The row can never be delivered (bad channel, message too long): park it as dead."""


class Deliverer(Protocol):
    """Turns one outbox row into an effect in the outside world; returns what to remember."""

    async def deliver(self, row: OutboxRecord) -> dict[str, Any] | None: ...


@dataclass(frozen=True)
class DrainConfig:
    batch: int = 50
    claim_ttl: timedelta = timedelta(seconds=60)
    max_attempts: int = 25
    backoff: float = 1.0
    max_backoff: float = 300.0
    stale_check: float = 5.0  # seconds between looks for dead claimers
    gather: float = 0.02  # after a wake, let a burst of rows pile up, then send as a batch
    patience: float = 0.2  # how long a batch defers to decided runs on their way to a tool
    busy_batch: int = 10  # rows per batch while decided runs are still pressing


class OutboxDrain:
    def __init__(self, engine: Engine, deliverer: Deliverer,
                 config: DrainConfig | None = None) -> None:
        self.e = engine
        self.deliverer = deliverer
        self.config = config or DrainConfig()
        self._wake = asyncio.Event()
        self._stale: tuple[float, tuple[str, ...]] = (-1e9, ())

    async def _stale_owners(self) -> tuple[str, ...]:
        """Dead claimers, looked up at most every few seconds (only takeovers need it)."""
        now = time.monotonic()
        if now - self._stale[0] > self.config.stale_check:
            self._stale = (now, tuple(await self.e.stale_owners()))
        return self._stale[1]

    def wake(self) -> None:
        """Drain now rather than at the next poll (a local commit added rows)."""
        self._wake.set()

    async def drain_once(self) -> int:
        """Deliver every due group head once; returns how many rows were delivered.

        Groups are independent, so their heads go out concurrently; within a group the
        next row becomes the head only after this one is delivered. Heads are claimed in
        one statement and marked delivered in one transaction. Each batch first lets
        decided runs reach their tool calls (see :mod:`runtime.urgency`).
        """
        e = self.e
        delivered = 0
        stale = await self._stale_owners()
        while True:
            quiet = await e.urgency.settle(self.config.patience)
            now = e.clock.now()
            async with e.db.read() as tx:
                heads = await tx.outbox.heads(
                    now=now, limit=self.config.batch if quiet else self.config.busy_batch,
                    stale_owners=stale)
            if not heads:
                return delivered
            async with e.db.write() as tx:
                claimed = await tx.outbox.claim_many(
                    [r.id for r in heads], owner=e.owner, now=now,
                    until=now + self.config.claim_ttl, stale_owners=stale)
            mine = [r for r in heads if r.id in claimed]
            results = await asyncio.gather(*(self._one(row) for row in mine))
            done = [(row.id, res) for row, (ok, res) in zip(mine, results, strict=True) if ok]
            if done:
                failpoint("after_post_before_mark")
                async with e.db.write() as tx:
                    await tx.outbox.delivered_many(done, owner=e.owner, now=e.clock.now())
            delivered += len(done)
            if not done:
                return delivered

    async def _one(self, row: OutboxRecord) -> tuple[bool, str | None]:
        """Deliver one claimed row: (delivered, result JSON); failures are recorded here."""
        attempts = row.attempts + 1
        try:
            result = await self.deliverer.deliver(row)
        except RetryLater as exc:
            await self._failed(row, attempts, str(exc), exc.after)
            return False, None
        except Undeliverable as exc:
            log.error("outbox %d (%s) is undeliverable: %s", row.id, row.kind, exc)
            await self._failed(row, attempts, str(exc), None, dead=True)
            return False, None
        except Exception as exc:
            log.warning("outbox %d (%s) failed: %s: %s", row.id, row.kind,
                        type(exc).__name__, exc)
            await self._failed(row, attempts, f"{type(exc).__name__}: {exc}", None)
            return False, None
        return True, None if result is None else compact_json(result)

    async def _failed(self, row: OutboxRecord, attempts: int, error: str, after: float | None,
                      *, dead: bool = False) -> None:
        if after is None:
            after = min(self.config.max_backoff, self.config.backoff * 2 ** (attempts - 1))
            after *= 0.8 + 0.4 * random.random()  # spread replicas' retries apart
        dead = dead or attempts >= self.config.max_attempts
        async with self.e.db.write() as tx:
            await tx.outbox.failed(row.id, owner=self.e.owner, error=error,
                                   retry_at=self.e.clock.now() + timedelta(seconds=after),
                                   dead=dead)

    async def run(self, stop: asyncio.Event, *, interval: float = 1.0) -> None:
        """Drain until ``stop`` is set: at every wake-up, and every ``interval`` seconds."""
        await repeat(self.drain_once, stop=stop, every=interval, what="outbox drain",
                     wake=self._wake, settle=self.config.gather)
