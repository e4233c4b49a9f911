"""Repositories per aggregate, bound together in one transaction (:class:`Tx`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

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

    def __init__(self, conn: AsyncConnection, dialect: str, *,
                 server_time: bool = False) -> None:
        self.conn = conn
        self.dialect = dialect
        self.scratch: dict[str, Any] = {}
        self._hooks: list[Callable[[Tx], Awaitable[None]]] = []
        fast = Conn(conn, dialect)  # hot statements skip SQLAlchemy's machinery
        self.runs = RunsRepo(fast, dialect, server_time=server_time)
        self.events = EventsRepo(fast, dialect)
        self.executions = ExecutionsRepo(fast, dialect)
        self.external = ExternalRepo(fast, dialect)
        self.approvals = ApprovalsRepo(fast, dialect)
        self.outbox = OutboxRepo(fast, dialect)
        self.audit = AuditRepo(fast, dialect)
        self.threads = ThreadsRepo(fast, dialect)
        self.limits = LimitsRepo(fast, dialect)
        self.retention = RetentionRepo(fast, dialect)
        self.stats = StatsRepo(fast, dialect)
        self.standing = StandingRepo(fast, dialect)
        self.adapters = AdaptersRepo(fast, dialect)

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
