"""Repositories per aggregate, bound together in one transaction (:class:`Tx`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar, overload

from approvald.store.fastsql import Conn
from approvald.store.repos.adapters import AdaptersRepo
from approvald.store.repos.approvals import ApprovalsRepo
from approvald.store.repos.audit import AuditRepo
from approvald.store.repos.base import Repo
from approvald.store.repos.events import EventsRepo
from approvald.store.repos.executions import ExecutionsRepo
from approvald.store.repos.external import ExternalRepo
from approvald.store.repos.keys import KeysRepo
from approvald.store.repos.limits import LimitsRepo
from approvald.store.repos.outbox import OutboxRepo
from approvald.store.repos.policy import PolicyRepo
from approvald.store.repos.retention import RetentionRepo
from approvald.store.repos.runs import RunsRepo
from approvald.store.repos.standing import StandingRepo
from approvald.store.repos.stats import StatsRepo
from approvald.store.repos.threads import ThreadsRepo
from approvald.store.repos.web import WebRepo

RepoT = TypeVar("RepoT", bound=Repo)
# the end of a write's connection handed over (Tx.lend): awaited with the error the work
# on it ended with, or None
End = Callable[[BaseException | None], Awaitable[None]]


class _Bound(Generic[RepoT]):
    """A repository made on first use in a transaction and kept in it (most transactions
    use two or three of the thirteen, and making all of them cost more than a planned
    statement)."""

    def __init__(self, cls: type[RepoT]) -> None:
        self.cls = cls
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, tx: None, owner: type) -> _Bound[RepoT]: ...
    @overload
    def __get__(self, tx: Tx, owner: type) -> RepoT: ...

    def __get__(self, tx: Tx | None, owner: type) -> RepoT | _Bound[RepoT]:
        if tx is None:
            return self
        repo = self.cls(tx.conn, tx.dialect, server_time=tx.server_time)
        tx.__dict__[self.name] = repo  # found there from now on: no call at all
        return repo


class Tx:
    """One open transaction and the repositories that work inside it.

    ``scratch`` holds per-transaction state of the layers above (the audit entries a
    transaction has recorded, say); ``before_commit`` hooks run, in order, as the last
    statements of a write transaction, so work that takes a global lock (chaining audit
    entries under the chain head) holds it for the shortest time and always last.

    ``alone``: a write sent as ONE statement in autocommit (``Database.write_one`` on
    PostgreSQL), with no transaction around it to roll back: a ``before_commit`` hook
    then runs only when nothing else was sent, and sends its one statement, which writes
    all or nothing, or raises :class:`~store.errors.NothingWritten` having written nothing.
    Its connection may be handed over (:meth:`lend`) to work that outlives the write.
    """

    runs = _Bound(RunsRepo)
    events = _Bound(EventsRepo)
    executions = _Bound(ExecutionsRepo)
    external = _Bound(ExternalRepo)
    approvals = _Bound(ApprovalsRepo)
    outbox = _Bound(OutboxRepo)
    audit = _Bound(AuditRepo)
    threads = _Bound(ThreadsRepo)
    limits = _Bound(LimitsRepo)
    retention = _Bound(RetentionRepo)
    stats = _Bound(StatsRepo)
    standing = _Bound(StandingRepo)
    adapters = _Bound(AdaptersRepo)
    policy = _Bound(PolicyRepo)
    web = _Bound(WebRepo)
    keys = _Bound(KeysRepo)

    def __init__(self, conn: Conn, dialect: str, *, server_time: bool = False,
                 alone: bool = False, lend: Callable[[], End] | None = None) -> None:
        self.conn = conn
        self.dialect = dialect
        self.server_time = server_time
        self.alone = alone
        self._lend = lend
        self.scratch: dict[str, Any] = {}
        self._hooks: list[Callable[[Tx], Awaitable[None]]] = []

    def before_commit(self, hook: Callable[[Tx], Awaitable[None]]) -> None:
        """Run ``hook(tx)`` at the end of this write transaction, just before COMMIT."""
        self._hooks.append(hook)

    def lend(self) -> End | None:
        """A write sent alone: its connection, and this transaction's repositories on it,
        handed over to work that may outlive the write's block (a statement sent for
        others too, which the block's cancellation must not cut): the block leaves the
        connection alone from now on, and the work ends it by awaiting the function
        returned (with None, or the error it ended with). None: this write's connection
        cannot be handed over (not sent alone), and nothing changed."""
        lend, self._lend = self._lend, None
        return None if lend is None else lend()

    def has_before_commit(self) -> bool:
        return bool(self._hooks)

    async def prepare_commit(self) -> None:
        """Run the ``before_commit`` hooks (the transaction helpers call this)."""
        while self._hooks:
            await self._hooks.pop(0)(self)


__all__ = ["AdaptersRepo", "ApprovalsRepo", "AuditRepo", "EventsRepo", "ExecutionsRepo",
           "ExternalRepo",
           "LimitsRepo",
           "OutboxRepo", "RetentionRepo",
           "RunsRepo", "StandingRepo", "StatsRepo", "ThreadsRepo", "Tx"]
