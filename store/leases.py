"""PostgreSQL connections kept checked out between transactions (issue 50).

Through SQLAlchemy every transaction, and every plain read, checked a connection out of
the pool and back in: an ``AsyncConnection`` made, greenlets spawned, the pool's checkout
and check-in with their events (``store/liveness.py``), a rollback on return; plain reads
and writes sent alone also set the connection's isolation level to AUTOCOMMIT and back
(each a rollback on the adapter). For a decision that was more Python than its
statements: ~10 checkouts and ~11 isolation-level sets per approval, SQLAlchemy 18-24% of
``serve``'s own time during 200 clicks (``tests/benchmarks/bench_clicks.py --profile``),
and two thirds of the CPU of a bare ``SELECT 1`` transaction
(``tests/benchmarks/bench_tx.py``).

Here a connection, once checked out, stays checked out: :class:`Leases` keeps it between
uses (the one used last is handed out first: its prepared statements are warm), and what
a transaction needs is said on the asyncpg adapter directly:

* a write transaction: BEGIN as the adapter says it, ahead of the first statement (as for
  SQLAlchemy); COMMIT, or ROLLBACK on error, awaited on the adapter
  (``store/private_sqlalchemy.py``), or through SQLAlchemy when a statement it ran began
  its own transaction on the connection;
* a plain read, or a write of one statement: the adapter's autocommit switched on for it
  (no BEGIN; no isolation level set, nothing said to the server).

What the pool did on checkout is done on taking a kept connection: one asyncpg knows is
closed, one idle for the liveness check's ``ping_after``, and one checked out before a
disconnect made SQLAlchemy invalidate the whole pool go back to the pool and another is
checked out there (closed ones replaced, idle ones pinged, invalidated ones reconnected:
the pool's own rules). What it did on check-in is done on giving one back: a connection
left inside a transaction (an error that could not roll back), one cancelled mid-use
(whatever it was doing, its state is unknown) or one SQLAlchemy invalidated is closed,
never kept. The pool's size still bounds it all: :class:`Leases` counts the connections
it holds, and when all are held a caller waits for one to come back (up to the pool's
timeout, then SQLAlchemy's ``TimeoutError``). Anything else (a snapshot read,
``Database.connection()``) runs on one of these too, handed back to the pool afterwards
for SQLAlchemy's reset of whatever was changed on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, Generic, TypeVar, cast

from approvald.store import private_sqlalchemy
from approvald.store.liveness import Liveness, server_gone
from sqlalchemy import event
from sqlalchemy import exc as sa_exc
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

T = TypeVar("T")
# the end of a connection lent out (Leases.lend): awaited with the error it ended with, or None
End = Callable[[BaseException | None], Awaitable[None]]
log = logging.getLogger("approvald.store")


class Lease:
    """A connection checked out of the pool and kept: SQLAlchemy's, the asyncpg
    adapter under it, and asyncpg's own."""

    __slots__ = ("adapted", "conn", "driver", "epoch", "kept", "owner", "since", "sync")

    def __init__(self, conn: AsyncConnection, epoch: int) -> None:
        self.conn = conn
        sync = conn.sync_connection
        assert sync is not None
        self.sync = sync  # what conn's in_transaction() and invalidated read, one call nearer
        self.adapted: Any = cast(Any, sync.connection.dbapi_connection)  # asyncpg adapter
        self.driver: Any = self.adapted.driver_connection  # asyncpg's connection
        self.epoch = epoch  # the pool's invalidations seen when it was checked out
        self.since = 0.0  # when it was last given back (the liveness clock's)
        # its prepared statements by SQL (store/private_sqlalchemy.py: execute): one dict
        # look-up a statement; they go with the connection
        self.kept: dict[str, Any] = {}
        # the block (Leased) it is in use by; another once that block lent it out
        self.owner: Any = None


class Leases:
    """The connections one :class:`~store.db.Database` keeps on PostgreSQL (see the
    module's text). ``capacity``: the pool's size (it has no overflow)."""

    def __init__(self, engine: AsyncEngine, liveness: Liveness, *, capacity: int,
                 timeout: float) -> None:
        self.engine = engine
        self.liveness = liveness
        self.capacity = capacity
        self.timeout = timeout
        self.held = 0  # checked out of the pool by this object: idle, in use, or reserved
        self.idle: list[Lease] = []
        self.closed = False
        self._epoch = 0
        # callers waiting for a connection, in order, each with its deadline (loop time)
        self._waiters: deque[tuple[asyncio.Future[Lease | None], float]] = deque()
        self._timer: asyncio.TimerHandle | None = None  # at the earliest deadline
        self._timer_at = 0.0  # when it is set for
        self._dbapi_error: Any = engine.dialect.loaded_dbapi.Error
        # registered after store.db's own handler, which may set is_disconnect
        event.listen(engine.sync_engine, "handle_error", self._on_error)

    def _on_error(self, context: Any) -> None:
        if context.is_disconnect and context.invalidate_pool_on_disconnect:
            # SQLAlchemy invalidates the pool: every connection checked out before now is
            # replaced on its next checkout. Kept ones go back to the pool for that.
            self._epoch += 1

    # -- the transactions ------------------------------------------------------------

    def transaction(self, open_: Callable[[Lease], T],
                    before_commit: Callable[[T], Awaitable[None]] | None = None
                    ) -> Leased[T]:
        """``async with``: ``open_(lease)`` for a transaction on a kept connection,
        ``before_commit`` of it awaited at the end of the block, then committed; rolled
        back on error."""
        return Leased(self, open_, before_commit, autocommit=False)

    def autocommit(self, open_: Callable[[Lease], T],
                   before_commit: Callable[[T], Awaitable[None]] | None = None
                   ) -> Leased[T]:
        """The same for statements each committed on its own (no BEGIN)."""
        return Leased(self, open_, before_commit, autocommit=True)

    def lend(self, lease: Lease) -> End:
        """Hand ``lease``, in use in autocommit by a block (:meth:`autocommit`), over to
        work that may outlive that block (its holder cancelled): the block leaves it
        alone from now on, and the work ends it by awaiting the function returned, with
        None (given back to be kept) or the error it ended with (rolled back, or closed
        when its state is unknown: a cancellation)."""
        lease.owner = None

        async def end(exc: BaseException | None) -> None:
            await asyncio.shield(self._finish(lease, exc))
        return end

    async def _finish(self, lease: Lease, exc: BaseException | None) -> None:
        """End the use in autocommit of ``lease``, which ended with ``exc`` (None: none)."""
        try:
            if exc is None and lease.sync.in_transaction():  # (SQLAlchemy's record of one)
                await lease.conn.commit()
        except BaseException as err:
            exc = err
        private_sqlalchemy.set_autocommit(lease.adapted, False)
        if exc is not None:
            await self._abandon(lease, exc)
        else:
            await self.give_back(lease)

    @asynccontextmanager
    async def borrowed(self) -> AsyncIterator[AsyncConnection]:
        """A connection for SQLAlchemy's own use (an isolation level, a BEGIN of its own),
        handed back to the pool afterwards: the pool resets what was changed on it."""
        lease = await self.take()
        try:
            yield lease.conn
        finally:
            await self._to_pool(lease)

    async def _end(self, lease: Lease, *, commit: bool) -> None:
        """End the adapter's transaction, a driver error raised as SQLAlchemy would: its
        exception class, and a connection the server ended invalidated (no statement: a
        COMMIT lost with its connection may have committed, and is not retried)."""
        try:
            await private_sqlalchemy.end_transaction(lease.adapted, commit=commit)
        except self._dbapi_error as err:
            gone = server_gone(err) or lease.driver.is_closed()
            if gone:
                with contextlib.suppress(Exception):
                    await asyncio.shield(lease.conn.invalidate())
            dialect = self.engine.dialect
            raise sa_exc.DBAPIError.instance(
                None, None, err, dialect.loaded_dbapi.Error, dialect=dialect,
                connection_invalidated=gone) from err

    async def _commit(self, lease: Lease) -> None:
        if lease.sync.in_transaction():  # a statement through SQLAlchemy began it
            await lease.conn.commit()
        else:
            await self._end(lease, commit=True)

    async def _abandon(self, lease: Lease, exc: BaseException) -> None:
        """The block, or its COMMIT, failed: roll back and keep the connection when that
        leaves it clean; cancelled (its state unknown), or not clean, it is closed."""
        await asyncio.shield(self._after_error(lease, isinstance(exc, Exception)))

    async def _after_error(self, lease: Lease, clean: bool) -> None:
        conn = lease.conn
        if clean and not conn.invalidated and not lease.driver.is_closed():
            try:
                if conn.in_transaction():
                    await conn.rollback()
                else:
                    await self._end(lease, commit=False)
            except Exception:
                pass  # closed below
            else:
                if not conn.invalidated:
                    await self.give_back(lease)
                    return
        await self._discard(lease)

    # -- taking and giving back ------------------------------------------------------

    async def take(self) -> Lease:
        """A kept connection fit for use, the last one given back first; else one checked
        out of the pool, or, with all the pool's held, the next one given back."""
        while True:
            lease: Lease | None
            if self.idle:
                lease = self.idle.pop()
            elif self.held < self.capacity:
                self.held += 1
                lease = None
            else:
                lease = await self._wait()  # None: a place in the pool, reserved
            if lease is None:
                try:
                    return Lease(await self.engine.connect(), self._epoch)
                except BaseException:
                    self._release()
                    raise
            if lease.epoch == self._epoch and self.liveness.trusted(lease.since) \
                    and not lease.driver.is_closed():
                return lease
            # back to the pool, whose checkout replaces, pings or reconnects it
            try:
                Liveness.idle_since(lease.conn.info, lease.since)
                await asyncio.shield(lease.conn.close())
                return Lease(await self.engine.connect(), self._epoch)
            except BaseException:
                self._release()
                raise

    async def give_back(self, lease: Lease) -> None:
        """Keep a connection whose work ended cleanly for the next use (or hand it to one
        waiting)."""
        if self.closed or lease.sync.invalidated:
            await self._to_pool(lease)
            return
        if Liveness.stranded(lease.driver):  # in a transaction nobody tracks
            log.warning("a kept connection was left inside a transaction; closing it")
            await self._discard(lease)
            return
        lease.since = self.liveness.clock()
        if not (self._waiters and self._hand(lease)):
            self.idle.append(lease)

    async def _wait(self) -> Lease | None:
        """The next connection given back (None: a place in the pool, reserved), or
        SQLAlchemy's ``TimeoutError`` after the pool's timeout. One timer, at the earliest
        waiter's deadline, serves them all: waiters are served in order and wait as long,
        so it is set when the first one comes and again when it fires (a timer of its
        own per waiter, as ``asyncio.timeout`` makes, cost more calls than the wait's
        other work when every click of a burst waits for a connection)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Lease | None] = loop.create_future()
        deadline = loop.time() + self.timeout
        self._waiters.append((fut, deadline))
        if self._timer is None or deadline < self._timer_at:  # (a shorter timeout)
            if self._timer is not None:
                self._timer.cancel()
            self._timer, self._timer_at = loop.call_at(deadline, self._expire), deadline
        try:
            return await fut
        except _TimedOut:
            raise sa_exc.TimeoutError(
                f"all {self.capacity} connections of the pool are in use; none came "
                f"back within {self.timeout:.0f} s (APPROVALD_DB_CONNECTIONS)") from None
        except BaseException:
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                # handed over as it gave up: pass it on
                got = fut.result()
                if got is None:
                    self._release()
                elif not self._hand(got):
                    self.idle.append(got)
            raise

    def _expire(self) -> None:
        """The earliest deadline: every waiter past its own gives up; the timer is set
        again for the earliest of those still waiting."""
        self._timer = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        waiting: deque[tuple[asyncio.Future[Lease | None], float]] = deque()
        for fut, deadline in self._waiters:
            if fut.done():
                continue
            if deadline <= now:
                fut.set_exception(_TimedOut())
            else:
                waiting.append((fut, deadline))
        self._waiters = waiting
        if waiting:
            at = min(d for _, d in waiting)
            self._timer, self._timer_at = loop.call_at(at, self._expire), at

    def _hand(self, item: Lease | None) -> bool:
        """Give ``item`` (a connection, or None: a place in the pool) to the longest
        waiting caller, if any."""
        while self._waiters:
            fut = self._waiters.popleft()[0]
            if not fut.done():
                fut.set_result(item)
                return True
        return False

    def _release(self) -> None:
        """A connection this object held is gone (closed, or back to the pool): its
        place goes to a caller waiting for one, or is free."""
        if not self._hand(None):
            self.held -= 1

    async def _to_pool(self, lease: Lease) -> None:
        try:
            await asyncio.shield(lease.conn.close())
        finally:
            self._release()

    async def _discard(self, lease: Lease) -> None:
        """Close a connection whose state is unknown (closing it rolls back on the
        server whatever it was inside)."""
        try:
            with contextlib.suppress(Exception):
                await asyncio.shield(_invalidated(lease.conn))
        finally:
            self._release()

    async def close(self) -> None:
        """Hand every kept connection back to the pool (those in use: as they come back)."""
        self.closed = True
        idle, self.idle = self.idle, []
        for lease in idle:
            with contextlib.suppress(Exception):
                await self._to_pool(lease)


class _TimedOut(Exception):
    """A waiter's deadline passed (:meth:`Leases._wait` raises SQLAlchemy's error)."""


class Leased(Generic[T]):
    """``async with``: work on a kept connection (:meth:`Leases.transaction`,
    :meth:`Leases.autocommit`). A class, not a generator: it is entered around every
    transaction, and a generator's context manager costs several times its calls."""

    __slots__ = ("_autocommit", "_before", "_lease", "_leases", "_open", "_value")

    def __init__(self, leases: Leases, open_: Callable[[Lease], T],
                 before_commit: Callable[[T], Awaitable[None]] | None, *,
                 autocommit: bool) -> None:
        self._leases = leases
        self._open = open_
        self._before = before_commit
        self._autocommit = autocommit
        self._lease: Lease | None = None

    async def __aenter__(self) -> T:
        lease = self._lease = await self._leases.take()
        lease.owner = self
        if self._autocommit:
            private_sqlalchemy.set_autocommit(lease.adapted, True)
        try:
            self._value = self._open(lease)
        except BaseException as exc:
            await self._failed(lease, exc)
            raise
        return self._value

    async def __aexit__(self, _type: type[BaseException] | None,
                        exc: BaseException | None, _tb: Any) -> None:
        lease = self._lease
        assert lease is not None
        self._lease = None
        if exc is not None:
            await self._failed(lease, exc)
            return  # raised again by the caller's ``async with``
        try:
            if self._before is not None:
                await self._before(self._value)
                if lease.owner is not self:  # lent out (Leases.lend): its borrower ends it
                    return
            if self._autocommit:
                if lease.sync.in_transaction():  # SQLAlchemy's record of one: no round trip
                    await lease.conn.commit()
                private_sqlalchemy.set_autocommit(lease.adapted, False)
            else:
                await self._leases._commit(lease)
        except BaseException as err:
            await self._failed(lease, err)
            raise
        await self._leases.give_back(lease)

    async def _failed(self, lease: Lease, exc: BaseException) -> None:
        if lease.owner is not self:  # lent out: its borrower ends it
            return
        if self._autocommit:
            private_sqlalchemy.set_autocommit(lease.adapted, False)
        await self._leases._abandon(lease, exc)


async def _invalidated(conn: AsyncConnection) -> None:
    if not conn.invalidated:
        await conn.invalidate()
    await conn.close()
