"""The APScheduler wiring: jobs rebuilt from the database, one per pending approval."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tests.helpers import Rows


async def test_rebuild_schedules_each_pending_approval_at_its_next_event(make_engine, db, clock):
    engine = make_engine()
    first = await engine.run("demo-refund", "Refund order A-1001", requested_by="U_DANA")
    second = await engine.run("demo-refund", "Refund order B-2002", requested_by="U_DANA")
    scheduler = engine.expiry_scheduler()
    assert await scheduler.rebuild() == 2
    jobs = {j.id: j for j in scheduler.scheduler.get_jobs()}
    for outcome in (first, second):
        [aid] = outcome.approval_ids
        a = await Rows(db).approval(aid)
        job = jobs[f"approval:{aid}"]
        # the first reminder (50% of 30m) comes before the expiry
        assert a.next_reminder_at == a.requested_at + timedelta(minutes=15)
        # wall-clock run date: the same span from now as the reminder is from engine time
        # (the test clock is months behind the wall clock; no job fires in a loop)
        expected = datetime.now(UTC) + (a.next_reminder_at - clock.now())
        assert abs((job.trigger.run_date - expected).total_seconds()) < 5
    # a decided request drops out at the next rebuild
    from approvald.runtime.approvals.decide import Actor

    await engine.decide(first.approval_ids[0], actor=Actor("U_ALICE", "slack"),
                        verdict="approve")
    assert await scheduler.rebuild() == 1
    assert {j.id for j in scheduler.scheduler.get_jobs()} == {
        f"approval:{second.approval_ids[0]}"}


async def test_a_due_job_settles_through_the_same_sweep_and_reschedules(make_engine, db, clock):
    engine = make_engine()
    outcome = await engine.run("demo-refund", "Refund order A-1001", requested_by="U_DANA")
    [aid] = outcome.approval_ids
    scheduler = engine.expiry_scheduler()
    await scheduler.rebuild()
    clock.advance(timedelta(minutes=15))
    await scheduler._due(aid)  # what APScheduler calls at the job's time
    a = await Rows(db).approval(aid)
    assert a.reminders_sent == 1 and a.status == "pending"
    job = scheduler.scheduler.get_job(f"approval:{aid}")
    assert job is not None  # the next event (the 90% reminder) is scheduled
    clock.advance(timedelta(minutes=20))
    await scheduler._due(aid)
    a = await Rows(db).approval(aid)
    assert a.status == "expired"
    assert await scheduler.rebuild() == 0
    assert scheduler.scheduler.get_job(f"approval:{aid}") is None


async def test_a_job_that_fires_early_changes_nothing(make_engine, db, clock):
    """Jobs only trigger a check against the engine's clock: silence never approves, and
    nothing expires before its time even if a job runs early (a clock jump, a replica)."""
    engine = make_engine()
    outcome = await engine.run("demo-refund", "Refund order A-1001", requested_by="U_DANA")
    [aid] = outcome.approval_ids
    scheduler = engine.expiry_scheduler()
    await scheduler._due(aid)
    a = await Rows(db).approval(aid)
    assert a.status == "pending" and a.reminders_sent == 0


async def test_a_rebuild_leaves_a_job_already_set_for_its_time_alone(make_engine, db, clock):
    """The sweep rebuilds the schedule every 15 s: a job already set for its approval's
    next event is left as it is (no job made again for each pending approval, each sweep,
    in one step of the event loop); one whose event moved, or that is gone, is set again."""
    engine = make_engine()
    outcomes = [await engine.run("demo-refund", f"Refund order A-{i}", requested_by="U_DANA")
                for i in range(3)]
    first, second, _ = (o.approval_ids[0] for o in outcomes)
    scheduler = engine.expiry_scheduler()
    assert await scheduler.rebuild() == 3
    before = {j.id: j for j in scheduler.scheduler.get_jobs()}
    added: list[str] = []
    add_job = scheduler.scheduler.add_job

    def counted(*args, **kwargs):
        added.append(kwargs["id"])
        return add_job(*args, **kwargs)

    scheduler.scheduler.add_job = counted
    assert await scheduler.rebuild() == 3
    assert added == []
    assert {j.id: j for j in scheduler.scheduler.get_jobs()} == before  # the same jobs
    # its next event moved (the first reminder sent): set again, for the next one
    clock.advance(timedelta(minutes=15))
    await scheduler._due(first)
    assert added == [f"approval:{first}"]
    # its job gone (fired, and its check failed): the next rebuild sets it again
    scheduler.scheduler.get_job(f"approval:{second}").remove()
    assert await scheduler.rebuild() == 3
    assert added == [f"approval:{first}", f"approval:{second}"]
    assert {j.id for j in scheduler.scheduler.get_jobs()} == set(before)


async def test_a_schedule_unread_at_start_is_left_to_the_sweep_and_a_bug_is_raised(
        make_engine, monkeypatch):
    """``serve`` answers /healthz before the schedule is read: a database failing then
    leaves the schedule to the sweep (tests/integration/test_serve_outage.py); a bug in
    reading it still stops start-up."""
    from sqlalchemy.exc import OperationalError

    engine = make_engine()
    for failure, raised in ((OperationalError("SELECT", {}, Exception("gone")), None),
                            (TypeError("a bug"), TypeError)):
        scheduler = engine.expiry_scheduler()

        async def rebuild(failure: Exception = failure) -> int:
            raise failure
        monkeypatch.setattr(scheduler, "rebuild", rebuild)
        try:
            if raised is None:
                assert await scheduler.start() is None  # not scheduled yet: not "0 pending"
                assert scheduler.scheduler.get_job("sweep") is not None
            else:
                with pytest.raises(raised):
                    await scheduler.start()
        finally:
            scheduler.shutdown()
