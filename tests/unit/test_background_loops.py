"""The background loops wait without a task per round (issue 50): the periodic loop
(worker poll, outbox drain), the resume worker's queue, the lease heartbeat. Each still
wakes, stops and renews as before."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from approvald.runtime.approvals.decide import Actor
from approvald.runtime.kernel.outcomes import Completed
from approvald.runtime.kernel.periodic import repeat, waited
from approvald.runtime.models.scripted import ScriptedModel, reply
from approvald.runtime.policies.tools import ToolContext, tool
from approvald.runtime.runs.agent import Agent
from approvald.store.repos.runs import RunsRepo

from tests.helpers import Rows

ALICE = Actor("U_ALICE", "slack")


def _tasks() -> set[asyncio.Task[Any]]:
    """The live tasks but the database libraries' (closing a connection, say)."""
    return {t for t in asyncio.all_tasks() if not t.done()
            and "site-packages" not in getattr(t.get_coro(), "cr_code", _NONE).co_filename}


_NONE = (lambda: None).__code__


async def test_waited_says_whether_the_event_came_in_time() -> None:
    event = asyncio.Event()
    assert await waited(event, 0.001) is False
    later = asyncio.get_running_loop().call_soon(event.set)
    assert await waited(event, 10) is True and later.cancelled() is False
    assert await waited(event, 0) is True  # set already: no wait at all


async def test_a_round_waits_with_no_task_of_its_own_and_wakes_and_stops_at_once() -> None:
    stop, wake = asyncio.Event(), asyncio.Event()
    rounds: list[int] = []
    waiting = asyncio.Event()

    async def work() -> None:
        rounds.append(len(rounds))
        waiting.set()

    loop = asyncio.create_task(repeat(work, stop=stop, every=3600, what="test", wake=wake))
    await asyncio.wait_for(waiting.wait(), 5)
    await asyncio.sleep(0)  # the round is over: the loop waits for a wake-up
    before = _tasks()
    for n in range(1, 4):  # each wake-up is a round, made with no task of its own
        waiting.clear()
        wake.set()
        await asyncio.wait_for(waiting.wait(), 5)
        await asyncio.sleep(0)
        assert len(rounds) == n + 1
        assert _tasks() == before
    stop.set()  # ends the wait at once, not after ``every``
    await asyncio.wait_for(loop, 5)
    assert len(rounds) == 4


async def test_a_loop_without_a_wake_event_stops_at_once() -> None:
    stop = asyncio.Event()
    rounds: list[int] = []

    async def work() -> None:
        rounds.append(1)

    loop = asyncio.create_task(repeat(work, stop=stop, every=3600, what="test"))
    await asyncio.sleep(0)
    stop.set()
    await asyncio.wait_for(loop, 5)
    assert rounds == [1]


async def test_the_worker_waits_for_runs_with_no_task_per_run_and_stops_at_once(
        make_engine) -> None:
    @tool(permission="execute")
    async def deploy(ctx: ToolContext, service: str) -> str:
        """Deploy (gated)."""
        return "deployed"

    agent = Agent(name="deployer", instructions="", tools=[deploy],
                  model=ScriptedModel.sequence([reply("deploying", ("deploy", {"service": "web"})),
                                                reply("done", turn=1)]))
    engine = make_engine(agents=[agent])
    paused = [await engine.run("deployer", "deploy web", requested_by="U_DANA") for _ in range(3)]
    worker = engine.worker(concurrency=2, poll_interval=3600)
    stop = asyncio.Event()
    serving = asyncio.create_task(worker.run(stop))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    idle = _tasks()
    for p in paused:
        await engine.decide(p.approval_ids[0], actor=ALICE, verdict="approve")
    for _ in range(200):  # until the three runs are through (each a task while it runs)
        if not worker.queued and not worker._active:
            break
        await asyncio.sleep(0.01)
    runs = [await Rows.of(engine).run(p.run_id) for p in paused]
    assert [r.status for r in runs if r is not None] == ["completed"] * 3
    assert _tasks() == idle  # no task was left waiting per run that went through
    stop.set()  # the worker waits on its queue alone: stop ends that wait at once
    await asyncio.wait_for(serving, 5)


def _pay_agent(calls: list[str], gate: asyncio.Event) -> Agent:
    @tool(permission="execute", policy="auto")
    async def pay(ctx: ToolContext, cents: int) -> str:
        """Pay (a long call, until the test says)."""
        calls.append(ctx.run_id)
        await asyncio.wait_for(gate.wait(), 10)
        return "paid"

    return Agent(name="payer", instructions="", tools=[pay], model=ScriptedModel.sequence(
        [reply(None, ("pay", {"cents": 5})), reply("paid", turn=1)]))


async def test_a_long_call_has_its_lease_renewed_again_and_again(make_engine, monkeypatch):
    renewed = asyncio.Event()
    renewals: list[str] = []
    renew = RunsRepo.renew_lease

    async def counted(self, run_id: str, **kw: Any) -> bool:  # type: ignore[no-untyped-def]
        ok = await renew(self, run_id, **kw)
        if kw.get("journal") is None:  # (the intent's own renewal carries the journal)
            renewals.append(run_id)
        if len(renewals) >= 3:
            renewed.set()
        return ok

    monkeypatch.setattr(RunsRepo, "renew_lease", counted)
    calls: list[str] = []
    engine = make_engine(agents=[_pay_agent(calls, renewed)],
                         lease_ttl=timedelta(seconds=0.15))
    run_id = await engine.start_run("payer", "pay", requested_by="U_DANA")
    outcome = await asyncio.wait_for(engine.advance(run_id), 10)
    assert isinstance(outcome, Completed), outcome  # the heartbeat kept the lease throughout
    assert calls == [run_id] and len(renewals) >= 3


async def test_a_short_advance_makes_no_heartbeat_task(make_engine):
    seen: list[set[str]] = []
    gate = asyncio.Event()
    gate.set()
    calls: list[str] = []
    agent = _pay_agent(calls, gate)
    original = agent.tools[0].fn

    async def looking(ctx: ToolContext, cents: int) -> str:
        seen.append({t.get_coro().__qualname__ for t in _tasks()})  # type: ignore[union-attr]
        return await original(ctx, cents)

    agent.tools[0].fn = looking
    engine = make_engine(agents=[agent])  # the default lease: a third of it is minutes
    run_id = await engine.start_run("payer", "pay", requested_by="U_DANA")
    assert isinstance(await engine.advance(run_id), Completed)
    assert calls == [run_id] and seen
    assert len(seen) == 1 and not any(name.endswith(".beat") for name in seen[0]), seen
    assert not any(name.endswith(".beat") for names in seen for name in names)
