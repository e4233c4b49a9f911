"""``/readyz``: whether this process can serve, in words an operator can act on.

The answer goes to whoever can reach the listener (a load balancer, and often more), so it
says what failed, never the database's host, port, user, name or the driver's own text;
those go to the log, once per change, for the operator.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import sqlite3
from typing import Any

from approvald.store import migrate
from approvald.store.db import Database

log = logging.getLogger("approvald.readiness")

READY_TIMEOUT = 2.0  # s the database gets to answer a readiness check

# PostgreSQL's SQLSTATE codes (asyncpg puts them on its exceptions) -> what to tell
SQLSTATES = {
    "28P01": "rejected the credentials (check the user and password in "
             "APPROVALD_DATABASE_URL)",
    "28000": "rejected the credentials (the user may not log in, or pg_hba.conf refuses "
             "this host)",
    "3D000": "does not exist (check the database name in APPROVALD_DATABASE_URL)",
    "53300": "refused the connection: too many connections (see APPROVALD_DB_CONNECTIONS "
             "and the server's max_connections)",
    "57P03": "is starting up or shutting down",
    "57P01": "closed the connection (an administrator or a failover ended it)",
    "42501": "refused access: the user lacks privileges on approvald's tables",
    **dict.fromkeys(("08000", "08001", "08003", "08004", "08006"),
                    "unreachable: the connection failed or was lost"),
}


def describe_failure(exc: BaseException) -> str:
    """What went wrong with the database, for an operator, without internals."""
    chain: list[BaseException] = []
    e: BaseException | None = exc
    while e is not None and e not in chain:
        chain.append(e)
        e = e.__cause__ or e.__context__
    for e in chain:
        state = getattr(e, "sqlstate", None)
        if isinstance(state, str) and state in SQLSTATES:
            return f"database {SQLSTATES[state]}"
    for e in chain:
        if isinstance(e, TimeoutError):
            return f"database unreachable: no answer within {READY_TIMEOUT:g} s"
        if isinstance(e, socket.gaierror):
            return "database unreachable: its host name does not resolve"
        if isinstance(e, ConnectionRefusedError):
            return "database unreachable: connection refused"
        if isinstance(e, ConnectionError):
            return "database unreachable: the connection failed or was lost"
        if isinstance(e, sqlite3.OperationalError):
            text = str(e)
            if "unable to open" in text:
                return "database file cannot be opened (check APPROVALD_DATABASE_URL's path " \
                       "and its directory's permissions)"
            if "locked" in text or "busy" in text:
                return "database is locked by another process"
            if "readonly" in text:
                return "database file is read-only"
        if isinstance(e, OSError):
            return "database unreachable: network error"
    name = type(exc).__name__
    if "Interface" in name or "Connection" in name:
        return "database unreachable: the connection failed or was lost"
    return "database error (the process log has the details)"


class Readiness:
    """Answers ``/readyz``; logs each change of answer (not every probe) with the detail."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._last: str | None = None  # the last failure told, None while ready

    async def check(self) -> tuple[int, dict[str, Any]]:
        """(HTTP status, body): 200 when the database answers within
        :data:`READY_TIMEOUT` and its schema is the one this code expects, else 503."""
        try:
            async with asyncio.timeout(READY_TIMEOUT):
                revision = await migrate.current_revision(self.db)
        except Exception as exc:  # unreachable, refused, timed out: not ready, say why
            why = describe_failure(exc)
            self._changed(why, f"{why} ({type(exc).__name__}: {exc})")
            return 503, {"ok": False, "database": why}
        if revision is not None and revision > migrate.HEAD:  # revisions are 0001, 0002, …
            why = (f"schema {revision} was written by a newer approvald; this one knows up "
                   f"to {migrate.HEAD}: replace this replica with the new version")
        elif revision != migrate.HEAD:
            why = (f"schema {revision or 'none'} is behind, this code needs {migrate.HEAD}: "
                   "run `approvald db upgrade`")
        else:
            if self._last is not None:
                log.info("ready again: the database answers")
            self._last = None
            return 200, {"ok": True, "database": "reachable", "schema": revision}
        self._changed(why, why)
        return 503, {"ok": False, "database": why}

    def _changed(self, why: str, detail: str) -> None:
        if why != self._last:
            log.warning("not ready: %s", detail)
        self._last = why
