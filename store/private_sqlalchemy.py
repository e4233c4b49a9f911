"""Every use of SQLAlchemy's private internals, in one place (issue 37).

The plan path (``store/fastsql.py``, on unless ``APPROVALD_DB_FAST_PATH=0``) compiles a
hot statement once through SQLAlchemy's public compiler and then applies what SQLAlchemy
would do per call straight to the driver. Two things it needs have no public name:

* the compiled statement's result columns (``SQLCompiler._result_columns``): each column's
  key, as a ``Row``'s ``_mapping`` names it, and its type; read once per plan;
* on PostgreSQL, what the asyncpg adapter's cursor does for a statement
  (``AsyncAdapt_asyncpg_cursor._prepare_and_execute``), said here on the adapter without
  a cursor (:func:`execute`): its ``_execute_mutex`` held, its transaction begun first
  (``_transaction``, ``_start_transaction``, unless ``isolation_level`` is autocommit),
  the statement prepared by its ``_prepare`` (then kept by the connection's lease), its
  errors translated by ``_handle_exception``, a statement asyncpg closed dropped from its
  ``_prepared_statement_cache``; awaited directly instead of through
  SQLAlchemy's greenlet;
* on PostgreSQL, the end of the adapter's transaction (``store/leases.py``): what the
  adapter's ``commit()`` and ``rollback()`` do (``_transaction``, ``_call_and_discard``,
  its errors translated by ``_handle_exception``), awaited directly too, and its
  ``autocommit`` switch, which the adapter reads before it would say BEGIN (set as the
  property does: ``isolation_level``, or back to ``_isolation_setting``).

The compiler attributes the plans read (``bind_names``, ``insert_prefetch``,
``positiontup`` ...) carry no underscore but are internals too; :data:`RELIES_ON` lists
them with the private ones. ``tests/unit/test_private_apis.py`` checks every one on the
installed SQLAlchemy, and :func:`missing` at start-up turns the fast path off (with a
warning) when one is gone. Versions: see pyproject.toml.
"""

from __future__ import annotations

import re
from importlib.metadata import version
from typing import Any

import sqlalchemy as sa
from approvald.store import private_asyncpg
from sqlalchemy.dialects.postgresql import asyncpg as pg_asyncpg
from sqlalchemy.dialects.sqlite import dialect as sqlite_dialect

# (what, name): the names the plans use that SQLAlchemy does not document as public
RELIES_ON: tuple[tuple[str, str], ...] = (
    ("SQLCompiler", "_result_columns"),
    ("SQLCompiler", "bind_names"),
    ("SQLCompiler", "positional"),
    ("SQLCompiler", "insert_prefetch"),
    ("SQLCompiler", "update_prefetch"),
    ("SQLCompiler", "escaped_bind_names"),
    ("SQLCompiler", "construct_expanded_state"),
    ("ExpandedState", "positiontup"),
    ("ResultColumnsEntry", "keyname"),
    ("ResultColumnsEntry", "type"),
    ("postgresql.asyncpg.AsyncAdapt_asyncpg_connection", "_execute_mutex"),
    ("postgresql.asyncpg.AsyncAdapt_asyncpg_connection", "_start_transaction"),
    ("postgresql.asyncpg.AsyncAdapt_asyncpg_connection", "_prepare"),
    ("postgresql.asyncpg.AsyncAdapt_asyncpg_connection", "isolation_level"),
    ("postgresql.asyncpg.AsyncAdapt_asyncpg_connection", "_prepared_statement_cache"),
    ("postgresql.asyncpg.AsyncAdapt_asyncpg_connection", "_transaction"),
    ("postgresql.asyncpg.AsyncAdapt_asyncpg_connection", "_call_and_discard"),
    ("postgresql.asyncpg.AsyncAdapt_asyncpg_connection", "_handle_exception"),
    ("postgresql.asyncpg.AsyncAdapt_asyncpg_connection", "autocommit"),
    ("postgresql.asyncpg.AsyncAdapt_asyncpg_connection", "_isolation_setting"),
)


def dependency() -> str:
    """The dependency this module reaches into, with its installed version."""
    return f"SQLAlchemy {version('sqlalchemy')}"


def missing() -> list[str]:
    """The names of :data:`RELIES_ON` the installed SQLAlchemy lacks (none: all there)."""
    t = sa.table("t", sa.column("a"))
    compiled: Any = sa.select(t.c.a).where(t.c.a == sa.bindparam("x")).compile(
        dialect=sqlite_dialect(paramstyle="qmark"))
    probes: dict[str, Any] = {
        "SQLCompiler": compiled,
        "postgresql.asyncpg.AsyncAdapt_asyncpg_connection":
            pg_asyncpg.AsyncAdapt_asyncpg_connection,
    }
    try:
        probes["ExpandedState"] = compiled.construct_expanded_state({"x": None})
    except Exception:  # its absence is reported below
        pass
    try:
        probes["ResultColumnsEntry"] = compiled._result_columns[0]
    except Exception:
        pass
    return [f"{what}.{name}" for what, name in RELIES_ON
            if what not in probes or not hasattr(probes[what], name)]


def result_columns(compiled: Any) -> Any:
    """A compiled statement's result columns: entries with ``keyname`` and ``type``."""
    return compiled._result_columns


# the adapter's reading of a command's status: the rows it touched (else -1)
_STATUS = re.compile(r"(?:SELECT|UPDATE|DELETE|INSERT \d+) (\d+)")
KEPT_STATEMENTS = 512  # a lease's prepared statements: more than the planned SQL there is


async def execute(adapted: Any, sql: str, args: tuple[Any, ...],
                  kept: dict[str, Any] | None) -> tuple[list[Any], Any, int]:
    """Run ``sql`` on an asyncpg adapter as its cursor's ``execute`` would (the adapter's
    mutex held; its transaction begun first unless it is in autocommit; the statement
    prepared through its cache), without a cursor, awaited here: ``(rows, the columns'
    attributes, rowcount)``. ``kept``: the connection's prepared statements by SQL (a
    lease's), read before the adapter's cache, which costs several calls per look-up.
    A statement asyncpg can no longer use is dropped from both (the adapter's own cursor
    would keep it until its cache evicted it): prepared again on its next use."""
    mutex = adapted._execute_mutex
    await mutex.acquire()
    try:
        if adapted._transaction is None and adapted.isolation_level != "autocommit":
            await adapted._start_transaction()
        try:
            got = kept.get(sql) if kept is not None else None
            if got is None:
                got = await adapted._prepare(sql, 0)  # 0: as a cursor of its own asks
                if kept is not None:
                    if len(kept) >= KEPT_STATEMENTS:
                        kept.clear()
                    kept[sql] = got
            stmt, attributes = got
            rows, status = await private_asyncpg.fetch(stmt, args)
        except Exception as error:
            if _stale(error):  # asyncpg closed it: prepared again next time
                if kept is not None:
                    kept.pop(sql, None)
                adapted._prepared_statement_cache.pop(sql, None)
            adapted._handle_exception(error)
    finally:
        mutex.release()
    reg = _STATUS.match(status or "")
    return rows, attributes, int(reg.group(1)) if reg else -1


def _stale(error: Exception) -> bool:
    """Whether asyncpg can no longer use the statement that raised ``error`` (the server
    invalidated its plan: a column's type changed; or it was closed). asyncpg is the
    ``postgres`` extra: imported here, where only a PostgreSQL statement's error leads."""
    from asyncpg import exceptions as e  # type: ignore[import-untyped]

    return isinstance(error, e.InvalidCachedStatementError | e.OutdatedSchemaCacheError
                      | e.InterfaceError)


async def end_transaction(adapted: Any, *, commit: bool) -> None:
    """COMMIT (or ROLLBACK) the adapter's transaction, if it began one, as its own
    ``commit()`` / ``rollback()`` would (the transaction is let go of whether or not it
    ended well; asyncpg's error is raised as the adapter's), awaited here."""
    tr = adapted._transaction
    if tr is None:
        return
    try:
        await adapted._call_and_discard(tr.commit if commit else tr.rollback)
    except Exception as error:
        adapted._handle_exception(error)


def set_autocommit(adapted: Any, on: bool) -> None:
    """Statements on ``adapted`` run each in its own implicit transaction (no BEGIN), or
    again at its isolation level (what the adapter's ``autocommit`` property sets, set
    here without its call)."""
    adapted.isolation_level = "autocommit" if on else adapted._isolation_setting
