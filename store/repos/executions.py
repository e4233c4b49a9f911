"""The execution ledger's rows: intent first, result after, keyed by (run_id, call_id)."""

from __future__ import annotations

import functools
from datetime import datetime
from typing import Any, cast

from approvald.store.fastsql import fast
from approvald.store.models import ToolExecution
from approvald.store.records import ExecutionRecord
from approvald.store.repos.base import Repo, to_record
from approvald.store.repos.runs import RunsRepo, lease_renewal
from sqlalchemy import Insert, Table, and_, bindparam, func, select, update
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
# a lease renewal's: the attempt its owner is running heard from
_HEARD = fast(update(_COLS).where(_COLS.c.run_id == bindparam("rid"),
                                  _COLS.c.owner == bindparam("lease"),
                                  _COLS.c.status == "started")
              .values(heard_at=bindparam("now")))
_FOR_RUN = fast(select(_COLS).where(_COLS.c.run_id == bindparam("rid")))
_INTENT: dict[str, Insert] = {
    "sqlite": fast(cast(Any, sqlite.insert(_COLS)).on_conflict_do_nothing()),
    "postgresql": cast(Any, postgresql.insert(_COLS)).on_conflict_do_nothing(),
}


_INTENT_COLS = ("call_id", "step", "tool", "args_digest", "status", "attempts", "started_at",
                "owner", "heard_at", "sensitive")


@functools.lru_cache(maxsize=4)
def _intent_under_lease(server: bool, journal: bool) -> Any:
    """PostgreSQL, one statement: the lease renewed (and the step's reply journaled) if it
    is still ``owner``'s, and the intent row inserted only then; answers (lease held,
    intent inserted)."""
    fence = lease_renewal(server, journal).cte("fence")
    # the row's values bound under names of no column (a name that is a column of ``runs``,
    # such as ``status``, would be taken as a value the UPDATE sets)
    rows = select(fence.c.id, *(bindparam(f"x_{c}", type_=_COLS.c[c].type)
                                for c in _INTENT_COLS))
    ins = (cast(Any, postgresql.insert(_COLS)).from_select(["run_id", *_INTENT_COLS], rows,
                                                                include_defaults=False)
           .on_conflict_do_nothing().returning(_COLS.c.call_id).cte("ins"))
    return fast(select(select(func.count()).select_from(fence).scalar_subquery(),
                       select(func.count()).select_from(ins).scalar_subquery()))


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

    async def intent_under_lease(self, *, run_id: str, call_id: str, step: int, tool: str,
                                 digest: str, now: datetime, owner: str,
                                 until: datetime, journal: str | None,
                                 sensitive: str | None) -> bool | None:
        """The intent row, written only while ``owner`` holds the run's lease, which this
        renews (until ``until``) and, with ``journal``, journals
        the step's model reply with: None if the lease is not ``owner``'s (nothing
        written), else whether the intent was inserted (False: one exists for this key).
        On PostgreSQL one statement, which a caller may send on its own, in autocommit
        (issue 50); on SQLite the renewal, then the insert."""
        if self.dialect != "postgresql":
            runs = RunsRepo(self.conn, self.dialect, server_time=self.server_time)
            if not await runs.renew_lease(run_id, owner=owner, now=now,
                                          until=until, journal=journal):
                return None
            return await self.record_intent(run_id=run_id, call_id=call_id, step=step,
                                            tool=tool, digest=digest, now=now, owner=owner,
                                            sensitive=sensitive)
        row_values = {"call_id": call_id, "step": step, "tool": tool, "args_digest": digest,
                      "status": "started", "attempts": 1, "started_at": now, "owner": owner,
                      "heard_at": now, "sensitive": sensitive}
        params: dict[str, Any] = {"rid": run_id, "owner": owner,
                                  **{f"x_{k}": v for k, v in row_values.items()}}
        params.update({"ttl": until - now} if self.server_time else {"until": until})
        if journal is not None:
            params["inflight"] = journal
        row = (await self.conn.execute(
            _intent_under_lease(self.server_time, journal is not None), params)).one()
        if not row[0]:
            return None
        return bool(row[1])

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
        await self.conn.execute(_HEARD, {"rid": run_id, "lease": owner, "now": now})

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
