"""``serve`` (and ``approvald sandbox``, which runs one) hides its start-up heap from the
cyclic garbage collector (issue 14): a full collection walked every module, table and
validator built at start-up, and under a burst of clicks one such pass held the event loop
for ~170 ms."""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path

from approvald.bot.config import Settings
from approvald.bot.sandbox.workspace import Sandbox
from approvald.bot.serve import Service, _run
from approvald.store.db import Database


async def test_serve_freezes_what_start_up_built(db_url: str, tmp_path: Path) -> None:
    assert gc.get_freeze_count() == 0
    db = Database(db_url)
    settings = Settings(APPROVALD_DATABASE_URL=db_url, APPROVALD_POLL_INTERVAL="600",
                        APPROVALD_DEMO_LEDGER=str(tmp_path / "ledger.jsonl"))
    service = Service(settings, db)
    running = asyncio.create_task(_run(service))
    try:
        # until start-up is over: it waits on the database, whose answers take as many
        # loop turns as a loaded machine makes them take (up to 30 s)
        for _ in range(3000):
            if gc.get_freeze_count() or running.done():
                break
            await asyncio.sleep(0.01)
        frozen = gc.get_freeze_count()
        # start-up's own objects are frozen, the service's among them
        assert frozen > 10_000
        assert all(o is not service for o in gc.get_objects())
        service.stop_event.set()
        assert await asyncio.wait_for(running, 30) is None
    finally:
        gc.unfreeze()
        service.stop_event.set()
        await db.close()


async def test_the_sandbox_freezes_what_its_start_up_built(tmp_path: Path) -> None:
    # ``approvald sandbox`` is a long-running serve as well, with the emulator and its page
    assert gc.get_freeze_count() == 0
    settings = Settings(APPROVALD_DATABASE_URL=f"sqlite+aiosqlite:///{tmp_path / 's.db'}",
                        APPROVALD_DEMO_LEDGER=str(tmp_path / "ledger.jsonl"))
    sandbox = Sandbox(settings, port=0)
    try:
        await sandbox.start()
        assert gc.get_freeze_count() > 10_000
        assert all(o is not sandbox.service for o in gc.get_objects())
    finally:
        gc.unfreeze()
        await sandbox.stop()
