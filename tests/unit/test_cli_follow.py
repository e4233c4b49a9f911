"""`approvald run` tells the truth about a run another process picked up first."""

from __future__ import annotations

import asyncio

from approvald.bot.cli.common import ELSEWHERE, describe, exit_code, follow
from approvald.runtime.kernel.outcomes import Busy, Completed

from tests.helpers import Rows
from tests.unit.test_waiting import sleepy_agent


async def test_run_waits_for_the_process_that_advances_the_run(make_engine, db):
    gate = asyncio.Event()
    agent = sleepy_agent(gate=gate)
    serve = make_engine(agents=[agent], owner="otherhost:4242:aa")  # picked it up first
    cli = make_engine(agents=[agent])
    run_id = await cli.start_run("batch", "go", requested_by="U1")
    elsewhere = asyncio.create_task(serve.advance(run_id))
    await _held(db, run_id)
    busy = await cli.advance(run_id)
    assert isinstance(busy, Busy)
    assert "being advanced by another process (otherhost:4242:aa" in describe(busy)
    assert exit_code(busy) == ELSEWHERE  # never "running" with exit 0
    following = asyncio.create_task(follow(cli, busy, patience=10))
    await asyncio.sleep(0.3)
    gate.set()
    outcome = await following
    assert isinstance(outcome, Completed) and outcome.result == "finished"
    assert exit_code(outcome) == 0
    await elsewhere
    gone = await follow(cli, await cli.advance(run_id), patience=0)
    assert isinstance(gone, Completed)


async def test_out_of_patience_it_says_so(make_engine, db):
    gate = asyncio.Event()
    agent = sleepy_agent(gate=gate)
    serve = make_engine(agents=[agent], owner="otherhost:4242:aa")
    cli = make_engine(agents=[agent])
    run_id = await cli.start_run("batch", "go", requested_by="U1")
    elsewhere = asyncio.create_task(serve.advance(run_id))
    await _held(db, run_id)
    outcome = await follow(cli, Busy(run_id, "running", holder="otherhost"), patience=0.3)
    assert isinstance(outcome, Busy) and exit_code(outcome) == ELSEWHERE
    gate.set()
    await elsewhere


async def _held(db, run_id: str) -> None:  # type: ignore[no-untyped-def]
    """Until the other process holds the run's lease."""
    for _ in range(500):
        run = await Rows(db).run(run_id)
        if run.lease_owner and run.lease_owner.startswith("otherhost"):
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the other process never took the run")
