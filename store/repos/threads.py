"""Each run's ops thread in chat: where it is and how far it has been told."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import cast

from sqlalchemy import Table, bindparam, or_, select, update

from store.models import Run, RunThread
from store.records import RunRecord
from store.repos.base import Repo

_T = cast(Table, RunThread.__table__)
_R = cast(Table, Run.__table__)
_GET = select(_T).where(_T.c.run_id == bindparam("rid"))


@dataclass(frozen=True, slots=True)
class ThreadRecord:
    run_id: str
    channel: str
    ts: str | None
    posted_seq: int
    posted_status: str
    claimed_by: str | None = None
    claimed_until: datetime | None = None
    next_attempt_at: datetime | None = None
    failures: int = 0
    reposts: int = 0


class ThreadsRepo(Repo):
    async def get(self, run_id: str) -> ThreadRecord | None:
        row = (await self.conn.execute(_GET, {"rid": run_id})).first()
        return None if row is None else ThreadRecord(**row._mapping)

    async def create(self, run_id: str, *, channel: str, ts: str, posted_status: str) -> None:
        await self.conn.execute(
            self.insert_ignore(RunThread),
            {"run_id": run_id, "channel": channel, "ts": ts, "posted_seq": 1,
             "posted_status": posted_status})

    async def advance(self, run_id: str, *, posted_seq: int | None = None,
                      posted_status: str | None = None) -> None:
        values: dict[str, object] = {}
        if posted_seq is not None:
            values["posted_seq"] = posted_seq
        if posted_status is not None:
            values["posted_status"] = posted_status
        if values:
            await self.conn.execute(update(_T).where(_T.c.run_id == run_id).values(values))

    async def behind(self, *, since: datetime, limit: int) -> list[tuple[RunRecord,
                                                                        ThreadRecord | None]]:
        """Runs whose thread is missing or behind their events or status.

        Only runs updated since ``since`` are considered for a missing thread, so turning
        the Slack face on does not post a thread for every run in history.
        """
        j = _R.outerjoin(_T, _T.c.run_id == _R.c.id)
        rows = await self.conn.execute(
            select(_R, _T.c.channel, _T.c.ts, _T.c.posted_seq, _T.c.posted_status)
            .select_from(j)
            .where(or_(
                (_T.c.run_id.is_(None)) & (_R.c.updated_at >= since),
                _T.c.posted_seq < _R.c.next_seq,
                _T.c.posted_status != _R.c.status,
            ))
            .order_by(_R.c.updated_at).limit(limit))
        out: list[tuple[RunRecord, ThreadRecord | None]] = []
        for r in rows:
            m = dict(r._mapping)
            thread = None
            if m["ts"] is not None:
                thread = ThreadRecord(run_id=m["id"], channel=m.pop("channel"), ts=m.pop("ts"),
                                      posted_seq=m.pop("posted_seq"),
                                      posted_status=m.pop("posted_status"))
            else:
                for k in ("channel", "ts", "posted_seq", "posted_status"):
                    m.pop(k)
            out.append((RunRecord(**m), thread))
        return out
