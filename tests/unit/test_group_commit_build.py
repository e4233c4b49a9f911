"""Issue 50: a group commit's statement is one for every batch size (its riders' and
entries' values bound as arrays), built and planned once for each rider kind and shape:
when there was one for each size, met the first time each was (a statement of many CTEs:
25-135 ms of CPU to build and compile), a serve's first minutes under load were spent
building them (34 met in one short benchmark, 1.5 s of CPU). The first time, it is built
and planned on a worker thread, not on the event loop's, where it would stall every call
meanwhile; met again, nothing is built. PostgreSQL only, as group commit is."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import pytest
from approvald.runtime.runs.external import NewRequest
from approvald.store import fastsql
from approvald.store.db import fast_path_setting
from approvald.store.repos import audit as audit_repo

from tests.helpers import Rows
from tests.unit.test_group_commit import (
    CHAINED,
    PG,
    Held,
    _ask,
    _chained_whole,
    _engine,
    joined,
)
from tests.unit.test_intake_statements import (  # noqa: F401  (a fixture)
    Statements,
    statements,
)


async def _batch(monkeypatch: pytest.MonkeyPatch, engine: Any, token: Any, first: int,
                 size: int) -> list[Any]:
    """One decision in flight, then ``size`` arriving meanwhile: written as one batch."""
    held = Held(monkeypatch, 1)
    until = joined(monkeypatch, engine)
    lead = _ask(engine, token, first)
    await held.sent.wait()
    rest = [_ask(engine, token, first + i) for i in range(1, size + 1)]
    await until(size + 1)
    held.release.set()
    return list(await asyncio.gather(lead, *rest))


@PG
async def test_a_batch_statement_met_first_is_built_off_the_event_loop(
        make_engine, statements: Statements, monkeypatch) -> None:  # noqa: F811
    engine, token = await _engine(make_engine)
    audit_repo._append_alone.cache_clear()  # (built by another test in this process)
    monkeypatch.setattr(audit_repo, "_BUILT", set(), raising=False)
    loop = threading.get_ident()
    planned: list[tuple[int, bool]] = []  # (the thread, a batch's statement)
    plan = fastsql._plan

    def spied(stmt: Any, dialect: Any, keys: frozenset[str]) -> Any:
        planned.append((threading.get_ident(), "riders" in keys))
        return plan(stmt, dialect, keys)

    monkeypatch.setattr(fastsql, "_plan", spied)
    primed: list[int] = []  # the threads statements were handed to (a thread each)
    prime = fastsql.Conn.prime

    def primes(conn: Any, stmt: Any, keys: frozenset[str]) -> None:
        primed.append(threading.get_ident())
        prime(conn, stmt, keys)

    monkeypatch.setattr(fastsql.Conn, "prime", primes)
    window = statements.during()
    docs = await _batch(monkeypatch, engine, token, 0, 5)
    assert [s.split()[:2] for s in window.sent] == [["WITH", "guessed"]] * 2, window.sent
    batches = [thread for thread, batch in planned if batch]
    # (APPROVALD_DB_FAST_PATH=0: no plans, the statement alone built on the thread)
    assert len(batches) == fast_path_setting() and loop not in batches, planned
    # the statement sent alone, its cache cleared too, likewise
    assert all(thread != loop for thread, _ in planned), planned
    assert primed and loop not in primed, primed
    planned.clear()
    primed.clear()
    docs += await _batch(monkeypatch, engine, token, 10, 5)  # met again: nothing built,
    assert planned == [] and primed == [], (planned, primed)  # nor handed to a thread
    assert all(new and doc["status"] == "approved" for doc, new in docs)
    await _chained_whole(engine, {doc["id"] for doc, _ in docs})


@PG
async def test_one_statement_serves_every_batch_size(
        make_engine, statements: Statements, monkeypatch) -> None:  # noqa: F811
    """A batch's statement does not depend on how many members it has (its values bound
    as arrays): batches of every size, and a decision sent alone, are one SQL text, built
    and planned once (a prepared statement a connection), not one for each size met,
    which cost a serve seconds of CPU over its first minutes (issue 50: 34 sizes and
    shapes met in one short benchmark, 1.5 s of CPU)."""
    engine, token = await _engine(make_engine)
    audit_repo._append_alone.cache_clear()  # (built by another test in this process)
    monkeypatch.setattr(audit_repo, "_BUILT", set(), raising=False)
    planned: list[str] = []  # the SQL of each plan made for a chained statement
    plan = fastsql._plan

    def spied(stmt: Any, dialect: Any, keys: frozenset[str]) -> Any:
        made = plan(stmt, dialect, keys)
        if made is not None and made.sql.startswith(CHAINED):
            planned.append(made.sql)
        return made

    monkeypatch.setattr(fastsql, "_plan", spied)
    window = statements.during()
    docs: list[Any] = []
    sizes = (1, 2, 3, 5, 7)
    for i, size in enumerate(sizes):
        docs += await _batch(monkeypatch, engine, token, 10 * i, size)
    chained = [s for s in window.sent if s.startswith(CHAINED)]
    assert len(chained) == 2 * len(sizes), chained  # each lead alone, then its batch
    assert len(set(chained)) == 1, sorted(set(chained))
    # (APPROVALD_DB_FAST_PATH=0: no plans)
    assert len(planned) == fast_path_setting(), planned
    assert all(new and doc["status"] == "approved" for doc, new in docs)
    await _chained_whole(engine, {doc["id"] for doc, _ in docs})


@PG
async def test_kept_reports_written_together_are_each_written_as_its_own(
        make_engine, statements: Statements, monkeypatch) -> None:  # noqa: F811
    """Kept calls' reports arriving while one is in flight are ONE statement (their rows
    bound as arrays, a row per report): each run, request and execution gets its own
    report's values, not another's (every call of the batch has the same call id and
    owner: its run tells them apart), and the chain is whole."""
    from approvald.runtime.runs.external import CALL_ID, Report
    engine, token = await _engine(make_engine)
    docs = [(await engine.open_request(token, NewRequest(
        tool="read_metrics", args={"n": i}, requested_by="U_DANA", start_owner="gw")))[0]
        for i in range(5)]

    def report(i: int) -> asyncio.Task[Any]:
        return asyncio.ensure_future(engine.record_request_report(token, docs[i]["id"], Report(
            "succeeded", docs[i]["effective_digest"], {"n": i}, None)))

    held = Held(monkeypatch, 1)
    until = joined(monkeypatch, engine)
    window = statements.during()
    first = report(0)
    await held.sent.wait()
    rest = [report(i) for i in range(1, 5)]
    await until(5)
    held.release.set()
    assert await asyncio.gather(first, *rest) == [True] * 5
    assert [s.split()[:2] for s in window.sent] == [["WITH", "guessed"]] * 2, window.sent
    for i, doc in enumerate(docs):
        run = await Rows.of(engine).run(doc["id"])
        assert run.status == "completed" and json.loads(run.result) == {"n": i}, run
        ran = await Rows.of(engine).execution(doc["id"], CALL_ID)
        assert ran.status == "succeeded" and json.loads(ran.result) == {"n": i}, ran
        after = await engine.request_document(token, doc["id"])
        assert after["result"]["status"] == "succeeded", after
    report_ = await Rows.of(engine).verify_audit()
    assert report_.ok, report_.problems
    actions: dict[str, list[str]] = {}
    for e in await Rows.of(engine).audit():
        actions.setdefault(str(e.run_id), []).append(e.action)
    assert all(actions[d["id"]] == ["requested", "approved", "executed"] for d in docs), \
        actions
