"""A one-hop (or no-hop) cursor for SQLAlchemy's aiosqlite dialect.

aiosqlite runs each sqlite3 call on the connection's own thread and hands the result
back to the event loop. Through SQLAlchemy a single statement costs three or four such
round trips (open a cursor, execute, fetch the rows, close). The cursor here does the
whole statement in ONE trip: on the connection thread it opens a sqlite3 cursor,
executes, fetches every row, notes ``description``/``rowcount``/``lastrowid`` and closes
it; ``fetchall`` and ``close`` then need no trip at all. A statement that cannot wait on
anything (one inside a transaction that has begun, or a ``SELECT``: see ``inline``)
takes no trip at all: it runs right on the loop's thread, in microseconds. Same SQL,
same transactions, much less CPU per statement (see docs/performance.md). SQLite only;
PostgreSQL goes through asyncpg untouched.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable, Sequence
from typing import Any, cast

import aiosqlite


def inline(conn: aiosqlite.Connection, sql: str) -> bool:
    """May this statement run on the event loop's thread, with no hop at all?

    Yes inside a transaction that has begun (a write transaction holds SQLite's write lock
    from its ``BEGIN IMMEDIATE``, so its statements never wait on another writer; a read
    transaction has its snapshot), and for a ``SELECT`` outside one (a WAL reader never
    waits on writers). Those statements take microseconds; what can wait (``BEGIN
    IMMEDIATE`` on the lock, ``COMMIT`` on fsync) still goes to the connection's thread.
    The thread is idle whenever SQLAlchemy runs a statement: it awaits each one.
    """
    raw = conn._connection
    return raw is not None and (raw.in_transaction or sql.startswith("SELECT"))


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
        cur = self._conn._conn.cursor()
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
            done = await cast(Any, self._conn)._execute(self._run, sql, parameters, many)
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


async def connect(path: str, *, busy_timeout: float) -> aiosqlite.Connection:
    """An aiosqlite connection whose cursors take one thread hop per statement."""
    # statements that cannot wait run on the loop's thread too (``inline``)
    conn = await aiosqlite.connect(path, timeout=busy_timeout, check_same_thread=False)
    conn.cursor = lambda: _Opening(conn)  # type: ignore[method-assign,assignment,return-value]
    return conn
