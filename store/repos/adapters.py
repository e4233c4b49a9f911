"""Paused framework agents (see ``runtime.adapters``): insert once per key, read, finish.

A pause is created with ``INSERT ... ON CONFLICT DO NOTHING`` on (framework, key), so two
processes re-running the step that paused agree on one row; finishing it is a
compare-and-set on ``status`` (``paused`` -> ``resumed``), so of two resumes racing to
record what the run came to, one records it and the other reads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from approvald.store.models import AdapterPause
from approvald.store.repos.base import Repo, to_record
from sqlalchemy import Table, select, update

_P = cast(Table, AdapterPause.__table__)


@dataclass(frozen=True, slots=True)
class AdapterPauseRecord:
    id: str
    framework: str
    key: str
    requested_by: str
    state: str
    requests: str
    status: str
    outcome: str | None
    created_at: datetime
    resumed_at: datetime | None


class AdaptersRepo(Repo):
    async def add(self, **values: Any) -> bool:
        """Insert a pause; False when the framework already has one under its key."""
        res = await self.conn.execute(self.insert_ignore(AdapterPause), values)
        return bool(res.rowcount == 1)

    async def get(self, pause_id: str) -> AdapterPauseRecord | None:
        row = (await self.conn.execute(select(_P).where(_P.c.id == pause_id))).first()
        return to_record(AdapterPauseRecord, row)

    async def by_key(self, framework: str, key: str) -> AdapterPauseRecord | None:
        row = (await self.conn.execute(
            select(_P).where(_P.c.framework == framework, _P.c.key == key))).first()
        return to_record(AdapterPauseRecord, row)

    async def paused(self, framework: str, *, limit: int = 100) -> list[AdapterPauseRecord]:
        """The framework's pauses not yet resumed, oldest first."""
        rows = await self.conn.execute(
            select(_P).where(_P.c.framework == framework, _P.c.status == "paused")
            .order_by(_P.c.created_at, _P.c.id).limit(limit))
        return [AdapterPauseRecord(**r._mapping) for r in rows]

    async def finish(self, pause_id: str, *, outcome: str, now: datetime) -> bool:
        """Record what the resume came to (once: compare-and-set on ``paused``)."""
        res = await self.conn.execute(
            update(_P).where(_P.c.id == pause_id, _P.c.status == "paused")
            .values(status="resumed", outcome=outcome, resumed_at=now))
        return bool(res.rowcount == 1)
