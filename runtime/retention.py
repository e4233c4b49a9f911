"""Pruning: keep the database from only growing, without touching what must stay.

``prune`` deletes, for runs that finished (completed, cancelled, failed) before the
horizon, their transcript events, execution ledger rows and thread bookkeeping, and
deletes outbox rows delivered or given up before it. It keeps every run row, every
approval and vote, and every audit entry: ``audit verify`` passes after pruning exactly
as before. Runs that are waiting, running, paused or need attention are never touched,
however old. Work goes in batches, one short transaction each, so a large first prune
does not hold locks for long; ``dry_run`` counts instead of deleting.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from approvald.runtime.clock import Clock
from approvald.store.db import Database
from approvald.store.repos import Tx
from approvald.store.repos.retention import Pruned

MIN_HORIZON = timedelta(days=1)  # run threads look back an hour for runs without one
BATCH = 500


@dataclass(frozen=True, slots=True)
class PruneReport:
    cutoff: datetime
    dry_run: bool
    pruned: Pruned

    def summary(self) -> str:
        p = self.pruned
        verb = "would prune" if self.dry_run else "pruned"
        return (f"{verb} {p.runs:,} runs finished before {self.cutoff.isoformat()}: "
                f"{p.events:,} transcript events, {p.executions:,} execution records, "
                f"{p.threads:,} thread records; {p.outbox:,} settled outbox rows; "
                "run rows, approvals, votes and the audit log are kept")


async def prune(db: Database, clock: Clock, older_than: timedelta, *, dry_run: bool = False,
                batch: int = BATCH) -> PruneReport:
    if older_than < MIN_HORIZON:
        raise ValueError(f"--older-than must be at least {MIN_HORIZON.days} day "
                         "(finished runs' threads may still be followed for an hour)")
    cutoff = clock.now() - older_than
    total = Pruned()
    after = ""
    while True:
        async def step(tx: Tx, after: str = after) -> tuple[list[str], Pruned]:
            ids = await tx.retention.finished_before(cutoff, after=after, limit=batch,
                                                     lock=not dry_run)
            if not ids:
                return ids, Pruned()
            if dry_run:
                return ids, await tx.retention.count_for_runs(ids)
            return ids, await tx.retention.delete_for_runs(ids)

        if dry_run:
            async with db.read(snapshot=True) as tx:
                ids, got = await step(tx)
        else:
            ids, got = await db.transact(step, what="pruning finished runs")
        if not ids:
            break
        total.add(got)
        after = ids[-1]
    if dry_run:
        async with db.read() as tx:
            total.outbox = await tx.retention.count_settled_outbox(cutoff)
    else:
        while True:
            async def outbox(tx: Tx) -> int:
                return await tx.retention.delete_settled_outbox(cutoff, limit=batch)
            n = await db.transact(outbox, what="pruning the outbox")
            total.outbox += n
            if n < batch:
                break
    return PruneReport(cutoff=cutoff, dry_run=dry_run, pruned=total)
