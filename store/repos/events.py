"""Run events: the append-only transcript."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from approvald.store.fastsql import fast
from approvald.store.models import Approval, RunEvent, ToolExecution
from approvald.store.records import ApprovalRecord, EventRecord, ExecutionRecord
from approvald.store.repos.base import Repo
from sqlalchemy import Integer, Table, bindparam, insert, literal_column, null, select, union_all
from sqlalchemy import cast as sql_cast

_E = cast(Table, RunEvent.__table__)
_INSERT = fast(insert(_E))
_LOAD = fast(select(_E).where(_E.c.run_id == bindparam("rid"),
                              _E.c.seq >= bindparam("since")).order_by(_E.c.seq))
_X = cast(Table, ToolExecution.__table__)
_A = cast(Table, Approval.__table__)
_PARTS = (_E, _X, _A)


def _part(n: int) -> Any:
    """The rows of ``_PARTS[n]`` for one run, in the columns of all three: its own in their
    places, typed NULLs in the others' (so each column keeps its type's processing)."""
    table = _PARTS[n]
    cols = [literal_column(str(n), Integer).label("part")]
    for t in _PARTS:
        cols += [(c if t is table else sql_cast(null(), c.type)).label(f"{t.name}_{c.name}")
                 for c in t.c]
    return select(*cols).where(table.c.run_id == bindparam("rid"))


# a run's whole state (its transcript, its ledger rows, its requests) in one statement
_STATE = fast(union_all(*(_part(n) for n in range(len(_PARTS))))
              .order_by("part", f"{_E.name}_seq", f"{_A.name}_requested_at"))
_SLICES = tuple(sum(len(t.c) for t in _PARTS[:n]) + 1 for n in range(len(_PARTS) + 1))
_KEYS = tuple(tuple(c.key for c in t.c) for t in _PARTS)  # each part's record fields


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

    async def state(self, run_id: str) -> tuple[list[EventRecord],
                                                 dict[str, ExecutionRecord],
                                                 list[ApprovalRecord]]:
        """A run's events in order, its execution ledger's rows by call, its requests in
        the order they were made: what :meth:`load`, ``executions.for_run`` and
        ``approvals.for_run`` return, read in one statement (a resume's, issue 50)."""
        events: list[EventRecord] = []
        executions: dict[str, ExecutionRecord] = {}
        approvals: list[ApprovalRecord] = []
        keys = _KEYS
        for row in await self.conn.execute(_STATE, {"rid": run_id}):
            n = row[0]
            values = dict(zip(keys[n], row[_SLICES[n]:_SLICES[n + 1]], strict=True))
            if n == 0:
                events.append(EventRecord(**values))
            elif n == 1:
                x = ExecutionRecord(**values)
                executions[x.call_id] = x
            else:
                approvals.append(ApprovalRecord(**values))
        return events, executions, approvals

    async def load(self, run_id: str, *, since: int = 0) -> list[EventRecord]:
        """Events of a run in order, from seq ``since`` on."""
        rows = await self.conn.execute(_LOAD, {"rid": run_id, "since": since})
        return [EventRecord(**r._mapping) for r in rows]
