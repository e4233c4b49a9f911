"""A run the resume worker has taken off its queue stays its own until its advance starts
(tests under load found it advanced twice: ``test_urgency.py``'s task count)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from approvald.runtime.approvals.decide import Actor
from approvald.runtime.engine import Engine
from approvald.runtime.kernel.outcomes import Busy, Paused
from approvald.runtime.kernel.urgency import Urgency
from approvald.runtime.runs.worker import ResumeWorker

from tests.helpers import Rows, parts

HELD = ("busy-1", "busy-2")  # runs (not in the database) whose advance keeps its slot


async def test_a_run_waiting_for_a_slot_is_not_claimed_again_by_a_poll_in_flight(
        make_engine: Callable[..., Engine]) -> None:
    """The worker took a run woken here off its queue and waits for a free slot; a poll
    that began before (its room counted then) must not claim that run and queue it once
    more: the run would be advanced twice, the second attempt finding it done or leased."""
    engine = make_engine()
    paused = await engine.run("demo-refund", "Refund order A-1001", requested_by="U_DANA")
    assert isinstance(paused, Paused)
    # decided with no worker taking decided runs: ready, under no lease, announced
    await engine.decide(paused.approval_ids[0], actor=Actor("U_ALICE", "slack"),
                        verdict="approve")
    run_id = paused.run_id

    p = parts(engine)
    advanced: list[tuple[str, str | None]] = []
    hold = asyncio.Event()  # the runs already using both slots

    async def advance(rid: str, *, stop: Any = None, stale_owners: Any = (),
                      claim: str | None = None) -> Busy:
        advanced.append((rid, claim))
        if rid in HELD:
            await hold.wait()
        return Busy(rid, "busy")

    # a worker that knows of no click pressing this run (as when another process, or the
    # expiry sweep, made it ready): it waits for a slot like any background run
    worker = ResumeWorker(p.db, p.clock, p.owners, p.signals, Urgency(), p.meter, advance,
                          lease_ttl=p.config.lease_ttl, concurrency=2, poll_interval=3600)
    # the poll in flight: its room counted (two free slots), then held before its claim
    in_poll, go_on = asyncio.Event(), asyncio.Event()
    stale = p.owners.stale

    async def held_stale(**kw: Any) -> Any:
        in_poll.set()
        await go_on.wait()
        return await stale(**kw)

    stop = asyncio.Event()
    serving = asyncio.create_task(worker.run(stop))
    await asyncio.sleep(0)  # the worker's own first poll has nothing to claim yet
    p.owners.stale = held_stale
    try:
        polling = asyncio.create_task(worker.poll_once())
        await in_poll.wait()
        for rid in HELD:  # each takes a slot and keeps it
            worker.wake(rid)
        for _ in range(50):
            await asyncio.sleep(0)
        assert sorted(rid for rid, _ in advanced) == sorted(HELD), advanced
        worker.wake(run_id)  # taken off the queue, then waits for a slot
        for _ in range(50):
            await asyncio.sleep(0)
        go_on.set()  # the poll goes on and claims what is ready and not the worker's
        await polling
        hold.set()
        for _ in range(200):  # every attempt it queued made (each a few steps)
            await asyncio.sleep(0)
        stop.set()
        await asyncio.wait_for(serving, 10)
    finally:
        del p.owners.stale
    assert [rid for rid, _ in advanced].count(run_id) == 1, advanced
    # the poll left it alone: nobody holds a lease on it now
    run = await Rows.of(engine).run(run_id)
    assert run is not None and run.lease_owner is None, run
