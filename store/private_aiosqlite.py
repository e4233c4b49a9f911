"""Every use of aiosqlite's private internals, in one place (issue 37).

aiosqlite runs each sqlite3 call on the connection's own thread and hands the result
back to the event loop. Through SQLAlchemy a single statement costs three or four such
round trips (open a cursor, execute, fetch the rows, close). The fast path
(``APPROVALD_DB_FAST_PATH``, on by default) saves them, which aiosqlite's public API
cannot do:

* the cursor here does the whole statement in ONE trip: on the connection thread it opens
  a sqlite3 cursor, executes, fetches every row, notes ``description``/``rowcount``/
  ``lastrowid`` and closes it; ``fetchall`` and ``close`` then need no trip at all;
* a statement that cannot wait on anything (one inside a transaction that has begun, or
  a ``SELECT``: see :func:`inline`) takes no trip at all: it runs right on the loop's
  thread, on the sqlite3 connection, in microseconds.

Same SQL, same transactions, much less CPU per statement (see docs/performance.md). SQLite only;
PostgreSQL goes through asyncpg (its private name is in ``private_sqlalchemy``).

What is relied on, all of it listed in :data:`RELIES_ON` (checked by
``tests/unit/test_private_apis.py`` and, at start-up, by :func:`missing`: a name gone
turns the fast path off with a warning rather than failing): ``Connection._connection``
(the sqlite3 connection, or None once closed), ``Connection._conn`` (the same, raising
when closed), ``Connection._execute`` (run a function on the connection's thread),
``Connection._thread`` (waited for when a connection fails to open: :func:`opened`), and
that ``Connection.cursor`` may be replaced on an instance. Versions: see pyproject.toml.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable, Generator, Iterable, Sequence
from importlib.metadata import version
from operator import attrgetter
from typing import Any, cast

import aiosqlite

# (what, name): the names this module uses that aiosqlite does not document
RELIES_ON: tuple[tuple[str, str], ...] = (
    ("aiosqlite.Connection (instance attribute)", "_connection"),
    ("aiosqlite.Connection", "_conn"),
    ("aiosqlite.Connection", "_execute"),
    ("aiosqlite.Connection (instance attribute)", "_thread"),
)


def dependency() -> str:
    """The dependency this module reaches into, with its installed version."""
    return f"aiosqlite {version('aiosqlite')}"


def missing() -> list[str]:
    """The names of :data:`RELIES_ON` the installed aiosqlite lacks (none: all there)."""
    # a Connection not yet awaited starts no thread and opens nothing
    try:
        probe: Any = aiosqlite.Connection(lambda: sqlite3.connect(":memory:"), 64)
    except TypeError:
        return ["aiosqlite.Connection(connector, iter_chunk_size) (to check the rest)"]
    gone = [f"{what}.{name}" for what, name in RELIES_ON
            if not hasattr(probe if "instance" in what else aiosqlite.Connection, name)]
    if getattr(aiosqlite.Connection, "__slots__", None) is not None:
        gone.append("aiosqlite.Connection.cursor (replaceable on an instance)")
    return gone


def sqlite3_connection(conn: aiosqlite.Connection) -> sqlite3.Connection:
    """The sqlite3 connection under ``conn``; ``ValueError`` once it is closed."""
    return conn._conn


async def on_thread(conn: aiosqlite.Connection, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` on ``conn``'s own thread (one round trip)."""
    return await cast(Any, conn)._execute(fn, *args)


async def say(conn: Any, sql: str) -> None:
    """``sql`` said on ``conn``'s own thread, its cursor closed there: one round trip, as
    ``conn.execute(sql)`` makes, without the aiosqlite cursor and the awaitable context
    made around it for a caller that reads nothing back (issue 50: every COMMIT)."""
    await conn._execute(_say, sql, conn)  # (the statement first, as aiosqlite's execute)


def _say(sql: str, conn: aiosqlite.Connection) -> None:  # (on the connection's thread)
    conn._conn.execute(sql).close()


def inline(conn: aiosqlite.Connection, sql: str) -> bool:
    """May this statement run on the event loop's thread, with no hop at all?

    Yes inside a transaction that has begun (a write transaction holds SQLite's write lock
    from its ``BEGIN IMMEDIATE``, so its statements never wait on another writer; a read
    transaction has its snapshot), and for a ``SELECT`` outside one (a WAL reader never
    waits on writers). Those statements take microseconds; what can wait (``BEGIN
    IMMEDIATE`` on the lock, ``COMMIT`` on fsync) still goes to the connection's thread.
    The thread is idle whenever SQLAlchemy runs a statement: it awaits each one.
    """
    return inline_connection(conn, sql) is not None


# ``connection_of(conn)``: the sqlite3 connection under ``conn``, or None once closed; read
# in C (no Python call: a planned statement asks it each time, :mod:`store.fastsql`)
connection_of: Callable[[aiosqlite.Connection], sqlite3.Connection | None] = \
    attrgetter("_connection")


def inline_connection(conn: aiosqlite.Connection, sql: str) -> sqlite3.Connection | None:
    """The sqlite3 connection to run ``sql`` on right here if it may (see :func:`inline`),
    else None. (A planned statement asks the same of :func:`connection_of`'s answer with
    what its plan knows of ``sql``: ``store.fastsql.Conn.execute``.)"""
    raw = connection_of(conn)
    if raw is not None and (raw.in_transaction or reads(sql)):
        return raw
    return None


def reads(sql: str) -> bool:
    """Whether ``sql`` is a ``SELECT``: outside a transaction, a WAL reader that never
    waits on writers (see :func:`inline`)."""
    return sql.startswith("SELECT")


class OneHopCursor:
    """Duck-types the parts of :class:`aiosqlite.Cursor` SQLAlchemy uses."""

    arraysize = 1

    def __init__(self, conn: aiosqlite.Connection) -> None:
        self._conn = conn
        self._rows: list[Any] = []
        self.description: Sequence[Any] | None = None
        self.rowcount = -1
        self.lastrowid: int | None = None

    def _run(self, sql: str, parameters: Any, many: bool) -> tuple[list[Any], Any, int,
                                                                    int | None]:
        # runs on the connection's thread: the sqlite3 cursor never leaves it
        cur = sqlite3_connection(self._conn).cursor()
        try:
            if many:
                cur.executemany(sql, parameters)
            elif parameters is None:
                cur.execute(sql)
            else:
                cur.execute(sql, parameters)
            rows = cur.fetchall() if cur.description else []
            return rows, cur.description, cur.rowcount, cur.lastrowid
        finally:
            cur.close()

    async def _do(self, sql: str, parameters: Any, many: bool) -> OneHopCursor:
        if inline(self._conn, sql):
            done = self._run(sql, parameters, many)
        else:
            done = await on_thread(self._conn, self._run, sql, parameters, many)
        self._rows, self.description, self.rowcount, self.lastrowid = done
        return self

    async def execute(self, sql: str, parameters: Any = None) -> OneHopCursor:
        return await self._do(sql, parameters, False)

    async def executemany(self, sql: str, parameters: Iterable[Any]) -> OneHopCursor:
        return await self._do(sql, parameters, True)

    async def fetchall(self) -> list[Any]:
        rows, self._rows = self._rows, []
        return rows

    async def fetchone(self) -> Any:
        return self._rows.pop(0) if self._rows else None

    async def fetchmany(self, size: int | None = None) -> list[Any]:
        n = size or self.arraysize
        rows, self._rows = self._rows[:n], self._rows[n:]
        return rows

    async def close(self) -> None:
        self._rows = []


class _Opening:
    """What ``connection.cursor()`` returns: awaitable, and usable with ``async with``."""

    def __init__(self, conn: aiosqlite.Connection) -> None:
        self._cursor = OneHopCursor(conn)

    def __await__(self) -> Generator[Any, None, OneHopCursor]:
        yield from ()
        return self._cursor

    async def __aenter__(self) -> OneHopCursor:
        return self._cursor

    async def __aexit__(self, *exc: object) -> None:
        await self._cursor.close()


async def opened(pending: aiosqlite.Connection) -> aiosqlite.Connection:
    """Await ``pending`` (an ``aiosqlite.connect(...)``); if it fails to open, its thread
    has stopped before the failure reaches the caller.

    aiosqlite queues the stop of a connection that failed to open and raises without
    waiting for it; had the event loop closed first (the end of a command, of a test), the
    thread failed to hand back its answer ("Event loop is closed"), reported wherever the
    process was by then. The stop is the thread's next item: microseconds."""
    try:
        return await pending
    except BaseException:
        thread = getattr(pending, "_thread", None)
        for _ in range(5000):  # at most ~5 s, never forever
            if thread is None or not thread.is_alive():
                break
            await asyncio.sleep(0.001)
        raise


async def connect(path: str, *, busy_timeout: float) -> aiosqlite.Connection:
    """An aiosqlite connection whose cursors take one thread hop per statement."""
    # statements that cannot wait run on the loop's thread too (``inline``)
    conn = await opened(aiosqlite.connect(path, timeout=busy_timeout,
                                          check_same_thread=False))
    conn.cursor = lambda: _Opening(conn)  # type: ignore[method-assign,assignment,return-value]
    return conn
