"""Column types shared by every table."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Protocol, cast

from approvald.store import caller_data
from sqlalchemy import DateTime, Text
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator


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


class Codec(Protocol):
    """What turns a sensitive column's text into what is stored, and back
    (``runtime/record/sealing.py``: authenticated encryption under the operator's data key).
    ``column``: ``table.column``, bound into the sealed value so that it opens nowhere
    else. Either call may raise to refuse (a missing key): the statement, and so the
    transaction, then fails whole."""

    def seal(self, text: str, column: str) -> str: ...

    def open(self, text: str, column: str) -> str: ...


_codec: Codec | None = None


def set_codec(codec: Codec | None) -> None:
    """Set how this process seals and opens sensitive columns (None: stored as given)."""
    global _codec
    _codec = codec


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
