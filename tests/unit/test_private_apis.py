"""The private names the database fast path relies on (issue 37) are all there, and the
fast path can be turned off.

Each dependency's private uses live in one module (``store/private_aiosqlite.py``,
``store/private_sqlalchemy.py``, ``store/private_asyncpg.py``) listing them in
``RELIES_ON``; pyproject.toml bounds those dependencies to releases this test has passed
on. When a release renames one, this fails naming it and the version, before the fast
path breaks in production (where :class:`Database` would turn it off with a warning).
"""

from __future__ import annotations

import importlib.util
import logging
from datetime import UTC, datetime
from types import ModuleType
from typing import Any

import pytest
from approvald.store import db as db_module
from approvald.store import fastsql, private_aiosqlite, private_asyncpg, private_sqlalchemy
from approvald.store.db import Database, fast_path_setting
from approvald.store.errors import ConfigError
from approvald.store.repos import runs as runs_repo

MODULES = [private_aiosqlite, private_sqlalchemy, private_asyncpg]


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__.rsplit(".", 1)[1])
def test_every_private_name_relied_on_is_there(module: ModuleType) -> None:
    if module is private_asyncpg and importlib.util.find_spec("asyncpg") is None:
        pytest.skip("asyncpg is not installed (the postgres extra)")
    assert module.RELIES_ON, "a private module that relies on nothing should be removed"
    gone = module.missing()
    assert not gone, (
        f"{module.dependency()} lacks {', '.join(gone)}, which {module.__name__} relies on: "
        "adapt that module to this release (or bound the dependency below it in "
        "pyproject.toml); APPROVALD_DB_FAST_PATH=0 runs without it meanwhile")


def test_a_missing_name_is_reported_with_its_dependency(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        sqlite_url: str) -> None:
    monkeypatch.setattr(private_aiosqlite, "RELIES_ON",
                        (*private_aiosqlite.RELIES_ON, ("aiosqlite.Connection", "_gone")))
    assert private_aiosqlite.missing() == ["aiosqlite.Connection._gone"]
    gaps = db_module.fast_path_gaps("sqlite")
    assert gaps == [f"aiosqlite.Connection._gone ({private_aiosqlite.dependency()})"]
    # the fast path turns itself off rather than fail at the first statement
    with caplog.at_level(logging.WARNING, logger="approvald.store"):
        d = Database(sqlite_url, fast_path=True)
    assert d.fast_path is False and "aiosqlite.Connection._gone" in caplog.text


@pytest.mark.parametrize(("raw", "on"), [("1", True), ("0", False), ("off", False),
                                         ("TRUE", True), (" no ", False)])
def test_the_setting_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch,
                                                   raw: str, on: bool) -> None:
    monkeypatch.setenv("APPROVALD_DB_FAST_PATH", raw)
    assert fast_path_setting() is on


def test_a_bad_setting_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("APPROVALD_DB_FAST_PATH", "maybe")
    with pytest.raises(ConfigError, match="APPROVALD_DB_FAST_PATH"):
        fast_path_setting()
    monkeypatch.delenv("APPROVALD_DB_FAST_PATH")
    assert fast_path_setting() is True  # the default


def test_the_settings_object_reads_it_too(monkeypatch: pytest.MonkeyPatch) -> None:
    from approvald.bot.config import Settings

    monkeypatch.delenv("APPROVALD_DB_FAST_PATH", raising=False)

    assert Settings().db_fast_path is True
    assert Settings(APPROVALD_DB_FAST_PATH="0").db_fast_path is False


async def test_with_the_fast_path_off_nothing_private_is_touched(
        db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Off, the database runs on plain SQLAlchemy and aiosqlite/asyncpg: every helper of
    the private modules is made to fail, and writes, reads and snapshots still work."""
    def refuse(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("a private API was used with the fast path off")

    for module in (private_aiosqlite, private_sqlalchemy):
        for name in ("connect", "inline", "inline_connection", "sqlite3_connection",
                     "on_thread", "result_columns", "execute",
                     "end_transaction", "set_autocommit"):
            if hasattr(module, name):
                monkeypatch.setattr(module, name, refuse)
    d = Database(db_url, fast_path=False, server_time=False)
    try:
        assert d._plans is None
        now = datetime(2026, 12, 4, 12, tzinfo=UTC)
        async with d.write() as tx:
            await tx.runs.create(run_id="r-off", agent="a", task="t", requested_by="U",
                                 instructions_version="v", now=now)
        async with d.read() as tx:
            # a statement registered for the plan path: here SQLAlchemy's own result
            res = await tx.conn.execute(runs_repo._GET, {"rid": "r-off"})
            assert not isinstance(res, fastsql.Rows)
            assert res.one().id == "r-off"
        async with d.read(snapshot=True) as tx:
            assert (await tx.conn.execute(runs_repo._GET, {"rid": "r-off"})).scalar_one()
        with pytest.raises(RuntimeError, match="boom"):
            async with d.write() as tx:
                await tx.runs.create(run_id="r-gone", agent="a", task="t",
                                     requested_by="U", instructions_version="v", now=now)
                raise RuntimeError("boom")
        async with d.read() as tx:  # rolled back
            assert (await tx.conn.execute(runs_repo._GET, {"rid": "r-gone"})).first() is None
    finally:
        await d.close()
