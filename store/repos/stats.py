"""Counts for health and metrics: how much is waiting, and since when."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from approvald.store.models import Approval, Outbox, Run
from approvald.store.repos.base import Repo
from sqlalchemy import func, select


@dataclass(slots=True)
class Snapshot:
    runs: dict[str, int] = field(default_factory=dict)  # by status
    pending_approvals: int = 0
    oldest_pending_at: datetime | None = None
    outbox_pending: int = 0
    oldest_outbox_at: datetime | None = None
    outbox_dead: int = 0


class StatsRepo(Repo):
    async def snapshot(self) -> Snapshot:
        s = Snapshot()
        rows = await self.conn.execute(select(Run.status, func.count()).group_by(Run.status))
        s.runs = {status: int(n) for status, n in rows}
        n, oldest = (await self.conn.execute(
            select(func.count(), func.min(Approval.requested_at))
            .where(Approval.status == "pending"))).one()
        s.pending_approvals, s.oldest_pending_at = int(n), oldest
        boxes = await self.conn.execute(
            select(Outbox.status, func.count(), func.min(Outbox.created_at))
            .where(Outbox.status.in_(("pending", "dead"))).group_by(Outbox.status))
        for status, count, first in boxes:
            if status == "pending":
                s.outbox_pending, s.oldest_outbox_at = int(count), first
            else:
                s.outbox_dead = int(count)
        return s
