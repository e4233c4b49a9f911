"""Limits shared by every process: token buckets, and the rows concurrency checks lock."""

from __future__ import annotations

from datetime import datetime
from typing import cast

from approvald.store.models import Limit
from approvald.store.repos.base import Repo
from sqlalchemy import Table, select, update

_T = cast(Table, Limit.__table__)


class LimitsRepo(Repo):
    async def lock(self, key: str, *, tokens: float, now: datetime) -> tuple[float, datetime]:
        """Hold the row ``key`` until the transaction ends (creating it with ``tokens``);
        returns its ``(tokens, updated_at)``. Take it after the run row (see store.db)."""
        await self.conn.execute(self.insert_ignore(Limit),
                                {"key": key, "tokens": tokens, "updated_at": now})
        row = (await self.conn.execute(
            select(_T.c.tokens, _T.c.updated_at).where(_T.c.key == key)
            .with_for_update())).one()
        return float(row[0]), row[1]

    async def set(self, key: str, *, tokens: float, now: datetime) -> None:
        await self.conn.execute(
            update(_T).where(_T.c.key == key).values(tokens=tokens, updated_at=now))
