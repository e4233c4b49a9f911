"""The plan path (store.fastsql) gives what SQLAlchemy gives: the same rows, the same
types in and out, the same exceptions; and it steps aside where it cannot be sure."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from approvald.runtime.approvals.decide import Actor
from approvald.runtime.kernel.outcomes import Completed, Paused
from approvald.runtime.runs.demo import REFUND_POLICY, DemoLedger, refund_agent
from approvald.store import fastsql
from approvald.store.db import Database
from approvald.store.models import Approval
from approvald.store.repos import approvals as approvals_repo
from approvald.store.repos import runs as runs_repo
from sqlalchemy import Select, select, text
from sqlalchemy import types as sa_types
from sqlalchemy.exc import IntegrityError

from tests.helpers import Rows, parts
from tests.unit.test_decisions import card_token

SQLITE_ONLY = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
T0 = datetime(2026, 12, 1, 9, 30, 15, 123456, tzinfo=UTC)


@pytest.fixture
async def sdb(sqlite_url: str):
    d = Database(sqlite_url, fast_path=True)
    yield d
    await d.close()


def approval_values(aid: str, run_id: str) -> dict[str, Any]:
    return {"id": aid, "run_id": run_id, "call_id": f"c-{aid}", "kind": "tool",
            "tool": "issue_refund", "args": json.dumps({"amount": 42, "note": "é"}),
            "digest": "d" * 64, "status": "pending", "approvers": json.dumps(["U_A"]),
            "requested_by": "U_DANA", "requested_at": T0,
            "expires_at": T0 + timedelta(hours=1), "token_nonce": "n",
            "policy": json.dumps({"ttl": 3600}), "packet": "{}"}


async def insert_run(d: Database, run_id: str) -> None:
    async with d.write() as tx:
        await tx.runs.create(run_id=run_id, agent="a", task="t", requested_by="U",
                             instructions_version="v", now=T0)


async def test_an_insert_by_plan_stores_what_sqlalchemy_stores(db: Database) -> None:
    await insert_run(db, "r1")
    async with db.write() as tx:
        await tx.approvals.insert(**approval_values("a-plan", "r1"))  # planned
        sa = await tx.conn.connection()  # SQLAlchemy itself
        await sa.execute(Approval.__table__.insert(), approval_values("a-sa", "r1"))
    assert fastsql._PREPARED[approvals_repo._INSERT].plan(
        db.engine.dialect, frozenset(approval_values("x", "r1"))) is not None
    async with db.read() as tx:
        rows = {r.id: dict(r._mapping) for r in await tx.conn.execute(
            select(Approval.__table__))}
        raw = {r[0]: r[1:] for r in await tx.conn.execute(
            text("SELECT id, requested_at, expires_at, rung, quorum FROM approvals"))}
    plan, sa = rows.pop("a-plan"), rows.pop("a-sa")
    assert plan.pop("id") == "a-plan" and sa.pop("id") == "a-sa"
    plan.pop("call_id"), sa.pop("call_id")
    assert plan == sa  # scalar defaults (rung, quorum...) and every type alike
    assert raw["a-plan"] == raw["a-sa"]  # byte for byte in the file, datetimes too
    assert plan["requested_at"] == T0 and plan["requested_at"].tzinfo is UTC


def _is_time(t: Any) -> bool:
    """Whether a bind's type holds a time (``since`` is a sequence number elsewhere)."""
    impl = getattr(t, "impl", t)
    return isinstance(impl, sa_types.DateTime)


async def test_every_planned_select_reads_what_sqlalchemy_reads(make_engine,
                                                                 ledger_path) -> None:
    engine = make_engine(agents=[refund_agent(DemoLedger(str(ledger_path)),
                                              approval=REFUND_POLICY)])
    paused = await engine.run("demo-refund", "Refund order A-1001, customer was double charged",
                              requested_by="U_DANA")
    assert isinstance(paused, Paused)
    a = await Rows.of(engine).approval(paused.approval_ids[0])
    assert a is not None
    await engine.decide(a.id, actor=Actor("U_ALICE", "slack"), verdict="approve",
                        token=card_token(a))
    assert isinstance(await engine.advance(a.run_id), Completed)
    execs = None
    execs = await Rows.of(engine).executions(a.run_id)
    call_id = next(iter(execs))
    params = {"aid": a.id, "rid": a.run_id, "cid": call_id, "since": 0, "d": a.digest,
              "sid": "none", "tool": a.tool, "xid": "none",
              # the audit reads (prepared when an earlier test in this worker read them)
              "seq": 1, "after": 0, "upto": 10**9, "lim": 50, "n": 50}
    selects = [p.stmt for p in fastsql._PREPARED.values() if isinstance(p.stmt, Select)]
    assert len(selects) >= 8
    compared = 0
    async with parts(engine).db.write() as tx:  # inside a transaction: every plan applies
        conn = tx.runs.conn
        for stmt in selects:
            binds = [bp for bp in stmt.compile(dialect=parts(engine).db.engine.dialect)
                     .binds.values() if bp.required]
            names = {bp.key for bp in binds}
            if not names <= params.keys() or any(
                    _is_time(bp.type) and not isinstance(params[bp.key], datetime)
                    for bp in binds):
                # prepared by an earlier test in this worker, with parameters this run does
                # not have (the demo refund's own reads all do: counted below)
                continue
            args = {k: params[k] for k in names}
            mine = await conn.execute(stmt, args)
            assert isinstance(mine, fastsql.Rows), stmt  # it went by its plan
            theirs = await (await tx.conn.connection()).execute(stmt, args)
            got = [dict(r._mapping) for r in mine]
            assert got == [dict(r._mapping) for r in theirs], str(stmt)
            assert [tuple(r) for r in mine] == [tuple(r) for r in got and mine]
            compared += bool(got)
    assert compared >= 6  # most found rows: the comparison compared something


async def test_returning_rowcount_and_attribute_access(db: Database) -> None:
    await insert_run(db, "r2")
    async with db.write() as tx:
        lease = await tx.runs.acquire_lease("r2", owner="w1", now=T0,
                                            until=T0 + timedelta(minutes=1))
        assert lease is not None and lease.run.lease_owner == "w1"
        assert lease.run.lease_expires_at == T0 + timedelta(minutes=1)
        assert await tx.runs.renew_lease("r2", owner="w1", now=T0,
                                         until=T0 + timedelta(minutes=2))
        assert not await tx.runs.renew_lease("r2", owner="w2", now=T0,
                                             until=T0 + timedelta(minutes=2))
        cancel = await tx.runs.checkpoint("r2", owner="w1", step=1, next_seq=3,
                                          status="running", now=T0,
                                          lease_until=T0 + timedelta(minutes=3),
                                          release=False)
        assert cancel is not None and not cancel
        row = (await tx.runs.conn.execute(runs_repo._GET, {"rid": "r2"})).one()
        assert isinstance(row, fastsql.Row)
        assert row.step == 1 and row[row._keys.index("next_seq")] == 3
        with pytest.raises(AttributeError):
            row.no_such_column  # noqa: B018
        assert (await tx.runs.conn.execute(runs_repo._GET, {"rid": "nope"})).first() is None


async def test_a_driver_error_is_sqlalchemys_and_changes_nothing(db: Database) -> None:
    await insert_run(db, "r3")
    async with db.write() as tx:
        await tx.events.append("r3", 0, 0, [(1, "{}")])
    with pytest.raises(IntegrityError):  # the same key twice: what callers catch
        async with db.write() as tx:
            await tx.events.append("r3", 1, 0, [(1, "{}")])
            await tx.events.append("r3", 1, 0, [(1, "{}")])
    async with db.read() as tx:
        assert [e.seq for e in await tx.events.load("r3")] == [0]  # rolled back whole
    async with db.write() as tx:  # the next writer starts on a fresh connection
        await tx.events.append("r3", 1, 0, [(1, "{}")])
    async with db.read() as tx:
        assert [e.seq for e in await tx.events.load("r3")] == [0, 1]


@pytest.mark.sqlite
async def test_what_a_plan_cannot_cover_goes_through_sqlalchemy(sdb: Database) -> None:
    await insert_run(sdb, "r4")
    dialect = sdb.engine.dialect
    # an IN list the caller passes: its SQL depends on its length
    expecting = runs_repo._update(("status",), True)
    assert fastsql._PREPARED[expecting].plan(
        dialect, frozenset({"rid", "expect", "v_status"})) is None
    async with sdb.write() as tx:
        assert await tx.runs.update("r4", expect_status=["running", "waiting"],
                                    status="cancelled")
    # a constant IN list is rendered once, as SQLAlchemy renders it per call
    assert "IN (?, ?)" in fastsql._PREPARED[approvals_repo._transition(
        "approved", ("pending", "proposed"), (), False, False)].plan(
        dialect, frozenset({"aid"})).sql
    # a write outside a transaction could wait for the lock: never on the loop's thread
    async with sdb.read() as tx:
        res = await tx.runs.conn.execute(runs_repo._RELEASE, {"rid": "r4", "owner": "x"})
        assert not isinstance(res, fastsql.Rows)


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_postgresql_takes_the_plan_path_in_writes_and_reads(db: Database) -> None:
    await insert_run(db, "r5")
    async with db.write() as tx:
        res = await tx.runs.conn.execute(runs_repo._GET, {"rid": "r5"})
        assert isinstance(res, fastsql.Rows) and res.one().id == "r5"
    for snapshot in (False, True):
        async with db.read(snapshot=snapshot) as tx:
            res = await tx.runs.conn.execute(runs_repo._GET, {"rid": "nope"})
            assert isinstance(res, fastsql.Rows) and res.first() is None


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_a_planned_statement_on_a_connection_the_server_ended_is_retried(
        db: Database) -> None:
    # as through SQLAlchemy: the connection is invalidated, the error says so, and a
    # transaction that never reached COMMIT runs again on a fresh connection
    import asyncpg  # type: ignore[import-untyped]

    from tests.conftest import PG_ADMIN_URL

    await insert_run(db, "r6")
    killer = await asyncpg.connect(f"{PG_ADMIN_URL.rsplit('/', 1)[0]}/{db.url.database}")
    attempts = 0

    async def work(tx: Any) -> str:
        nonlocal attempts
        attempts += 1
        if attempts == 1:
            pid = (await tx.conn.execute(text("SELECT pg_backend_pid()"))).scalar_one()
            await killer.fetch("SELECT pg_terminate_backend($1, 5000)", pid)
        run = await tx.runs.get("r6")  # by plan: on the dead connection the first time
        return str(run.id)

    try:
        assert await db.transact(work, what="a planned statement on a dead connection") \
            == "r6"
    finally:
        await killer.close()
    assert attempts == 2


@pytest.mark.sqlite
async def test_a_plain_read_checks_out_a_sqlalchemy_connection_only_when_needed(
        sdb: Database) -> None:
    await insert_run(sdb, "r5")
    pool = sdb.engine.pool
    held = pool.checkedout()  # the write connection, kept between write transactions
    async with sdb.read() as tx:
        assert (await tx.runs.get("r5")) is not None  # planned: the driver's connection
        assert pool.checkedout() == held
        assert await tx.runs.count_by_status() == {"running": 1}  # not planned
        assert pool.checkedout() == held + 1
    assert pool.checkedout() == held  # given back with the read
    for _ in range(3):  # one idle driver connection serves reads one after another
        async with sdb.read() as tx:
            await tx.runs.get("r5")
    assert len(sdb._readers) == 1
    async with sdb.write() as tx:
        await tx.runs.update("r5", step=7)
    async with sdb.read() as tx:  # the same pooled connection sees the latest commit
        run = await tx.runs.get("r5")
        assert run is not None and run.step == 7


@pytest.mark.sqlite
async def test_a_write_waiting_on_another_process_lock_fails_retryably(
        sqlite_url: str) -> None:
    """BEGIN IMMEDIATE is said on the driver connection: a lock held elsewhere past the
    busy timeout is SQLAlchemy's OperationalError, which transact() retries."""
    import sqlite3

    from approvald.store.db import is_retryable
    from sqlalchemy.exc import OperationalError

    d = Database(sqlite_url, busy_timeout_ms=50, fast_path=True)
    other = sqlite3.connect(d.url.database, isolation_level=None)
    try:
        await insert_run(d, "r6")
        other.execute("BEGIN IMMEDIATE")  # another process's writer
        with pytest.raises(OperationalError) as caught:
            async with d.write() as tx:
                await tx.runs.update("r6", step=1)
        assert is_retryable(caught.value) and "locked" in str(caught.value)
        other.execute("ROLLBACK")
        async with d.write() as tx:  # and the same connection writes once it is free
            assert await tx.runs.update("r6", step=2)
        async with d.read() as tx:
            run = await tx.runs.get("r6")
            assert run is not None and run.step == 2
    finally:
        other.close()
        await d.close()


@pytest.mark.sqlite
async def test_a_free_write_lock_is_taken_without_a_hop_to_the_driver_thread(
        sdb: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    """BEGIN IMMEDIATE on a free lock runs right on the loop: of a transaction only its
    COMMIT (which waits for the disk) goes to the driver's thread."""
    import aiosqlite

    await insert_run(sdb, "r8")
    hops: list[str] = []
    real = aiosqlite.Connection._execute

    async def counted(self: Any, fn: Any, *args: Any, **kwargs: Any) -> Any:
        hops.append(str(args[0]) if args else getattr(fn, "__name__", "?"))
        return await real(self, fn, *args, **kwargs)

    monkeypatch.setattr(aiosqlite.Connection, "_execute", counted)
    for step in (1, 2):
        async with sdb.write() as tx:
            assert await tx.runs.update("r8", step=step)
    assert hops == ["COMMIT", "COMMIT"]


@pytest.mark.sqlite
async def test_a_write_waits_off_the_loop_for_another_process_lock(sqlite_url: str) -> None:
    """When another process holds SQLite's write lock, BEGIN waits for it on the driver's
    thread (up to the busy timeout) while the loop goes on, then writes; the write
    connection's own busy timeout is back to 0 afterwards (nothing on the loop waits)."""
    import asyncio
    import sqlite3

    d = Database(sqlite_url, busy_timeout_ms=10_000, fast_path=True)
    other = sqlite3.connect(d.url.database, isolation_level=None)
    try:
        await insert_run(d, "r9")
        other.execute("BEGIN IMMEDIATE")  # another process's writer

        async def write() -> None:
            async with d.write() as tx:
                assert await tx.runs.update("r9", step=3)

        task = asyncio.create_task(write())
        ticks = 0
        while ticks < 20:  # the loop keeps turning while the write waits
            await asyncio.sleep(0)
            ticks += 1
        assert not task.done()
        other.execute("ROLLBACK")
        await asyncio.wait_for(task, 10)
        async with d.read() as tx:
            run = await tx.runs.get("r9")
            assert run is not None and run.step == 3
        assert d._writer is not None
        raw = d._writer.sync_connection.connection.driver_connection  # type: ignore[union-attr]
        assert raw._conn.execute("PRAGMA busy_timeout").fetchone()[0] == 0
    finally:
        other.close()
        await d.close()


@pytest.mark.sqlite
async def test_a_write_cancelled_while_its_begin_waits_leaves_no_transaction_behind(
        sqlite_url: str) -> None:
    """A write cancelled while its BEGIN IMMEDIATE waits on the driver's thread for
    another process's lock: that BEGIN may still start a transaction there once the lock
    is free, so its connection is never written on again (the next write opens another,
    and is not refused as a transaction within a transaction)."""
    import asyncio
    import sqlite3

    d = Database(sqlite_url, busy_timeout_ms=10_000, fast_path=True)
    other = sqlite3.connect(d.url.database, isolation_level=None)
    try:
        await insert_run(d, "r10")
        other.execute("BEGIN IMMEDIATE")  # another process's writer

        async def write() -> None:
            async with d.write() as tx:
                await tx.runs.update("r10", step=4)

        task = asyncio.create_task(write())
        for _ in range(20):  # its BEGIN is waiting on the driver's thread
            await asyncio.sleep(0)
        assert not task.done()
        task.cancel()
        other.execute("ROLLBACK")  # the lock is free: that BEGIN goes through
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 10)
        async with d.write() as tx:
            assert await tx.runs.update("r10", step=5)
        async with d.read() as tx:
            run = await tx.runs.get("r10")
            assert run is not None and run.step == 5
    finally:
        other.close()
        await d.close()


@pytest.mark.sqlite
async def test_a_write_cancelled_midway_leaves_nothing_and_the_next_one_works(
        sdb: Database) -> None:
    import asyncio

    await insert_run(sdb, "r7")
    inside = asyncio.Event()

    async def stuck() -> None:
        async with sdb.write() as tx:
            await tx.runs.update("r7", step=5)
            inside.set()
            await asyncio.Event().wait()  # cancelled here, mid-transaction

    task = asyncio.create_task(stuck())
    await inside.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    async with sdb.write() as tx:  # on a fresh connection; the lock was rolled back
        assert await tx.runs.update("r7", next_seq=9)
    async with sdb.read() as tx:
        run = await tx.runs.get("r7")
        assert run is not None and (run.step, run.next_seq) == (0, 9)


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_a_lease_prepares_a_statement_once_and_again_after_the_server_changed_it(
        db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    """A kept connection keeps its prepared statements (one look-up a statement, not the
    adapter's cache); one the server invalidated (a column's type changed under it) fails
    once, as through SQLAlchemy, and is prepared again on its next use instead of being
    handed back closed."""
    from sqlalchemy import Integer, bindparam, column, table
    from sqlalchemy.dialects.postgresql.asyncpg import AsyncAdapt_asyncpg_connection
    from sqlalchemy.exc import DBAPIError

    probe = table("plan_probe", column("id", sa_types.Text), column("n", Integer))
    stmt = fastsql.fast(select(probe.c.id, probe.c.n).where(probe.c.id == bindparam("id")))
    prepared: list[str] = []
    real = AsyncAdapt_asyncpg_connection._prepare

    async def counting(self: Any, sql: str, ts: Any) -> Any:
        prepared.append(sql)
        return await real(self, sql, ts)

    monkeypatch.setattr(AsyncAdapt_asyncpg_connection, "_prepare", counting)

    async def ddl(sql: str) -> None:
        async with db.connection() as c:
            await c.execute(text(sql))
            await c.commit()

    async def read() -> Any:
        async with db.read() as tx:
            res = await tx.conn.execute(stmt, {"id": "a"})
            assert isinstance(res, fastsql.Rows)
            return res.one()

    await ddl("CREATE TABLE plan_probe (id text PRIMARY KEY, n integer)")
    try:
        await ddl("INSERT INTO plan_probe VALUES ('a', 1)")
        for _ in range(3):
            assert await read() == ("a", 1)
        # once, on the connection kept for reads
        assert len([q for q in prepared if "FROM plan_probe" in q]) == 1
        await ddl("ALTER TABLE plan_probe ALTER COLUMN n TYPE bigint")
        failed = []
        for _ in range(4):
            try:
                assert await read() == ("a", 1)
            except DBAPIError as exc:
                failed.append(str(exc.orig))
        assert len(failed) == 1 and "cached statement plan is invalid" in failed[0], failed
    finally:
        await ddl("DROP TABLE plan_probe")
