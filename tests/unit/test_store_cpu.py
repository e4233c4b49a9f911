"""Issue 50: the store's Python per statement and per transaction, cut with no change in
what it does. Counted exactly (``sys.setprofile``, each function once per call, a
coroutine resumed not counted again) in the store, its drivers and SQLAlchemy, the event
loop left out (its turns depend on timing)."""

from __future__ import annotations

import dis
import sys
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from approvald.runtime.kernel.clock import SystemClock
from approvald.store import fastsql
from approvald.store.db import Database
from sqlalchemy import exc as sa_exc

from tests.helpers import Rows

T0 = datetime(2026, 12, 1, 9, 30, tzinfo=UTC)
WATCHED = ("/store/", "aiosqlite/", "asyncpg/", "sqlalchemy/")


class Calls:
    """Python calls on this thread, by ``file:function`` (files matching ``WATCHED``)."""

    def __init__(self, watched: tuple[str, ...] = WATCHED) -> None:
        self.seen: Counter[str] = Counter()
        self.watched = watched
        self._first: dict[Any, int] = {}

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        if event != "call":
            return
        code = frame.f_code
        at = self._first.get(code)
        if at is None:  # where a fresh frame stands: a resumed coroutine is further on
            at = self._first[code] = next(
                (i.offset for i in dis.get_instructions(code) if i.opname == "RESUME"), 0)
        if frame.f_lasti <= at and any(w in code.co_filename for w in self.watched):
            self.seen[f"{code.co_filename.rsplit('/', 1)[-1]}:{code.co_qualname}"] += 1

    async def during(self, work: Callable[[], Awaitable[Any]]) -> Counter[str]:
        sys.setprofile(self)
        try:
            await work()
        finally:
            sys.setprofile(None)
        return self.seen


def called(work: Callable[[], Any], *, into_c: bool = False) -> Counter[str]:
    """The Python functions ``work()`` calls on this thread, as ``file:qualified name``
    (``work`` itself left out); ``into_c``: its calls into C instead, by qualified name."""
    seen: Counter[str] = Counter()
    own = getattr(work, "__code__", None)

    def profile(frame: Any, event: str, arg: Any) -> None:
        if into_c:
            if event == "c_call" and arg is not sys.setprofile:
                seen[getattr(arg, "__qualname__", None) or repr(arg)] += 1
        elif event == "call" and frame.f_code is not own:
            code = frame.f_code
            seen[f"{code.co_filename.rsplit('/', 1)[-1]}:{code.co_qualname}"] += 1

    sys.setprofile(profile)
    try:
        work()
    finally:
        sys.setprofile(None)
    return seen


async def _create(db: Database, run_id: str) -> None:
    await Rows(db).in_one_write(lambda tx: tx.runs.create(
        run_id=run_id, agent="a", task="t", requested_by="U", instructions_version="v",
        now=T0))


async def test_a_write_transaction_s_python_calls(db: Database) -> None:
    """One planned INSERT in a write transaction: what the store, its driver and
    SQLAlchemy call around it, exactly. On SQLite its COMMIT goes to the driver's thread
    as one function (no aiosqlite cursor, no awaitable context around it), SQLAlchemy is
    not asked whether it holds a transaction it never began, whether the statement may run
    on the loop is read with no call, and its result is made with no Python call."""
    await _create(db, "r0")  # connections opened, plans made
    # (on PostgreSQL the store's own: asyncpg's protocol calls vary with the server's
    # replies)
    seen = await Calls(WATCHED if db.dialect == "sqlite" else ("/store/",)).during(
        lambda: _create(db, "r1"))
    common = {"__init__.py:Tx.__init__": 1, "__init__.py:Tx.prepare_commit": 1,
              "__init__.py:_Bound.__get__": 1, "base.py:Repo.__init__": 1,
              "db.py:Database.write": 1,
              "fastsql.py (a plan):_f": 1, "fastsql.py:Conn.__init__": 1,
              "fastsql.py:Conn.execute": 1, "runs.py:RunsRepo.create": 1,
              "runs.py:as_inserted": 1, "runs.py:new_run": 1}
    if db.dialect == "sqlite":
        want = {**common,
                "core.py:Connection._execute": 1,
                "core.py:set_result": 1, "db.py:WriteLock.acquire": 1,
                "db.py:WriteLock.release": 1, "db.py:_SQLiteWrite.__aenter__": 1,
                "db.py:_SQLiteWrite.__aexit__": 1, "db.py:_SQLiteWrite.__init__": 1,
                "db.py:_SQLiteWrite._end": 1, "fastsql.py:begin_immediate": 1,
                "fastsql.py:on_driver_thread": 1, "private_aiosqlite.py:say": 1,
                # (the run's Boolean column: SQLAlchemy's processor)
                "sqltypes.py:Boolean._strict_as_bool": 1,
                "sqltypes.py:Boolean.bind_processor.<locals>.process": 1}
    else:
        want = {**common, "db.py:Database._on_lease": 1,
                "fastsql.py:Conn._run_pg": 1, "leases.py:Leased.__aenter__": 1,
                "leases.py:Leased.__aexit__": 1, "leases.py:Leased.__init__": 1,
                "leases.py:Leases._commit": 1, "leases.py:Leases._end": 1,
                "leases.py:Leases.give_back": 1, "leases.py:Leases.take": 1,
                "leases.py:Leases.transaction": 1, "liveness.py:Liveness.stranded": 1,
                "liveness.py:Liveness.trusted": 1,
                "private_asyncpg.py:fetch": 1, "private_asyncpg.py:untracked_transaction": 1,
                "private_sqlalchemy.py:end_transaction": 1, "private_sqlalchemy.py:execute": 1}
    assert seen == Counter(want), repr(sorted(seen.items()))


def test_a_planned_result_answers_as_before() -> None:
    """A plan's result is made with no Python call (a pair: its rows, its rowcount), and
    answers as the class it replaced did, SQLAlchemy's errors included."""
    row = type("R", (fastsql.Row,), {"__slots__": (), "_keys": ("a", "b")})
    none, one, two = (fastsql.Rows((rows, n)) for rows, n in
                      (([], 0), ([row((1, "x"))], 1), ([row((1, "x")), row((2, "y"))], 5)))
    assert [r.rowcount for r in (none, one, two)] == [0, 1, 5]
    assert list(two) == two.all() == [(1, "x"), (2, "y")] and list(none) == []
    assert two.all() is not two.all()  # a list of its own each time, as before
    assert (none.first(), one.first(), two.first()) == (None, (1, "x"), (1, "x"))
    assert one.one() == (1, "x") and one.scalar_one() == 1
    assert none.scalar_one_or_none() is None and one.scalar_one_or_none() == 1
    assert next(iter(two)).b == "x" and one.one()._mapping == {"a": 1, "b": "x"}
    for fails, error in ((none.one, sa_exc.NoResultFound), (two.one, sa_exc.MultipleResultsFound),
                         (none.scalar_one, sa_exc.NoResultFound),
                         (two.scalar_one_or_none, sa_exc.MultipleResultsFound)):
        with pytest.raises(error):
            fails()
    made: list[Any] = []
    assert called(lambda: made.append(fastsql.Rows(([], 3)).rowcount)) == Counter()
    assert made == [3]


def test_the_system_clock_is_read_with_no_python_call() -> None:
    clock = SystemClock()
    before, got = datetime.now(UTC), []
    assert called(lambda: got.append(clock.now())) == Counter()
    assert got[0].tzinfo is UTC and before <= got[0] <= datetime.now(UTC)


async def test_a_resume_s_read_of_a_run_s_state_makes_its_records_only(db: Database) -> None:
    """``tx.events.state`` (a resume's one read): the statement, and a record per row;
    nothing of the tables' columns walked again per read."""
    await _create(db, "r1")
    await Rows(db).in_one_write(lambda tx: tx.events.append("r1", 0, 1, [(1, "{}"), (1, "{}")]))

    async def read(tx: Any) -> Counter[str]:
        await tx.events.state("r1")  # the plan made
        return await Calls(("/store/", "sqlalchemy/")).during(lambda: tx.events.state("r1"))
    seen = await Rows(db).in_one_read(read)
    assert seen == Counter({"events.py:EventsRepo.state": 1, "fastsql.py:Conn.execute": 1,
                            "fastsql.py (a plan):_f": 2,  # its parameters, its rows
                            "fastsql.py (a plan):_f.<locals>.<listcomp>": 1,
                            "fastsql.py:Rows.__iter__": 1,
                            **({"fastsql.py:Conn._run_pg": 1, "private_asyncpg.py:fetch": 1,
                                "private_sqlalchemy.py:execute": 1}
                               if db.dialect == "postgresql" else {})}), \
        repr(sorted(seen.items()))


def test_who_waits_on_a_write_is_read_with_no_python_call() -> None:
    """Every write asks :func:`store.waiting.since` (the context's own ``get``, called from
    C); a block for someone who waits costs three calls, not a generator's five."""
    from approvald.store import waiting

    got: list[float | None] = []

    def block() -> None:
        got.append(waiting.since())
        with waiting.waiting(3.0):
            got.append(waiting.since())

    calls = called(block)
    assert [*got, waiting.since()] == [None, 3.0, None]
    assert calls == Counter({"waiting.py:waiting.__init__": 1, "waiting.py:waiting.__enter__": 1,
                             "waiting.py:waiting.__exit__": 1}), calls
    with pytest.raises(KeyError), waiting.waiting(5.0):  # left as it was, whatever happens
        raise KeyError
    assert waiting.since() is None


async def test_the_chain_verifier_s_batch_reads_are_planned_statements(db: Database) -> None:
    """What ``audit verify`` (and the model-based test's check after every step) reads in
    batches, the requests decided and the standing approvals: statements built once and
    run by their plans, none built or compiled through SQLAlchemy per read."""
    await _create(db, "r1")

    async def read(tx: Any) -> list[Counter[str]]:
        reads = (lambda: tx.approvals.decided_rows(after="", batch=50),
                 lambda: tx.approvals.decided_rows(only="a1"),
                 lambda: tx.standing.every(after="", batch=50))
        for r in reads:
            await r()  # the plans made
        return [await Calls(("/store/", "sqlalchemy/")).during(r) for r in reads]
    seens = await Rows(db).in_one_read(read)
    for seen in seens:
        outside = {k: n for k, n in seen.items() if not k.startswith(
            ("approvals.py:", "standing.py:", "fastsql.py", "private_asyncpg.py:",
             "private_sqlalchemy.py:execute"))}
        assert outside == {}, repr(sorted(seen.items()))
        assert seen["fastsql.py:Conn.execute"] == 1, repr(sorted(seen.items()))
