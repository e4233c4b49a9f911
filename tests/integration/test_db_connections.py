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


async def test_a_caller_waiting_past_the_pools_timeout_gets_sqlalchemys_error(
        pg_url) -> None:
    """With every connection in use a caller waits for one given back, and gives up with
    SQLAlchemy's ``TimeoutError`` after the pool's timeout; one timer serves all the
    waiters (store/leases.py), set again for the next one when the first is served."""
    if pg_url is None:
        pytest.skip("PostgreSQL is not available")
    from approvald.store.db import Database
    from sqlalchemy.exc import TimeoutError as PoolTimeout

    db = Database(pg_url, connections=2, server_time=False)
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
