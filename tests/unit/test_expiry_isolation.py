"""One bad request never stops the expiry sweep for the others (issue 36, defect 4).

A request whose stored escalation ladder, policy snapshot or times cannot be computed
with is written straight to the database here (as a request made before intake bounded
durations would be), beside ordinary ones that are due. The sweep settles the ordinary
ones as usual and isolates the bad one: logged once with its id, audited (``failed``, with
what failed), and settled the safe way (expired, as if ``on_expire`` were cancel: silence
never approves), so it does not fail every sweep after it either.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from approvald.runtime.policies.policy import Rung
from approvald.runtime.record import audit
from approvald.runtime.record.state import ToolMessage
from approvald.store.models import Approval
from sqlalchemy import update

from tests.unit.test_gate import pause, refund_lines, refunds

LADDER: dict[str, Any] = {"approvers": ["U_ALICE"], "ttl": "30m", "reminders": ["50%", "90%"],
                          "on_expire": "escalate",
                          "escalate": [Rung(approvers=["U_CFO"], ttl="1h")]}


async def tamper(db, approval_id: str, **values: Any) -> None:  # type: ignore[no-untyped-def]
    """Somebody (an old intake, a hand edit) wrote these values to the request's row."""
    async with db.write() as tx:
        await tx.conn.execute(update(Approval).where(Approval.id == approval_id).values(**values))


async def endless_rung(db, approval_id: str) -> None:  # type: ignore[no-untyped-def]
    """The request's stored ladder escalates to a rung nobody can compute the end of."""
    async with db.read() as tx:
        a = await tx.approvals.get(approval_id)
    snapshot = json.loads(a.policy)
    snapshot["escalate"][0]["ttl"] = "99999999d"
    await tamper(db, approval_id, policy=json.dumps(snapshot))


def logged(caplog: pytest.LogCaptureFixture, approval_id: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records
            if r.levelno >= logging.WARNING and approval_id in r.getMessage()]


async def trail(db, approval_id: str) -> list[Any]:  # type: ignore[no-untyped-def]
    async with db.read() as tx:
        return list(await tx.audit.query(approval_id=approval_id))


@pytest.mark.parametrize("only", [False, True], ids=["sweep", "job"])
async def test_an_escalation_that_cannot_be_computed_expires_alone(
        make_engine, db, clock, ledger_path, caplog, only):
    engine = refunds(make_engine, ledger_path, **LADDER)
    bad = await pause(engine)
    good = await pause(engine)
    [bad_id], [good_id] = bad.approval_ids, good.approval_ids
    await endless_rung(db, bad_id)
    clock.advance(timedelta(minutes=31))

    swept = await engine.sweep(only=[bad_id, good_id] if only else None)

    # the ordinary request escalates as it always did
    [(old, new)] = swept.escalated
    assert old == good_id
    async with db.read() as tx:
        a_good, a_new, a_bad = [await tx.approvals.get(i) for i in (good_id, new, bad_id)]
    assert a_good.status == "superseded" and a_new.status == "pending"
    assert a_new.approvers_value() == ["U_CFO"]
    # the bad one expires, as if on_expire were cancel, and its run is woken to hear so
    assert swept.expired == [bad_id] and bad.run_id in swept.runs_ready
    assert a_bad.status == "expired" and a_bad.decided_by == "system:expiry"
    entries = await trail(db, bad_id)
    assert [e.action for e in entries] == ["requested", "failed", "expired"]
    failed = json.loads(entries[1].details)
    assert failed["tool"] == "issue_refund" and failed["during"] == "expiry"
    assert failed["error"]  # what went wrong, in words
    assert "cancel" in failed["outcome"] and "never approves" in failed["outcome"]
    assert json.loads(entries[2].details)["on_expire"] == "cancel"
    assert len(logged(caplog, bad_id)) == 1

    # settled for good: the next sweeps neither fail nor log it again
    clock.advance(timedelta(minutes=1))
    again = await engine.sweep()
    assert again.expired == [] and again.escalated == []
    assert len(logged(caplog, bad_id)) == 1
    # the run hears "expired", and the refund never runs (silence never approves)
    done = await engine.advance(bad.run_id)
    assert done.status == "completed"
    state = await engine.state(bad.run_id)
    assert any(isinstance(m, ToolMessage) and m.content == {"status": "expired"}
               for m in state.messages)
    assert refund_lines(ledger_path) == []
    report = await audit.verify(db)
    assert report.ok, report.problems


async def test_a_reminder_that_cannot_be_computed_stops_alone(
        make_engine, db, clock, ledger_path, caplog):
    engine = refunds(make_engine, ledger_path, **LADDER)
    bad = await pause(engine)
    good = await pause(engine)
    [bad_id], [good_id] = bad.approval_ids, good.approval_ids
    async with db.read() as tx:
        requested_at = (await tx.approvals.get(bad_id)).requested_at
    # a snapshot nobody can read any more, whose reminder comes first
    await tamper(db, bad_id, policy='{"ttl": "half an hour"}',
                 next_reminder_at=requested_at + timedelta(minutes=1))
    clock.advance(timedelta(minutes=15))

    swept = await engine.sweep()

    assert swept.reminded == [good_id]  # the ordinary request is reminded as usual
    async with db.read() as tx:
        a_bad = await tx.approvals.get(bad_id)
    assert a_bad.status == "pending" and a_bad.next_reminder_at is None  # no more tries
    entries = await trail(db, bad_id)
    assert [e.action for e in entries] == ["requested", "failed"]
    failed = json.loads(entries[1].details)
    assert failed["during"] == "reminder" and failed["error"]
    assert len(logged(caplog, bad_id)) == 1
    assert (await engine.sweep()).reminded == []
    assert len(logged(caplog, bad_id)) == 1

    # at its expiry it cannot be escalated either (its ladder is unreadable): it expires
    clock.advance(timedelta(minutes=16))
    swept = await engine.sweep()
    assert swept.expired == [bad_id] and [o for o, _ in swept.escalated] == [good_id]
    assert [e.action for e in await trail(db, bad_id)] == [
        "requested", "failed", "failed", "expired"]
    assert len(logged(caplog, bad_id)) == 2  # once for the reminder, once for the expiry
    assert refund_lines(ledger_path) == []


async def test_the_scheduler_settles_around_a_bad_request_and_still_rebuilds(
        make_engine, db, clock, ledger_path, caplog):
    engine = refunds(make_engine, ledger_path, **LADDER)
    bad = await pause(engine)
    good = await pause(engine)
    await endless_rung(db, bad.approval_ids[0])
    clock.advance(timedelta(minutes=31))
    later = await pause(engine)  # not due: the rebuild schedules it
    scheduler = engine.expiry_scheduler()

    await scheduler.sweep()  # what APScheduler runs every interval

    async with db.read() as tx:
        statuses = {a.id: a.status for a in await tx.approvals.recent()}
    assert statuses[bad.approval_ids[0]] == "expired"
    assert statuses[good.approval_ids[0]] == "superseded"
    pending = {i for i, s in statuses.items() if s == "pending"}
    assert len(pending) == 2 and later.approval_ids[0] in pending  # + the escalation
    assert {j.id for j in scheduler.scheduler.get_jobs()} == {f"approval:{i}" for i in pending}
    assert not [r for r in caplog.records if "sweep failed" in r.getMessage()]


async def test_a_request_due_beyond_any_date_is_scheduled_with_the_rest(make_engine, db, clock):
    engine = make_engine()
    far = await pause(engine)
    near = await pause(engine)
    await tamper(db, far.approval_ids[0], next_reminder_at=None,
                 expires_at=datetime(9999, 12, 31, tzinfo=UTC))
    scheduler = engine.expiry_scheduler()

    assert await scheduler.rebuild() == 2
    jobs = {j.id: j for j in scheduler.scheduler.get_jobs()}
    assert set(jobs) == {f"approval:{far.approval_ids[0]}", f"approval:{near.approval_ids[0]}"}
    # a job only triggers a check: the far one looks again within a day, changing nothing
    far_job = jobs[f"approval:{far.approval_ids[0]}"]
    assert far_job.trigger.run_date <= datetime.now(UTC) + timedelta(days=1, minutes=1)
    await scheduler._due(far.approval_ids[0])
    async with db.read() as tx:
        assert (await tx.approvals.get(far.approval_ids[0])).status == "pending"
    assert scheduler.scheduler.get_job(f"approval:{far.approval_ids[0]}") is not None


async def test_only_the_data_is_blamed_on_a_row_never_an_outage(db):
    """The sweep isolates a request only for a failure of its own data; a database that
    fails takes the whole sweep down, to be tried again, and cancels nothing."""
    from approvald.store.db import Database, is_store_failure

    now = datetime(2026, 1, 1, tzinfo=UTC)
    async with db.write() as tx:
        await tx.runs.create(run_id="r" * 32, agent="a", task="t", requested_by="U1",
                             instructions_version="1", now=now)
    caught: list[BaseException] = []
    for values in ({"now": now}, {"now": now.replace(tzinfo=None)}):  # a twin, a naive time
        with pytest.raises(Exception) as err:
            async with db.write() as tx:
                await tx.runs.create(run_id="r" * 32, agent="a", task="t", requested_by="U1",
                                     instructions_version="1", **values)
        caught.append(err.value)
    assert not any(is_store_failure(e) for e in caught)
    assert not is_store_failure(OverflowError("date value out of range"))

    gone = Database("postgresql+asyncpg://postgres@127.0.0.1:1/approvald")  # nobody there
    with pytest.raises(Exception) as outage:
        async with gone.read() as tx:
            await tx.runs.get("r" * 32)
    await gone.close()
    assert is_store_failure(outage.value)
    assert is_store_failure(ConnectionRefusedError(111, "Connection refused"))


async def test_a_click_on_a_bad_request_past_its_expiry_is_refused_and_audited(
        make_engine, db, clock, ledger_path, caplog):
    """No sweep has run: the click finds the request overdue, whose expiry cannot be
    worked out with the refusal; the refusal is recorded all the same, the clicker is told
    it expired, and the request is settled the safe way."""
    from approvald.runtime.approvals.decide import Actor
    from approvald.runtime.kernel.errors import DecisionRefused

    engine = refunds(make_engine, ledger_path, **LADDER)
    bad = await pause(engine)
    [bad_id] = bad.approval_ids
    await endless_rung(db, bad_id)
    clock.advance(timedelta(minutes=31))
    with pytest.raises(DecisionRefused) as refused:
        await engine.decide(bad_id, actor=Actor("U_ALICE", "slack"), verdict="approve")
    assert refused.value.reason == "expired"
    actions = [e.action for e in await trail(db, bad_id)]
    assert actions[0] == "requested" and "refused" in actions and actions[-1] == "expired"
    async with db.read() as tx:
        assert (await tx.approvals.get(bad_id)).status == "expired"
    assert refund_lines(ledger_path) == []
    report = await audit.verify(db)
    assert report.ok, report.problems
