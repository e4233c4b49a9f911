"""Issue 50: a plan (store/fastsql.py) writes the column types' processors for times and
sealed text (store/types.py) as expressions, with no Python call per value bound or read:
the same values in and out as the processors themselves, the same errors, on both
dialects; an expression that does not answer as its processor does is not used."""

from __future__ import annotations

import random
from collections import Counter
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from approvald.store import fastsql, types
from approvald.store.types import SealedText, UTCDateTime
from sqlalchemy import Column, MetaData, Table, Text, insert, select
from sqlalchemy.dialects.postgresql.asyncpg import dialect as pg_dialect
from sqlalchemy.dialects.sqlite.aiosqlite import dialect as sqlite_dialect

from tests.unit import test_planned_types as planned_types
from tests.unit.test_store_cpu import called

DIALECTS = pytest.mark.parametrize("dialect", [sqlite_dialect(), pg_dialect()],
                                   ids=["sqlite", "postgres"])
T = Table("inline_probe", MetaData(), Column("id", Text, primary_key=True),
          Column("at", UTCDateTime()), Column("args", SealedText("approvals.args")),
          Column("details", SealedText("audit_log.details")))
KEYS = frozenset({"id", "at", "args", "details"})


class Stamp(datetime):
    """A datetime subclass: not the expression's, the processor's."""


TIMES = [datetime(2026, 12, 1, 9, 30, 15, 123456, tzinfo=UTC), datetime(1, 1, 1, tzinfo=UTC),
         datetime(2026, 3, 29, 2, 30, 0, 1, tzinfo=timezone(timedelta(hours=2))),
         datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
         Stamp(2026, 1, 2, 3, 4, 5, tzinfo=UTC), None]
# what SQLite may hand back in a DATETIME column besides what approvald stores
ODD_TEXTS = ["2026-01-02 03:04:05+05:30", "2026-01-02T03:04:05Z", "2026-01-02", "not a time",
             17, b"2026-01-02 03:04:05"]


class Codec(planned_types.Codec):
    sealed_prefix = "sealed:"  # it gives back as it is every other text


PLAN = "fastsql.py (a plan):_f"


@pytest.fixture(params=[None, Codec()], ids=["no codec", "codec"])
def codec(request: pytest.FixtureRequest) -> Any:
    types.set_codec(request.param)
    yield request.param
    types.set_codec(None)


def _plans(dialect: Any) -> tuple[Any, Any]:
    put = fastsql._plan(insert(T), dialect, KEYS)
    get = fastsql._plan(select(T), dialect, frozenset())
    assert put is not None and get is not None
    if not get.resolved:  # PostgreSQL: as the server describes timestamptz
        get.resolve(dialect, [25, 1184, 25, 25])
    return put, get


def _by_call(plan: Any, params: dict[str, Any]) -> tuple[Any, ...]:
    """The slots' values as the processors themselves make them."""
    return tuple(const if const is not fastsql._CALLER
                 else proc(params[name]) if proc is not None else params[name]
                 for name, const, proc in plan.slots)


def _same(a: Any, b: Any) -> bool:
    return len(a) == len(b) and all(fastsql.same(x, y) for x, y in zip(a, b, strict=True))


def _outcome(fn: Any, *args: Any) -> tuple[str, Any]:
    try:
        return "value", fn(*args)
    except Exception as exc:
        return type(exc).__name__, str(exc)


@DIALECTS
def test_a_plan_binds_and_reads_what_the_processors_make(dialect: Any, codec: Any) -> None:
    put, get = _plans(dialect)
    texts = [None, "", "{}", "4242 4242 4242 4242", "sealed:approvals.args:}{"]
    for i, at in enumerate(TIMES):
        params = {"id": f"r{i}", "at": at, "args": texts[i % 5], "details": texts[(i + 2) % 5]}
        mine = put.parameters(params)
        assert _same(mine, _by_call(put, params)), params
        fetched = [tuple(mine)]
        assert all(_same(r, s) for r, s in zip(
            get.rows(fetched), fastsql._rows(get.row, get.procs, inline=False)(fetched),
            strict=True))
    for wrong in (datetime(2026, 1, 1), "2026-01-01", 0):  # naive, not a datetime: refused
        params = {"id": "w", "at": wrong, "args": None, "details": None}
        assert _outcome(put.parameters, params) == _outcome(_by_call, put, params)
        assert _outcome(put.parameters, params)[0] == "ValueError"
    if dialect.name == "sqlite":
        for odd in ODD_TEXTS:  # read as the processor reads them, or refused as it refuses
            fetched = [("a", "2026-01-02 03:04:05.000006", None, "x"), ("b", odd, "y", None)]
            assert _outcome(get.rows, fetched) == _outcome(
                fastsql._rows(get.row, get.procs, inline=False), fetched), odd
        with pytest.raises(ValueError, match="a row of 3 columns, not 4"):
            get.rows([("a", None, None)])


@DIALECTS
def test_a_plan_makes_no_python_call_per_value(dialect: Any, codec: Any) -> None:
    put, get = _plans(dialect)
    params = {"id": "r", "at": TIMES[0], "args": "{}", "details": "{}"}
    calls = called(lambda: put.parameters(params))
    # the codec's own seal of the sealed column, if there is a codec: nothing else
    assert calls == Counter({
        PLAN: 1, **({"test_planned_types.py:Codec.seal": 1} if codec is not None else {})}), calls
    stored = put.parameters(params)
    if dialect.name == "postgresql":  # asyncpg hands back a time, not its text
        stored = (stored[0], TIMES[0], *stored[2:])
    rows = [stored] * 5
    calls = called(lambda: get.rows(rows))
    # the rows made: the codec opens what it sealed, nothing else is called
    opened = {"test_planned_types.py:Codec.open": 5} if codec is not None else {}
    assert calls == Counter({PLAN: 1, f"{PLAN}.<locals>.<listcomp>": 1, **opened}), calls


def test_a_time_s_text_is_read_as_the_processor_reads_it() -> None:
    """A text of a time in any form, well made or not: the same time, or refused as the
    processor refuses it."""
    read = fastsql._rows(fastsql.Row, (types._result_sqlite,))
    by_call = fastsql._rows(fastsql.Row, (types._result_sqlite,), inline=False)
    rnd = random.Random(50)
    pieces = ["0", "1", "2", "9", "12", "59", "60", "-", ":", ".", ",", " ", "T", "+", "Z",
              "W", "24", "000000", "123456789", "+05:30", "-00:00", "+00:00"]
    texts = ["2026-01-02 " + "".join(rnd.choice(pieces) for _ in range(rnd.randint(0, 8)))
             for _ in range(20000)]
    texts += ["2026-01-02 03:04:05.000006", "2026-01-02 03", "2026-W01-1 03:04",
              "2026-01-02 03:04:05+01:00", "2026-01-02 24:00", "2026-01-02 "]
    for text in texts:
        assert _outcome(read, [(text,)]) == _outcome(by_call, [(text,)]), text


@DIALECTS
def test_an_expression_that_answers_otherwise_is_not_used(dialect: Any,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """Checked against its processor on probes when a plan is made (here a mutant: a
    time bound with its zone's offset left on, a sealed column bound in clear)."""
    proc = fastsql.bind_processor(T.c.at.type, dialect)
    template, names, probes = proc.inline  # type: ignore[union-attr]
    monkeypatch.setitem(vars(proc), "inline",
                        (template.replace("[:-6]", "").replace(".astimezone(", ".replace("),
                         names, probes))
    sealed = fastsql.bind_processor(T.c.args.type, dialect)
    assert sealed is not None
    types.set_codec(Codec())
    try:
        env: dict[str, Any] = {}
        assert fastsql._inline(proc, 0, "x0", "x0", env, bind=True) is None
        monkeypatch.setitem(vars(sealed), "inline", ("{first}", {}, ("{}",)))
        assert fastsql._inline(sealed, 1, "x1", "x1", env, bind=True) is None
        # {first} not where the value is read first: refused, not a NameError per call
        monkeypatch.setitem(vars(proc), "inline", ("({v} if {first} is None else 1)", {}, ()))
        assert fastsql._inline(proc, 0, "x0", "x0", env, bind=True) is not None
        monkeypatch.setitem(vars(proc), "inline", ("(1 if {v} is None else {first})", {}, ()))
        assert fastsql._inline(proc, 0, "x0", "x0", env, bind=True) is None
    finally:
        types.set_codec(None)
