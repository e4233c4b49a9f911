"""Shared plumbing for repositories."""

from __future__ import annotations

from typing import Any, TypeVar

from approvald.store.fastsql import Conn
from sqlalchemy import Insert, Row
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import DeclarativeBase

R = TypeVar("R")


class Repo:
    """A repository bound to one connection inside one transaction."""

    def __init__(self, conn: Conn, dialect: str, *,
                 server_time: bool = False) -> None:
        self.conn = conn
        self.dialect = dialect
        self.server_time = server_time  # lease times from the database's clock

    def insert_ignore(self, model: type[DeclarativeBase]) -> Insert:
        """``INSERT ... ON CONFLICT DO NOTHING`` for this dialect."""
        stmt: Any
        if self.dialect == "postgresql":
            stmt = postgresql.insert(model).on_conflict_do_nothing()
        else:
            stmt = sqlite.insert(model).on_conflict_do_nothing()
        assert isinstance(stmt, Insert)
        return stmt


def to_record(cls: type[R], row: Row[Any] | None) -> R | None:
    if row is None:
        return None
    return cls(**row._mapping)


def pinned(table: Any, values: dict[str, Any]) -> dict[str, Any]:
    """An UPDATE's ``values``, and every other column of ``table`` (but its key) set to
    itself.

    SQLAlchemy's own execution (``APPROVALD_DB_FAST_PATH=0``) gives every UPDATE in a
    statement, one in a CTE too, a ``SET`` for each execution parameter named like one of
    its table's columns. A statement of several writes has parameters named for the other
    tables' columns (a run's ``step`` and ``owner``, a request's ``kind``): pinned, an
    UPDATE sets on both paths exactly what it names here."""
    return {**{c.key: c for c in table.c if c.key not in values and not c.primary_key},
            **values}
