"""Where each run's ops thread lives in chat."""

from __future__ import annotations

from sqlalchemy import select

from store.models import RunThread
from store.repos.base import Repo


class ThreadsRepo(Repo):
    async def get(self, run_id: str) -> tuple[str, str] | None:
        row = (await self.conn.execute(
            select(RunThread.channel, RunThread.ts).where(RunThread.run_id == run_id)
        )).first()
        return None if row is None else (str(row[0]), str(row[1]))

    async def set(self, run_id: str, *, channel: str, ts: str) -> None:
        await self.conn.execute(
            self.insert_ignore(RunThread), {"run_id": run_id, "channel": channel, "ts": ts}
        )
