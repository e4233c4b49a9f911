"""The execution ledger's rows: intent first, result after, keyed by (run_id, call_id)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, cast

from approvald.store.fastsql import fast
from approvald.store.models import ToolExecution
from approvald.store.records import ExecutionRecord
from approvald.store.repos.base import Repo, to_record
from sqlalchemy import Insert, Table, and_, bindparam, select, update
from sqlalchemy.dialects import postgresql, sqlite

_COLS = cast(Table, ToolExecution.__table__)
_KEY = and_(_COLS.c.run_id == bindparam("rid"), _COLS.c.call_id == bindparam("cid"))
_RESULT = fast(
    update(_COLS).where(_KEY, _COLS.c.status.in_(["started", "unknown"]))
    .values(status=bindparam("status"), result=bindparam("result"),
            error_class=bindparam("error_class"), error=bindparam("error"),
            finished_at=bindparam("now"), latency_ms=bindparam("latency_ms"))
)
_GET = fast(select(_COLS).where(_KEY))
_FOR_RUN = fast(select(_COLS).where(_COLS.c.run_id == bindparam("rid")))
_INTENT: dict[str, Insert] = {
    "sqlite": fast(cast(Any, sqlite.insert(_COLS)).on_conflict_do_nothing()),
    "postgresql": cast(Any, postgresql.insert(_COLS)).on_conflict_do_nothing(),
}


class ExecutionsRepo(Repo):
    async def get(self, run_id: str, call_id: str) -> ExecutionRecord | None:
        row = (await self.conn.execute(_GET, {"rid": run_id, "cid": call_id})).first()
        return to_record(ExecutionRecord, row)

    async def started_by(self, owner: str) -> str | None:
        """The run whose call ``owner`` started and has not finished (a caller that runs
        approved calls itself names the attempt: a Claude Code tool use); None if none."""
        row = (await self.conn.execute(
            select(_COLS.c.run_id).where(_COLS.c.owner == owner,
                                         _COLS.c.status == "started").limit(1))).first()
        return None if row is None else str(row[0])

    async def for_run(self, run_id: str) -> dict[str, ExecutionRecord]:
        rows = await self.conn.execute(_FOR_RUN, {"rid": run_id})
        return {r.call_id: ExecutionRecord(**r._mapping) for r in rows}

    async def record_intent(self, *, run_id: str, call_id: str, step: int, tool: str,
                            digest: str, now: datetime, owner: str | None = None,
                            sensitive: str | None = None) -> bool:
        """Insert the intent row (``owner``: the lease id of the attempt; ``sensitive``:
        the JSON list of the call's declared paths); False if one already exists for
        this key."""
        res = await self.conn.execute(
            _INTENT[self.dialect],
            {
                "run_id": run_id, "call_id": call_id, "step": step, "tool": tool,
                "args_digest": digest, "status": "started", "attempts": 1, "started_at": now,
                "owner": owner, "heard_at": now, "sensitive": sensitive,
            },
        )
        return bool(res.rowcount == 1)

    async def record_done(self, *, run_id: str, call_id: str, step: int, tool: str,
                          digest: str, started_at: datetime, now: datetime, owner: str | None,
                          status: str, result: str | None, error_class: str | None,
                          error: str | None, latency_ms: float | None,
                          sensitive: str | None = None) -> bool:
        """Insert a finished call in one row, with no intent before it (an idempotent
        call, whose result rides in its step's checkpoint); False if the key exists."""
        res = await self.conn.execute(
            _INTENT[self.dialect],
            {
                "run_id": run_id, "call_id": call_id, "step": step, "tool": tool,
                "args_digest": digest, "status": status, "attempts": 1,
                "started_at": started_at, "owner": owner, "heard_at": now, "result": result,
                "error_class": error_class, "error": error, "finished_at": now,
                "latency_ms": latency_ms, "sensitive": sensitive,
            },
        )
        return bool(res.rowcount == 1)

    async def retry_intent(self, *, run_id: str, call_id: str, now: datetime,
                           owner: str | None = None, attempts: int | None = None) -> bool:
        """Start the next attempt of an unknown/started call (compare-and-set on the
        attempt number it follows, when given)."""
        stmt = (update(ToolExecution)
                .where(ToolExecution.run_id == run_id, ToolExecution.call_id == call_id,
                       ToolExecution.status.in_(["started", "unknown"])))
        if attempts is not None:
            stmt = stmt.where(ToolExecution.attempts == attempts)
        res = await self.conn.execute(
            stmt.values(status="started", attempts=ToolExecution.attempts + 1, started_at=now,
                        finished_at=None, result=None, error=None, error_class=None,
                        owner=owner, heard_at=now))
        return bool(res.rowcount == 1)

    async def heard(self, run_id: str, *, owner: str, now: datetime) -> None:
        """The attempt ``owner`` is running is still alive (its lease was renewed)."""
        await self.conn.execute(
            update(ToolExecution)
            .where(ToolExecution.run_id == run_id, ToolExecution.owner == owner,
                   ToolExecution.status == "started")
            .values(heard_at=now))

    async def record_result(self, *, run_id: str, call_id: str, status: str,
                            result: str | None, error_class: str | None, error: str | None,
                            now: datetime, latency_ms: float | None,
                            digest: str | None = None) -> bool:
        """Record the outcome of a started call; False if it was not in ``started``.
        ``digest``: of the arguments that ran, when its caller says they were not the
        ones it was started with (a coding assistant reports what it ran)."""
        values = {"rid": run_id, "cid": call_id, "status": status, "result": result,
                  "error_class": error_class, "error": error, "now": now,
                  "latency_ms": latency_ms}
        if digest is None:
            res = await self.conn.execute(_RESULT, values)
        else:
            res = await self.conn.execute(
                update(_COLS).where(_COLS.c.run_id == run_id, _COLS.c.call_id == call_id,
                                    _COLS.c.status.in_(["started", "unknown"]))
                .values(status=status, result=result, error_class=error_class, error=error,
                        finished_at=now, latency_ms=latency_ms, args_digest=digest))
        return bool(res.rowcount == 1)

    async def mark_unknown(self, *, run_id: str, call_id: str) -> None:
        await self.conn.execute(
            update(ToolExecution)
            .where(ToolExecution.run_id == run_id, ToolExecution.call_id == call_id,
                   ToolExecution.status == "started")
            .values(status="unknown")
        )
