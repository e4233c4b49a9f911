"""Which replica leads the polling (issue 50): on PostgreSQL the replica holding a lock on
its listening connection polls at the rates it was given, the others slower; a replica
gone hands the lead on; a CLI process never takes it (store/wakeups.py)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from approvald.bot.serve import Service
from approvald.runtime.kernel.periodic import Pace
from approvald.store.db import Database
from approvald.store.wakeups import Wakeups

from tests.integration.test_wakeups import settings


async def _until(check: object, what: str, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_one_replica_leads_and_hands_the_lead_on_when_it_is_gone(db_url: str) -> None:
    dbs = [Database(db_url) for _ in range(3)]
    paces = [Pace(), Pace()]
    cli = Wakeups(dbs[0], origin="cli", on_signal=lambda k, v: None)  # no periodic work
    a, b = (Wakeups(db, origin=name, on_signal=lambda k, v: None, on_lead=pace.lead,
                    lead_retry=0.05)
            for db, name, pace in zip(dbs[1:], "ab", paces, strict=True))
    try:
        for w in (cli, a, b):  # the CLI first: it must not take the lead
            assert await w.start()
            async with asyncio.timeout(10):
                await w.listening()
        assert [p.leading for p in paces] == [True, False]
        assert (a.leading, b.leading) == (True, False)
        await a.close()  # gone: its lock goes with its connection
        await _until(lambda: paces[1].leading, "B to take the lead")
    finally:
        for w in (cli, a, b):
            await w.close()
        for db in dbs:
            await db.close()


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_a_serve_replica_follows_while_another_leads(db_url: str, tmp_path: Path) -> None:
    db_a, db_b = Database(db_url), Database(db_url)
    a = Service(settings(db_url, tmp_path), db_a)
    b = Service(settings(db_url, tmp_path), db_b)
    idle = Service(settings(db_url, tmp_path), db_a)  # its loops do not run: never leads
    try:
        assert await idle.wakeups.start()
        for s in (a, b):  # (the loops run: they may lead)
            await s.start()
            async with asyncio.timeout(10):
                await s.wakeups.listening()
        assert (a.engine.pace.leading, b.engine.pace.leading) == (True, False)
    finally:
        await a.stop(grace=5)
        await b.stop(grace=5)
        await idle.wakeups.close()
        await db_a.close()
        await db_b.close()
