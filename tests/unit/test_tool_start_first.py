"""A run someone's click decided goes ahead of background runs in the resume worker's
queue (issue 50)."""

from __future__ import annotations

import asyncio

from approvald.runtime.approvals.decide import Actor
from approvald.runtime.kernel.urgency import Urgency
from approvald.runtime.models.scripted import ScriptedModel, reply
from approvald.runtime.policies.tools import ToolContext, tool
from approvald.runtime.runs.agent import Agent

from tests.helpers import parts

ALICE = Actor("U_ALICE", "slack")


def agents(log: list[str], *names: str) -> list[Agent]:
    """One agent per name: a gated ``deploy`` of the service it is named after, then its
    final reply; and ``crawler``, a read (auto) call. Each call is logged as it starts."""

    @tool(permission="execute")
    async def deploy(ctx: ToolContext, service: str) -> str:
        """Deploy (gated)."""
        log.append(f"deploy {service}")
        return "deployed"

    @tool(permission="read")
    async def crawl(ctx: ToolContext, site: str) -> str:
        """A background call."""
        log.append(f"crawl {site}")
        return "crawled"

    made = [Agent(name="crawler", instructions="", tools=[crawl],
                  model=ScriptedModel.sequence([reply("crawling", ("crawl", {"site": "a"})),
                                                reply("done", turn=1)]))]
    for name in names:
        made.append(Agent(name=name, instructions="", tools=[deploy],
                          model=ScriptedModel.sequence(
                              [reply("deploying", ("deploy", {"service": name})),
                               reply("done", turn=1)])))
    return made


class Ticks:
    """An injected monotonic clock, moved by hand."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


async def test_a_decided_run_is_taken_ahead_of_background_runs_queued_before_it(
        make_engine) -> None:
    """The worker's queue reads the priority: a run someone's click decided is advanced
    before background runs queued ahead of it, so it never waits behind one of them held
    back for clicks still being answered (a background run waits for every answer; this
    click came before the one being answered, so its run waits for none)."""
    started: list[str] = []
    ticks = Ticks()
    engine = make_engine(agents=agents(started, "web"), urgency=Urgency(monotonic=ticks))
    paused = await engine.run("web", "deploy web", requested_by="U_DANA")
    worker = engine.worker(poll_interval=3600)
    background = await engine.start_run("crawler", "crawl a", requested_by="U_DANA")
    worker.wake(background)  # queued first
    await engine.decide(paused.approval_ids[0], actor=ALICE, verdict="approve")
    worker.wake(paused.run_id)  # (the decision's own hand-over is the serving worker's)
    ticks.t += 0.1
    urgency = parts(engine).urgency
    urgency.begin_answer("a later click")  # being answered, and never done here
    taken: list[str] = []
    advance = worker.advance

    def recording(run_id: str, **kw):  # type: ignore[no-untyped-def]
        taken.append(run_id)
        return advance(run_id, **kw)

    worker.advance = recording
    stop = asyncio.Event()
    serving = asyncio.create_task(worker.run(stop))
    try:
        for _ in range(500):
            if started:
                break
            await asyncio.sleep(0.001)
        # before, the background run at the queue's head was taken first, once it had
        # waited its patience for the answer, and the decided run behind it with it
        assert taken[0] == paused.run_id
        assert started[0] == "deploy web"
    finally:
        urgency.end("a later click")
        stop.set()
        await asyncio.wait_for(serving, 10)
