"""The per-test reset of the session's PostgreSQL database (tests/conftest.py) empties every
table the migrations make, in one statement, and restarts their sequences."""

from __future__ import annotations

from approvald.store.db import Database
from approvald.store.models import Base
from sqlalchemy import text

from tests.conftest import TABLES, reset_pg


async def test_the_reset_names_every_table_and_empties_them(pg_url: str | None) -> None:
    if pg_url is None:  # only without APPROVALD_REQUIRE_PG (CI sets it)
        import pytest

        pytest.skip("PostgreSQL is not reachable (set APPROVALD_TEST_PG_URL)")
    db = Database(pg_url)
    try:
        async with db.connection() as conn:
            rows = await conn.execute(text(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"))
            # (a test may add a probe table of its own; the reset leaves it be)
            assert set(TABLES) == set(Base.metadata.tables) <= {r[0] for r in rows}
            await conn.execute(text(
                "INSERT INTO policy_in_force (id, digest, source, loaded_at) "
                "VALUES (1, 'd', 's', now())"))
            await conn.commit()
        await reset_pg(pg_url)
        async with db.connection() as conn:
            for table in TABLES:
                count = (await conn.execute(text(f"SELECT count(*) FROM {table}"))).scalar()
                assert count == 0, table
    finally:
        await db.close()
