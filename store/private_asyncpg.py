"""Every use of asyncpg's private internals, in one place (issue 37).

Two:

* a pooled connection's checkout check (``store/liveness.py``) replaces a connection left
  inside a transaction nobody tracks (a cancellation SQLAlchemy did not see:
  ``tests/integration/test_db_cancel.py``). Besides asyncpg's public
  ``is_in_transaction()`` it looks at asyncpg's own record of a transaction it started
  (``Connection._top_xact``), read with a default: were the name gone, the check would
  fall back to the public one alone;
* a planned statement (``store/private_sqlalchemy.py``: :func:`fetch`) is executed as
  ``PreparedStatement.fetch`` executes it, on the connection's protocol, with its checks
  said here: asyncpg's guard decorators and helpers around it cost about sixteen Python
  calls a statement (issue 50). Were a name gone, the fast path would be off
  (``store/db.py``: ``fast_path_gaps``).

``tests/unit/test_private_apis.py`` fails on an asyncpg without it, so the gap is
seen before a release ships. asyncpg is optional (the ``postgres`` extra); versions: see
pyproject.toml.
"""

from __future__ import annotations

from importlib.metadata import version
from typing import Any

RELIES_ON: tuple[tuple[str, str], ...] = (
    ("asyncpg.connection.Connection", "_top_xact"),
    ("asyncpg.connection.Connection", "_protocol"),
    ("asyncpg.connection.Connection", "_aborted"),
    ("asyncpg.connection.Connection", "_pool_release_ctr"),
    ("asyncpg.connection.Connection", "reload_schema_state"),
    ("asyncpg.prepared_stmt.PreparedStatement", "_state"),
    ("asyncpg.prepared_stmt.PreparedStatement", "_connection"),
    ("asyncpg.prepared_stmt.PreparedStatement", "_con_release_ctr"),
    ("asyncpg.protocol.protocol.Protocol", "bind_execute"),
    ("asyncpg.protocol.protocol.Protocol", "is_connected"),
    ("asyncpg.protocol.protocol.PreparedStatementState", "closed"),
    ("asyncpg.protocol.protocol.PreparedStatementState", "mark_closed"),
)


def dependency() -> str:
    """The dependency this module reaches into, with its installed version."""
    return f"asyncpg {version('asyncpg')}"


def missing() -> list[str]:
    """The names of :data:`RELIES_ON` the installed asyncpg lacks (none: all there)."""
    from asyncpg.connection import Connection  # type: ignore[import-untyped]
    from asyncpg.prepared_stmt import PreparedStatement  # type: ignore[import-untyped]
    from asyncpg.protocol import protocol  # type: ignore[import-untyped]

    classes = {"asyncpg.connection.Connection": Connection,
               "asyncpg.prepared_stmt.PreparedStatement": PreparedStatement,
               "asyncpg.protocol.protocol.Protocol": getattr(protocol, "Protocol", None),
               "asyncpg.protocol.protocol.PreparedStatementState":
                   getattr(protocol, "PreparedStatementState", None)}
    return [f"{what}.{name}" for what, name in RELIES_ON
            if not hasattr(classes[what], name)]


def untracked_transaction(driver: Any) -> bool:
    """Whether asyncpg holds a transaction object on ``driver`` (an asyncpg connection)."""
    return getattr(driver, "_top_xact", None) is not None


# asyncpg's own ``PreparedStatement.fetch``, once seen (a wrapped one, a test's statement
# counter or hold, is called as it is: it sees every statement, as before)
_OWN_FETCH: list[Any] = [None]


async def fetch(stmt: Any, args: tuple[Any, ...]) -> tuple[list[Any], str | None]:
    """``stmt.fetch(*args)`` and then ``stmt.get_statusmsg()``, for an asyncpg
    ``PreparedStatement``, said as asyncpg says them: its checks first (the statement
    open, the connection not released to an asyncpg pool nor closed: the same errors, in
    the same order), then its protocol's ``bind_execute``, and on a schema change under a
    statement the server's types re-read and the statement closed (prepared again by its
    next user). No check after the result: asyncpg's ``get_statusmsg`` checks the
    connection again, and could call a statement that completed failed."""
    own = stmt.__class__.fetch
    if own is not _OWN_FETCH[0]:
        if own.__module__ != "asyncpg.prepared_stmt":  # wrapped: called as it is
            return await stmt.fetch(*args), stmt.get_statusmsg()
        _OWN_FETCH[0] = own
    conn, state = stmt._connection, stmt._state
    if state.closed:
        raise _error("interface")("cannot call PreparedStmt.fetch(): the prepared statement "
                                  "is closed")
    if stmt._con_release_ctr != conn._pool_release_ctr:
        raise _error("interface")("cannot call PreparedStatement.fetch(): the underlying "
                                  "connection has been released back to the pool")
    protocol = conn._protocol
    if conn._aborted or not protocol.is_connected():  # (its is_closed(), said in place)
        raise _error("interface")("cannot call PreparedStatement.fetch(): the underlying "
                                  "connection is closed")
    try:
        rows, status, _ = await protocol.bind_execute(state, args, "", 0, True, None)
    except Exception as error:
        if isinstance(error, _error("outdated")):
            await conn.reload_schema_state()
            state.mark_closed()
        raise
    return rows, status.decode() if status is not None else None


def _error(kind: str) -> Any:
    """asyncpg's ``InterfaceError`` or ``OutdatedSchemaCacheError`` (imported only when
    one is raised or checked: asyncpg is optional)."""
    from asyncpg import exceptions  # type: ignore[import-untyped]

    return exceptions.InterfaceError if kind == "interface" else \
        exceptions.OutdatedSchemaCacheError
