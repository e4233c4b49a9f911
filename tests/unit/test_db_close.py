"""``Database.close`` leaves no SQLite connection open, even one in use when it is called.

An aiosqlite connection left to the garbage collector stops its thread from ``__del__``,
which makes a future on whatever event loop is current: a closed one, once the test that
opened it has finished, and its thread then dies of "Event loop is closed" in some later,
unrelated test (seen in CI as ``PytestUnhandledThreadExceptionWarning``).
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiosqlite
import pytest
from approvald.store.db import Database
from sqlalchemy import text


class Made:
    """Every aiosqlite connection made during the test. Garbage not yet collected stays in
    it: open, unreachable and left to the collector is the very leak looked for (a full
    ``gc`` pass over a worker's heap cost most of a second a test)."""

    def __init__(self) -> None:
        self.count = 0
        self.alive: weakref.WeakSet[aiosqlite.Connection] = weakref.WeakSet()

    def still_open(self) -> list[aiosqlite.Connection]:
        return [c for c in self.alive if c._connection is not None]


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch) -> Made:
    made = Made()
    init = aiosqlite.Connection.__init__

    def tracked(self: aiosqlite.Connection, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        made.count += 1
        made.alive.add(self)

    monkeypatch.setattr(aiosqlite.Connection, "__init__", tracked)
    return made


async def held_while_closing(d: Database, use: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    release = asyncio.Event()
    task = asyncio.create_task(use(release))
    for _ in range(100):  # until it holds its connection (no clock involved: loop turns)
        await asyncio.sleep(0)
    await d.close()
    release.set()
    await task


@pytest.mark.parametrize("fast_path", [True, False], ids=["fast", "plain"])
@pytest.mark.parametrize("case", ["pooled", "plain_read", "write", "write_after_close"])
async def test_close_leaves_no_connection_open(sqlite_url: str, case: str, fast_path: bool,
                                               made: Made) -> None:
    d = Database(sqlite_url, fast_path=fast_path)

    async def pooled(release: asyncio.Event) -> None:
        async with d.connection() as conn:
            await conn.execute(text("SELECT 1"))
            await release.wait()

    async def plain_read(release: asyncio.Event) -> None:
        async with d.read() as tx:
            await tx.runs.get("nobody")
            await release.wait()

    async def write(release: asyncio.Event) -> None:
        async with d.write() as tx:
            await tx.runs.get("nobody")
            await release.wait()

    async with d.write() as tx:  # the one write connection, and a reader, opened and idle
        await tx.runs.get("nobody")
    async with d.read() as tx:
        await tx.runs.get("nobody")
    if case == "write_after_close":
        await d.close()
        async with d.write() as tx:
            await tx.runs.get("nobody")
        await d.close()
    else:
        await held_while_closing(d, {"pooled": pooled, "plain_read": plain_read,
                                     "write": write}[case])
    assert made.count >= 1  # it saw the connections made
    assert made.still_open() == []


def driver_threads() -> set[str]:
    import threading
    return {t.name for t in threading.enumerate() if "_connection_worker_thread" in t.name}


@pytest.mark.sqlite
async def test_a_file_that_cannot_be_opened_leaves_no_driver_thread_behind(
        tmp_path: Path) -> None:
    """aiosqlite queues the stop of a connection that failed to open and returns without
    waiting for it: had the event loop closed first (the end of a test, of a command), the
    thread failed to hand back its answer ("Event loop is closed"), reported in whatever
    ran next. The thread is gone by the time the failure reaches the caller."""
    d = Database(f"sqlite+aiosqlite:///{tmp_path}/no-such-dir/a.db")
    before = driver_threads()
    try:
        for _ in range(3):  # a plain read's driver connection, and the pool's
            with pytest.raises(Exception, match="unable to open"):
                async with d.read():
                    pass
            assert driver_threads() - before == set()  # no await since the failure
            with pytest.raises(Exception, match="unable to open"):
                async with d.write():
                    pass
            assert driver_threads() - before == set()
    finally:
        await d.close()
