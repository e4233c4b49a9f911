"""Run events: the append-only transcript."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from approvald.store.fastsql import fast
from approvald.store.models import RunEvent
from approvald.store.records import EventRecord
from approvald.store.repos.base import Repo
from sqlalchemy import Table, bindparam, insert, select

_E = cast(Table, RunEvent.__table__)
_INSERT = fast(insert(_E))
_LOAD = fast(select(_E).where(_E.c.run_id == bindparam("rid"),
                              _E.c.seq >= bindparam("since")).order_by(_E.c.seq))


class EventsRepo(Repo):
    async def append(self, run_id: str, first_seq: int, step: int,
                     events: Sequence[tuple[int, str]]) -> int:
        """Append ``(schema_version, body)`` events from ``first_seq``; returns the next seq.

        The (run_id, seq) key makes a duplicate append fail instead of forking history.
        """
        if events:
            await self.conn.execute(
                _INSERT,
                [
                    {"run_id": run_id, "seq": first_seq + i, "step": step, "v": v, "body": body}
                    for i, (v, body) in enumerate(events)
                ],
            )
        return first_seq + len(events)

    async def load(self, run_id: str, *, since: int = 0) -> list[EventRecord]:
        """Events of a run in order, from seq ``since`` on."""
        rows = await self.conn.execute(_LOAD, {"rid": run_id, "since": since})
        return [EventRecord(**r._mapping) for r in rows]
