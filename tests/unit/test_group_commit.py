"""Group commit (issue 50): on PostgreSQL the auto decisions that arrive while one of this
process's chained statements is in flight are written together, in the next one.

An answer at once is one statement sent alone (the request, its run, its start and its
audit entries, chained to the head this process last left). One process sends those
statements one at a time (each guesses the head the one before leaves), so alone they
cap a ``serve`` at one decision per round trip. The decisions that arrive meanwhile join
one batch: its first member leads it; given the turn, one statement carries every
member's rows and all their entries, written whole or not at all. A member whose rows do
not hold (its key taken, its token revoked) fails the statement whole: then each member
is written alone, as a transaction, and only that one is refused. The statement runs in
a task that holds the connection its leader handed over, so the leader's cancellation (a
hook's time budget) does not cut it under the others. PostgreSQL only: SQLite has no
data-modifying CTE, and its writer is alone.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from typing import Any

import pytest
from approvald.runtime.engine import Engine
from approvald.runtime.runs import external
from approvald.runtime.runs.external import NewRequest

from tests.helpers import Rows, create_token, parts, revoke_token
from tests.unit.test_intake_statements import (  # noqa: F401  (a fixture)
    KEYS,
    POLICY,
    Statements,
    statements,
)

PG = pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
CHAINED = "WITH guessed"  # how a statement sent alone with its rows and entries begins


class Held:
    """The ``nth`` chained statement sent alone (counted from 1, as this test sends them)
    held before the driver sends it, until ``release`` is set: ``sent`` is set then, and
    ``pid`` is its connection's server process."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, nth: int) -> None:
        import asyncpg.prepared_stmt  # type: ignore[import-untyped]

        self.sent, self.release = asyncio.Event(), asyncio.Event()
        self.seen = 0
        self.pid = 0
        fetch = asyncpg.prepared_stmt.PreparedStatement.fetch
        held = self

        async def fetched(stmt: Any, *args: Any, **kwargs: Any) -> Any:
            if stmt._query.startswith(CHAINED):
                held.seen += 1
                if held.seen == nth:
                    held.pid = stmt._connection.get_server_pid()
                    held.sent.set()
                    await held.release.wait()
            return await fetch(stmt, *args, **kwargs)

        monkeypatch.setattr(asyncpg.prepared_stmt.PreparedStatement, "fetch", fetched)


def joined(monkeypatch: pytest.MonkeyPatch, engine: Engine) -> Callable[[int], Any]:
    """``await joined(n)``: until ``n`` chainings of ``engine`` have reached their chain's
    turn (joined a batch, or found no statement in flight), counted as they come."""
    trail = parts(engine).audit
    come: list[int] = []
    changed = asyncio.Event()
    chain = trail._chain

    async def counted(tx: Any) -> None:
        task = asyncio.ensure_future(chain(tx))
        # its first step: its rows worked out, its place taken (it sends nothing before)
        await asyncio.sleep(0)
        come.append(1)
        changed.set()
        await task

    trail._chain = counted

    async def until(n: int) -> None:
        while len(come) < n:
            changed.clear()
            await changed.wait()

    return until


async def _engine(make_engine: Callable[..., Engine]) -> tuple[Engine, Any]:
    engine = make_engine(policy=POLICY)
    made = await create_token(engine, KEYS, "bot", created_by="test", via="test",
                              tools="*")
    await engine.open_request(made.record, NewRequest(  # connections opened, head known
        tool="read_metrics", args={"n": -1}, requested_by="U_DANA"))
    return engine, made.record


def _ask(engine: Engine, token: Any, i: int, **kw: Any) -> asyncio.Task[Any]:
    return asyncio.ensure_future(engine.open_request(token, NewRequest(
        tool="read_metrics", args={"n": i}, requested_by="U_DANA", **kw)))


def _begun(sent: list[str]) -> int:
    """The write transactions begun (``BEGIN``; without the fast path, at its isolation
    level), not a snapshot's read (``REPEATABLE READ``)."""
    return sum(s.startswith("BEGIN") and "REPEATABLE" not in s for s in sent)


async def _chained_whole(engine: Engine, ids: set[str]) -> None:
    """Each of ``ids`` has its request, its run and its two entries, once; one chain."""
    report = await Rows.of(engine).verify_audit()
    assert report.ok, report.problems
    entries = await Rows.of(engine).audit()
    assert [e.seq for e in entries] == list(range(1, len(entries) + 1))
    mine = collections.defaultdict(list)
    for e in entries:
        mine[e.run_id].append(e.action)
    for rid in ids:
        assert mine[rid] == ["requested", "approved"], (rid, mine[rid])
        assert await Rows.of(engine).run(rid) is not None


@PG
async def test_decisions_arriving_during_a_statement_are_written_in_one(
        make_engine, statements: Statements, monkeypatch) -> None:  # noqa: F811
    """Five auto decisions arrive while one is in flight: the five are ONE statement
    (two in all for the six, against six one at a time), each answered written, every
    entry chained once, in order."""
    engine, token = await _engine(make_engine)
    held = Held(monkeypatch, 1)
    until = joined(monkeypatch, engine)
    window = statements.during()
    first = _ask(engine, token, 0)
    await held.sent.wait()
    rest = [_ask(engine, token, i) for i in range(1, 6)]
    await until(6)
    held.release.set()
    docs = await asyncio.gather(first, *rest)
    assert all(new and doc["status"] == "approved" for doc, new in docs)
    assert [s.split()[:2] for s in window.sent] == [["WITH", "guessed"]] * 2, window.sent
    await _chained_whole(engine, {doc["id"] for doc, _ in docs})


@PG
@pytest.mark.parametrize("why", ["key_taken", "token_revoked"])
async def test_a_member_whose_rows_do_not_hold_is_refused_alone(
        make_engine, statements: Statements, monkeypatch, why: str) -> None:  # noqa: F811
    """One member of a batch cannot be written (its idempotency key is taken by another
    member of the same batch; its token was revoked after it was kept in memory): the
    statement fails whole, each member is written again alone, as a transaction, and
    only that one is refused (the key's request found, not new; the revoked token's a
    401); the others are written, and the chain is whole."""
    engine, token = await _engine(make_engine)
    if why == "token_revoked":
        other = (await create_token(engine, KEYS, "other", created_by="test", via="test",
                                    tools="*")).record
        await engine.open_request(other, NewRequest(
            tool="read_metrics", args={"n": -2}, requested_by="U_DANA"))
        await revoke_token(engine, "other", by="test", via="test")
    held = Held(monkeypatch, 1)
    until = joined(monkeypatch, engine)
    window = statements.during()
    first = _ask(engine, token, 0)
    await held.sent.wait()
    rest = [_ask(engine, token, i) for i in range(1, 4)]
    if why == "key_taken":  # the same call twice, under one key: found free by both
        odd = [_ask(engine, token, 9, idempotency_key="k"),
               _ask(engine, token, 9, idempotency_key="k")]
    else:
        odd = [asyncio.ensure_future(engine.open_request(other, NewRequest(
            tool="read_metrics", args={"n": 9}, requested_by="U_DANA")))]
    await until(4 + len(odd))
    held.release.set()
    docs = await asyncio.gather(first, *rest)
    outcomes = await asyncio.gather(*odd, return_exceptions=True)
    assert all(new for _, new in docs)
    if why == "key_taken":
        assert sorted(new for _, new in outcomes) == [False, True], outcomes
        assert outcomes[0][0]["id"] == outcomes[1][0]["id"]
        docs += [o for o in outcomes if o[1]]
    else:
        assert isinstance(outcomes[0], external.ExternalError), outcomes
        assert outcomes[0].code == "unauthorized"
    # the batch's statement was sent, failed whole, and its members were written again
    assert sum(s.startswith(CHAINED) for s in window.sent) == 2, window.sent
    assert _begun(window.sent) == 3 + len(odd), window.sent
    await _chained_whole(engine, {doc["id"] for doc, _ in docs})
    runs = [r for r in await Rows.of(engine).runs(limit=50) if r.agent == "external:bot"]
    assert len(runs) == len(docs) + 1  # (the first, before) none without its request


@PG
@pytest.mark.parametrize("when", ["in_flight", "waiting"])
async def test_a_cancelled_leader_loses_none_of_the_others(
        make_engine, statements: Statements, monkeypatch, when: str) -> None:  # noqa: F811
    """The batch's first member (its leader) is cancelled, as a hook's time budget
    cancels its decision: while the batch's statement is in flight (it goes on, on the
    connection the leader handed over: every member's rows written, the leader's too,
    its outcome unknown to its caller), or while the batch waits for its turn (the
    leader's rows left out). The others are written, in one statement."""
    engine, token = await _engine(make_engine)
    held = Held(monkeypatch, 1)
    batch = Held(monkeypatch, 2)
    until = joined(monkeypatch, engine)
    window = statements.during()
    first = _ask(engine, token, 0)
    await held.sent.wait()
    leader = _ask(engine, token, 1)
    await until(2)
    rest = [_ask(engine, token, i) for i in range(2, 5)]
    await until(5)
    if when == "waiting":
        leader.cancel()
        batch.release.set()
    held.release.set()
    if when == "in_flight":
        await batch.sent.wait()
        leader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leader
    batch.release.set()
    docs = await asyncio.gather(first, *rest)
    assert all(new for _, new in docs)
    assert sum(s.startswith(CHAINED) for s in window.sent) == 2, window.sent
    assert _begun(window.sent) == 0, window.sent
    ids = {doc["id"] for doc, _ in docs}
    await _chained_whole(engine, ids)
    runs = [r for r in await Rows.of(engine).runs(limit=50) if r.agent == "external:bot"]
    # the leader's too once its statement was in flight; never a run without its request
    assert len(runs) == 1 + len(ids) + (when == "in_flight")
    await _chained_whole(engine, {r.id for r in runs})


@PG
async def test_a_connection_lost_under_the_batch_is_raised_to_each_member(
        make_engine, statements: Statements, monkeypatch) -> None:  # noqa: F811
    """The batch's connection dies under its statement (the server ended its backend):
    its outcome is unknown (in autocommit it may have committed), so each member is told
    the error, as one decision sent alone would be, and none is written again; the next
    decision finds the head unknown and is chained under its lock, the chain whole."""
    from sqlalchemy.exc import DBAPIError

    engine, token = await _engine(make_engine)
    held = Held(monkeypatch, 1)
    batch = Held(monkeypatch, 2)
    until = joined(monkeypatch, engine)
    window = statements.during()
    first = _ask(engine, token, 0)
    await held.sent.wait()
    rest = [_ask(engine, token, i) for i in range(1, 4)]
    await until(4)
    held.release.set()
    await batch.sent.wait()
    # (ended before the statement is sent: the call waits until the backend is gone)
    await Rows.of(engine).select(f"SELECT pg_terminate_backend({batch.pid}, 10000)")
    batch.release.set()
    await first
    outcomes = await asyncio.gather(*rest, return_exceptions=True)
    assert all(isinstance(o, DBAPIError) for o in outcomes), outcomes
    assert _begun(window.sent) == 0, window.sent  # none written again
    doc, new = await engine.open_request(token, NewRequest(
        tool="read_metrics", args={"n": 9}, requested_by="U_DANA"))
    assert new
    await _chained_whole(engine, {doc["id"]})
    runs = [r for r in await Rows.of(engine).runs(limit=50) if r.agent == "external:bot"]
    assert len(runs) == 3  # the one before, the first, the last: nothing of the batch
