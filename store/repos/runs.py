"""Runs: creation, leases (compare-and-set), checkpoints, cancellation."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import and_, func, insert, or_, select, update

from store.models import Run
from store.records import RunRecord
from store.repos.base import Repo, to_record


class RunsRepo(Repo):
    async def create(self, *, run_id: str, agent: str, task: str, requested_by: str,
                     instructions_version: str, now: datetime, status: str = "running") -> None:
        await self.conn.execute(
            insert(Run),
            {
                "id": run_id, "agent": agent, "status": status, "step": 0, "next_seq": 0,
                "task": task, "requested_by": requested_by,
                "instructions_version": instructions_version, "cancel_requested": False,
                "created_at": now, "updated_at": now,
            },
        )

    async def get(self, run_id: str) -> RunRecord | None:
        row = (await self.conn.execute(select(Run.__table__).where(Run.id == run_id))).first()
        return to_record(RunRecord, row)

    async def find(self, prefix: str) -> list[RunRecord]:
        """Runs whose id starts with ``prefix`` (the CLI accepts unambiguous prefixes)."""
        rows = await self.conn.execute(
            select(Run.__table__).where(Run.id.startswith(prefix, autoescape=True)).limit(2)
        )
        return [RunRecord(**r._mapping) for r in rows]

    async def recent(self, *, status: str | None = None, limit: int = 50) -> list[RunRecord]:
        stmt = select(Run.__table__).order_by(Run.created_at.desc(), Run.id).limit(limit)
        if status:
            stmt = stmt.where(Run.status == status)
        return [RunRecord(**r._mapping) for r in await self.conn.execute(stmt)]

    async def count_by_status(self) -> dict[str, int]:
        rows = await self.conn.execute(select(Run.status, func.count()).group_by(Run.status))
        return {status: int(n) for status, n in rows}

    async def acquire_lease(self, run_id: str, *, owner: str, now: datetime, until: datetime,
                            stale_owners: Sequence[str] = ()) -> bool:
        """Take the run's lease if it is free, expired, ours, or held by a dead owner."""
        free = or_(
            Run.lease_owner.is_(None),
            Run.lease_expires_at < now,
            Run.lease_owner == owner,
        )
        if stale_owners:
            free = or_(free, Run.lease_owner.in_(list(stale_owners)))
        res = await self.conn.execute(
            update(Run)
            .where(and_(Run.id == run_id, free))
            .values(lease_owner=owner, lease_expires_at=until)
        )
        return bool(res.rowcount == 1)

    async def renew_lease(self, run_id: str, *, owner: str, until: datetime) -> bool:
        res = await self.conn.execute(
            update(Run).where(Run.id == run_id, Run.lease_owner == owner)
            .values(lease_expires_at=until)
        )
        return bool(res.rowcount == 1)

    async def release_lease(self, run_id: str, *, owner: str) -> None:
        await self.conn.execute(
            update(Run).where(Run.id == run_id, Run.lease_owner == owner)
            .values(lease_owner=None, lease_expires_at=None)
        )

    async def update_owned(self, run_id: str, *, owner: str, **values: Any) -> bool:
        """Update the run only while ``owner`` holds its lease; False means the lease is gone."""
        res = await self.conn.execute(
            update(Run).where(Run.id == run_id, Run.lease_owner == owner).values(**values)
        )
        return bool(res.rowcount == 1)

    async def update(self, run_id: str, *, expect_status: Sequence[str] | None = None,
                     **values: Any) -> bool:
        """Update the run, optionally only if its status is one of ``expect_status``."""
        stmt = update(Run).where(Run.id == run_id)
        if expect_status is not None:
            stmt = stmt.where(Run.status.in_(list(expect_status)))
        res = await self.conn.execute(stmt.values(**values))
        return bool(res.rowcount == 1)

    async def runnable(self, *, now: datetime, limit: int = 100,
                       stale_owners: Sequence[str] = ()) -> list[RunRecord]:
        """Runs that are ``running`` and not held by a live lease: ready to advance."""
        free = or_(Run.lease_owner.is_(None), Run.lease_expires_at < now)
        if stale_owners:
            free = or_(free, Run.lease_owner.in_(list(stale_owners)))
        rows = await self.conn.execute(
            select(Run.__table__).where(Run.status == "running", free)
            .order_by(Run.updated_at).limit(limit)
        )
        return [RunRecord(**r._mapping) for r in rows]

    async def lease_owners(self) -> list[str]:
        rows = await self.conn.execute(
            select(Run.lease_owner).where(Run.lease_owner.is_not(None)).distinct()
        )
        return [str(r[0]) for r in rows if r[0] is not None]

    async def checkpoint(self, run_id: str, *, owner: str, **values: Any) -> bool | None:
        """Write the step's run-row changes while we hold the lease.

        Returns the run's ``cancel_requested`` flag (seen at this step boundary), or None if
        the lease is no longer ours and nothing was written.
        """
        row = (await self.conn.execute(
            update(Run).where(Run.id == run_id, Run.lease_owner == owner)
            .values(**values).returning(Run.cancel_requested)
        )).first()
        return None if row is None else bool(row[0])

    async def cancel_if_idle(self, run_id: str, *, now: datetime, error: str,
                             stale_owners: Sequence[str] = ()) -> bool:
        """Cancel at once unless a live worker is mid-step (then only the flag is set)."""
        idle = or_(
            Run.status.in_(["awaiting_approval", "needs_attention"]),
            and_(Run.status == "running",
                 or_(Run.lease_owner.is_(None), Run.lease_expires_at < now,
                     Run.lease_owner.in_(list(stale_owners)))),
        )
        res = await self.conn.execute(
            update(Run).where(Run.id == run_id, idle)
            .values(status="cancelled", cancel_requested=True, error=error, updated_at=now,
                    lease_owner=None, lease_expires_at=None, inflight=None)
        )
        return bool(res.rowcount == 1)
