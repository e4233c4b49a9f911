"""``Database.close`` leaves no SQLite connection open, even one in use when it is called.

An aiosqlite connection left to the garbage collector stops its thread from ``__del__``,
which makes a future on whatever event loop is current: a closed one, once the test that
opened it has finished, and its thread then dies of "Event loop is closed" in some later,
unrelated test (seen in CI as ``PytestUnhandledThreadExceptionWarning``).
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiosqlite
import pytest
from approvald.store.db import Database
from sqlalchemy import text


def open_connections() -> set[int]:
    gc.collect()
    return {id(o) for o in gc.get_objects()
            if isinstance(o, aiosqlite.Connection) and o._connection is not None}


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
async def test_close_leaves_no_connection_open(sqlite_url: str, case: str,
                                               fast_path: bool) -> None:
    before = open_connections()
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
    assert open_connections() - before == set()


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
