"""``approvald serve``: the long-running process.

It runs the expiry scheduler, the resume worker and the outbox drain, and (when Slack is
configured) the Slack app. SIGTERM or SIGINT stops it cleanly: in-flight runs stop at
their next step boundary and release their leases, so another process can continue them.
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
from runtime.outbox import Deliverer, OutboxDrain
from runtime.scheduler import ExpiryScheduler
from runtime.worker import ResumeWorker

log = logging.getLogger("approvald.serve")


async def serve(settings: Settings, *, ready: asyncio.Event | None = None) -> int:
    db = await open_database(settings)
    engine = build_engine(settings, db, require_tokens=False)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    slack = None
    deliverer: Deliverer
    if settings.slack_configured:
        from bot.app import SlackService

        slack = SlackService(settings, engine)
        deliverer = slack.deliverer
    else:
        log.warning("no Slack settings: approval requests are logged; decide with "
                    "`approvald approvals approve|deny|edit`")
        deliverer = LogDeliverer()

    drain = OutboxDrain(engine, deliverer)
    worker = ResumeWorker(engine, poll_interval=settings.poll_interval)
    scheduler = ExpiryScheduler(engine,
                                sweep_interval=timedelta(seconds=settings.sweep_interval))
    engine.on_opened(lambda _id: drain.wake())
    engine.on_ready(lambda _id: drain.wake())
    tasks: list[asyncio.Task[None]] = []
    try:
        if slack is not None:
            await slack.start()
        pending = await scheduler.start()
        tasks = [asyncio.create_task(worker.run(stop), name="worker"),
                 asyncio.create_task(drain.run(stop), name="outbox")]
        if slack is not None:
            tasks.append(asyncio.create_task(slack.follow_threads(stop), name="threads"))
        print(f"approvald: serving on {db.display_url} ({pending} pending approvals scheduled"
              f"{', Slack ' + slack.mode if slack else ', no Slack'}); SIGTERM stops",
              file=sys.stderr, flush=True)
        if ready is not None:
            ready.set()
        await stop.wait()
        log.info("stopping: letting runs reach a step boundary")
    finally:
        stop.set()
        scheduler.shutdown()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if slack is not None:
            with contextlib.suppress(Exception):
                await slack.stop()
        await engine.registry.aclose()
        await db.close()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
    print("approvald: stopped", file=sys.stderr, flush=True)
    return 0
