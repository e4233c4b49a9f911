"""The run-thread follower's read of runs without a thread starts at a mark that moves
(issue 50, "large histories stay fast; serve memory flat").

It read every run updated since the follower began (its ``since``, fixed at start less a
lookback): a read that grew with the process's uptime. The mark moves forward, and never
past a run that still needs a thread: one the poll found and did not thread (paced,
skipped, its claim failed), one whose write committed late (its time older than the read,
by less than :data:`runtime.threads.COMMIT_MARGIN`), or a caller's request that asked a
person after its run last changed.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from approvald.runtime.kernel.clock import ManualClock
from approvald.runtime.threads import COMMIT_MARGIN
from approvald.store.models import Approval, Run
from approvald.store.repos.threads import ThreadsRepo

from tests.helpers import Rows

HOUR = timedelta(hours=1)
TTL = timedelta(seconds=90)


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[datetime]]:
    """The ``since`` of each read of the store's poll."""
    seen: list[datetime] = []
    real = ThreadsRepo.behind

    async def spy(self: ThreadsRepo, **kw: Any) -> Any:
        seen.append(kw["since"])
        return await real(self, **kw)

    monkeypatch.setattr(ThreadsRepo, "behind", spy)
    yield seen


def _run_row(run_id: str, at: datetime, agent: str = "demo-steps") -> dict[str, Any]:
    return {"id": run_id, "agent": agent, "status": "completed", "step": 1, "next_seq": 2,
            "task": "t", "requested_by": "U_DANA", "instructions_version": "v",
            "cancel_requested": False, "failures": 0, "created_at": at, "updated_at": at}


async def _threaded(engine: Any, since: datetime) -> list[str]:
    """One poll; every run it finds without a thread gets one (told nothing yet)."""
    found = await engine.threads.behind(since=since, limit=10)
    new = [run.id for run, seen in found if seen is None]
    for rid in new:
        assert await engine.threads.claim(rid, None, channel="C_OPS", ttl=TTL)
        assert await engine.threads.finish(rid, {"ts": "1.0", "posted_seq": 2,
                                                 "posted_status": "completed"})
    return new


async def test_the_read_of_runs_without_a_thread_moves_on_with_the_clock(
        make_engine, clock: ManualClock, reads: list[datetime]) -> None:
    engine = make_engine()
    since = clock.now() - HOUR
    run_id = (await engine.run("demo-steps", "1", requested_by="U_DANA")).run_id
    assert await _threaded(engine, since) == [run_id]
    clock.advance(3 * HOUR)  # the follower has been up three hours
    assert await _threaded(engine, since) == []
    assert await _threaded(engine, since) == []
    # the last read started a margin before the one before it, not where the follower began
    assert reads[-1] == clock.now() - COMMIT_MARGIN, (reads, clock.now())


async def test_a_run_found_and_not_threaded_is_read_again_however_late(
        make_engine, clock: ManualClock) -> None:
    """A run the poll found without a thread (paced, skipped, its claim failed) holds the
    mark back until it has one."""
    engine = make_engine()
    since = clock.now() - HOUR
    run_id = (await engine.run("demo-steps", "1", requested_by="U_DANA")).run_id
    for _ in range(3):
        [(run, seen)] = await engine.threads.behind(since=since, limit=10)
        assert run.id == run_id and seen is None  # and not claimed (its claim failed)
        clock.advance(2 * HOUR)
    assert await _threaded(engine, since) == [run_id]


async def test_a_write_that_commits_after_the_read_is_read_by_the_next(
        make_engine, clock: ManualClock) -> None:
    """A transaction that took its time, then waited (a lock) and committed after a poll
    read: its run's time is older than that read, and the next poll still reads it."""
    engine = make_engine()
    since = clock.now() - HOUR
    clock.advance(2 * HOUR)
    assert await _threaded(engine, since) == []
    late = clock.now() - COMMIT_MARGIN + timedelta(seconds=1)
    await Rows.of(engine).insert(Run.__table__, [_run_row("late-1", late)])
    clock.advance(1)
    assert await _threaded(engine, since) == ["late-1"]


async def test_a_callers_request_that_asks_after_its_run_last_changed_gets_its_thread(
        make_engine, clock: ManualClock) -> None:
    """With ``callers``, a caller's request gets a thread once it asked a person: found by
    its request's time when that is later than its run's."""
    engine = make_engine()
    rows = Rows.of(engine)
    since = clock.now() - HOUR
    await rows.insert(Run.__table__, [_run_row("xcaller", clock.now(), "external:ci-bot")])
    clock.advance(2 * HOUR)
    assert await engine.threads.behind(since=since, limit=10, callers=True) == []
    # it asks a person now (the approval of a run of ours, moved onto it)
    paused = await engine.run("demo-refund", "Refund order A-1001", requested_by="U_DANA")
    [approval_id] = paused.approval_ids
    assert await engine.threads.claim(paused.run_id, None, channel="C_OPS", ttl=TTL)
    await rows.forge(Approval.__table__, Approval.id == approval_id, run_id="xcaller")
    clock.advance(1)
    found = await engine.threads.behind(since=since, limit=10, callers=True)
    assert "xcaller" in [run.id for run, seen in found if seen is None], found
    # its run changes after it asked (a caller's report), and it waits for its thread:
    # it is still found by when it asked
    clock.advance(timedelta(minutes=10))
    await rows.forge(Run.__table__, Run.id == "xcaller", updated_at=clock.now())
    for _ in range(2):
        found = await engine.threads.behind(since=since, limit=10, callers=True)
        assert "xcaller" in [run.id for run, seen in found if seen is None], found
        clock.advance(2 * HOUR)


async def test_a_read_cut_short_by_its_limit_leaves_the_mark_where_it_was(
        make_engine, clock: ManualClock) -> None:
    """A poll that filled its limit did not see every run without a thread: the ones past
    the limit (served by age, not by time of change) may be older than those it saw."""
    engine = make_engine()
    rows = Rows.of(engine)
    start = clock.now()
    early = _run_row("early", start)  # began first, changed last
    early["updated_at"] = start + 2 * HOUR
    await rows.insert(Run.__table__, [early, _run_row("later", start + HOUR)])
    clock.advance(3 * HOUR)
    [(first, _)] = await engine.threads.behind(since=start, limit=1)
    assert first.id == "early"
    found = await engine.threads.behind(since=start, limit=10)
    assert [run.id for run, _ in found] == ["early", "later"]
