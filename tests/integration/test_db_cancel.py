"""A transaction cancelled part-way (a lease heartbeat stopped with its step, a shutdown)
never hands its connection on half-begun.

asyncpg marks a transaction as the connection's own before it sends ``BEGIN``; cancelled
while it waits for the answer, the server is inside the transaction but SQLAlchemy's
adapter never learned of it, so the pool's rollback on check-in does nothing. The next
transaction on that connection was then a savepoint inside the abandoned one: its COMMIT
was a ``RELEASE SAVEPOINT``, nothing it wrote was committed, and its row locks were held
by an idle connection until the process died (three replicas stalled on them for good).
Cancellations are swept across the whole of a transaction, one event-loop turn apart,
through a planned statement (``store/fastsql.py``: the heartbeat's lease renewal) and
through SQLAlchemy's own path.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from approvald.store.db import Database, is_store_failure
from approvald.store.repos import Tx
from sqlalchemy import text
from sqlalchemy.exc import TimeoutError as PoolTimeout

from tests.helpers import START
from tests.integration.test_db_reconnect import admin

TURNS = 50  # event-loop turns swept: past the end of a write, on this machine and slower
POOL = 3  # connections kept by ``small`` (pool_size=1 keeps 2; SQLite's writer is one)


@pytest.fixture
async def small(db_url: str) -> AsyncIterator[Database]:
    """A database with a pool this small: writes after a cancelled one soon reuse its
    connection (the pool hands connections out first in, first out)."""
    database = Database(db_url, pool_size=1, server_time=False)
    yield database
    await database.close()


@pytest.fixture
async def probe(small: Database) -> None:
    async with small.write() as tx:
        await tx.conn.execute(text("CREATE TABLE IF NOT EXISTS cancel_probe "
                                   "(id TEXT PRIMARY KEY, note TEXT NOT NULL)"))
        await tx.conn.execute(text("DELETE FROM cancel_probe"))


async def outside(db: Database) -> Any:
    """A connection to the same database outside ``db``'s pool (None on SQLite: a read
    through a second ``Database`` serves)."""
    return await admin(db) if db.dialect == "postgresql" else None


async def committed(db: Database, admin: Any, row_id: str) -> bool:
    """Whether ``row_id`` is committed: seen by a connection ``db`` does not own."""
    if admin is not None:
        return bool(await admin.fetchval("SELECT count(*) FROM cancel_probe WHERE id = $1",
                                         row_id))
    other = Database(db.url.render_as_string(hide_password=False))
    try:
        async with other.read() as tx:
            found = await tx.conn.execute(text("SELECT count(*) FROM cancel_probe "
                                               "WHERE id = :id"), {"id": row_id})
            return bool(found.scalar_one())
    finally:
        await other.close()


async def cancel_after(turns: int, work: Any) -> None:
    task = asyncio.create_task(work())
    for _ in range(turns):
        await asyncio.sleep(0)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def renew(tx: Tx) -> None:
    """The lease heartbeat's statement (planned: it skips SQLAlchemy's execution path)."""
    await tx.runs.renew_lease("no-such-run", owner="w", now=START, until=START)


async def by_sqlalchemy(tx: Tx) -> None:
    await tx.conn.execute(text("SELECT count(*) FROM cancel_probe"))


@pytest.mark.parametrize("first", [renew, by_sqlalchemy])
async def test_a_write_cancelled_anywhere_leaves_no_transaction_behind(
        small: Database, probe: None, first: Any) -> None:
    admin = await outside(small)
    try:
        for turns in range(TURNS):
            async def cancelled() -> None:
                async with small.write() as tx:
                    await first(tx)
                    await renew(tx)
            await cancel_after(turns, cancelled)
            # every pooled connection in turn: whichever the cancelled write left behind
            for n in range(POOL):
                row_id = f"after-{turns}-{n}"
                async with small.write() as tx:
                    await tx.conn.execute(text("INSERT INTO cancel_probe VALUES (:id, 'y')"),
                                          {"id": row_id})
                assert await committed(small, admin, row_id), \
                    f"a write after one cancelled at turn {turns} was not committed"
        if admin is not None:
            idle = await admin.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND state LIKE 'idle in transaction%'")
            assert idle == 0, f"{idle} connection(s) left idle in a transaction"
    finally:
        if admin is not None:
            await admin.close()


async def test_a_snapshot_read_cancelled_anywhere_leaves_no_transaction_behind(
        small: Database, probe: None) -> None:
    admin = await outside(small)
    try:
        for turns in range(TURNS):
            async def cancelled() -> None:
                async with small.read(snapshot=True) as tx:
                    await tx.runs.get("no-such-run")
                    await tx.conn.execute(text("SELECT 1"))
            await cancel_after(turns, cancelled)
            for n in range(POOL):
                row_id = f"after-{turns}-{n}"
                async with small.read(snapshot=True) as tx:  # a snapshot read, then a write
                    await tx.conn.execute(text("SELECT count(*) FROM cancel_probe"))
                async with small.write() as tx:
                    await tx.conn.execute(text("INSERT INTO cancel_probe VALUES (:id, 'y')"),
                                          {"id": row_id})
                assert await committed(small, admin, row_id), \
                    f"a write after a read cancelled at turn {turns} was not committed"
    finally:
        if admin is not None:
            await admin.close()


# asyncpg's transactions; SQLite's writer is discarded on any error
@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_a_pooled_connection_left_in_a_transaction_is_replaced_on_checkout(
        small: Database, probe: None) -> None:
    """Whatever path leaves one behind: here a BEGIN said on the driver itself."""
    admin = await outside(small)
    try:
        async with small.connection() as conn:
            raw = await conn.get_raw_connection()
            await raw.driver_connection.execute("BEGIN")  # unknown to SQLAlchemy
        for n in range(POOL):
            async with small.write() as tx:
                await tx.conn.execute(text("INSERT INTO cancel_probe VALUES (:id, 'y')"),
                                      {"id": f"after-{n}"})
            assert await committed(small, admin, f"after-{n}")
    finally:
        await admin.close()


@pytest.mark.sqlite
async def test_a_cancelled_write_whose_traceback_lives_on_holds_no_lock(tmp_path: Path) -> None:
    """Without the fast path, the pool closes the connection of a cancelled write. Python
    3.11+ closes a SQLite connection with a statement not yet finalized (its cursor still
    referenced, here by the kept traceback of the cancellation) as a "zombie" that keeps its
    transaction, and the file's write lock, until that cursor is collected: every later
    writer waited out its busy timeout and failed "database is locked". Rolled back before
    it is closed, it holds nothing."""
    d = Database(f"sqlite+aiosqlite:///{tmp_path}/a.db", busy_timeout_ms=300,
                 server_time=False, fast_path=False)
    kept: list[BaseException] = []  # what a log handler or an error report may hold on to
    try:
        async with d.write() as tx:
            await tx.conn.execute(text("CREATE TABLE cancel_probe "
                                       "(id TEXT PRIMARY KEY, note TEXT NOT NULL)"))
        for turns in range(TURNS):
            async def cancelled() -> None:
                async with d.write() as tx:
                    await by_sqlalchemy(tx)
            task = asyncio.create_task(cancelled())
            for _ in range(turns):
                await asyncio.sleep(0)
            task.cancel()
            try:
                await task
            except asyncio.CancelledError as exc:
                kept.append(exc)
            async with d.write() as tx:  # within 300 ms, or "database is locked"
                await tx.conn.execute(text("INSERT INTO cancel_probe VALUES (:id, 'y')"),
                                      {"id": str(turns)})
    finally:
        kept.clear()
        await d.close()


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_a_caller_waits_for_a_kept_connection_and_gives_up_with_the_pool(
        db_url: str) -> None:
    """PostgreSQL's connections stay checked out between transactions (store/leases.py):
    with all of them in use a caller waits for one to come back, handed over to the one
    that waited longest; one that stops waiting (cancelled, or past the pool's timeout)
    takes nothing with it."""
    db = Database(db_url, connections=1, fast_path=True, server_time=False)
    assert db._leases is not None
    held, done = asyncio.Event(), asyncio.Event()

    async def hold() -> None:
        async with db.write() as tx:
            await tx.conn.execute(text("SELECT 1"))
            held.set()
            await done.wait()

    async def read() -> int:
        async with db.read() as tx:
            return int((await tx.conn.execute(text("SELECT 2"))).scalar_one())

    try:
        holder = asyncio.create_task(hold())
        await held.wait()
        gave_up = asyncio.create_task(read())
        waiting = asyncio.create_task(read())
        await asyncio.sleep(0)  # both are waiting: no connection is free
        assert len(db._leases._waiters) == 2
        gave_up.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gave_up
        db._leases.timeout = 0.05  # the pool's (30 s by default)
        with pytest.raises(PoolTimeout) as timed_out:
            await read()
        assert is_store_failure(timed_out.value)
        done.set()
        await holder
        assert await asyncio.wait_for(waiting, 10) == 2  # handed the connection
        assert await read() == 2
        # handed the connection just as it is cancelled, a caller passes it on
        write = db.write()
        await write.__aenter__()
        late = asyncio.create_task(read())
        await asyncio.sleep(0)
        assert len(db._leases._waiters) == 1
        await write.__aexit__(None, None, None)  # its connection handed to the waiting one
        late.cancel()  # before that one could run
        with pytest.raises(asyncio.CancelledError):
            await late
        assert await read() == 2  # at once: the pool's timeout is 0.05 s here
        # one connection, held by the one object, checked out of the pool once
        assert (db._leases.held, db.engine.pool.checkedout()) == (1, 1)  # type: ignore[attr-defined]
    finally:
        done.set()
        await db.close()


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_waiting_callers_share_one_timer_set_again_for_the_next(db_url: str) -> None:
    """With every connection in use a caller waits for one given back, and gives up with
    SQLAlchemy's ``TimeoutError`` after the pool's timeout; one timer serves all the
    waiters (store/leases.py), set again for the next one when the first is served."""
    db = Database(db_url, connections=2, fast_path=True, server_time=False)
    leases = db._leases
    assert leases is not None

    async def read() -> int:
        async with db.read() as tx:
            return int((await tx.conn.execute(text("SELECT 1"))).scalar_one())

    async def hold(until: asyncio.Event, entered: asyncio.Event | None = None) -> int:
        async with db.read():
            if entered is not None:
                entered.set()
            await until.wait()
            return 1

    try:
        async with db.read(), db.read():  # both connections in use
            leases.timeout = 0.0
            with pytest.raises(PoolTimeout, match="all 2 connections of the pool are in use"):
                await asyncio.wait_for(read(), 10)  # (a mutant that never gives up)
        gates = [asyncio.Event() for _ in range(3)]
        entered = [asyncio.Event() for _ in range(2)]
        holders = [asyncio.create_task(hold(g, e)) for g, e in zip(gates[:2], entered, strict=True)]
        for e in entered:
            await e.wait()
        # two waiters: the first is served before its deadline, the second waits
        # longer and gives up at its own, on the timer set again for it
        leases.timeout = 0.05
        first = asyncio.create_task(hold(gates[2]))
        await asyncio.sleep(0)
        leases.timeout = 0.1
        second = asyncio.create_task(read())
        await asyncio.sleep(0)
        gates[0].set()  # its connection goes to the first waiter
        with pytest.raises(PoolTimeout):
            await asyncio.wait_for(second, 10)
        for g in gates:
            g.set()
        assert await asyncio.gather(first, *holders) == [1, 1, 1]
        assert not [f for f, _ in leases._waiters if not f.done()]
        leases.timeout = 30.0
        assert await asyncio.gather(read(), read(), read()) == [1, 1, 1]
    finally:
        await db.close()
