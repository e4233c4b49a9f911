"""Nothing stuck: a busy or broken dependency makes a run wait, not fail; a run that can
never succeed ends after bounded attempts instead of spinning."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from approvald.runtime.approvals.decide import Actor
from approvald.runtime.engine import Engine, EngineConfig, assemble
from approvald.runtime.kernel.errors import ModelUnavailable
from approvald.runtime.kernel.outcomes import Completed, Failed, NeedsAttention, Paused, Waiting
from approvald.runtime.models.base import ModelReply, ToolSpec, Transcript
from approvald.runtime.models.scripted import ScriptedModel, reply
from approvald.runtime.policies.tools import ToolContext, tool
from approvald.runtime.runs.agent import Agent, Registry
from approvald.runtime.runs.demo import REFUND_POLICY, DemoLedger, refund_script
from approvald.runtime.runs.runner import MAX_FAILURES
from approvald.store.models import RunEvent
from sqlalchemy import insert

from tests.conftest import SIGNER
from tests.helpers import Rows


class Flaky:
    """A model provider that is down (or rate-limiting) for its first ``outages`` calls."""

    def __init__(self, script: Any, *, outages: int, retry_after: float | None) -> None:
        self.script = script
        self.outages = outages
        self.retry_after = retry_after
        self.calls = 0

    async def complete(self, *, instructions: str, messages: Transcript,
                       tools: Sequence[ToolSpec]) -> ModelReply:
        self.calls += 1
        if self.calls <= self.outages:
            raise ModelUnavailable("model provider answered HTTP 429: slow down",
                                   retry_after=self.retry_after)
        result: ModelReply = self.script(messages)
        return result


def flaky_refunds(make_engine, ledger_path, **kw: Any) -> tuple[Engine, Flaky]:  # type: ignore[no-untyped-def]
    from approvald.runtime.runs.demo import refund_agent

    agent = refund_agent(DemoLedger(str(ledger_path)), approval=REFUND_POLICY)
    model = Flaky(refund_script, **kw)
    agent.model = model
    return make_engine(agents=[agent]), model


async def test_a_rate_limited_model_parks_the_run_until_retry_after(make_engine, db, clock,
                                                                    ledger_path):
    engine, _ = flaky_refunds(make_engine, ledger_path, outages=1, retry_after=30)
    run_id = await engine.start_run("demo-refund", "Refund order A-1001",
                                    requested_by="U_DANA")
    outcome = await engine.advance(run_id)
    assert isinstance(outcome, Waiting), outcome  # not Failed
    assert outcome.until == clock.now() + timedelta(seconds=30)
    async def run_and_ready(tx):  # type: ignore[no-untyped-def]
        return await tx.runs.get(run_id), await tx.runs.runnable(now=clock.now())

    run, ready = await Rows(db).in_one_read(run_and_ready)
    assert run.status == "running" and run.lease_owner is None  # the lease is given back
    assert "429" in run.wait_reason and run_id not in [r.id for r in ready]
    assert isinstance(await engine.advance(run_id), Waiting)  # nobody touches it early
    clock.advance(31)
    [resumed] = await engine.recover()  # any process picks it up once it is due
    assert isinstance(resumed, Paused)
    run = await Rows(db).run(run_id)
    assert run.wait_until is None and run.failures == 0  # a step went through


async def test_an_outage_right_after_an_approval_waits_with_backoff(make_engine, db, clock,
                                                                    ledger_path):
    engine, model = flaky_refunds(make_engine, ledger_path, outages=0, retry_after=None)
    paused = await engine.run("demo-refund", "Refund order A-1001", requested_by="U_DANA")
    model.outages = model.calls + 3  # the provider goes down just as someone approves
    await engine.decide(paused.approval_ids[0], actor=Actor("U_ALICE", "slack"),
                        verdict="approve")
    waits = []
    for _ in range(3):
        outcome = await engine.advance(paused.run_id)
        assert isinstance(outcome, Waiting), outcome
        waits.append((outcome.until - clock.now()).total_seconds())
        clock.set(outcome.until)
    # exponential backoff with jitter: about 2 s, 4 s, 8 s
    assert 1.5 <= waits[0] <= 2.5 and 3 <= waits[1] <= 5 and 6 <= waits[2] <= 10
    done = await engine.advance(paused.run_id)
    assert isinstance(done, Completed) and "was issued" in done.result
    refunds = [e for e in map(json.loads, ledger_path.read_text().splitlines())
               if e["tool"] == "issue_refund"]
    assert len(refunds) == 1


def sleepy_agent(*, max_runs: int | None = None, per_minute: int | None = None,
                 gate: asyncio.Event | None = None) -> Agent:
    @tool(permission="read")
    async def work(ctx: ToolContext) -> str:
        """Takes a while."""
        if gate is not None:
            await gate.wait()
        return "done"

    def script(messages: Transcript) -> ModelReply:
        if len(messages) == 1:
            return reply(None, ("work", {}))
        return reply("finished", turn=1)

    return Agent(name="batch", instructions="", model=ScriptedModel(script), tools=[work],
                 max_concurrent_runs=max_runs, model_calls_per_minute=per_minute)


async def test_max_concurrent_runs_queues_the_rest_across_engines(make_engine, db, clock):
    gate = asyncio.Event()
    agent = sleepy_agent(max_runs=2, gate=gate)
    engines = [make_engine(agents=[agent]) for _ in range(2)]  # two processes
    ids = [await engines[0].start_run("batch", "go", requested_by="U1") for _ in range(5)]
    tasks = [asyncio.create_task(engines[i % 2].advance(run_id)) for i, run_id in
             enumerate(ids)]
    done: set[asyncio.Task[Any]] = set()
    running = set(tasks)
    while len(done) < 3:  # three are turned away at once; two hold the slots
        more, running = await asyncio.wait(running, timeout=5,
                                           return_when=asyncio.FIRST_COMPLETED)
        assert more, "nothing was queued"
        done |= more
    queued = [t.result() for t in done]
    assert all(isinstance(o, Waiting) and o.reason.startswith("queued") for o in queued)
    gate.set()
    assert all(isinstance(o, Completed) for o in await asyncio.gather(*running))
    clock.advance(3)
    finished = await engines[1].recover()
    assert len(finished) == 3 and all(isinstance(o, Completed) for o in finished)


async def test_model_calls_per_minute_are_shared_through_the_database(make_engine, db, clock):
    agent = sleepy_agent(per_minute=3)
    engine = make_engine(agents=[agent])
    other = make_engine(agents=[agent])
    ids = [await engine.start_run("batch", "go", requested_by="U1") for _ in range(2)]
    first = await engine.advance(ids[0])  # two model calls
    assert isinstance(first, Completed)
    second = await other.advance(ids[1])  # one call left this minute, then it waits
    assert isinstance(second, Waiting) and "model calls per minute" in second.reason
    assert timedelta(seconds=15) <= second.until - clock.now() <= timedelta(seconds=21)
    clock.set(second.until)
    assert isinstance(await other.advance(ids[1]), Completed)


async def test_a_run_whose_agent_is_gone_backs_off_then_needs_attention(make_engine, db,
                                                                        clock):
    engine = make_engine()
    run_id = await engine.start_run("demo-steps", "3", requested_by="U1")
    redeployed = assemble(db, Registry([]), clock=clock, config=EngineConfig(), signer=SIGNER)
    outcomes = []
    for _ in range(MAX_FAILURES):
        outcome = await redeployed.advance(run_id)
        outcomes.append(outcome)
        if isinstance(outcome, Waiting):
            assert "unknown agent 'demo-steps'" in outcome.reason
            clock.set(outcome.until)
    assert all(isinstance(o, Waiting) for o in outcomes[:-1])
    last = outcomes[-1]
    assert isinstance(last, NeedsAttention) and "gave up after 5 attempts" in last.reason
    async def run_and_entries(tx):  # type: ignore[no-untyped-def]
        return await tx.runs.get(run_id), await tx.audit.query(run_id=run_id)

    run, entries = await Rows(db).in_one_read(run_and_entries)
    [entry] = [e for e in entries if e.action == "needs_attention"]
    assert run.status == "needs_attention" and "unknown agent" in run.error
    assert json.loads(entry.details)["attempts"] == 5
    # nothing picks it up any more: no hot loop
    assert await redeployed.recover() == []


async def test_an_undecodable_event_ends_a_run_instead_of_spinning(make_engine, db, clock):
    engine = make_engine()
    run_id = await engine.start_run("demo-steps", "3", requested_by="U1")

    async def torn(tx):  # type: ignore[no-untyped-def]
        await tx.conn.execute(insert(RunEvent), [
            {"run_id": run_id, "seq": 1, "step": 1, "v": 2, "body": "{not json"}])
        await tx.runs.update(run_id, next_seq=2)

    await Rows(db).in_one_write(torn)
    for _ in range(MAX_FAILURES - 1):
        waiting = await engine.advance(run_id)
        assert isinstance(waiting, Waiting)
        clock.set(waiting.until)
    ended = await engine.advance(run_id)
    assert isinstance(ended, Failed) and "JSONDecodeError" in ended.error
