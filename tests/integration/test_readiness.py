"""``/readyz``'s words for each way a database fails (issue 36, defect 11), against real
servers and files: what an operator can act on, never the URL's host, port, user or name."""

from __future__ import annotations

from pathlib import Path

import pytest
from approvald.bot.readiness import Readiness
from approvald.store.db import Database

from tests.conftest import PG_ADMIN_URL

SERVER = PG_ADMIN_URL.rsplit("@", 1)[1].rsplit("/", 1)[0]  # the test server's host:port


async def answer(url: str) -> tuple[int, str]:
    db = Database(url)
    try:
        status, body = await Readiness(db).check()
    finally:
        await db.close()
    assert set(body) == {"ok", "database"} and body["ok"] is False
    return status, body["database"]


@pytest.mark.parametrize(("url", "words"), [
    (f"postgresql+asyncpg://no_such_role_q7@{SERVER}/test",
     "database rejected the credentials"),
    (f"postgresql+asyncpg://postgres@{SERVER}/no_such_db_q7",
     "database does not exist (check the database name in APPROVALD_DATABASE_URL)"),
    ("postgresql+asyncpg://postgres:s3cret_q7@127.0.0.1:1/test",
     "database unreachable: connection refused"),
    ("postgresql+asyncpg://postgres:s3cret_q7@no-such-host-q7.invalid/test",
     "database unreachable: its host name does not resolve"),
])
async def test_postgresql_failures_in_an_operators_words(pg_url: str | None, url: str,
                                                         words: str) -> None:
    if pg_url is None:
        pytest.skip("PostgreSQL is not available")
    status, said = await answer(url)
    assert status == 503 and said.startswith(words), said
    for secret in ("q7", "postgres", "127.0.0.1", SERVER, ":1/"):
        assert secret not in said


async def test_an_sqlite_file_that_cannot_be_opened(tmp_path: Path) -> None:
    status, said = await answer(f"sqlite+aiosqlite:///{tmp_path}/missing-dir-q7/a.db")
    assert status == 503 and said.startswith("database file cannot be opened"), said
    assert "q7" not in said and str(tmp_path) not in said
