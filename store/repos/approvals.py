"""Approvals and votes. Every transition is a compare-and-set on ``status``."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Insert, Table, Update, bindparam, func, select, update
from sqlalchemy.dialects import postgresql, sqlite

from store.models import Approval, ApprovalVote
from store.records import ApprovalRecord, VoteRecord
from store.repos.base import Repo, to_record

_T = cast(Table, Approval.__table__)
_V = cast(Table, ApprovalVote.__table__)
# statements built once: SQLAlchemy then skips construction and cache-key work per call
_GET = select(_T).where(_T.c.id == bindparam("aid"))
_FOR_RUN = select(_T).where(_T.c.run_id == bindparam("rid")).order_by(_T.c.requested_at)
_VOTES = select(_V).where(_V.c.approval_id == bindparam("aid")).order_by(_V.c.at)
_VOTE: dict[str, Insert] = {
    "sqlite": cast(Any, sqlite.insert(_V)).on_conflict_do_nothing(),
    "postgresql": cast(Any, postgresql.insert(_V)).on_conflict_do_nothing(),
}


@functools.lru_cache(maxsize=64)
def _transition(to: str, from_: tuple[str, ...], keys: tuple[str, ...]) -> Update:
    return (update(_T).where(_T.c.id == bindparam("aid"), _T.c.status.in_(from_))
            .values(status=to, **{k: bindparam(f"v_{k}") for k in keys}).returning(_T))


class ApprovalsRepo(Repo):
    async def insert(self, **values: Any) -> None:
        await self.conn.execute(_T.insert(), values)

    async def get(self, approval_id: str) -> ApprovalRecord | None:
        row = (await self.conn.execute(_GET, {"aid": approval_id})).first()
        return to_record(ApprovalRecord, row)

    async def find(self, prefix: str) -> list[ApprovalRecord]:
        rows = await self.conn.execute(
            select(_T).where(Approval.id.startswith(prefix, autoescape=True)).limit(2)
        )
        return [ApprovalRecord(**r._mapping) for r in rows]

    async def for_run(self, run_id: str) -> list[ApprovalRecord]:
        rows = await self.conn.execute(_FOR_RUN, {"rid": run_id})
        return [ApprovalRecord(**r._mapping) for r in rows]

    async def recent(self, *, status: str | None = None, run_id: str | None = None,
                   limit: int = 100) -> list[ApprovalRecord]:
        stmt = select(_T).order_by(Approval.requested_at.desc()).limit(limit)
        if status:
            stmt = stmt.where(Approval.status == status)
        if run_id:
            stmt = stmt.where(Approval.run_id == run_id)
        return [ApprovalRecord(**r._mapping) for r in await self.conn.execute(stmt)]

    async def pending_schedule(self) -> list[tuple[str, datetime, datetime | None]]:
        """(id, expires_at, next_reminder_at) of every pending approval."""
        rows = await self.conn.execute(
            select(Approval.id, Approval.expires_at, Approval.next_reminder_at)
            .where(Approval.status == "pending")
        )
        return [(r[0], r[1], r[2]) for r in rows]

    async def due_for_expiry(self, now: datetime, limit: int) -> list[str]:
        rows = await self.conn.execute(
            select(Approval.id).where(Approval.status == "pending", Approval.expires_at <= now)
            .order_by(Approval.expires_at).limit(limit)
        )
        return [r[0] for r in rows]

    async def due_for_reminder(self, now: datetime, limit: int) -> list[ApprovalRecord]:
        rows = await self.conn.execute(
            select(_T).where(Approval.status == "pending", Approval.next_reminder_at <= now,
                             Approval.expires_at > now)
            .order_by(Approval.next_reminder_at).limit(limit)
        )
        return [ApprovalRecord(**r._mapping) for r in rows]

    async def transition(self, approval_id: str, *, to: str, from_: Sequence[str] = ("pending",),
                         **values: Any) -> ApprovalRecord | None:
        """Compare-and-set ``status`` from one of ``from_`` to ``to``; None if we lost."""
        keys = tuple(sorted(values))
        row = (await self.conn.execute(
            _transition(to, tuple(from_), keys),
            {"aid": approval_id, **{f"v_{k}": values[k] for k in keys}},
        )).first()
        return to_record(ApprovalRecord, row)

    async def expire_batch(self, ids: Sequence[str], *, now: datetime) -> list[ApprovalRecord]:
        """Compare-and-set each still-pending, overdue approval in ``ids`` to expired."""
        if not ids:
            return []
        rows = await self.conn.execute(
            update(_T)
            .where(Approval.id.in_(list(ids)), Approval.status == "pending",
                   Approval.expires_at <= now)
            .values(status="expired", decided_at=now, decided_by="system:expiry",
                    decided_via="scheduler", verdict="expired")
            .returning(_T)
        )
        return [ApprovalRecord(**r._mapping) for r in rows]

    async def count_approve(self, approval_id: str, digest: str) -> int | None:
        """Recount approve votes on ``digest`` while locking the row; None if not pending.

        The UPDATE takes the row lock first, so on PostgreSQL a concurrent voter waits
        and then sees this vote: quorum cannot be missed by two simultaneous clicks.
        """
        res = (await self.conn.execute(
            update(_T).where(Approval.id == approval_id, Approval.status == "pending")
            .values(approve_count=Approval.approve_count).returning(Approval.id)
        )).first()
        if res is None:
            return None
        n = (await self.conn.execute(
            select(func.count()).select_from(ApprovalVote)
            .where(ApprovalVote.approval_id == approval_id, ApprovalVote.verdict == "approve",
                   ApprovalVote.digest == digest)
        )).scalar_one()
        await self.conn.execute(
            update(_T).where(Approval.id == approval_id).values(approve_count=n)
        )
        return int(n)

    async def add_vote(self, *, approval_id: str, actor: str, verdict: str, digest: str,
                       via: str, at: datetime) -> bool:
        """Record a vote; False if this actor already voted on this approval."""
        res = await self.conn.execute(
            _VOTE[self.dialect],
            {"approval_id": approval_id, "actor": actor, "verdict": verdict, "digest": digest,
             "via": via, "at": at},
        )
        return bool(res.rowcount == 1)

    async def votes(self, approval_id: str) -> list[VoteRecord]:
        rows = await self.conn.execute(_VOTES, {"aid": approval_id})
        return [VoteRecord(**r._mapping) for r in rows]

    async def set_edit(self, approval_id: str, *, edited_args: str, edited_digest: str) -> bool:
        res = await self.conn.execute(
            update(_T).where(Approval.id == approval_id, Approval.status == "pending")
            .values(edited_args=edited_args, edited_digest=edited_digest, approve_count=0)
        )
        return bool(res.rowcount == 1)

    async def advance_reminder(self, approval_id: str, *, sent: int,
                               next_at: datetime | None) -> bool:
        """Count one reminder as sent, if nobody else did already (compare-and-set)."""
        res = await self.conn.execute(
            update(_T).where(Approval.id == approval_id, Approval.status == "pending",
                             Approval.reminders_sent == sent)
            .values(reminders_sent=sent + 1, next_reminder_at=next_at)
        )
        return bool(res.rowcount == 1)

    async def set_message(self, approval_id: str, *, channel: str, ts: str) -> None:
        await self.conn.execute(
            update(_T).where(Approval.id == approval_id).values(channel=channel, message_ts=ts)
        )

    async def cancel_pending_for_run(self, run_id: str, *, now: datetime,
                                     by: str) -> list[ApprovalRecord]:
        rows = await self.conn.execute(
            update(_T).where(Approval.run_id == run_id, Approval.status == "pending")
            .values(status="cancelled", decided_at=now, decided_by=by, verdict="cancelled")
            .returning(_T)
        )
        return [ApprovalRecord(**r._mapping) for r in rows]

    async def pending_for_actor_candidates(self, limit: int = 200) -> list[ApprovalRecord]:
        rows = await self.conn.execute(
            select(_T).where(Approval.status == "pending")
            .order_by(Approval.expires_at).limit(limit)
        )
        return [ApprovalRecord(**r._mapping) for r in rows]

    async def runs_without_pending(self, run_ids: Sequence[str], *, kind: str) -> list[str]:
        """Those of ``run_ids`` with no pending approval of ``kind`` left."""
        if not run_ids:
            return []
        rows = await self.conn.execute(
            select(Approval.run_id).where(Approval.run_id.in_(list(run_ids)),
                                          Approval.status == "pending", Approval.kind == kind)
            .distinct())
        busy = {r[0] for r in rows}
        return [r for r in run_ids if r not in busy]

