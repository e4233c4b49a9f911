"""What each replica does on its own schedule (issue 50): its polls go at the process's
pace (slower while another replica leads, runtime/kernel/periodic.py), and the look-up
of dead lease and claim holders that the worker's poll and the outbox drain both need is
made once for the two."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from approvald.bot.slack.log_delivery import LogDeliverer
from approvald.bot.slack.threads import ThreadFollower
from approvald.runtime.kernel import periodic
from approvald.store.repos.outbox import OutboxRepo
from approvald.store.repos.runs import RunsRepo
from approvald.store.repos.threads import ThreadsRepo
from slack_sdk.web.async_client import AsyncWebClient


@pytest.mark.parametrize("loop", ["worker", "drain", "threads"])
async def test_a_following_replica_polls_at_its_pace(make_engine: Any, loop: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    engine = make_engine()
    engine.pace.lead(False)  # another replica leads
    stop = asyncio.Event()
    asked: list[float] = []

    async def waited(event: asyncio.Event, patience: float) -> bool:
        asked.append(patience)
        stop.set()  # one round is enough
        return True

    monkeypatch.setattr(periodic, "waited", waited)
    if loop == "worker":
        run = engine.worker(poll_interval=2.0).run(stop)
    elif loop == "drain":
        run = engine.drain(LogDeliverer()).run(stop, interval=2.0)
    else:
        follower = ThreadFollower(engine, AsyncWebClient(token="xoxb-test"), channel="C1")
        run = follower.run(stop, poll=2.0)
    await asyncio.wait_for(run, 10)
    assert asked == [2.0 * periodic.FOLLOWING]


async def test_the_worker_and_the_drain_look_dead_owners_up_once_between_them(
        make_engine: Any, clock: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """And the run threads' poll (a dead process's thread claims are taken at once): one
    look-up, in one read, finds every kind of holder."""
    engine = make_engine()
    looked: list[str] = []
    lease_owners, claimers = RunsRepo.lease_owners, OutboxRepo.claimers
    thread_claimers = ThreadsRepo.claimers

    async def runs(self: RunsRepo) -> list[str]:
        looked.append("runs")
        return await lease_owners(self)

    async def outbox(self: OutboxRepo) -> list[str]:
        looked.append("outbox")
        return await claimers(self)

    async def threads(self: ThreadsRepo) -> list[str]:
        looked.append("threads")
        return await thread_claimers(self)

    monkeypatch.setattr(RunsRepo, "lease_owners", runs)
    monkeypatch.setattr(OutboxRepo, "claimers", outbox)
    monkeypatch.setattr(ThreadsRepo, "claimers", threads)
    worker, drain = engine.worker(), engine.drain(LogDeliverer())
    await worker.poll_once()
    await drain.drain_once()
    await worker.poll_once()
    await engine.threads.behind(since=clock.now(), limit=10)
    assert looked == ["runs", "outbox", "threads"]


async def test_a_run_thread_follower_polls_at_the_interval_it_holds(
        make_engine: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its poll is the follower's own, 0.5 s unless given (a harness serving Slack sets it
    as it sets the channel's pacing, on the follower serve made), or one ``run`` asks."""
    engine = make_engine()
    asked: list[float] = []

    async def waited(event: asyncio.Event, patience: float) -> bool:
        asked.append(patience)
        event.set()  # (``stop``) one round is enough
        return True

    monkeypatch.setattr(periodic, "waited", waited)
    client = AsyncWebClient(token="xoxb-test")
    follower = ThreadFollower(engine, client, channel="C1")
    await asyncio.wait_for(follower.run(asyncio.Event()), 10)
    follower.poll = 0.05
    await asyncio.wait_for(follower.run(asyncio.Event()), 10)
    await asyncio.wait_for(ThreadFollower(engine, client, channel="C1", poll=0.2)
                           .run(asyncio.Event()), 10)
    await asyncio.wait_for(follower.run(asyncio.Event(), poll=2.0), 10)
    assert asked == [0.5, 0.05, 0.2, 2.0]
