"""APScheduler jobs that make expiry and reminders prompt.

The database is the source of truth, not a job store: at start the schedule is rebuilt
from pending approvals (one job per approval, at its next reminder or its expiry), and a
periodic sweep catches anything a job missed (a restart, another replica's request, a
clock jump). Jobs and the sweep both go through :class:`runtime.requests.expiry.Expiry`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

from approvald.runtime.kernel.clock import Clock
from approvald.runtime.kernel.signals import Signals
from approvald.runtime.requests.expiry import Expiry
from approvald.store.db import Database, is_store_failure

log = logging.getLogger("approvald.scheduler")
# the furthest ahead a job is set: a job only triggers a check against the database, so
# one far off may as well look again tomorrow, and no stored time, however far, overflows
# the wall-clock arithmetic of its run date
LONGEST_WAIT = timedelta(days=1)


def _job_id(approval_id: str) -> str:
    return f"approval:{approval_id}"


class ExpiryScheduler:
    def __init__(self, db: Database, clock: Clock, expiry: Expiry, signals: Signals, *,
                 sweep_interval: timedelta = timedelta(seconds=15)) -> None:
        self.db = db
        self.clock = clock
        self.expiry = expiry
        self.signals = signals
        self.sweep_interval = sweep_interval
        # APScheduler (and its time zone modules) loaded by the process that schedules
        # (serve), not by each command that builds an engine
        from apscheduler.schedulers.asyncio import AsyncIOScheduler

        self.scheduler = AsyncIOScheduler(timezone=UTC)
        self._known: set[str] = set()
        # the engine time each approval's job is set for: the sweep's rebuild leaves alone a
        # job already set for its approval's next event
        self._when: dict[str, datetime] = {}
        self._unschedulable: set[str] = set()  # logged once each

    async def rebuild(self) -> int:
        """(Re)create one job per pending approval from the database; returns the count."""
        async with self.db.read() as tx:
            rows = await tx.approvals.pending_schedule()
        live = set()
        for approval_id, expires_at, next_reminder in rows:
            live.add(approval_id)
            try:
                when = min(expires_at, next_reminder) if next_reminder else expires_at
                self.schedule(approval_id, when)
            except Exception:  # one row never costs the others their jobs
                if approval_id not in self._unschedulable:
                    log.exception("approval %s could not be scheduled; the periodic sweep "
                                  "still settles it", approval_id)
                self._unschedulable.add(approval_id)
        self._unschedulable &= live
        for job in self.scheduler.get_jobs():  # decided elsewhere: drop its job
            if job.id.startswith("approval:") and job.id.removeprefix("approval:") not in live:
                job.remove()
        self._known = live
        self._when = {k: v for k, v in self._when.items() if k in live}
        return len(rows)

    def schedule(self, approval_id: str, when: datetime) -> None:
        """Set approval ``approval_id``'s job for engine time ``when``, unless its job is
        set for that time already. The sweep's :meth:`rebuild` (every 15 s) made every
        pending approval's job again: with 1,374 pending (bench_fleet's ``serve``), a step
        of 60-82 ms of the event loop's CPU under load every sweep, a stall in issue 50's
        open loop, and about ten new objects a job for the cyclic collector to walk. A job
        left as it was need not follow the engine's clock closely: the sweep itself
        settles whatever is due, whatever the jobs say."""
        if self._when.get(approval_id) == when \
                and self.scheduler.get_job(_job_id(approval_id)) is not None:
            return
        # run_date is wall-clock and ``when`` is engine time: wake up after the same span
        # (an injected clock may run ahead of or behind the wall clock); the job only
        # *triggers* a check against the engine's clock
        delay = min(max(when - self.clock.now(), timedelta(0)), LONGEST_WAIT)
        self.scheduler.add_job(
            self._due, "date", run_date=datetime.now(UTC) + delay, args=[approval_id],
            id=_job_id(approval_id), replace_existing=True, misfire_grace_time=None,
            coalesce=True,
        )
        self._when[approval_id] = when
        self._known.add(approval_id)

    async def _due(self, approval_id: str) -> None:
        try:
            await self.expiry.sweep(only=[approval_id])
            async with self.db.read() as tx:
                a = await tx.approvals.get(approval_id)
            if a is not None and a.status == "pending":
                nxt = min(a.expires_at, a.next_reminder_at or a.expires_at)
                self.schedule(approval_id, nxt)
            else:
                self._known.discard(approval_id)
                self._when.pop(approval_id, None)
        except Exception:
            log.exception("expiry job for approval %s failed; the sweep will retry", approval_id)

    async def sweep(self) -> None:
        try:
            result = await self.expiry.sweep()
            if result.expired or result.escalated or result.reminded:
                log.info("sweep: %d expired, %d escalated, %d reminded", len(result.expired),
                         len(result.escalated), len(result.reminded))
        except Exception:
            log.exception("expiry sweep failed; retrying at the next interval")
        try:  # whatever became of the sweep: the jobs are what make the next one prompt
            await self.rebuild()
        except Exception:
            log.exception("rebuilding the expiry schedule failed; retrying at the next interval")

    async def start(self) -> int | None:
        """Schedule every pending approval and start the sweep; how many were scheduled,
        or None when the database did not answer. ``serve`` already answers ``/healthz``
        when this runs: a database that fails now (it refused the credentials, it closed
        the connection) must not stop it, so the schedule is then left to the sweep, which
        rebuilds it every ``sweep_interval``. Any other error is raised."""
        try:
            n: int | None = await self.rebuild()
        except Exception as exc:
            if not is_store_failure(exc):
                raise
            log.warning("the expiry schedule cannot be read yet (%s: %s); the sweep reads it "
                        "every %g s", type(exc).__name__, str(exc).partition("\n")[0],
                        self.sweep_interval.total_seconds())
            n = None
        self.scheduler.add_job(self.sweep, "interval",
                               seconds=self.sweep_interval.total_seconds(), id="sweep",
                               replace_existing=True, coalesce=True, max_instances=1)
        self.scheduler.start()
        self.signals.on_opened(self._opened)
        return n

    def every(self, name: str, work: Callable[[], Awaitable[object]], seconds: float) -> None:
        """Run ``work`` every ``seconds`` (a failure is logged and retried next time)."""
        async def job() -> None:
            try:
                await work()
            except Exception:
                log.exception("%s failed; retrying at the next interval", name)
        self.scheduler.add_job(job, "interval", seconds=seconds, id=name,
                               replace_existing=True, coalesce=True, max_instances=1)

    def _opened(self, approval_id: str) -> None:
        """A request opened in this process: schedule it without waiting for the sweep."""
        self.scheduler.add_job(self._reschedule, args=[approval_id],
                               id=f"open:{approval_id}", replace_existing=True)

    async def _reschedule(self, approval_id: str) -> None:
        async with self.db.read() as tx:
            a = await tx.approvals.get(approval_id)
        if a is not None and a.status == "pending":
            self.schedule(approval_id, min(a.expires_at, a.next_reminder_at or a.expires_at))

    def shutdown(self) -> None:
        if self.scheduler.running:
            self.scheduler.shutdown(wait=False)
