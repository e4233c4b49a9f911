"""Repositories per aggregate, bound together in one transaction (:class:`Tx`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from store.fastsql import Conn
from store.repos.adapters import AdaptersRepo
from store.repos.approvals import ApprovalsRepo
from store.repos.audit import AuditRepo
from store.repos.events import EventsRepo
from store.repos.executions import ExecutionsRepo
from store.repos.external import ExternalRepo
from store.repos.limits import LimitsRepo
from store.repos.outbox import OutboxRepo
from store.repos.retention import RetentionRepo
from store.repos.runs import RunsRepo
from store.repos.standing import StandingRepo
from store.repos.stats import StatsRepo
from store.repos.threads import ThreadsRepo


class Tx:
    """One open transaction and the repositories that work inside it.

    ``scratch`` holds per-transaction state of the layers above (the audit entries a
    transaction has recorded, say); ``before_commit`` hooks run, in order, as the last
    statements of a write transaction, so work that takes a global lock (chaining audit
    entries under the chain head) holds it for the shortest time and always last.
    """

    __slots__ = ("_hooks", "adapters", "approvals", "audit", "conn", "dialect", "events",
                 "executions", "external", "limits", "outbox", "retention", "runs", "scratch",
                 "standing", "stats", "threads")

    def __init__(self, conn: Conn, dialect: str, *, server_time: bool = False) -> None:
        self.conn = conn
        self.dialect = dialect
        self.scratch: dict[str, Any] = {}
        self._hooks: list[Callable[[Tx], Awaitable[None]]] = []
        self.runs = RunsRepo(conn, dialect, server_time=server_time)
        self.events = EventsRepo(conn, dialect)
        self.executions = ExecutionsRepo(conn, dialect)
        self.external = ExternalRepo(conn, dialect)
        self.approvals = ApprovalsRepo(conn, dialect)
        self.outbox = OutboxRepo(conn, dialect)
        self.audit = AuditRepo(conn, dialect)
        self.threads = ThreadsRepo(conn, dialect)
        self.limits = LimitsRepo(conn, dialect)
        self.retention = RetentionRepo(conn, dialect)
        self.stats = StatsRepo(conn, dialect)
        self.standing = StandingRepo(conn, dialect)
        self.adapters = AdaptersRepo(conn, dialect)

    def before_commit(self, hook: Callable[[Tx], Awaitable[None]]) -> None:
        """Run ``hook(tx)`` at the end of this write transaction, just before COMMIT."""
        self._hooks.append(hook)

    async def prepare_commit(self) -> None:
        """Run the ``before_commit`` hooks (the transaction helpers call this)."""
        while self._hooks:
            await self._hooks.pop(0)(self)


__all__ = ["AdaptersRepo", "ApprovalsRepo", "AuditRepo", "EventsRepo", "ExecutionsRepo",
           "ExternalRepo",
           "LimitsRepo",
           "OutboxRepo", "RetentionRepo",
           "RunsRepo", "StandingRepo", "StatsRepo", "ThreadsRepo", "Tx"]
