"""The background-loop shape (runtime/kernel/periodic.py): work at once, again at each
wake-up (one kept while the work runs), until stop; no task made per round."""

from __future__ import annotations

import asyncio
import sys

import pytest
from approvald.runtime.kernel import periodic
from approvald.runtime.kernel.periodic import repeat


async def test_each_wake_up_is_a_round_one_during_the_work_is_kept_and_stop_ends_it() -> None:
    stop, wake = asyncio.Event(), asyncio.Event()
    rounds: list[int] = []
    done = asyncio.Event()

    async def work() -> None:
        rounds.append(len(rounds))
        if len(rounds) == 2:
            wake.set()  # arrives while this round works: a third round follows at once
        if len(rounds) == 3:
            done.set()

    loop = asyncio.create_task(repeat(work, stop=stop, every=3600, what="test", wake=wake))
    for _ in range(100):
        await asyncio.sleep(0)
    assert rounds == [0]  # the first at once; the period is an hour
    wake.set()
    await asyncio.wait_for(done.wait(), 5)
    assert rounds == [0, 1, 2]
    stop.set()  # ends the wait for the next wake-up at once, not after the hour
    await asyncio.wait_for(loop, 5)
    assert rounds == [0, 1, 2]


async def test_a_failed_round_is_logged_and_the_next_one_comes(
        caplog: pytest.LogCaptureFixture) -> None:
    stop, wake = asyncio.Event(), asyncio.Event()
    calls: list[int] = []

    async def work() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("boom")
        stop.set()

    loop = asyncio.create_task(repeat(work, stop=stop, every=0.01, what="the test loop",
                                      wake=wake))
    await asyncio.wait_for(loop, 5)
    assert len(calls) == 2
    assert "the test loop failed; retrying" in caplog.text


async def test_waiting_makes_no_task_per_round() -> None:
    """One task for the loop's life (it rings the wake-up at stop); each round waits on
    one event under a timeout (issue 50: three tasks a round, a round per click)."""
    stop, wake, worked = asyncio.Event(), asyncio.Event(), asyncio.Event()
    rounds = 0

    async def work() -> None:
        nonlocal rounds
        rounds += 1
        worked.set()

    loop = asyncio.get_running_loop()
    real = loop.create_task
    made: list[str] = []

    def spy(coro, **kw):  # type: ignore[no-untyped-def]
        f = sys._getframe(1)
        while f is not None and "asyncio" in f.f_code.co_filename:
            f = f.f_back  # type: ignore[assignment]
        if f is not None and f.f_code.co_name == "repeat":
            made.append(coro.__qualname__)
        return real(coro, **kw)

    loop.create_task = spy  # type: ignore[method-assign]
    try:
        running = asyncio.create_task(repeat(work, stop=stop, every=3600, what="test",
                                             wake=wake, settle=0.001))
        for _ in range(20):
            await asyncio.wait_for(worked.wait(), 5)
            worked.clear()
            wake.set()
        stop.set()
        await asyncio.wait_for(running, 5)
    finally:
        del loop.create_task
    assert rounds >= 20
    assert made == ["_ring"], made


async def test_a_replica_that_follows_waits_longer_between_rounds(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 50: every replica polled at the one rate; while another replica leads, the
    period is :data:`FOLLOWING` times longer, and back to the rate given once it leads."""
    stop, pace = asyncio.Event(), periodic.Pace()
    asked: list[float] = []

    async def waited(event: asyncio.Event, patience: float) -> bool:
        asked.append(patience)  # (no waiting: the next round at once)
        return False

    async def work() -> None:
        pace.lead(len(asked) != 1)  # leads, follows in the second round, leads again
        if len(asked) == 3:
            stop.set()

    monkeypatch.setattr(periodic, "waited", waited)
    await asyncio.wait_for(repeat(work, stop=stop, every=2.0, what="test", pace=pace), 5)
    assert asked == [2.0, 2.0 * periodic.FOLLOWING, 2.0]
