"""Retention: what pruning may delete, counted or deleted in batches.

Only the bulky, replaceable parts of *finished* runs go (their transcript, execution
ledger rows and thread bookkeeping) and outbox rows that were settled long ago. The run
row, its approvals and votes (the decisions themselves) stay, and the audit log is never
touched: it must stay verifiable.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from approvald.store.models import (
    Outbox,
    Run,
    RunEvent,
    RunThread,
    ToolExecution,
    WebLink,
    WebSession,
    WebSlackState,
)
from approvald.store.repos.base import Repo
from sqlalchemy import Table, delete, exists, func, or_, select

FINISHED = ("completed", "cancelled", "failed")

_R = cast(Table, Run.__table__)
_E = cast(Table, RunEvent.__table__)
_X = cast(Table, ToolExecution.__table__)
_T = cast(Table, RunThread.__table__)
_O = cast(Table, Outbox.__table__)
_PER_RUN: tuple[tuple[str, Table], ...] = (("events", _E), ("executions", _X),
                                            ("threads", _T))
# the web review queue's rows that are of no use once expired: sign-in links, sessions,
# Sign in with Slack states (every table of bot/web that holds rows; its refusal counts
# are deleted as they are folded into the audit log)
EXPIRING: dict[str, Table] = {"web_links": cast(Table, WebLink.__table__),
                              "web_sessions": cast(Table, WebSession.__table__),
                              "web_slack_states": cast(Table, WebSlackState.__table__)}


@dataclass(slots=True)
class Pruned:
    runs: int = 0
    events: int = 0
    executions: int = 0
    threads: int = 0
    outbox: int = 0

    def add(self, other: Pruned) -> None:
        for name in ("runs", "events", "executions", "threads", "outbox"):
            setattr(self, name, getattr(self, name) + getattr(other, name))


class RetentionRepo(Repo):
    async def finished_before(self, cutoff: datetime, *, after: str, limit: int,
                              lock: bool = False) -> list[str]:
        """Ids of runs that finished before ``cutoff`` and still have something to
        prune, in id order after ``after``.

        ``lock``: hold their rows until the transaction ends (PostgreSQL), the first lock
        of the one lock order; a finished run never changes again, but this keeps it so.
        """
        left = or_(*(exists().where(t.c.run_id == _R.c.id) for _, t in _PER_RUN))
        stmt: Any = (select(_R.c.id)
                     .where(_R.c.status.in_(FINISHED), _R.c.updated_at < cutoff,
                            _R.c.id > after, left)
                     .order_by(_R.c.id).limit(limit))
        if lock and self.dialect == "postgresql":
            stmt = stmt.with_for_update()
        return [r for (r,) in await self.conn.execute(stmt)]

    async def count_for_runs(self, run_ids: Sequence[str]) -> Pruned:
        got = Pruned(runs=len(run_ids))
        for name, table in _PER_RUN:
            n = (await self.conn.execute(select(func.count()).select_from(table)
                                         .where(table.c.run_id.in_(run_ids)))).scalar_one()
            setattr(got, name, int(n))
        return got

    async def delete_for_runs(self, run_ids: Sequence[str]) -> Pruned:
        got = Pruned(runs=len(run_ids))
        for name, table in _PER_RUN:
            res = await self.conn.execute(delete(table).where(table.c.run_id.in_(run_ids)))
            setattr(got, name, int(res.rowcount or 0))
        return got

    async def count_expired(self, table: str, cutoff: datetime) -> int:
        t = EXPIRING[table]
        return int((await self.conn.execute(select(func.count()).select_from(t)
                                            .where(t.c.expires_at < cutoff))).scalar_one())

    async def delete_expired(self, table: str, cutoff: datetime, *, limit: int) -> int:
        """Delete up to ``limit`` rows of the web table ``table`` that expired before
        ``cutoff`` (a live one never: each is of use only until it expires)."""
        t = EXPIRING[table]
        key = next(iter(t.primary_key.columns))
        keys = select(key).where(t.c.expires_at < cutoff).order_by(key).limit(limit)
        res = await self.conn.execute(delete(t).where(key.in_(keys.scalar_subquery())))
        return int(res.rowcount or 0)

    def _settled(self, cutoff: datetime) -> Any:
        return (_O.c.status.in_(("delivered", "dead")), _O.c.created_at < cutoff)

    async def count_settled_outbox(self, cutoff: datetime) -> int:
        return int((await self.conn.execute(select(func.count()).select_from(_O)
                                            .where(*self._settled(cutoff)))).scalar_one())

    async def delete_settled_outbox(self, cutoff: datetime, *, limit: int) -> int:
        """Delete up to ``limit`` delivered or dead outbox rows created before ``cutoff``
        (a pending row is never deleted, however old)."""
        ids = select(_O.c.id).where(*self._settled(cutoff)).order_by(_O.c.id).limit(limit)
        res = await self.conn.execute(delete(_O).where(_O.c.id.in_(ids.scalar_subquery())))
        return int(res.rowcount or 0)
