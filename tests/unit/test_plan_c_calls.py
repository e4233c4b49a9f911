"""Issue 50: the calls into C a planned statement makes, counted exactly: a time this
process made (in UTC already) bound with no ``astimezone``, which would give it back as
it is; a registered statement's plan found with one look-up (no ``id`` taken first)."""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from approvald.store import db as db_module
from approvald.store import fastsql, private_asyncpg
from approvald.store.db import Database
from approvald.store.repos import runs as runs_repo
from sqlalchemy.dialects.postgresql.asyncpg import dialect as pg_dialect
from sqlalchemy.dialects.sqlite.aiosqlite import dialect as sqlite_dialect

from tests.helpers import Rows
from tests.unit.test_inline_processors import _plans
from tests.unit.test_store_cpu import T0, called

DIALECTS = pytest.mark.parametrize("dialect", [sqlite_dialect(), pg_dialect()],
                                   ids=["sqlite", "postgres"])


def c_calls(work: Callable[[], Any]) -> Counter[str]:
    """The calls into C ``work()`` makes on this thread, by qualified name."""
    return called(work, into_c=True)


@DIALECTS
def test_a_time_in_utc_is_bound_without_astimezone(dialect: Any) -> None:
    put, _get = _plans(dialect)
    base = {"id": "r", "args": None, "details": None}
    utc = {**base, "at": datetime(2026, 12, 7, 16, 30, 5, 120, tzinfo=UTC)}
    # SQLite: its text alone (isoformat); PostgreSQL: the time as it is
    want = Counter({"datetime.isoformat": 1}) if dialect.name == "sqlite" else Counter()
    assert c_calls(lambda: put.parameters(utc)) == want
    # another zone: turned to UTC first, as before
    other = {**base, "at": datetime(2026, 12, 7, 22, 0, tzinfo=timezone(timedelta(hours=5)))}
    assert c_calls(lambda: put.parameters(other))["datetime.astimezone"] == 1
    bound = put.parameters(other)[1]
    assert bound == ("2026-12-07 17:00:00.000000" if dialect.name == "sqlite"
                     else datetime(2026, 12, 7, 17, tzinfo=UTC))


async def test_a_planned_statement_s_plan_is_found_with_one_call(db: Database) -> None:
    """On SQLite, one planned read: the registry's look-up, the driver's statement, its
    rows and its cursor closed; nothing else in C (the plan's own expressions aside)."""
    await Rows(db).in_one_write(lambda tx: tx.runs.create(
        run_id="r1", agent="a", task="t", requested_by="U", instructions_version="v",
        now=T0))
    async def read(tx: Any) -> Counter[str]:
        await tx.conn.execute(runs_repo._GET, {"rid": "r1"})  # its plan made
        seen: Counter[str] = Counter()

        def profile(frame: Any, event: str, arg: Any) -> None:
            if event == "c_call" and frame.f_code is fastsql.Conn.execute.__code__ \
                    and arg is not sys.setprofile:
                seen[getattr(arg, "__qualname__", None) or repr(arg)] += 1

        sys.setprofile(profile)
        try:
            await tx.conn.execute(runs_repo._GET, {"rid": "r1"})
        finally:
            sys.setprofile(None)
        return seen
    seen = await Rows(db).in_one_read(read)
    want = {"dict.get": 1}
    if db.dialect == "sqlite":
        want |= {"Connection.execute": 1, "Cursor.fetchall": 1, "Cursor.close": 1}
    assert seen == Counter(want), seen


def test_a_statement_hashed_otherwise_than_by_identity_is_not_registered() -> None:
    from sqlalchemy import Select, column, select

    class Hashed(Select[Any]):
        def __hash__(self) -> int:
            return 1

    with pytest.raises(TypeError, match="not hashed by identity"):
        fastsql.fast(Hashed(column("a")))
    assert type(select(column("a"))).__hash__ is object.__hash__  # what is registered


def test_a_missing_asyncpg_name_turns_postgresql_s_fast_path_off(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(private_asyncpg, "RELIES_ON", (
        *private_asyncpg.RELIES_ON, ("asyncpg.prepared_stmt.PreparedStatement", "_gone")))
    assert db_module.fast_path_gaps("postgresql") == [
        f"asyncpg.prepared_stmt.PreparedStatement._gone ({private_asyncpg.dependency()})"]
    assert db_module.fast_path_gaps("sqlite") == []


async def test_a_renewal_hears_only_its_owner_s_started_attempt_by_its_plan(
        db: Database) -> None:
    """A lease renewal's ``heard``: the attempt its owner is running is heard from, no
    other (another owner's, a finished one, another run's); by its plan, with nothing of
    SQLAlchemy's per statement (it was built and compiled per renewal before)."""
    from tests.unit.test_store_cpu import Calls

    for rid in ("r1", "r2"):
        await Rows(db).in_one_write(lambda tx, rid=rid: tx.runs.create(
            run_id=rid, agent="a", task="t", requested_by="U", instructions_version="v",
            now=T0))

    async def intents(tx: Any) -> None:
        for rid, cid, owner in (("r1", "mine", "w1"), ("r1", "theirs", "w2"),
                                ("r1", "done", "w1"), ("r2", "other", "w1")):
            await tx.executions.record_intent(run_id=rid, call_id=cid, step=1, tool="t",
                                              digest="d", now=T0, owner=owner)
        await tx.executions.record_result(run_id="r1", call_id="done", status="succeeded",
                                          result="{}", error_class=None, error=None, now=T0,
                                          latency_ms=1.0)
    await Rows(db).in_one_write(intents)
    later = T0 + timedelta(minutes=5)

    async def heard(tx: Any) -> Counter[str]:
        await tx.executions.heard("r1", owner="w1", now=T0)  # its plan made
        return await Calls(("sqlalchemy/",)).during(
            lambda: tx.executions.heard("r1", owner="w1", now=later))
    assert await Rows(db).in_one_write(heard) == Counter()

    async def read(tx: Any) -> dict[tuple[str, str], datetime]:
        return {(rid, cid): x.heard_at for rid in ("r1", "r2")
                for cid, x in (await tx.executions.for_run(rid)).items()}
    assert await Rows(db).in_one_read(read) == {
        ("r1", "mine"): later, ("r1", "theirs"): T0, ("r1", "done"): T0, ("r2", "other"): T0}


async def test_a_write_s_begin_on_a_closed_connection_is_refused_as_aiosqlite_refuses_it(
        tmp_path: Any) -> None:
    """``BEGIN IMMEDIATE`` on the loop reads the sqlite3 connection in C; once aiosqlite's
    connection is closed, the same ``ValueError`` its ``_conn`` gives, nothing said."""
    import aiosqlite

    raw = await aiosqlite.connect(tmp_path / "closed.db")
    await raw.close()
    with pytest.raises(ValueError, match=r"^no active connection$") as theirs:
        raw._conn  # noqa: B018  (aiosqlite's own refusal, to compare)
    with pytest.raises(ValueError) as mine:
        await fastsql.begin_immediate(raw, sqlite_dialect(), 0)
    assert str(mine.value) == str(theirs.value)
