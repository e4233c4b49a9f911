"""The run-thread follower's poll reads only what can be behind (issue 50).

``ThreadsRepo.behind`` is polled every half second by every replica's follower. It read
every run in history (``SCAN runs``, a thread and an audit probe per run): milliseconds per
poll at a few thousand runs, and each reader connection's page cache filled with the whole
table. Its plan must reach runs and threads through indexes only: the runs updated since
``since`` (by ``updated_at``) and the threads not yet settled (a partial index).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from approvald.store.db import Database
from approvald.store.repos import threads

from tests.helpers import Rows

# PostgreSQL plans a table of a few rows as it likes: these leave it the index-driven plan,
# if there is one (a whole table or index read is then what no index could avoid)
_KNOBS = ("enable_seqscan", "enable_mergejoin", "enable_hashjoin")
_SCANS = ("Seq Scan", "Index Scan", "Index Only Scan", "Bitmap Index Scan")


async def _plan(db: Database, callers: bool, stale: bool = False) -> list[str]:
    """What the database says it does for the poll: SQLite's ``EXPLAIN QUERY PLAN``
    details, or PostgreSQL's plan nodes."""
    return list(await Rows(db).in_one_read(lambda tx: _explain(db, tx, callers, stale)))


async def _explain(db: Database, tx: Any, callers: bool, stale: bool) -> list[str]:
    conn = await tx.conn.connection()
    at: Any = datetime(2026, 1, 2, tzinfo=UTC)  # a day after the history
    if db.dialect == "sqlite":
        at = at.isoformat()  # (a plan's values do not matter: SQLite's, as text)
    # (stale: the poll that also takes a dead process's claims, ``Owners.stale``)
    stmt = (threads._BEHIND_STALE if stale else threads._BEHIND)[callers]
    params = {"now": at, "since": at, "lim": 100, "max_reposts": 1}
    if stale:
        params["stale"] = ["host:4194305:dead00"]
    state = stmt.compile(dialect=conn.dialect).construct_expanded_state(params)
    sql, args = state.statement, tuple(state.positional_parameters)
    if db.dialect == "sqlite":
        res = await conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {sql}", args)
        return [str(r[-1]) for r in res]
    for knob in _KNOBS:
        await conn.exec_driver_sql(f"SET {knob} = off")
    res = await conn.exec_driver_sql(f"EXPLAIN (FORMAT JSON) {sql}", args)
    plan = res.scalar_one()
    for knob in _KNOBS:
        await conn.exec_driver_sql(f"RESET {knob}")
    nodes, out = [json.loads(plan)[0]["Plan"] if isinstance(plan, str)
                  else plan[0]["Plan"]], []
    while nodes:
        n = nodes.pop()
        # a scan of runs, threads or requests with no condition on its index reads it
        # whole (a bitmap index scan names its index, not its table)
        read = n.get("Relation Name") or n.get("Index Name") or ""
        whole = n["Node Type"] in _SCANS and "Index Cond" not in n \
            and any(t in read for t in ("runs", "run_threads", "approvals")) \
            and n.get("Index Name") != "ix_run_threads_unsettled"
        out.append(" ".join(filter(None, (
            n["Node Type"], n.get("Relation Name"), n.get("Index Name"),
            n.get("Index Cond"), "(whole)" if whole else ""))))
        nodes.extend(n.get("Plans", []))
    return out


async def _history(db: Database, n: int) -> None:
    """``n`` finished runs, each thread told its every event and final status, as a
    follower leaves them, one in two a caller's request that asked a person; then the
    planner's statistics (PostgreSQL)."""
    now = datetime(2026, 1, 1, tzinfo=UTC)

    async def forged(tx: Any) -> None:
        for i in range(n):
            rid = f"run-{i:04d}"
            asked = i % 2 == 1
            await tx.runs.create(run_id=rid, task="t", requested_by="U",
                                 agent="external:ci" if asked else "demo-steps",
                                 instructions_version="v", now=now)
            if asked:
                await tx.approvals.insert(**_approval(rid, now))
            await tx.runs.update(rid, status=("completed", "failed", "cancelled")[i % 3],
                                 next_seq=4)
            await tx.threads.open(rid, channel="C", owner="o", until=now)
            await tx.threads.finish(rid, owner="o", now=now, ts=f"{i}.0", posted_seq=4,
                                    posted_status=("completed", "failed", "cancelled")[i % 3])

    rows = Rows(db)
    await rows.in_one_write(forged)
    if db.dialect == "postgresql":
        await rows.execute("ANALYZE")


def _approval(run_id: str, at: datetime) -> dict[str, Any]:
    """A decided request of run ``run_id``, made at ``at``."""
    return {"id": f"a-{run_id}", "run_id": run_id, "call_id": "call", "kind": "tool_call",
            "tool": "deploy", "args": "{}", "digest": "0" * 64, "status": "approved",
            "rung": 0, "supersedes": None, "approvers": "[]", "quorum": 1,
            "approve_count": 1, "policy": "{}", "packet": "{}", "requested_by": "U",
            "token_nonce": "n", "requested_at": at, "expires_at": at,
            "reminders_sent": 0, "next_reminder_at": None, "tool_version": None,
            "tool_schema": None}


@pytest.mark.parametrize("stale", [False, True])
@pytest.mark.parametrize("callers", [False, True])
async def test_the_poll_reads_runs_and_threads_by_index(db: Database, callers: bool,
                                                        stale: bool) -> None:
    await _history(db, 200)
    plan = await _plan(db, callers, stale)
    whole = [line for line in plan
             if (line.startswith("SCAN") and "INDEX" not in line)  # SQLite: a table read whole
             or line.startswith("Seq Scan") or line.endswith("(whole)")]  # PostgreSQL
    assert not whole, plan
    # and not every run's index entry either: runs by updated_at, threads by the partial
    # index, callers' requests by when they asked
    every = [line for line in plan
             if line.startswith(("SCAN runs", "SCAN run_threads", "SCAN approvals"))
             and "ix_run_threads_unsettled" not in line]
    assert not every, plan
    asked = [line for line in plan if "approvals" in line and "requested_at" in line]
    assert bool(asked) == callers, plan
