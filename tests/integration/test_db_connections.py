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

