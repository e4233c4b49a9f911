"""Cross-replica wake-ups on PostgreSQL (issue 14): a decision committed by one process
is acted on by another within moments, not at its next poll (set to 10 minutes here)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from approvald.bot.config import Settings
from approvald.bot.serve import Service
from approvald.runtime.approvals.decide import Actor
from approvald.store.db import Database
from approvald.store.wakeups import Wakeups

from tests.helpers import Rows


async def eventually(check: Any, what: str, within: float = 20.0) -> None:
    deadline = time.monotonic() + within
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def settings(url: str, tmp_path: Path) -> Settings:
    return Settings(APPROVALD_DATABASE_URL=url, APPROVALD_POLL_INTERVAL="600",
                    APPROVALD_SWEEP_INTERVAL="600",
                    APPROVALD_DEMO_LEDGER=str(tmp_path / "ledger.jsonl"))


async def test_a_decision_on_one_replica_wakes_another_at_once(pg_url, tmp_path) -> None:
    if pg_url is None:
        pytest.skip("PostgreSQL is not available")
    db_a, db_b = Database(pg_url), Database(pg_url)
    a = Service(settings(pg_url, tmp_path), db_a)  # started without its worker: busy elsewhere
    b = Service(settings(pg_url, tmp_path), db_b)
    try:
        await a.scheduler.start()
        assert await a.wakeups.start()
        await b.start()  # worker, drain, scheduler: all polling every 10 minutes
        async with asyncio.timeout(10):
            await a.wakeups.listening()
            await b.wakeups.listening()
        paused = await a.engine.run("demo-refund", "Refund order A-7", requested_by="U_DANA")
        assert paused.status == "awaiting_approval"
        # B heard of the new request and schedules its expiry too
        await eventually(lambda: _true(b.wakeups.received >= 1), "B to hear of the request")
        await a.engine.decide(paused.approval_ids[0], actor=Actor("U_ALICE", "cli"),
                              verdict="approve")

        async def completed() -> bool:
            run = await Rows(db_a).run(paused.run_id)
            return run is not None and run.status == "completed"
        await eventually(completed, "replica B to advance the run A's decision woke")
        # a wake-up is sent after its commit, in the background (publishing never
        # blocks), and counted once the server took it: the count may trail the run's
        # completion by a moment
        await eventually(lambda: _true(a.wakeups.sent >= 2),  # opened, ready (and outbox)
                         "A to announce its commits")
        # B's own commits while advancing (outbox rows): delivered by B's own drain, which
        # its commits woke; no other replica is told of them (issue 50)
        async def delivered() -> bool:
            return not await Rows(db_a).in_one_read(
                lambda tx: tx.outbox.recent(status="pending"))
        await eventually(delivered, "B to deliver the rows it committed")
        assert b.wakeups.sent == 0
        lines = (tmp_path / "ledger.jsonl").read_text().splitlines()
        assert sum('"issue_refund"' in line for line in lines) == 1
    finally:
        await b.stop(grace=5)
        await a.stop(grace=5)
        await db_a.close()
        await db_b.close()


async def _true(value: bool) -> bool:
    return value


async def test_a_process_does_not_hear_itself_and_sqlite_needs_nothing(pg_url, sqlite_url
                                                                        ) -> None:
    heard: list[tuple[str, str]] = []
    lite = Database(sqlite_url)
    try:
        w = Wakeups(lite, origin="one", on_signal=lambda k, v: heard.append((k, v)))
        assert await w.start() is False
        w.publish("ready", "x")  # a no-op
        assert w.sent == 0
    finally:
        await lite.close()
    if pg_url is None:
        pytest.skip("PostgreSQL is not available")
    db = Database(pg_url)
    mine: list[tuple[str, str]] = []
    theirs: list[tuple[str, str]] = []
    one = Wakeups(db, origin="one", on_signal=lambda k, v: mine.append((k, v)))
    two = Wakeups(db, origin="two", on_signal=lambda k, v: (theirs.append((k, v)),
                                                             two.publish("echo", v)))
    try:
        await one.start()
        await two.start()
        async with asyncio.timeout(10):
            await one.listening()
            await two.listening()
        one.publish("ready", "run-1")
        one.publish("outbox")
        await eventually(lambda: _true(len(theirs) == 2), "the other process to hear")
        assert theirs == [("ready", "run-1"), ("outbox", "")]
        await asyncio.sleep(0.2)
        assert mine == []  # never its own, and a relayed wake-up is not sent on again
        assert two.sent == 0
    finally:
        await one.close()
        await two.close()
        await db.close()


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_outbox_rows_a_process_delivers_itself_wake_no_other_and_are_delivered(
        db_url: str, tmp_path: Path) -> None:
    """Issue 50: a click's ``pg_notify`` was the outbox's wake-up (the card's update, the
    run's thread), sent to replicas that could only race this process's own drain for
    the rows. A process whose drain runs tells no one, and delivers them itself at once
    (the others poll every 10 minutes here); a process with no drain running (busy
    elsewhere, a CLI) still wakes the others, who deliver its rows."""
    db_a, db_b = Database(db_url), Database(db_url)
    a = Service(settings(db_url, tmp_path), db_a)
    b = Service(settings(db_url, tmp_path), db_b)
    said: dict[str, list[str]] = {"a": [], "b": []}
    for name, service in (("a", a), ("b", b)):
        publish = service.wakeups.publish

        def told(kind: str, key: str = "", *, name: str = name, publish: Any = publish
                 ) -> None:
            said[name].append(kind)
            publish(kind, key)
        service.wakeups.publish = told  # type: ignore[method-assign]
    try:
        await a.start()  # worker, drain, scheduler
        await b.scheduler.start()  # no worker, no drain: busy elsewhere
        assert await b.wakeups.start()
        async with asyncio.timeout(10):
            await a.wakeups.listening()
            await b.wakeups.listening()

        async def pending() -> int:
            return len(await Rows(db_a).in_one_read(
                lambda tx: tx.outbox.recent(status="pending")))

        # A opens a request, decides it, runs the call: its outbox rows, delivered by A
        paused = await a.engine.run("demo-refund", "Refund order A-8", requested_by="U_DANA")
        await a.engine.decide(paused.approval_ids[0], actor=Actor("U_ALICE", "cli"),
                              verdict="approve")

        async def settled() -> bool:
            run = await Rows(db_a).run(paused.run_id)
            return run is not None and run.status == "completed" and await pending() == 0
        await eventually(settled, "A to complete the run and deliver its rows")
        assert "outbox" not in said["a"], said["a"]  # no replica woken to race A's drain
        assert said["a"].count("opened") == 1  # the others schedule its expiry: told

        # B, with no drain running, opens a request: its card is delivered by A, woken
        received = a.wakeups.received
        paused = await b.engine.run("demo-refund", "Refund order A-9", requested_by="U_DANA")
        assert "outbox" in said["b"]
        await eventually(lambda: _true(a.wakeups.received > received), "A to hear of B")
        await eventually(lambda: pending_is(pending, 0), "A to deliver B's rows")
    finally:
        await a.stop(grace=5)
        await b.stop(grace=5)
        await db_a.close()
        await db_b.close()


async def pending_is(pending: Any, n: int) -> bool:
    return bool(await pending() == n)
