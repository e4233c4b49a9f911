"""``approvald serve``: the long-running process.

It runs the expiry scheduler, the resume worker and the outbox drain, and (when Slack is
configured) the Slack app and the run-thread follower. SIGTERM or SIGINT stops it
cleanly: in-flight runs stop at their next step boundary and release their leases, so
another process can continue them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from datetime import timedelta

from bot.config import Settings
from bot.log_delivery import LogDeliverer
from bot.wiring import build_engine, open_database
from runtime import audit
from runtime.clock import Clock
from runtime.engine import Engine
from runtime.outbox import Deliverer, OutboxDrain
from runtime.scheduler import ExpiryScheduler
from runtime.worker import ResumeWorker
from store.db import Database

log = logging.getLogger("approvald.serve")


class Service:
    """Everything ``serve`` runs, startable and stoppable in-process (tests use it too)."""

    def __init__(self, settings: Settings, db: Database, *, clock: Clock | None = None) -> None:
        self.settings = settings
        self.db = db
        self.engine: Engine = build_engine(settings, db)
        if clock is not None:
            self.engine.clock = clock
            self.engine.ledger.clock = clock
        self.stop_event = asyncio.Event()
        self.slack = None
        deliverer: Deliverer
        if settings.slack_configured:
            from bot.app import SlackService

            self.slack = SlackService(settings, self.engine)
            deliverer = self.slack.deliverer
        else:
            deliverer = LogDeliverer()
        self.drain = OutboxDrain(self.engine, deliverer)
        self.worker = ResumeWorker(self.engine, poll_interval=settings.poll_interval)
        self.scheduler = ExpiryScheduler(
            self.engine, sweep_interval=timedelta(seconds=settings.sweep_interval))
        self.engine.on_outbox(self.drain.wake)
        self._tasks: list[asyncio.Task[None]] = []
        self.pending_scheduled = 0

    async def start(self, *, background: bool = True) -> None:
        """Start the Slack face and scheduler; with ``background``, the worker, outbox
        drain and thread follower too (tests may drive those by hand instead)."""
        if self.slack is not None:
            await self.slack.start()
        else:
            log.warning("no Slack settings: approval requests are logged; decide with "
                        "`approvald approvals approve|deny|edit`")
        self.pending_scheduled = await self.scheduler.start()
        if self.slack is not None and self.settings.audit_channel:
            self.scheduler.every("audit-head", self.post_audit_head,
                                 self.settings.audit_head_interval)
        if not background:
            return
        stop = self.stop_event
        self._tasks = [asyncio.create_task(self.worker.run(stop), name="worker"),
                       asyncio.create_task(self.drain.run(stop), name="outbox")]
        if self.slack is not None:
            self._tasks.append(asyncio.create_task(self.slack.threads.run(stop),
                                                   name="threads"))

    async def post_audit_head(self) -> None:
        """Queue the audit chain's head for the audit channel: a witness outside the
        database that ``audit verify --expect`` can be checked against later."""
        if await audit.queue_head(self.db, now=self.engine.clock.now()):
            self.engine.notify_outbox()

    async def stop(self) -> None:
        self.stop_event.set()
        self.scheduler.shutdown()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.slack is not None:
            with contextlib.suppress(Exception):
                await self.slack.stop()
        await self.engine.registry.aclose()

    def describe(self) -> str:
        face = f"Slack {self.slack.mode}" if self.slack else "no Slack"
        return (f"serving on {self.db.display_url} ({self.pending_scheduled} pending approvals "
                f"scheduled, {face})")


async def serve(settings: Settings) -> int:
    db = await open_database(settings)
    loop = asyncio.get_running_loop()
    try:
        service = Service(settings, db)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, service.stop_event.set)
        try:
            await service.start()
            print(f"approvald: {service.describe()}; SIGTERM stops", file=sys.stderr,
                  flush=True)
            await service.stop_event.wait()
            log.info("stopping: letting runs reach a step boundary")
        finally:
            await service.stop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
    finally:
        await db.close()
    print("approvald: stopped", file=sys.stderr, flush=True)
    return 0
