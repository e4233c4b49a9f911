"""The HTTP hook's fail-closed budget (``bot.api.routes.within``): a decision that has not
ended by the budget is answered then (a deny), even one stuck where its cancellation does
not reach, and one that ends first is answered at once. Time moves through the event
loop's clock, set by the test (no sleep)."""

from __future__ import annotations

import asyncio

import pytest
from approvald.bot.api.routes import within


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

    work = asyncio.ensure_future(stuck())
    waiting = asyncio.ensure_future(within(work, 2.0))
    try:
        await _turns()
        now[0] += 1.9
        await _turns()
        assert not waiting.done()  # before the budget: still waiting for the decision
        now[0] += 0.1
        await _turns()
        assert waiting.done() and waiting.result() is False  # at the budget: answered
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

    work = asyncio.ensure_future(decided())
    assert await within(work, 3600.0) is True and work.result() == "allow"
    done = asyncio.get_running_loop().create_future()
    done.set_result(None)
    assert await within(done, 0.0) is True  # ended before it was waited for
