"""Repositories per aggregate, bound together in one transaction (:class:`Tx`)."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncConnection

from store.repos.approvals import ApprovalsRepo
from store.repos.audit import AuditRepo
from store.repos.events import EventsRepo
from store.repos.executions import ExecutionsRepo
from store.repos.outbox import OutboxRepo
from store.repos.runs import RunsRepo
from store.repos.threads import ThreadsRepo


class Tx:
    """One open transaction and the repositories that work inside it."""

    __slots__ = ("approvals", "audit", "conn", "dialect", "events", "executions", "outbox",
                 "runs", "threads")

    def __init__(self, conn: AsyncConnection, dialect: str) -> None:
        self.conn = conn
        self.dialect = dialect
        self.runs = RunsRepo(conn, dialect)
        self.events = EventsRepo(conn, dialect)
        self.executions = ExecutionsRepo(conn, dialect)
        self.approvals = ApprovalsRepo(conn, dialect)
        self.outbox = OutboxRepo(conn, dialect)
        self.audit = AuditRepo(conn, dialect)
        self.threads = ThreadsRepo(conn, dialect)


__all__ = ["ApprovalsRepo", "AuditRepo", "EventsRepo", "ExecutionsRepo", "OutboxRepo",
           "RunsRepo", "ThreadsRepo", "Tx"]
