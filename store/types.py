"""Column types shared by every table."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from operator import methodcaller
from typing import Any, Protocol, cast

from approvald.store import caller_data
from approvald.store.fastsql import same
from sqlalchemy import DateTime, Text
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator

Processor = Callable[[Any], Any] | None
# how SQLite's DATETIME stores a time (SQLAlchemy's default storage format)
_SQLITE_FORMAT = "%04d-%02d-%02d %02d:%02d:%02d.%06d"
# probes a planned processor must answer as SQLAlchemy's own does (see ``planned``)
_PROBES = (datetime(2026, 3, 29, 1, 30, 5, 120, tzinfo=UTC),
           datetime(1999, 12, 31, 23, 59, 59, tzinfo=UTC),
           datetime(2026, 10, 25, 2, 15, tzinfo=timezone(timedelta(hours=5, minutes=30))))


def _refuse(value: Any) -> None:
    raise ValueError(f"approvald stores timezone-aware datetimes only, got {value!r}")


def _bind_sqlite(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, datetime) or value.tzinfo is None:
        _refuse(value)
    v = value.astimezone(UTC)
    return _SQLITE_FORMAT % (v.year, v.month, v.day, v.hour, v.minute, v.second,
                             v.microsecond)


def _result_sqlite(value: str) -> datetime:  # never None: a plan skips None values
    v = datetime.fromisoformat(value)  # (as _result_tagged: a call fewer per value)
    return v.replace(tzinfo=UTC) if v.tzinfo is None else v.astimezone(UTC)


def inlined(fn: Callable[[Any], Any], template: str, probes: tuple[Any, ...],
            **names: Any) -> Callable[[Any], Any]:
    """``fn``, carrying an expression that does exactly what it does (the same value, the
    same error) with no Python call of its own: a plan (store/fastsql.py) writes it in
    place of a call to ``fn`` per value. ``{v}`` is the value (``{first}`` where it is read
    first, if that is elsewhere: in ``a if b else c``, in ``b``), ``{p}`` is ``fn``, ``{t}``
    a name of its own to assign, and each of ``names`` is itself. A bound value's
    expression takes None too; a result value's never sees None. The plan checks it
    against ``fn`` on ``probes`` (and None, for a bound value) first."""
    vars(fn)["inline"] = (template, names, probes)
    return fn


# a time as SQLite's DATETIME stores it: ``isoformat``'s, less its "+00:00" (C calls only;
# one call for a time in UTC already, as this process makes them: ``astimezone(UTC)`` gives
# such a time back as it is; another class, or a naive time, goes to the function: it
# refuses it or reads it as it does)
inlined(_bind_sqlite, "(None if {first} is None else {v}.isoformat(' ', 'microseconds')[:-6] "
        "if {v}.__class__ is {dt} and {v}.tzinfo is {utc} else {v}.astimezone({utc})"
        ".isoformat(' ', 'microseconds')[:-6] if {v}.__class__ is {dt} and {v}.tzinfo is "
        "not None else {p}({v}))", _PROBES, utc=UTC, dt=datetime)
# read back: _result_sqlite's own expression (the same C calls, no Python call)
inlined(_result_sqlite, "({t}.replace(tzinfo={utc}) if ({t} := {fromiso}({v})).tzinfo is None "
        "else {t}.astimezone({utc}))", tuple(_bind_sqlite(p) for p in _PROBES),
        fromiso=datetime.fromisoformat, utc=UTC)


def _result_tagged(v: datetime) -> datetime:
    return v.replace(tzinfo=UTC) if v.tzinfo is None else v.astimezone(UTC)


_TEXTS = ("{}", "")  # what an opening expression is checked on (sealing: None only, since
# a codec's seal may warn, refuse, or seal each time differently)
_TIMESTAMPTZ = 1184  # PostgreSQL's type oid for timestamptz, as asyncpg describes it


def _bind_aware(value: Any) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, datetime) or value.tzinfo is None:
        _refuse(value)
    return value.astimezone(UTC)  # type: ignore[no-any-return]


# (a time in UTC already, as this process makes them, bound as it is: what ``astimezone``
# would give back, with no call)
inlined(_bind_aware, "(None if {first} is None else {v} if {v}.__class__ is {dt} and "
        "{v}.tzinfo is {utc} else {v}.astimezone({utc}) if {v}.__class__ is {dt} and "
        "{v}.tzinfo is not None else {p}({v}))", _PROBES, utc=UTC, dt=datetime)


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC in Python on every dialect.

    PostgreSQL stores ``timestamptz``; SQLite has no time zones, so values are normalized
    to UTC on the way in and tagged UTC on the way out. Naive datetimes are refused: a
    time without a zone is a bug waiting for a daylight-saving change.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if not isinstance(value, datetime) or value.tzinfo is None:
            raise ValueError(f"approvald stores timezone-aware datetimes only, got {value!r}")
        utc: datetime = value.astimezone(UTC)
        return utc.replace(tzinfo=None) if dialect.name == "sqlite" else utc

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        assert isinstance(value, datetime)
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)

    # The plan path (store/fastsql.py) applies these instead of SQLAlchemy's
    # ``TypeDecorator`` processors: the same values in and out, in one call per value
    # instead of three or four (issue 50). Each is checked against SQLAlchemy's own on
    # probes when a plan is made; a dialect or a storage format they do not know keeps
    # SQLAlchemy's.

    def planned_bind(self, dialect: Dialect) -> Processor:
        mine = _bind_sqlite if dialect.name == "sqlite" else _bind_aware
        return planned(mine, self.bind_processor(dialect), _PROBES)

    def planned_result(self, dialect: Dialect, coltype: Any) -> Processor:
        theirs = self.result_processor(dialect, coltype)
        if dialect.name == "sqlite":
            stored = self.bind_processor(dialect)
            probes = tuple(stored(p) for p in _PROBES) if stored is not None else ()
            return planned(_result_sqlite, theirs, probes)
        if coltype == _TIMESTAMPTZ:
            # asyncpg answers timestamptz aware (in UTC): astimezone is then the value
            # itself, called from C (no Python frame per value)
            return planned(methodcaller("astimezone", UTC), theirs, _PROBES)
        # a time without a zone (or of a type not described): tagged UTC, as above
        return planned(_result_tagged, theirs, (*_PROBES, datetime(2026, 1, 2, 3)))


class Codec(Protocol):
    """What turns a sensitive column's text into what is stored, and back
    (``runtime/record/sealing.py``: authenticated encryption under the operator's data key).
    ``column``: ``table.column``, bound into the sealed value so that it opens nowhere
    else. Either call may raise to refuse (a missing key): the statement, and so the
    transaction, then fails whole."""

    def seal(self, text: str, column: str) -> str: ...

    def open(self, text: str, column: str) -> str: ...


_codec: Codec | None = None
# the codec, and how every value it would not give back as it is starts (its
# ``sealed_prefix``, if it names one: "" otherwise), read together by a column's plan
# (changed in place: the plans' inline expressions hold this list)
_opening: list[Any] = [None, ""]


def set_codec(codec: Codec | None) -> None:
    """Set how this process seals and opens sensitive columns (None: stored as given).
    A codec whose ``open`` gives back as it is every text not starting with its
    ``sealed_prefix`` (a str attribute) is asked to open only those that do (issue 50:
    a call per value read)."""
    global _codec
    _codec = codec
    prefix = getattr(codec, "sealed_prefix", "")
    _opening[:] = [codec, prefix if isinstance(prefix, str) else ""]


def codec() -> Codec | None:
    """How this process seals and opens sensitive columns."""
    return _codec


class SealedText(TypeDecorator[str]):
    """Text that may hold a secret (a call's arguments, a transcript, a tool's result):
    sealed on the way in and opened on the way out by the process's :class:`Codec`, so
    that the database holds no secret in clear and every reader sees the real text.
    One mechanism for every such column, whichever repository writes or reads it.

    ``column`` (``table.column``) must be registered in :mod:`store.caller_data`, which
    says how it is kept: ``sealed``, or ``masked`` (written in clear, because what is
    written holds no secret: the audit log's masked details, which must verify without
    the key; values sealed there before are opened like the rest)."""

    impl = Text
    cache_ok = True

    def __init__(self, column: str) -> None:
        super().__init__()
        kind = caller_data.holds(column)
        if kind == "clear":
            raise LookupError(f"{column} is registered as holding no caller data: it is "
                              "plain Text, not SealedText")
        self.column = column
        self.sealed = kind == "sealed"

    def process_bind_param(self, value: Any, dialect: Dialect) -> str | None:
        if value is None or _codec is None or not self.sealed:
            return cast(str | None, value)
        return _codec.seal(value, self.column)

    def process_result_value(self, value: Any, dialect: Dialect) -> str | None:
        if value is None or _codec is None:
            return cast(str | None, value)
        return _codec.open(value, self.column)

    # The plan path's processors (see UTCDateTime's): the codec is read per value, as
    # above, since :func:`set_codec` may change it; text the codec never touches (a
    # ``masked`` column on the way in) needs no call at all.

    def planned_bind(self, dialect: Dialect) -> Processor:
        if self.impl_instance.bind_processor(dialect) is not None:
            return self.bind_processor(dialect)  # a Text this code does not know
        if not self.sealed:
            return None
        column = self.column

        def seal(value: Any) -> Any:
            c = _codec
            return value if value is None or c is None else c.seal(value, column)
        # no call of its own: the codec's, if there is one and a value to seal
        return inlined(seal, "({v} if {first} is None or {o}[0] is None else "
                       "{o}[0].seal({v}, {column}))", (), o=_opening, column=column)

    def planned_result(self, dialect: Dialect, coltype: Any) -> Processor:
        if self.impl_instance.result_processor(dialect, coltype) is not None:
            return self.result_processor(dialect, coltype)
        column = self.column

        def open_(value: Any) -> Any:  # never None: a plan skips None values
            c, prefix = _opening
            return value if c is None or not value.startswith(prefix) \
                else c.open(value, column)
        # no call at all for a text the codec gives back as it is; else the codec's own
        return inlined(open_, "({v} if {o}[0] is None or not {v}.startswith({o}[1]) else "
                       "{o}[0].open({v}, {column}))", _TEXTS, o=_opening, column=column)


def planned(mine: Processor, theirs: Processor, probes: tuple[Any, ...]) -> Processor:
    """``mine`` where it answers every probe as SQLAlchemy's processor ``theirs`` does
    (the same value, the same type, the same time zone), else ``theirs``."""
    if mine is None or theirs is None:
        return theirs
    try:
        agree = all(same(mine(p), theirs(p)) for p in probes)
    except Exception:
        agree = False
    return mine if agree and probes else theirs


