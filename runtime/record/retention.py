"""Pruning: keep the database from only growing, without touching what must stay.

``prune`` deletes, for runs that finished (completed, cancelled, failed) before the
horizon, their transcript events, execution ledger rows and thread bookkeeping, and
deletes outbox rows delivered or given up before it. It keeps every run row, every
approval and vote, and every audit entry: ``audit verify`` passes after pruning exactly
as before. Runs that are waiting, running, paused or need attention are never touched,
however old. Work goes in batches, one short transaction each, so a large first prune
does not hold locks for long; ``dry_run`` counts instead of deleting.

``prune_expired`` deletes what is of no use to anyone once it expired, whatever the
horizon: the web review queue's sign-in links, sessions and Sign in with Slack states,
:data:`EXPIRED_KEPT` after they expired (so that a link opened late is still told it
expired, rather than that it never existed). ``serve`` runs it every hour while the
review queue is on, ``prune`` runs it too: a table anyone on the network can add rows to
(by asking for links, signing in) never only grows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from approvald.runtime.kernel.clock import Clock
from approvald.store.db import Database
from approvald.store.repos import Tx
from approvald.store.repos.retention import EXPIRING, Pruned

MIN_HORIZON = timedelta(days=1)  # run threads look back an hour for runs without one
BATCH = 500
EXPIRED_KEPT = timedelta(days=1)  # how long an expired web row is kept, to say it expired


@dataclass(frozen=True, slots=True)
class PruneReport:
    cutoff: datetime
    dry_run: bool
    pruned: Pruned
    expired: dict[str, int] = field(default_factory=dict)  # web table -> expired rows

    def summary(self) -> str:
        p = self.pruned
        verb = "would prune" if self.dry_run else "pruned"
        return (f"{verb} {p.runs:,} runs finished before {self.cutoff.isoformat()}: "
                f"{p.events:,} transcript events, {p.executions:,} execution records, "
                f"{p.threads:,} thread records; {p.outbox:,} settled outbox rows; "
                f"{expired_summary(self.expired)}; "
                "run rows, approvals, votes and the audit log are kept")


def expired_summary(expired: dict[str, int]) -> str:
    """``3 expired sign-in links, 1 sessions, 0 used sign-in states``."""
    names = {"web_links": "expired sign-in links", "web_sessions": "sessions",
             "web_slack_states": "used sign-in states"}
    return ", ".join(f"{expired.get(t, 0):,} {names[t]}" for t in EXPIRING)


async def prune_expired(db: Database, clock: Clock, *, dry_run: bool = False,
                        batch: int = BATCH) -> dict[str, int]:
    """Delete (``dry_run``: count) the web review queue's rows that expired more than
    :data:`EXPIRED_KEPT` ago, in batches; how many, by table."""
    cutoff = clock.now() - EXPIRED_KEPT
    done: dict[str, int] = {}
    for table in EXPIRING:
        if dry_run:
            async with db.read() as tx:
                done[table] = await tx.retention.count_expired(table, cutoff)
            continue
        done[table] = 0
        while True:
            async def step(tx: Tx, table: str = table) -> int:
                return await tx.retention.delete_expired(table, cutoff, limit=batch)
            n = await db.transact(step, what=f"pruning expired {table}")
            done[table] += n
            if n < batch:
                break
    return done


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
    expired = await prune_expired(db, clock, dry_run=dry_run, batch=batch)
    return PruneReport(cutoff=cutoff, dry_run=dry_run, pruned=total, expired=expired)
