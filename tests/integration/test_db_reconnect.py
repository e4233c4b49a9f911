"""PostgreSQL connections the server ends (a restart, ``pg_terminate_backend``, a failover).

A transaction whose connection died before COMMIT was rolled back by the server, so
:meth:`Database.transact` runs it again on a fresh connection; one that died at COMMIT may
or may not have committed, so it is not run again. A pooled connection the server ended is
replaced on checkout (``store/liveness.py``), however asyncpg words the failure: without a
round trip when asyncpg has read the connection's end, with a ping when it idled.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import pytest
from approvald.store.db import Database
from approvald.store.repos import Tx
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from tests.conftest import PG_ADMIN_URL

pytestmark = pytest.mark.parametrize("db_url", ["postgres"], indirect=True)


async def admin(db: Database) -> Any:
    """A connection to the test database outside ``db``'s pool."""
    return await asyncpg.connect(f"{PG_ADMIN_URL.rsplit('/', 1)[0]}/{db.url.database}",
                                 timeout=5)


@pytest.fixture
async def probe(db: Database) -> None:
    """A table of its own for these tests to write to (the schema's are not theirs)."""
    async with db.write() as tx:
        await tx.conn.execute(text("CREATE TABLE IF NOT EXISTS reconnect_probe "
                                   "(id TEXT PRIMARY KEY, note TEXT NOT NULL)"))
        await tx.conn.execute(text("DELETE FROM reconnect_probe"))


async def write(tx: Tx, row_id: str, note: str) -> None:
    await tx.conn.execute(text("INSERT INTO reconnect_probe VALUES (:id, :note)"),
                          {"id": row_id, "note": note})


async def rows(db: Database, note: str) -> int:
    async with db.read() as tx:
        found = await tx.conn.execute(
            text("SELECT count(*) FROM reconnect_probe WHERE note = :n"), {"n": note})
        return int(found.scalar_one())


async def test_a_transaction_whose_connection_died_runs_again(db: Database,
                                                             probe: None) -> None:
    attempts = 0

    async def work(tx: Tx) -> str:
        nonlocal attempts
        attempts += 1
        await write(tx, f"row-{attempts}", "reconnect")
        if attempts == 1:  # the server ends the connection in the middle of the transaction
            await tx.conn.execute(text("SELECT pg_terminate_backend(pg_backend_pid())"))
        return f"row-{attempts}"

    assert await db.transact(work, what="a doomed transaction") == "row-2"
    assert attempts == 2
    assert await rows(db, "reconnect") == 1  # the first attempt was rolled back


async def test_a_connection_lost_at_commit_is_not_run_again(db: Database,
                                                            probe: None) -> None:
    attempts = 0
    killer = await admin(db)

    async def work(tx: Tx) -> None:
        nonlocal attempts
        attempts += 1
        await write(tx, f"row-{attempts}", "ambiguous")
        pid = (await tx.conn.execute(text("SELECT pg_backend_pid()"))).scalar_one()
        await killer.execute("SELECT pg_terminate_backend($1)", pid)
        await asyncio.sleep(0.2)  # the connection is gone before COMMIT is sent

    try:
        with pytest.raises(DBAPIError):
            await db.transact(work, what="a transaction that dies at COMMIT")
    finally:
        await killer.close()
    # had COMMIT reached the server, running it again could have done it twice
    assert attempts == 1
    assert await rows(db, "ambiguous") == 0


async def one(db: Database) -> int:
    async with db.read() as tx:
        return int((await tx.conn.execute(text("SELECT 1"))).scalar_one())


class Pings:
    """Counts SQLAlchemy's ping (an empty statement) on every asyncpg connection; with
    ``fail_first``, the first one fails the way asyncpg fails on a connection the server
    ended whose end it has not read yet."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *, fail_first: bool = False) -> None:
        self.seen: list[str] = []
        fetchrow = asyncpg.connection.Connection.fetchrow

        async def counted(conn: Any, query: str, *args: Any, **kwargs: Any) -> Any:
            if query == ";":
                self.seen.append(query)
                if fail_first and len(self.seen) == 1:
                    raise asyncpg.exceptions.InternalClientError(
                        "cannot switch to state 12; another operation (2) is in progress")
            return await fetchrow(conn, query, *args, **kwargs)

        monkeypatch.setattr(asyncpg.connection.Connection, "fetchrow", counted)


class Monotonic:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def manual_clock(db: Database) -> Monotonic:
    assert db.liveness is not None
    clock = Monotonic()
    db.liveness.clock = clock
    return clock


async def test_pooled_connections_the_server_ended_are_replaced(db: Database) -> None:
    # used moments ago, so not pinged: asyncpg has read their end, which is enough
    assert await asyncio.gather(*(one(db) for _ in range(5))) == [1] * 5  # five in the pool
    killer = await admin(db)
    try:  # the timeout waits until each backend has really exited
        ended = await killer.fetch(
            "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()")
    finally:
        await killer.close()
    assert len(ended) >= 5 and all(row[0] for row in ended)
    assert await asyncio.gather(*(one(db) for _ in range(5))) == [1] * 5


async def test_only_a_connection_that_idled_is_pinged(db: Database,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # pool_pre_ping asked the server (BEGIN, an empty statement, ROLLBACK) before every
    # transaction; a connection used less than a second ago is now trusted
    clock = manual_clock(db)
    pings = Pings(monkeypatch)
    for _ in range(10):
        assert await one(db) == 1
        clock.now += 0.5
    assert pings.seen == []
    clock.now += 1.0  # idle for a second and a half: it is asked
    assert await one(db) == 1
    assert pings.seen == [";"]
    assert await one(db) == 1  # and trusted again right after
    assert pings.seen == [";"]


async def test_the_ping_replaces_a_connection_asyncpg_calls_busy(
        db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    # When the server ends a connection, asyncpg reads its last message before the end of
    # the socket; a use in between fails with "another operation is in progress" rather
    # than "connection is closed". That is the server gone too: the ping must reconnect.
    clock = manual_clock(db)
    assert await one(db) == 1  # one pooled connection
    pings = Pings(monkeypatch, fail_first=True)
    clock.now += 60  # it idled: it is pinged, and the ping fails
    async with db.read() as tx:
        assert (await tx.conn.execute(text("SELECT 2"))).scalar_one() == 2
    assert pings.seen == [";"]  # the new connection, just made, needs no ping


async def test_a_connection_lost_at_a_planned_commit_is_not_run_again(db: Database) -> None:
    # the transaction's only statement went by its plan (store/fastsql.py), so its COMMIT
    # is said on the driver's adapter (store/leases.py), not by SQLAlchemy
    attempts = 0
    killer = await admin(db)

    async def work(tx: Tx) -> None:
        nonlocal attempts
        attempts += 1
        await tx.runs.create(run_id=f"r-{attempts}", agent="a", task="t", requested_by="U",
                             instructions_version="v", now=datetime(2026, 1, 1, tzinfo=UTC))
        raw = await (await tx.conn.connection()).get_raw_connection()
        await killer.execute("SELECT pg_terminate_backend($1)",
                             raw.driver_connection.get_server_pid())
        await asyncio.sleep(0.2)  # the connection is gone before COMMIT is sent

    try:
        with pytest.raises(DBAPIError) as lost:
            await db.transact(work, what="a transaction that dies at COMMIT")
    finally:
        await killer.close()
    assert attempts == 1
    assert lost.value.connection_invalidated and lost.value.statement is None
    async with db.read() as tx:
        assert await tx.runs.get("r-1") is None


async def _pids(db: Database, n: int) -> set[int]:
    """The server processes of ``n`` connections in use at once."""
    together = asyncio.Barrier(n)

    async def pid() -> int:
        async with db.read() as tx:
            found = int((await tx.conn.execute(text("SELECT pg_backend_pid()"))).scalar_one())
            await together.wait()
            return found

    return set(await asyncio.gather(*(pid() for _ in range(n))))


async def test_a_disconnect_replaces_every_connection_from_before_it(db: Database) -> None:
    # SQLAlchemy takes a statement's lost connection as the whole pool's: every connection
    # checked out before it is replaced on its next checkout, and so is every connection
    # kept checked out between transactions (store/leases.py) on its next use
    before = await _pids(db, 3)
    assert len(before) == 3
    with pytest.raises(DBAPIError) as lost:
        async with db.write() as tx:
            await tx.conn.execute(text("SELECT pg_terminate_backend(pg_backend_pid())"))
    assert lost.value.connection_invalidated
    after = await _pids(db, 3)
    assert len(after) == 3 and not after & before
