"""Expiry at scale: rebuild the schedule for 10,000 pending approvals, expire 1,000 in a sweep.

    python tests/benchmarks/bench_expiry.py [--pending 10000] [--overdue 1000] [--db URL]

Measures, on a real database (a temp SQLite file unless --db names another):
  * rebuild: reading every pending approval and creating one APScheduler job each
    (what ``approvald serve`` does at start), against the bare query as the in-run baseline;
  * sweep: expiring ``--overdue`` approvals in one ``Expiry.sweep`` (batched
    compare-and-set, audit entries, card updates, runs woken), against expiring the same
    number one transaction at a time as the in-run baseline.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from approvald.runtime.engine import assemble
from approvald.runtime.kernel.canonical import call_digest
from approvald.runtime.kernel.clock import ManualClock
from approvald.runtime.kernel.ids import new_id, new_nonce
from approvald.runtime.runs.agent import Registry
from approvald.runtime.runs.demo import REFUND_POLICY, demo_agents
from approvald.store import migrate
from approvald.store.db import Database
from approvald.store.models import Approval, Run
from sqlalchemy import insert

from tests.helpers import parts

PER_RUN = 10


async def seed(db: Database, clock: ManualClock, pending: int, overdue: int) -> None:
    """``pending`` approvals on pending/PER_RUN runs; the first ``overdue`` expire soonest."""
    now = clock.now()
    args = {"order_id": "A-1001", "amount_cents": 4200, "reason": "duplicate charge"}
    policy = json.dumps(REFUND_POLICY.snapshot())
    runs, approvals = [], []
    for r in range(pending // PER_RUN):
        run_id = new_id()
        runs.append({"id": run_id, "agent": "demo-refund", "status": "awaiting_approval",
                     "step": 2, "next_seq": 5, "task": "bench", "requested_by": "U_DANA",
                     "instructions_version": "bench", "cancel_requested": False,
                     "created_at": now, "updated_at": now})
        for k in range(PER_RUN):
            i = r * PER_RUN + k
            # overdue ones expire within the next minute; the rest over the next day
            ttl = timedelta(seconds=1 + i % 60) if i < overdue else timedelta(hours=2 + i % 20)
            approvals.append({
                "id": new_id(), "run_id": run_id, "call_id": f"call_{k}", "kind": "tool_call",
                "tool": "issue_refund", "args": json.dumps(args),
                "digest": call_digest("issue_refund", args), "status": "pending", "rung": 0,
                "approvers": "[]", "quorum": 1, "approve_count": 0, "policy": policy,
                "packet": "{}", "requested_by": "U_DANA", "token_nonce": new_nonce(),
                "requested_at": now, "expires_at": now + ttl, "reminders_sent": 2,
                "next_reminder_at": None})
    async with db.write() as tx:
        for i in range(0, len(runs), 500):
            await tx.conn.execute(insert(Run), runs[i:i + 500])
        for i in range(0, len(approvals), 500):
            await tx.conn.execute(insert(Approval), approvals[i:i + 500])


async def bench(url: str | None, pending: int, overdue: int) -> None:
    path = None
    if url is None:
        path = os.path.join(tempfile.mkdtemp(), "expiry.db")
        url = f"sqlite+aiosqlite:///{path}"
    db = Database(url)
    await migrate.upgrade(db)
    clock = ManualClock()
    engine = assemble(db, Registry(demo_agents()), clock=clock)
    t0 = time.perf_counter()
    await seed(db, clock, pending, overdue)
    print(f"database: {db.display_url.split('?')[0]}")
    print(f"seeded {pending:,} pending approvals on {pending // PER_RUN:,} runs in "
          f"{time.perf_counter() - t0:.2f} s")

    t0 = time.perf_counter()
    async with db.read() as tx:
        rows = await tx.approvals.pending_schedule()
    query_s = time.perf_counter() - t0
    scheduler = engine.expiry_scheduler()
    t0 = time.perf_counter()
    jobs = await scheduler.rebuild()
    rebuild_s = time.perf_counter() - t0
    assert jobs == len(rows) == pending
    print(f"rebuild schedule: {rebuild_s * 1000:,.0f} ms for {jobs:,} jobs "
          f"({rebuild_s / jobs * 1e6:.0f} us/approval); baseline, the bare query: "
          f"{query_s * 1000:,.0f} ms")

    clock.advance(timedelta(minutes=2))
    t0 = time.perf_counter()
    result = await parts(engine).expiry.sweep(limit=overdue * 2)
    sweep_s = time.perf_counter() - t0
    assert len(result.expired) == overdue, len(result.expired)
    print(f"sweep: expired {len(result.expired):,} overdue approvals in {sweep_s * 1000:,.0f} ms "
          f"({sweep_s / overdue * 1e3:.2f} ms each, incl. audit entries, card updates, "
          f"{len(result.runs_ready):,} runs woken)")

    # baseline: the same work one transaction per approval (what a naive job per id does)
    clock.advance(timedelta(hours=3))
    async with db.read() as tx:
        due = await tx.approvals.due_for_expiry(clock.now(), overdue)
    t0 = time.perf_counter()
    for approval_id in due:
        await engine.sweep(only=[approval_id])
    single_s = time.perf_counter() - t0
    print(f"baseline, one sweep per approval: {len(due):,} in {single_s * 1000:,.0f} ms "
          f"({single_s / max(len(due), 1) * 1e3:.2f} ms each); batched is "
          f"{single_s / sweep_s:.1f}x faster")
    await db.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pending", type=int, default=10_000)
    parser.add_argument("--overdue", type=int, default=1_000)
    parser.add_argument("--db", default=None, help="database URL (default: a temp SQLite file)")
    a = parser.parse_args()
    asyncio.run(bench(a.db, a.pending, a.overdue))
    return 0


if __name__ == "__main__":
    sys.exit(main())
