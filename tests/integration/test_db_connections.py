"""How many connections a process keeps to PostgreSQL: ``APPROVALD_DB_CONNECTIONS``
(default 8). N replicas hold N times as many (plus 2 each for wake-ups), which the
server's ``max_connections`` must admit; and a burst larger than the pool waits for a
connection instead of opening more."""

from __future__ import annotations

import asyncio

import pytest
from approvald.bot.config import Settings
from approvald.bot.wiring import open_database
from pydantic import ValidationError
from sqlalchemy import text


def test_the_setting_defaults_to_8_and_refuses_fewer_than_2() -> None:
    assert Settings().db_connections == 8
    assert Settings(APPROVALD_DB_CONNECTIONS="30").db_connections == 30
    with pytest.raises(ValidationError, match="APPROVALD_DB_CONNECTIONS"):
        Settings(APPROVALD_DB_CONNECTIONS="1")


async def test_a_burst_shares_the_pool_it_is_given(pg_url) -> None:
    if pg_url is None:
        pytest.skip("PostgreSQL is not available")
    db = await open_database(Settings(APPROVALD_DATABASE_URL=pg_url,
                                      APPROVALD_DB_CONNECTIONS="3"), quiet=True)
    most = 0

    async def one(k: int) -> None:
        nonlocal most

        async def write(tx):  # type: ignore[no-untyped-def]
            nonlocal most
            most = max(most, db.engine.pool.checkedout())  # type: ignore[attr-defined]
            await tx.conn.execute(text("SELECT pg_sleep(0.02)"))
            return k

        assert await db.transact(write, what=f"burst {k}") == k

    try:
        assert db.engine.pool.size() == 3  # type: ignore[attr-defined]
        await asyncio.gather(*(one(k) for k in range(12)))
        assert most == 3  # all three used, never a fourth
        backends = await _backends(pg_url)
        assert backends <= 3, backends
    finally:
        await db.close()


async def _backends(url: str) -> int:
    """Connections open to ``url``'s database (the pool's, as this test opens no other
    but the one asking)."""
    import asyncpg  # type: ignore[import-untyped]

    dsn = url.replace("postgresql+asyncpg://", "postgresql://")
    conn = await asyncpg.connect(dsn)
    try:
        n: int = await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid()")
        return n
    finally:
        await conn.close()


async def test_a_caller_waits_for_a_kept_connection_and_gives_up_with_the_pool(
        pg_url: str | None) -> None:
    """PostgreSQL's connections stay checked out between transactions (store/leases.py):
    with all of them in use a caller waits for one to come back, handed over to the one
    that waited longest; one that stops waiting (cancelled, or past the pool's timeout)
    takes nothing with it."""
    if pg_url is None:
        pytest.skip("PostgreSQL is not available")
    from approvald.store.db import Database, is_store_failure
    from sqlalchemy.exc import TimeoutError as PoolTimeout

    db = Database(pg_url, connections=1, fast_path=True, server_time=False)
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
