"""Round trips to PostgreSQL that a decision does not need (issue 14).

Only a write (or a snapshot read) opens a transaction, and a burst keeps the connections
it opened.

Every BEGIN is a round trip to the server ahead of the work, and a COMMIT or ROLLBACK is
another. ``pool_pre_ping`` said BEGIN, an empty statement and ROLLBACK before every
transaction, and plain reads, which at READ COMMITTED see a snapshot per statement
anyway, were wrapped in BEGIN and COMMIT. Counted here over one whole decision, from the
Approve to the completed run, with asyncpg's own transaction calls.
"""

from __future__ import annotations

import asyncio
import collections
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import pytest
from approvald.runtime.approvals.decide import Actor
from approvald.runtime.engine import assemble
from approvald.runtime.kernel.outcomes import Completed, Paused
from approvald.runtime.runs.agent import Registry
from approvald.runtime.runs.demo import REFUND_POLICY, DemoLedger, refund_agent
from approvald.store.db import Database
from approvald.store.repos import Tx
from sqlalchemy import event, text
from sqlalchemy.ext.asyncio import AsyncConnection

from tests.conftest import SIGNER
from tests.unit.test_decisions import card_token

pytestmark = pytest.mark.parametrize("db_url", ["postgres"], indirect=True)


class Counted:
    """asyncpg's BEGIN/COMMIT/ROLLBACK and SQLAlchemy's pings, and the ``Database``'s
    write transactions and snapshot reads, while ``on``."""

    def __init__(self, db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
        self.on = False
        self.n: collections.Counter[str] = collections.Counter()
        tr = asyncpg.transaction.Transaction
        for name in ("start", "commit", "rollback"):
            monkeypatch.setattr(tr, name, self._wrap(getattr(tr, name), name))
        fetchrow = asyncpg.connection.Connection.fetchrow

        async def pinged(conn: Any, query: str, *args: Any, **kwargs: Any) -> Any:
            if query == ";" and self.on:
                self.n["ping"] += 1
            return await fetchrow(conn, query, *args, **kwargs)

        monkeypatch.setattr(asyncpg.connection.Connection, "fetchrow", pinged)
        write, read = db.write, db.read

        def counted_write(**kw: Any) -> Any:
            if self.on:
                self.n["write"] += 1
            return write(**kw)

        def counted_read(*, snapshot: bool = False) -> Any:
            if self.on and snapshot:
                self.n["snapshot read"] += 1
            return read(snapshot=snapshot)

        monkeypatch.setattr(db, "write", counted_write)
        monkeypatch.setattr(db, "read", counted_read)

    def _wrap(self, real: Any, name: str) -> Any:
        async def counted(tr: Any, *args: Any, **kwargs: Any) -> Any:
            if self.on:
                self.n[name] += 1
            return await real(tr, *args, **kwargs)
        return counted


async def test_a_plain_read_says_no_begin(db: Database,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    counted = Counted(db, monkeypatch)
    async with db.read() as tx:  # a connection in the pool
        await tx.conn.execute(text("SELECT 1"))
    counted.on = True
    async with db.read() as tx:
        assert (await tx.conn.execute(text("SELECT 1"))).scalar_one() == 1
        assert (await tx.conn.execute(text("SELECT 2"))).scalar_one() == 2
    assert dict(counted.n) == {}
    async with db.read(snapshot=True) as tx:  # one snapshot across statements: a transaction
        assert (await tx.conn.execute(text("SHOW transaction_isolation"))).scalar_one() \
            == "repeatable read"
    assert dict(counted.n) == {"snapshot read": 1, "start": 1, "commit": 1}
    async with db.read() as tx:  # the pooled connection is back at its own level
        assert (await tx.conn.execute(text("SHOW transaction_isolation"))).scalar_one() \
            == "read committed"


async def test_a_decision_begins_only_its_writes(db: Database, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    ledger = DemoLedger(str(tmp_path / "ledger.json"))
    engine = assemble(db, Registry([refund_agent(ledger, approval=REFUND_POLICY)]),
                    signer=SIGNER)
    counted = Counted(db, monkeypatch)
    paused = await engine.run("demo-refund", "Refund order A-1001, customer was double "
                              "charged", requested_by="U_DANA")
    assert isinstance(paused, Paused)
    approval = await engine.approval(paused.approval_ids[0])
    counted.on = True
    await engine.decide(approval.id, actor=Actor("U_ALICE", "slack"), verdict="approve",
                        token=card_token(approval))
    assert isinstance(await engine.advance(approval.run_id), Completed)
    n = counted.n
    assert n["write"] >= 3  # the decision, the call's intent and its result at least
    # a BEGIN per write transaction and snapshot read, each ended once; nothing else
    assert (n["start"], n["ping"]) == (n["write"] + n["snapshot read"], 0), dict(n)
    assert n["commit"] + n["rollback"] == n["start"], dict(n)


async def test_a_burst_keeps_the_connections_it_opened(db: Database) -> None:
    # Connections past the pool's size were closed again on check-in, so each burst
    # opened them anew: a TCP and authentication handshake, then every statement
    # prepared again on the fresh connection (a round trip each); py-spy put that at
    # ~20% of serve's time during 200 clicks on PostgreSQL.
    connects: list[int] = []
    event.listen(db.engine.sync_engine, "connect", lambda *_: connects.append(1))
    together = asyncio.Barrier(20)

    async def hold() -> None:  # twenty transactions at once, each on its own connection
        async with db.read() as tx:
            await tx.conn.execute(text("SELECT 1"))
            await together.wait()

    await asyncio.gather(*(hold() for _ in range(20)))
    assert len(connects) == 20
    await asyncio.gather(*(hold() for _ in range(20)))
    assert len(connects) == 20  # the second burst opened none


T0 = datetime(2026, 1, 1, tzinfo=UTC)


async def _pid(tx: Tx) -> int:
    """The server process of the connection ``tx`` runs on (asked of asyncpg: no
    statement sent)."""
    raw = await (await tx.conn.connection()).get_raw_connection()
    return int(raw.driver_connection.get_server_pid())


async def test_transactions_keep_their_connection_checked_out(
        db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Issue 50: every write, write of one statement and plain read checked a connection
    # out of the pool and back in (events, a rollback on return), and each autocommit one
    # set the connection's isolation level to AUTOCOMMIT and back: ~10 checkouts and ~11
    # level sets per approval. A connection is now kept between them (store/leases.py).
    d = Database(db_url, server_time=False, fast_path=True)
    checkouts: list[int] = []
    event.listen(d.engine.sync_engine, "checkout", lambda *_: checkouts.append(1))
    levels: list[str] = []
    set_level = d.engine.dialect.set_isolation_level

    def counted(dbapi_conn: Any, level: str) -> None:
        levels.append(level)
        set_level(dbapi_conn, level)

    monkeypatch.setattr(d.engine.dialect, "set_isolation_level", counted)
    try:
        async with d.read() as tx:  # the one checkout
            await tx.runs.get("no-such-run")
        assert len(checkouts) == 1
        for _ in range(5):
            async with d.write() as tx:
                await tx.runs.renew_lease("no-such-run", owner="w", now=T0, until=T0)
            async with d.write_one() as tx:
                await tx.runs.renew_lease("no-such-run", owner="w", now=T0, until=T0)
            async with d.read() as tx:
                await tx.runs.get("no-such-run")
                await tx.conn.execute(text("SELECT 1"))  # SQLAlchemy's own, on it too
        assert (len(checkouts), levels) == (1, [])
    finally:
        await d.close()


@pytest.mark.parametrize("through", ["plans", "sqlalchemy"])
async def test_a_kept_connection_rolls_back_and_is_kept(db_url: str, through: str) -> None:
    # A read and a write of one statement switch the connection to autocommit for their
    # statements; the write after them is a transaction again (its error undoes its
    # insert), and the rollback leaves the connection fit to keep.
    d = Database(db_url, server_time=False, fast_path=True)
    try:
        async with d.read() as tx:
            pid = await _pid(tx)
        async with d.write_one() as tx:
            await tx.runs.renew_lease("no-such-run", owner="w", now=T0, until=T0)
        with pytest.raises(RuntimeError, match="undo"):
            async with d.write() as tx:
                if through == "sqlalchemy":  # SQLAlchemy begins the transaction
                    await tx.conn.execute(text("SELECT 1"))
                await tx.runs.create(run_id="r-undone", agent="a", task="t",
                                     requested_by="U", instructions_version="v", now=T0)
                assert await _pid(tx) == pid
                raise RuntimeError("undo")
        async with d.read() as tx:
            assert await tx.runs.get("r-undone") is None
            assert await _pid(tx) == pid  # kept, not replaced
            assert not (await tx.conn.connection()).in_transaction()
    finally:
        await d.close()


async def test_a_decision_sends_every_statement_by_its_plan(
        db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A statement SQLAlchemy executes costs several times a planned one, and began its
    # own transaction on the connection: the decision's locks, the lease taken to resume
    # and the call's intent went that way, not registered for a plan (issue 50).
    d = Database(db_url, server_time=False, fast_path=True)
    try:
        ledger = DemoLedger(str(tmp_path / "ledger.json"))
        engine = assemble(d, Registry([refund_agent(ledger, approval=REFUND_POLICY)]),
                          signer=SIGNER)
        paused = await engine.run("demo-refund", "Refund order A-1001, customer was "
                                  "double charged", requested_by="U_DANA")
        assert isinstance(paused, Paused)
        approval = await engine.approval(paused.approval_ids[0])
        by_sqlalchemy: list[str] = []
        execute = AsyncConnection.execute

        async def counted(conn: Any, stmt: Any, *args: Any, **kwargs: Any) -> Any:
            by_sqlalchemy.append(" ".join(str(stmt).split())[:80])
            return await execute(conn, stmt, *args, **kwargs)

        monkeypatch.setattr(AsyncConnection, "execute", counted)
        await engine.decide(approval.id, actor=Actor("U_ALICE", "slack"), verdict="approve",
                            token=card_token(approval))
        assert isinstance(await engine.advance(approval.run_id), Completed)
        assert by_sqlalchemy == []
    finally:
        await d.close()
