"""The shipped migrations build exactly the models' schema, on both dialects."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import text

from store import migrate
from store.db import Database
from store.errors import SchemaOutOfDate


def test_head_constant_matches_the_migration_scripts() -> None:
    assert migrate.HEAD == migrate.head_revision()


async def test_empty_database_upgrades_to_exactly_the_models(tmp_path: Path, pg_url) -> None:
    from tests.conftest import _pg_admin

    urls = [f"sqlite+aiosqlite:///{tmp_path / 'empty.db'}"]
    if pg_url is not None:
        urls.append(await _fresh_pg(pg_url))
    try:
        await _check(urls)
    finally:
        if len(urls) > 1:
            await _pg_admin(f'DROP DATABASE IF EXISTS "{urls[1].rsplit("/", 1)[1]}" WITH (FORCE)')


async def _check(urls: list[str]) -> None:
    for url in urls:
        db = Database(url)
        result = await migrate.upgrade(db)
        assert (result.before, result.after) == (None, migrate.HEAD)
        again = await migrate.upgrade(db)
        assert not again.changed
        async with db.connection() as conn:
            diffs = await conn.run_sync(migrate.compare)
        await db.close()
        assert diffs == [], f"{url}: {diffs}"


async def _fresh_pg(session_url: str) -> str:
    """A brand-new PostgreSQL database (the session one is already migrated)."""
    import uuid

    from tests.conftest import _pg_admin

    name = f"approvald_mig_{uuid.uuid4().hex[:8]}"
    await _pg_admin(f'CREATE DATABASE "{name}"')
    return session_url.rsplit("/", 1)[0] + "/" + name


async def test_a_database_from_a_newer_version_is_refused(tmp_path: Path) -> None:
    db = Database(f"sqlite+aiosqlite:///{tmp_path / 'new.db'}")
    await migrate.upgrade(db)
    async with db.connection() as conn:
        await conn.execute(text("UPDATE alembic_version SET version_num = '9999'"))
        await conn.commit()
    with pytest.raises(SchemaOutOfDate, match="9999"):
        await migrate.upgrade(db)
    await db.close()


async def test_sqlite_pragmas_are_set(tmp_path: Path) -> None:
    db = Database(f"sqlite+aiosqlite:///{tmp_path / 'p.db'}")
    async with db.connection() as conn:
        values = [(await conn.execute(text(f"PRAGMA {p}"))).scalar()
                  for p in ("journal_mode", "synchronous", "foreign_keys", "busy_timeout")]
    await db.close()
    assert values == ["wal", 2, 1, 10000]


@pytest.mark.parametrize("url,msg", [
    ("mysql://x/y", "unsupported database 'mysql'"),
    ("not a url", "not a database URL"),
    ("sqlite+aiosqlite://", "needs a file path"),
])
def test_bad_database_urls_are_one_clear_error(url: str, msg: str) -> None:
    from store.errors import ConfigError

    with pytest.raises(ConfigError, match=msg):
        Database(url)
