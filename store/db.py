"""Engines, connections and transactions; every dialect detail lives here.

SQLite (the embedded default) runs in WAL mode with ``synchronous=FULL``, foreign keys and
a busy timeout, and write transactions start with ``BEGIN IMMEDIATE`` so two writers
queue on the lock instead of failing a read-to-write upgrade. PostgreSQL runs through
asyncpg at READ COMMITTED; the queries' compare-and-set and row locks do the rest.

One lock order, everywhere: a transaction that changes a run's approvals locks the run
row first (``RunsRepo.lock``), then the approval rows, and the audit chain head last (audit
entries are chained by a ``before_commit`` hook). Two transactions about one run therefore
queue on its run row and cannot deadlock each other; :meth:`Database.transact` still
retries the rare deadlock or serialization failure a bounded number of times.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import importlib.util
import logging
import os
import sqlite3
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from typing import Any, TypeVar

import aiosqlite
from approvald.store import fastsql, private_aiosqlite, private_asyncpg, private_sqlalchemy, waiting
from approvald.store.errors import ConfigError, NothingWritten
from approvald.store.fastsql import Conn
from approvald.store.leases import Lease, Leases
from approvald.store.liveness import Liveness, server_gone
from approvald.store.repos import Tx
from sqlalchemy import event
from sqlalchemy.engine import URL, Dialect, make_url
from sqlalchemy.exc import (
    ArgumentError,
    DataError,
    DBAPIError,
    IntegrityError,
    OperationalError,
    SQLAlchemyError,
    StatementError,
)
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

log = logging.getLogger("approvald.store")
T = TypeVar("T")
# PostgreSQL's "try the transaction again" codes: serialization failure, deadlock detected
RETRYABLE_SQLSTATES = frozenset({"40001", "40P01"})


def is_retryable(exc: BaseException) -> bool:
    """A failure that rolled the whole transaction back and may succeed if run again:
    a deadlock or serialization failure on PostgreSQL, a lock wait that ran out on SQLite,
    or a connection that died while a statement ran (so COMMIT was never sent)."""
    if not isinstance(exc, DBAPIError):
        return False
    code = getattr(exc.orig, "sqlstate", None) or getattr(exc.orig, "pgcode", None)
    if code in RETRYABLE_SQLSTATES:
        return True
    # a connection lost at COMMIT (no statement) may or may not have committed: not retried
    if exc.connection_invalidated and exc.statement is not None:
        return True
    return isinstance(exc, OperationalError) and "database is locked" in str(exc.orig)


def is_store_failure(exc: BaseException) -> bool:
    """Did the database fail (a connection, a lock, a timeout, the server), rather than the
    values a statement carried?

    Work that isolates one bad row from the rest (the expiry sweep) must never blame a row
    for an outage: an outage fails the whole batch, which is tried again later, while a
    data or integrity error, or a value that could not even be bound, is the row's own.
    """
    if isinstance(exc, DBAPIError):
        return not isinstance(exc, DataError | IntegrityError)
    if isinstance(exc, StatementError):  # a bind parameter refused its value
        return False
    # a driver's own error (the SQLite fast paths run statements on the driver directly)
    if isinstance(exc, sqlite3.Error):
        return not isinstance(exc, sqlite3.DataError | sqlite3.IntegrityError)
    code = getattr(exc, "sqlstate", None)
    if isinstance(code, str) and code:
        return not code.startswith(("22", "23"))  # data exception, integrity violation
    return isinstance(exc, SQLAlchemyError | OSError | TimeoutError)


_DRIVERS = {
    "sqlite": "sqlite+aiosqlite",
    "sqlite+aiosqlite": "sqlite+aiosqlite",
    "postgres": "postgresql+asyncpg",
    "postgresql": "postgresql+asyncpg",
    "postgresql+asyncpg": "postgresql+asyncpg",
}


def normalize_url(raw: str) -> URL:
    """Parse a database URL and pick the async driver; a bad URL is one clear error."""
    try:
        url = make_url(raw)
    except ArgumentError:
        raise ConfigError(
            f"APPROVALD_DATABASE_URL: not a database URL: {raw!r} "
            "(expected e.g. sqlite+aiosqlite:///approvald.db or postgresql+asyncpg://host/db)"
        ) from None
    driver = _DRIVERS.get(url.drivername)
    if driver is None:
        raise ConfigError(
            f"APPROVALD_DATABASE_URL: unsupported database {url.drivername!r} "
            "(approvald supports SQLite and PostgreSQL)"
        )
    url = url.set(drivername=driver)
    if driver.startswith("sqlite") and not url.database:
        raise ConfigError("APPROVALD_DATABASE_URL: a SQLite URL needs a file path "
                          "(in-memory databases cannot be shared between processes)")
    if driver.startswith("sqlite") and url.database and url.database != ":memory:":
        # a relative path is resolved once, so what is shown is the file actually used
        url = url.set(database=os.path.abspath(url.database))
    return url


FAST_PATH_ENV = "APPROVALD_DB_FAST_PATH"
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def fast_path_setting() -> bool:
    """``APPROVALD_DB_FAST_PATH`` (default on): whether hot statements may skip
    SQLAlchemy's per-statement machinery through the drivers' private internals
    (``store/private_aiosqlite.py``, ``store/private_sqlalchemy.py``). Off, every
    statement goes through plain SQLAlchemy and aiosqlite/asyncpg (slower, and immune to a
    release that renames what the fast path relies on)."""
    raw = os.environ.get(FAST_PATH_ENV, "1").strip().lower()
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise ConfigError(f"{FAST_PATH_ENV}: expected 1 or 0 (true/false, on/off), got {raw!r}")


def fast_path_gaps(dialect: str) -> list[str]:
    """What the fast path on ``dialect`` relies on that the installed drivers lack, each
    named with its dependency's version (none: it may run)."""
    modules: list[Any] = [private_sqlalchemy]
    if dialect == "sqlite":
        modules.append(private_aiosqlite)
    elif dialect == "postgresql" and importlib.util.find_spec("asyncpg") is not None:
        modules.append(private_asyncpg)
    return [f"{name} ({m.dependency()})" for m in modules for name in m.missing()]


class Database:
    """An async engine plus the transaction helpers the repositories run in.

    ``fast_path``: see :func:`fast_path_setting` (None: read it from the environment).
    """

    def __init__(self, url: str, *, busy_timeout_ms: int = 10_000,
                 pool_size: int = 10, server_time: bool | None = None,
                 connections: int | None = None, fast_path: bool | None = None) -> None:
        self.url = normalize_url(url)
        self.dialect = "sqlite" if self.url.drivername.startswith("sqlite") else "postgresql"
        self.fast_path = fast_path_setting() if fast_path is None else fast_path
        if self.fast_path:
            gaps = fast_path_gaps(self.dialect)
            if gaps:
                log.warning("the database fast path is off: the installed drivers lack %s "
                            "(set %s=0 to say so and silence this)", ", ".join(gaps),
                            FAST_PATH_ENV)
                self.fast_path = False
        # leases on PostgreSQL use the database's clock (replicas' clocks may disagree);
        # tests that move an injected clock across a lease turn it off
        self.server_time = (self.dialect == "postgresql") if server_time is None \
            else server_time and self.dialect == "postgresql"
        kwargs: dict[str, Any] = {}
        capacity = 0  # PostgreSQL: the pool's connections
        self._connect_reader: Callable[[], Awaitable[Any]] | None = None
        if self.dialect == "postgresql":
            # as many kept as may be open: past the pool's size a connection was closed on
            # check-in, so each burst opened it again and prepared its statements anew.
            # ``connections`` (APPROVALD_DB_CONNECTIONS) sets it exactly: N replicas hold
            # N times as many, which the server's max_connections must admit
            capacity = connections or 2 * pool_size
            kwargs.update(pool_size=capacity, max_overflow=0)
        else:
            path = self.url.database
            assert path is not None
            fast = self.fast_path

            async def creator() -> Any:
                if fast:  # one-hop cursors, and statements that cannot wait on the loop
                    return await private_aiosqlite.connect(
                        path, busy_timeout=busy_timeout_ms / 1000)
                # (opened() only waits on the driver's thread if it failed to open; with no
                # ``_thread`` in a later aiosqlite it is plain aiosqlite.connect)
                return await private_aiosqlite.opened(
                    aiosqlite.connect(path, timeout=busy_timeout_ms / 1000))

            async def reader() -> Any:
                raw = await creator()
                raw.isolation_level = None  # autocommit: a SELECT is its own snapshot
                return raw

            if fast:
                self._connect_reader = reader

            # every transaction ends in an explicit COMMIT or ROLLBACK, so the pool's extra
            # rollback on check-in is a wasted round trip to the driver thread. The pool
            # keeps as many connections as a burst uses: SQLAlchemy's default (5, plus 10
            # closed again on check-in) opened and closed ~60 connections, each a thread,
            # a file open and four PRAGMAs, during 200 simultaneous clicks.
            kwargs.update(async_creator=creator, pool_reset_on_return=None,
                          pool_size=2 * pool_size, max_overflow=pool_size)
        self.engine: AsyncEngine = create_async_engine(self.url, **kwargs)
        # PostgreSQL: a pooled connection is checked on checkout without a round trip
        # unless it idled (store/liveness.py); SQLite's connections are files
        self.liveness: Liveness | None = None
        if self.dialect == "postgresql":
            _configure_postgresql(self.engine)
            self.liveness = Liveness()
            self.liveness.install(self.engine)
        # PostgreSQL's plain reads: the same pool, each statement committed on its own
        self._autocommit: AsyncEngine | None = (
            self.engine.execution_options(isolation_level="AUTOCOMMIT")
            if self.dialect == "postgresql" else None)
        # SQLite has one writer. Queueing this process's writers here costs nothing; left
        # to SQLite they spin in its busy handler, which sleeps up to 100 ms per retry.
        # Correctness never rests on this lock: other processes, and every compare-and-set,
        # go through SQLite's own locking (BEGIN IMMEDIATE + busy timeout).
        self._write_lock: WriteLock | None = None
        # the dialect hot statements are planned for (store/fastsql.py); None: no plans
        self._plans: Dialect | None = (fastsql.plans_for(self.engine.dialect)
                                       if self.fast_path else None)
        # PostgreSQL with the fast path: connections kept checked out between transactions,
        # begun and ended on the driver's adapter (store/leases.py)
        self._leases: Leases | None = None
        if self.liveness is not None and self._plans is not None:
            self._leases = Leases(self.engine, self.liveness, capacity=capacity,
                                  timeout=self.engine.pool.timeout())  # type: ignore[attr-defined]
        self._readers: list[Any] = []  # idle driver connections for plain SQLite reads
        self._writer: AsyncConnection | None = None  # SQLite: the one write connection
        self._writer_parts: tuple[AsyncConnection, Any, Any] | None = None  # (its sync, driver)
        self._reader_cap = 2 * pool_size
        self._busy_timeout_ms = busy_timeout_ms
        if self.dialect == "sqlite":
            _configure_sqlite(self.engine, busy_timeout_ms)
            self._write_lock = WriteLock()
        # closed: connections still in use then are closed as they come back, not kept
        # (the pool's dispose() closes only idle ones; one checked in afterwards would
        # stay open until the garbage collector found it, after its event loop was gone)
        self._closed = False
        event.listen(self.engine.sync_engine, "checkin", self._on_checkin)

    @property
    def display_url(self) -> str:
        return self.url.render_as_string(hide_password=True)

    def write(self) -> AbstractAsyncContextManager[Tx]:
        """A read-write transaction, committed on exit, rolled back on error.

        A write someone waits on (:func:`store.waiting.since`: a click whose request is
        held open until its decision commits, an approved call about to start) takes this
        process's SQLite write queue ahead of the others, whoever has waited longest
        first. The order of commits is all it changes.
        """
        if self._leases is not None:  # PostgreSQL: on a kept connection (store/leases.py)
            return self._leases.transaction(self._on_lease, Tx.prepare_commit)
        if self._write_lock is not None and self._plans is not None:
            return _SQLiteWrite(self)  # SQLite with the fast path
        return self._write()

    # (a transaction's Tx and Conn made in place, here and in _SQLiteWrite and _PlainRead:
    # a helper's call more per transaction otherwise)
    def _on_lease(self, lease: Lease) -> Tx:
        return Tx(Conn(self._plans, conn=lease.conn, adapted=lease.adapted, kept=lease.kept),
                  self.dialect, server_time=self.server_time)

    def _alone_on_lease(self, lease: Lease) -> Tx:
        leases = self._leases
        assert leases is not None
        return Tx(Conn(self._plans, conn=lease.conn, adapted=lease.adapted, kept=lease.kept),
                  self.dialect, server_time=self.server_time, alone=True,
                  lend=lambda: leases.lend(lease))

    @asynccontextmanager
    async def _write(self) -> AsyncIterator[Tx]:
        if self._write_lock is None:
            async with self.engine.connect() as conn, conn.begin():
                tx = self._tx(Conn(self._plans, conn=conn))
                yield tx
                await tx.prepare_commit()
            return
        # SQLite without the fast path (with it: _SQLiteWrite): a pooled connection, begun
        # by SQLAlchemy
        assert self._plans is None
        await self._write_lock.acquire(since=waiting.since())
        try:
            async with self.engine.connect() as conn, _never_reused_after_error(conn):
                await conn.execution_options(approvald_begin="IMMEDIATE")
                async with conn.begin():
                    tx = self._tx(Conn(None, conn=conn))
                    yield tx
                    await tx.prepare_commit()
        finally:
            self._write_lock.release()

    def write_one(self) -> AbstractAsyncContextManager[Tx]:
        """A write of ONE statement that is atomic on its own (a repository method made
        for it, such as ``ExecutionsRepo.intent_under_lease``): on PostgreSQL sent in
        autocommit, committed when it returns, with no BEGIN and COMMIT round trips
        (issue 50); on SQLite an ordinary write transaction (:meth:`write`), in which the
        method may send more than one.

        Or, with nothing sent in the block, its ``before_commit`` hook's one statement
        (``Tx.alone``: the audit trail's chaining, which carries the rows the block handed
        it, :meth:`~runtime.record.audit.AuditTrail.ride`): it writes all or nothing, and
        raises :class:`~store.errors.NothingWritten` when it wrote nothing
        (:meth:`transact_one` then writes it as a transaction)."""
        if self._leases is not None:
            return self._leases.autocommit(self._alone_on_lease, _alone_hooks)
        if self._autocommit is None:
            return self.write()
        return self._write_one()

    @asynccontextmanager
    async def _write_one(self) -> AsyncIterator[Tx]:
        assert self._autocommit is not None
        conn = self._autocommit.connect()
        await conn.start()
        lent = False

        def lend() -> Callable[[BaseException | None], Awaitable[None]]:
            nonlocal lent
            lent = True
            return lambda _exc: asyncio.shield(conn.close())

        try:
            tx = Tx(Conn(self._plans, conn=conn), self.dialect, server_time=self.server_time,
                    alone=True, lend=lend)
            yield tx
            await _alone_hooks(tx)
        finally:
            if not lent:  # (as its own ``async with`` would close it)
                await asyncio.shield(conn.close())

    async def transact_one(self, work: Callable[[Tx], Awaitable[T]], *,
                           what: str = "transaction") -> T:
        """Run ``work(tx)`` as a write of one statement (:meth:`write_one`: on PostgreSQL
        alone, in autocommit, no BEGIN and COMMIT), and as a write transaction
        (:meth:`transact`) when that statement wrote nothing (what it was written under
        no longer held: :class:`~store.errors.NothingWritten`) or was rolled back to break
        a deadlock; on SQLite as :meth:`transact`. ``work`` is run again from the start
        then, and must do nothing outside the write it is handed. A connection lost while
        the statement ran is raised, not retried: in autocommit it may have committed."""
        if self._autocommit is not None:
            try:
                async with self.write_one() as tx:
                    return await work(tx)
            except NothingWritten:
                pass
            except DBAPIError as exc:
                code = getattr(exc.orig, "sqlstate", None) or getattr(exc.orig, "pgcode", None)
                if code not in RETRYABLE_SQLSTATES:
                    raise
        return await self.transact(work, what=what)

    async def transact(self, work: Callable[[Tx], Awaitable[T]], *, attempts: int = 4,
                       what: str = "transaction") -> T:
        """Run ``work(tx)`` in a write transaction, again from the start (a bounded number
        of times) when the database rolled it back: to break a deadlock or a serialization
        conflict, or because the connection died before COMMIT (the server restarted, or
        terminated its backend). ``work`` must do nothing outside the transaction it is
        handed."""
        for attempt in range(1, attempts + 1):
            try:
                async with self.write() as tx:
                    return await work(tx)
            except DBAPIError as exc:
                if attempt == attempts or not is_retryable(exc):
                    raise
                log.info("%s rolled back (%s); retrying (attempt %d of %d)", what,
                         type(exc.orig).__name__, attempt + 1, attempts)
                await asyncio.sleep(0.005 * attempt)
        raise AssertionError("unreachable")

    def read(self, *, snapshot: bool = False) -> AbstractAsyncContextManager[Tx]:
        """Reads. By default each statement sees the latest commit (no BEGIN/COMMIT round
        trips at all: autocommit on both databases); ``snapshot=True`` gives one consistent
        transaction across statements, for readers that compare rows with each other."""
        if self._leases is not None and not snapshot:
            # at READ COMMITTED every statement has a snapshot of its own, in a transaction
            # or not: one around plain reads only added its BEGIN and COMMIT round trips
            return self._leases.autocommit(self._on_lease)
        if self._connect_reader is not None and not snapshot:
            return _PlainRead(self)
        return self._read(snapshot=snapshot)

    @asynccontextmanager
    async def _read(self, *, snapshot: bool) -> AsyncIterator[Tx]:
        if self.dialect == "sqlite" and not snapshot:  # no fast path: autocommit, no BEGIN
            async with self.engine.connect() as conn, _never_reused_after_error(conn):
                await conn.execution_options(approvald_begin=None)
                yield self._tx(Conn(None, conn=conn))
            return
        if self._autocommit is not None and not snapshot:  # no fast path: as with leases
            async with self._autocommit.connect() as conn:
                yield self._tx(Conn(self._plans, conn=conn))
            return
        async with self.connection() as conn, AsyncExitStack() as guard:
            if self.dialect == "sqlite" and self._plans is None:  # no fast path
                await guard.enter_async_context(_never_reused_after_error(conn))
            if snapshot and self.dialect == "postgresql":
                # READ COMMITTED gives each statement its own snapshot; a reader that
                # compares rows with each other needs one snapshot for the whole read
                await conn.execution_options(isolation_level="REPEATABLE READ")
            async with conn.begin():
                yield self._tx(Conn(self._plans, conn=conn))

    def _tx(self, conn: Conn) -> Tx:
        return Tx(conn, self.dialect, server_time=self.server_time)

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[AsyncConnection]:
        """A connection for SQLAlchemy's own use, back to the pool afterwards."""
        if self._leases is not None:  # counted among the pool's, with the kept ones
            async with self._leases.borrowed() as conn:
                yield conn
            return
        async with self.engine.connect() as conn:
            yield conn

    async def reach(self) -> None:
        """Connect once and let go: an unreachable or missing database raises here (what
        opening it checks), and nothing is read or written."""
        async with self.connection():
            pass

    async def close(self) -> None:
        """Close every connection: idle ones now, ones in use as they come back. Each is
        closed whatever happens to the others (an unclosed aiosqlite connection left to
        the garbage collector stops its thread on an event loop that may be closed)."""
        self._closed = True
        # the write connection in use by a write is closed by that write when it ends
        in_use = self._write_lock is not None and self._write_lock.held
        writer, self._writer = (None, self._writer) if in_use else (self._writer, None)
        readers, self._readers = self._readers, []
        if self._leases is not None:  # to the pool, which closes them on check-in now
            await self._leases.close()
        try:
            if writer is not None:  # not back to the pool: its busy timeout is 0
                await _discard(writer)
        finally:
            try:
                for raw in readers:
                    with contextlib.suppress(Exception):
                        await raw.close()
            finally:
                await self.engine.dispose()

    def _on_checkin(self, dbapi_conn: Any, record: Any) -> None:
        if self._closed and dbapi_conn is not None:
            record.invalidate()  # closes it (the pool it returns to is gone)


class _SQLiteWrite:
    """``async with``: a write transaction on SQLite with the fast path. The write lock
    admits one writer at a time, so one connection serves them all (no pool checkout per
    transaction), and BEGIN IMMEDIATE and COMMIT are said on its driver connection
    directly: SQLAlchemy's transaction machinery cost more than the statements in between
    (it begins nothing itself on this connection, and commits what a statement it ran
    opened on its side). A class, not a generator, as :class:`_PlainRead`."""

    __slots__ = ("_db", "_parts", "_tx")

    def __init__(self, db: Database) -> None:
        self._db = db

    async def __aenter__(self) -> Tx:
        db = self._db
        lock, plans = db._write_lock, db._plans
        assert lock is not None and plans is not None
        await lock.acquire(since=waiting.since())
        try:
            writer = db._writer
            fresh = writer is None
            if writer is None:
                writer = await db.engine.connect()
                await writer.execution_options(approvald_begin=None)
                db._writer = writer
            parts = db._writer_parts
            if fresh or parts is None or parts[0] is not writer:
                # its SQLAlchemy and driver connections, read once (the writer is never
                # reconnected: a failure discards it)
                sync = writer.sync_connection
                assert sync is not None
                parts = db._writer_parts = (writer, sync, sync.connection.driver_connection)
            self._parts = parts
            raw = parts[2]
            try:
                if fresh:  # it never waits for SQLite's lock on the loop: begin_immediate
                    await fastsql.on_driver_thread(raw, "PRAGMA busy_timeout=0", plans)
                # inside: a BEGIN cancelled while it waited may still start a transaction
                # on the driver's thread, and the connection must not be trusted again
                await fastsql.begin_immediate(raw, plans, db._busy_timeout_ms)
                tx = self._tx = Tx(Conn(plans, conn=writer, raw=raw), db.dialect,
                                   server_time=db.server_time)
            except BaseException:
                await self._drop()
                raise
        except BaseException:
            await self._end()
            raise
        return tx

    async def __aexit__(self, _type: type[BaseException] | None,
                        exc: BaseException | None, _tb: Any) -> None:
        try:
            if exc is not None:
                await self._drop()
                return  # raised again by the caller's ``async with``
            writer, sync, raw = self._parts
            try:
                await self._tx.prepare_commit()
                if self._tx.conn.through and sync.in_transaction():
                    await writer.commit()
                else:
                    assert self._db._plans is not None
                    await fastsql.on_driver_thread(raw, "COMMIT", self._db._plans)
            except BaseException:
                await self._drop()
                raise
        finally:
            await self._end()

    async def _drop(self) -> None:
        """Closing the driver's connection rolls the transaction back; the next writer
        starts on a fresh one rather than trust this one (a cancellation mid-COMMIT, a
        broken file)."""
        db = self._db
        writer, db._writer = db._writer, None
        if writer is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(_discard(writer))

    async def _end(self) -> None:
        db = self._db
        assert db._write_lock is not None
        try:
            if db._closed and db._writer is not None:  # closed while this one wrote
                writer, db._writer = db._writer, None
                with contextlib.suppress(Exception):
                    await asyncio.shield(_discard(writer))
        finally:
            db._write_lock.release()


class _PlainRead:
    """``async with``: a SQLite read in autocommit (each statement sees the latest commit)
    on one of the database's idle driver connections: planned statements run on it
    directly, and a SQLAlchemy connection is checked out only if a statement needs one
    (checking one out and in costs more than a planned statement). A class, not a
    generator: it is entered around every plain read, and two nested generators' context
    managers and an exit stack cost more calls than the read's statement."""

    __slots__ = ("_conn", "_db", "_raw")

    def __init__(self, db: Database) -> None:
        self._db = db
        self._raw: Any = None
        self._conn: AsyncConnection | None = None

    async def __aenter__(self) -> Tx:
        db = self._db
        assert db._connect_reader is not None
        raw = self._raw = db._readers.pop() if db._readers else await db._connect_reader()
        return Tx(Conn(db._plans, raw=raw, open_conn=self._open), db.dialect,
                  server_time=db.server_time)

    async def _open(self) -> AsyncConnection:
        conn = self._db.engine.connect()
        await conn.start()
        self._conn = conn  # closed on exit, whatever happens next
        await conn.execution_options(approvald_begin=None)
        return conn

    async def __aexit__(self, *_exc: object) -> None:
        db, raw, conn = self._db, self._raw, self._conn
        try:
            if conn is not None:  # as its own ``async with`` would close it
                await asyncio.shield(conn.close())
        finally:
            if not db._closed and len(db._readers) < db._reader_cap \
                    and not raw.in_transaction:
                db._readers.append(raw)
            else:  # kept after close(), it would never be closed
                await raw.close()


async def _alone_hooks(tx: Tx) -> None:
    """The end of a write sent alone (:meth:`Database.write_one`)."""
    if tx.has_before_commit():
        # a statement sent before it is committed already: the hook's could not be undone
        # with it
        assert tx.conn.sent == 0, "write_one: a hook's statement must be the only one"
        await tx.prepare_commit()
        assert tx.conn.sent <= 1, "write_one: a hook sent more than one statement"


@asynccontextmanager
async def _never_reused_after_error(conn: AsyncConnection) -> AsyncIterator[None]:
    """SQLite without the fast path: a pooled connection whose work failed or was
    cancelled is closed, not handed on. A BEGIN or COMMIT cancelled while it ran on the
    driver's thread may have left it inside a transaction SQLAlchemy does not know of
    (holding the write lock), and the pool does not roll back on check-in."""
    try:
        yield
    except BaseException:
        with contextlib.suppress(Exception):
            await asyncio.shield(conn.invalidate())
        raise


async def _discard(conn: AsyncConnection) -> None:
    await conn.invalidate()
    await conn.close()


class WriteLock:
    """A mutex with two kinds of waiters: writers someone is waiting on, each with the
    monotonic time that person began waiting (a click held open until its decision
    commits; an approved call about to start), served oldest first; and ordinary
    writers, served in order after them. After ``streak`` hand-overs in a row to the
    first kind a waiting ordinary writer gets its turn, so a stream of pressing writes
    slows ordinary ones down but never starves them."""

    def __init__(self, *, streak: int = 4) -> None:
        self.streak = streak
        self._held = False
        self._pressing: list[tuple[float, int, asyncio.Future[None]]] = []  # a heap
        self._ordinary: deque[asyncio.Future[None]] = deque()
        self._seq = 0  # ties (one person's several writes) keep their arrival order
        self._run = 0  # hand-overs ahead of the line since an ordinary writer had the lock

    @property
    def held(self) -> bool:
        return self._held

    async def acquire(self, *, since: float | None = None) -> None:
        if not self._held and not self._pressing and not self._ordinary:
            self._held = True
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if since is None:
            self._ordinary.append(fut)
        else:
            self._seq += 1
            heapq.heappush(self._pressing, (since, self._seq, fut))
        try:
            await fut  # release() hands the lock over by resolving it
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():  # handed over just as we were cancelled
                self.release()
            raise

    def release(self) -> None:
        ordinary_first = self._run >= self.streak
        while self._pressing or self._ordinary:
            ordinary = bool(self._ordinary) and (ordinary_first or not self._pressing)
            fut = self._ordinary.popleft() if ordinary else heapq.heappop(self._pressing)[2]
            if not fut.done():  # skip waiters cancelled while queued
                self._run = 0 if ordinary else self._run + 1
                fut.set_result(None)  # ownership passes straight on: _held stays True
                return
        self._held = False


def _configure_postgresql(engine: AsyncEngine) -> None:
    @event.listens_for(engine.sync_engine, "handle_error")
    def _on_error(context: Any) -> None:
        # Count a connection the server ended as a disconnect, however asyncpg words it:
        # a ping on checkout then replaces it instead of failing, and a statement
        # that hits it invalidates the pool (its other connections died with it).
        if not context.is_disconnect and server_gone(context.original_exception):
            context.is_disconnect = True


def _configure_sqlite(engine: AsyncEngine, busy_timeout_ms: int) -> None:
    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # take transaction control away from the driver so we can say BEGIN IMMEDIATE
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=FULL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
        cur.close()

    @event.listens_for(engine.sync_engine, "invalidate")
    def _on_invalidate(dbapi_conn: Any, _record: Any, _exc: BaseException | None) -> None:
        # Roll back before the pool closes it. Python 3.11+ closes a SQLite connection whose
        # statements are not all finalized (a cursor still referenced by the traceback of a
        # cancelled write) as a "zombie" that keeps its transaction, and so the file's
        # write lock, until the garbage collector gets to that cursor: every later writer
        # waited out its busy timeout and failed "database is locked". (Not in a greenlet:
        # the collector's own cleanup, where nothing can be awaited.)
        with contextlib.suppress(Exception):
            dbapi_conn.rollback()

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(conn: Any) -> None:
        mode = conn.get_execution_options().get("approvald_begin", "DEFERRED")
        if mode is not None:  # None: statement-at-a-time reads in autocommit
            conn.exec_driver_sql(f"BEGIN {mode}")
