"""Whether a pooled PostgreSQL connection is still alive, checked on checkout, cheaply.

SQLAlchemy's ``pool_pre_ping`` asks the server before every transaction; through asyncpg
that is three round trips (BEGIN, an empty statement, ROLLBACK) ahead of each
transaction's own, and a decision runs dozens of transactions. Instead, on checkout:

* a connection asyncpg already knows is closed (it read the server's goodbye and the end
  of the socket: a restart, ``pg_terminate_backend``, a failover) is replaced without
  asking the server;
* a connection idle for ``ping_after`` seconds or more is pinged as before, since a lot
  can happen to an idle socket (a server restarted while nobody read it, a NAT or a
  proxy that dropped it);
* a connection used less than ``ping_after`` seconds ago is trusted;
* a connection left inside a transaction (by a cancellation that SQLAlchemy did not see:
  ``tests/integration/test_db_cancel.py``) is replaced, whatever its age.

What this gives up: a connection the server ends in the last moments before it is reused,
before this process's event loop has read the socket's end. Its transaction's first
statement then fails as a disconnect: :meth:`store.db.Database.transact` runs such a
transaction again on a fresh connection (nothing of it was committed). The dead connection
is invalidated (a statement through SQLAlchemy invalidates the whole pool; the others are
replaced on checkout once asyncpg has read their end). A ping only narrows that window, it
never closed it: a connection can die between the ping and the statement.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from approvald.store import private_asyncpg
from sqlalchemy import event
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.ext.asyncio import AsyncEngine

log = logging.getLogger("approvald.store")
_IDLE_SINCE = "approvald_idle_since"
# a kept connection (store/leases.py) handed back to the pool after idling: since when
_KEPT_SINCE = "approvald_kept_since"
# What asyncpg says when the server ended the connection under it (pg_terminate_backend, a
# restart, a failover) and the socket's end has not been read yet: the protocol is left
# mid-message, so the next use fails with a client-side "internal" error, not a disconnect
_GONE_MESSAGES = ("another operation", "protocol is in an unexpected state",
                  "terminating connection", "connection is closed")


def server_gone(exc: BaseException) -> bool:
    """Whether ``exc`` (asyncpg's, or SQLAlchemy's adaptation of it) says the server
    ended the connection."""
    code = getattr(exc, "sqlstate", None) or ""
    return code.startswith("08") or code in ("57P01", "57P02", "57P03") or any(
        m in str(exc) for m in _GONE_MESSAGES)


class Liveness:
    """Checkout-time liveness checks for one engine's pool (see the module's text)."""

    def __init__(self, *, ping_after: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ping_after = ping_after
        self.clock = clock  # monotonic seconds; tests move it instead of waiting

    def install(self, engine: AsyncEngine) -> None:
        event.listen(engine.sync_engine, "checkin", self._checkin)
        event.listen(engine.sync_engine, "checkout", self._checkout)

    def trusted(self, since: float) -> bool:
        """Whether a connection last used at ``since`` (this clock's) needs no ping."""
        return self.clock() - since < self.ping_after

    @staticmethod
    def stranded(driver: Any) -> bool:
        """Whether the asyncpg connection ``driver`` is inside a transaction, asyncpg's or
        the server's, that its user no longer tracks."""
        return bool(driver.is_in_transaction()) or private_asyncpg.untracked_transaction(
            driver)

    @staticmethod
    def idle_since(info: dict[str, Any], since: float) -> None:
        """A connection kept out of the pool (``store/leases.py``) goes back to it having
        idled since ``since``: its next checkout judges it by that, not by its check-in
        (``info``: the connection's, ``AsyncConnection.info``)."""
        info[_KEPT_SINCE] = since

    def _checkin(self, _dbapi_conn: Any, record: Any) -> None:
        kept = record.info.pop(_KEPT_SINCE, None)
        record.info[_IDLE_SINCE] = self.clock() if kept is None else kept

    def _checkout(self, dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        since = record.info.pop(_IDLE_SINCE, None)  # None: a connection just made
        driver = dbapi_conn.driver_connection
        if driver.is_closed():
            raise DisconnectionError("the server closed this pooled connection")
        if self.stranded(driver):
            # a transaction nobody tracks (asyncpg's, which the pool's rollback on check-in
            # does not see): the next transaction would be a savepoint inside it, and
            # never commit. Replaced: closing it rolls the abandoned one back.
            log.warning("a pooled connection was left inside a transaction; replacing it")
            raise DisconnectionError("a pooled connection was left inside a transaction")
        if since is None or self.trusted(since):
            return
        try:
            dbapi_conn.ping()
        except Exception as exc:
            if driver.is_closed() or server_gone(exc):
                raise DisconnectionError(f"ping failed: {exc}") from exc
            raise
