"""The plan path's own processors for the column types (store/types.py) give what
SQLAlchemy's ``TypeDecorator`` processors give, value for value, on both dialects; a
sealed column's processor still seals and opens; and a processor that disagrees with
SQLAlchemy's on the probes is not used."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from operator import methodcaller
from typing import Any

import pytest
from approvald.store import fastsql, types
from approvald.store.types import SealedText, UTCDateTime
from sqlalchemy.dialects.postgresql.asyncpg import dialect as pg_dialect
from sqlalchemy.dialects.sqlite.aiosqlite import dialect as sqlite_dialect

DIALECTS = pytest.mark.parametrize("dialect", [sqlite_dialect(), pg_dialect()],
                                   ids=["sqlite", "postgres"])
TIMES = [datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 12, 1, 9, 30, 15, 123456, tzinfo=UTC),
         datetime(1, 1, 1, tzinfo=UTC), datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
         datetime(2026, 3, 29, 2, 30, 0, 1, tzinfo=timezone(timedelta(hours=2))),
         datetime(2026, 10, 25, 1, 0, tzinfo=timezone(timedelta(hours=-9, minutes=-30)))]


def _theirs(t: Any, d: Any) -> tuple[Any, Any]:
    impl = t.dialect_impl(d)
    return impl.bind_processor(d), impl.result_processor(d, None)


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b and getattr(a, "tzinfo", None) == getattr(
        b, "tzinfo", None)


@DIALECTS
def test_a_time_is_bound_and_read_as_sqlalchemy_does(dialect: Any) -> None:
    t = UTCDateTime()
    coltype = 1184 if dialect.name == "postgresql" else None  # timestamptz, as described
    bind, result = fastsql.bind_processor(t, dialect), fastsql.result_processor(t, dialect,
                                                                               coltype)
    their_bind, their_result = _theirs(t, dialect)
    # the plan's own, not SQLAlchemy's (which would make this test compare nothing)
    assert bind is (types._bind_sqlite if dialect.name == "sqlite" else types._bind_aware)
    assert result is types._result_sqlite if dialect.name == "sqlite" else \
        isinstance(result, methodcaller)
    if dialect.name == "postgresql":  # timestamptz above; a time without a zone is tagged
        tagged = fastsql.result_processor(t, dialect, 1114)
        assert tagged is types._result_tagged
        naive = datetime(2026, 1, 2, 3, 4, 5, 6)
        assert _same(tagged(naive), their_result(naive)) and tagged(naive).tzinfo is UTC
    assert bind(None) is None
    for value in TIMES:
        stored = bind(value)
        assert _same(stored, their_bind(value)), value
        assert _same(result(stored), their_result(stored)), value
        assert result(stored) == value and result(stored).tzinfo is UTC
    for wrong in (datetime(2026, 1, 1), "2026-01-01", 0):  # naive, not a datetime
        with pytest.raises(ValueError, match="timezone-aware") as mine:
            bind(wrong)
        with pytest.raises(ValueError) as sa:
            their_bind(wrong)
        assert str(mine.value) == str(sa.value)


class Codec:
    def seal(self, text: str, column: str) -> str:
        return f"sealed:{column}:{text[::-1]}"

    def open(self, text: str, column: str) -> str:
        head = f"sealed:{column}:"
        return text[len(head):][::-1] if text.startswith(head) else text


@DIALECTS
@pytest.mark.parametrize("codec", [Codec(), None], ids=["codec", "no codec"])
def test_a_sealed_column_is_sealed_and_opened_by_the_plan(dialect: Any, codec: Any) -> None:
    types.set_codec(codec)
    try:
        for column in ("approvals.args", "audit_log.details"):  # sealed, masked
            t = SealedText(column)
            bind = fastsql.bind_processor(t, dialect)
            result = fastsql.result_processor(t, dialect, None)
            their_bind, their_result = _theirs(t, dialect)
            for value in ("{}", "4242 4242 4242 4242", ""):
                mine = bind(value) if bind is not None else value
                assert mine == their_bind(value), (column, value)
                assert result(mine) == their_result(mine) == value
            if t.sealed and codec is not None:
                assert bind is not None and bind("x") == "sealed:approvals.args:x"
        # the codec is read per value: one set after the plan was made is used
        bind = fastsql.bind_processor(SealedText("approvals.args"), dialect)
        assert bind is not None
        types.set_codec(Codec())
        assert bind("y") == "sealed:approvals.args:y"
    finally:
        types.set_codec(None)


@DIALECTS
def test_a_processor_that_disagrees_with_sqlalchemys_is_not_used(
        dialect: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Checked on probes when a plan is made: a format this code does not know (here a
    mutant of its own) leaves SQLAlchemy's processors in place."""
    if dialect.name == "sqlite":
        monkeypatch.setattr(types, "_SQLITE_FORMAT", "%04d/%02d/%02d %02d:%02d:%02d.%06d")
        monkeypatch.setattr(types, "_result_sqlite", lambda v: datetime.fromisoformat(v))
    else:
        monkeypatch.setattr(types, "_bind_aware", lambda v: v)
    t = UTCDateTime()
    impl = t.dialect_impl(dialect)
    bind = fastsql.bind_processor(t, dialect)
    assert bind is not None and bind.__qualname__ == impl.bind_processor(dialect).__qualname__
    assert bind(TIMES[4]) == impl.bind_processor(dialect)(TIMES[4])
    if dialect.name == "sqlite":
        result = fastsql.result_processor(t, dialect, None)
        assert result is not None
        assert result.__qualname__ == impl.result_processor(dialect, None).__qualname__
