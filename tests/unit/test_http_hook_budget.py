"""The HTTP hook's fail-closed budget (``bot.api.routes.within``): a decision that has not
ended by the budget is answered then (a deny), even one stuck where its cancellation does
not reach, and one that ends first is answered at once. Time moves through the event
loop's clock, set by the test (no sleep)."""

from __future__ import annotations

import asyncio

import pytest
from approvald.bot.api.routes import within


def _running() -> list[asyncio.Task[object]]:
    """The decisions ``within`` is running."""
    return [t for t in asyncio.all_tasks()
            if getattr(t.get_coro(), "__qualname__", "") == "within.<locals>.run"]


async def _turns(n: int = 5) -> None:
    for _ in range(n):  # the loop runs what is ready (the test stays ready: no blocking)
        await asyncio.sleep(0)


async def test_a_decision_stuck_past_its_cancellation_is_answered_at_the_budget(
        monkeypatch: pytest.MonkeyPatch) -> None:
    loop = asyncio.get_running_loop()
    now = [loop.time()]
    monkeypatch.setattr(loop, "time", lambda: now[0])
    release = asyncio.Event()

    async def stuck() -> str:  # a statement its driver does not give up
        while True:
            try:
                await release.wait()
                return "late"
            except asyncio.CancelledError:
                continue

    waiting = asyncio.ensure_future(within(stuck(), 2.0))
    await _turns()
    [work] = _running()
    try:
        now[0] += 1.9
        await _turns()
        assert not waiting.done()  # before the budget: still waiting for the decision
        now[0] += 0.1
        await _turns()
        assert waiting.done() and waiting.result() is work  # at the budget: answered
        work.cancel()  # (the route's straggler, cancelled: it ignores it and runs on)
        await _turns()
        assert not work.done()
    finally:
        release.set()
        waiting.cancel()
    assert await work == "late"


async def test_a_decision_that_ends_first_is_answered_then() -> None:
    async def decided() -> str:
        await asyncio.sleep(0)
        return "allow"

    work = await within(decided(), 3600.0)
    assert work.done() and work.result() == "allow"


async def test_a_caller_that_goes_away_cancels_the_decision() -> None:
    started = asyncio.Event()

    async def deciding() -> str:
        started.set()
        await asyncio.Event().wait()
        return "never"

    waiting = asyncio.ensure_future(within(deciding(), 3600.0))
    await started.wait()
    [work] = _running()
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    with pytest.raises(asyncio.CancelledError):
        await work
