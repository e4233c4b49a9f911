"""Retention (issue 14): ``prune`` deletes finished runs' bulk past the horizon and keeps
everything that must stay: waiting runs, run rows, approvals, votes, the audit log."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

import pytest
from approvald.runtime.approvals.decide import Actor
from approvald.runtime.record import audit
from approvald.runtime.record.outbox import DrainConfig
from approvald.runtime.record.retention import prune
from approvald.store.models import Approval, AuditEntry, Outbox, Run, RunEvent, ToolExecution
from sqlalchemy import func, select

from tests.helpers import Rows, make_cli

# processes, browsers or hundreds of schedules: out of the inner loop (-m 'not slow')
pytestmark = pytest.mark.slow

async def _count(db, model, *where) -> int:
    async def count(tx):  # type: ignore[no-untyped-def]
        return (await tx.conn.execute(
            select(func.count()).select_from(model).where(*where))).scalar_one()

    return int(await Rows(db).in_one_read(count))


async def test_prune_keeps_what_must_stay_and_the_audit_log_verifies(db, make_engine,
                                                                     clock) -> None:
    engine = make_engine()
    # 1,000 finished runs, 90+ days old: 990 short ones, 10 refunds that were approved
    old_refunds = []
    for i in range(10):
        paused = await engine.run("demo-refund", f"Refund order A-{i}", requested_by="U_DANA")
        await engine.decide(paused.approval_ids[0], actor=Actor("U_ALICE", "slack"),
                            verdict="approve")
        assert (await engine.advance(paused.run_id)).status == "completed"
        old_refunds.append(paused.run_id)
    sem = asyncio.Semaphore(8)

    async def steps(n: int) -> None:
        async with sem:
            assert (await engine.run("demo-steps", "2", requested_by="U_DANA")).status \
                == "completed"
    await asyncio.gather(*(steps(i) for i in range(990)))

    class Posted:  # Slack took every card and update
        async def deliver(self, row):
            return {"ok": True}
    drain = engine.drain(Posted(), DrainConfig(patience=0))
    while await drain.drain_once():
        pass
    clock.advance(timedelta(days=91))
    # what must never go: a run waiting for a decision since long before the horizon...
    waiting = await engine.run("demo-refund", "Refund order B-1", requested_by="U_DANA")
    clock.advance(timedelta(days=91))
    # ...and a run that finished recently
    recent = await engine.run("demo-steps", "1", requested_by="U_DANA")
    entries = await _count(db, AuditEntry)
    approvals = await _count(db, Approval)
    runs = await _count(db, Run)
    waiting_events = await _count(db, RunEvent, RunEvent.run_id == waiting.run_id)
    head_before = (await audit.verify(db)).head

    dry = await prune(db, clock, timedelta(days=90), dry_run=True)
    assert dry.pruned.runs == 1_000 and dry.pruned.events > 3_000
    assert await _count(db, RunEvent) > dry.pruned.events  # nothing deleted yet

    report = await prune(db, clock, timedelta(days=90), batch=128)
    assert report.pruned.runs == 1_000
    assert (report.pruned.events, report.pruned.executions) == \
        (dry.pruned.events, dry.pruned.executions)
    assert report.pruned.outbox == dry.pruned.outbox > 0
    old = Run.id.in_(old_refunds)
    assert await _count(db, RunEvent, RunEvent.run_id.in_(old_refunds)) == 0
    assert await _count(db, ToolExecution, ToolExecution.run_id.in_(old_refunds)) == 0
    assert await _count(db, Run, old) == 10  # the run rows stay
    # kept: every run row, approval and audit entry; the waiting and the recent runs whole
    assert (await _count(db, Run), await _count(db, Approval), await _count(db, AuditEntry)) \
        == (runs, approvals, entries)
    assert await _count(db, RunEvent, RunEvent.run_id == waiting.run_id) == waiting_events
    assert await _count(db, RunEvent, RunEvent.run_id == recent.run_id) > 0
    assert await _count(db, Outbox, Outbox.status == "delivered") == 0
    assert await _count(db, Outbox, Outbox.status == "pending") > 0  # the waiting card
    report_after = await audit.verify(db)
    assert report_after.ok, report_after.problems
    assert report_after.head == head_before
    # the waiting run still goes on: its request lapsed long ago, so the sweep expires it
    # and the model hears {"status": "expired"}; its whole transcript was there to resume
    await engine.sweep()
    assert (await engine.advance(waiting.run_id)).status == "completed"
    # a second prune finds nothing more to do
    again = await prune(db, clock, timedelta(days=90))
    assert (again.pruned.runs, again.pruned.outbox) == (0, 0)


async def test_prune_refuses_a_horizon_under_a_day(db, clock) -> None:
    with pytest.raises(ValueError, match="at least 1 day"):
        await prune(db, clock, timedelta(hours=2))


def test_prune_from_the_command_line(sqlite_url: str, tmp_path: Path) -> None:
    cli = make_cli(sqlite_url, tmp_path, in_process=True)
    cli.ok("run", "demo-steps", "--task", "2", "--requested-by", "U_DANA")
    out = cli.ok("prune", "--older-than", "90d", "--dry-run")
    assert out.startswith("would prune 0 runs finished before")
    bad = cli("prune", "--older-than", "2h")
    assert bad.returncode != 0 and "at least 1 day" in bad.stderr
    assert "Traceback" not in bad.stderr
    bad = cli("prune", "--older-than", "soon")
    assert bad.returncode != 0 and "--older-than" in bad.stderr


def test_serve_prunes_on_a_schedule_only_with_a_horizon_of_a_day_or_more() -> None:
    from approvald.bot.config import Settings
    from pydantic import ValidationError

    assert Settings(APPROVALD_PRUNE_OLDER_THAN="90d").prune_older_than == "90d"
    assert Settings(APPROVALD_PRUNE_OLDER_THAN="").prune_older_than is None
    for bad in ("2h", "soon"):
        with pytest.raises(ValidationError, match="PRUNE_OLDER_THAN"):
            Settings(APPROVALD_PRUNE_OLDER_THAN=bad)
