"""The agent loop: checkpoints at step boundaries, leases, cancellation, tool outcomes."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from approvald.runtime.approvals.decide import Actor
from approvald.runtime.kernel.outcomes import Busy, Cancelled, Completed, Failed
from approvald.runtime.models.scripted import ScriptedModel, reply
from approvald.runtime.policies.policy import PolicyFile, ToolOverride
from approvald.runtime.policies.tools import ToolContext, tool
from approvald.runtime.record.state import AssistantMessage, ToolMessage
from approvald.runtime.runs.agent import Agent
from approvald.store.db import Database
from approvald.store.models import ToolExecution
from sqlalchemy import func, select

from tests.conftest import ledger_lines
from tests.helpers import Rows


async def test_demo_steps_completes_with_one_checkpoint_per_step(make_engine, db, ledger_path):
    engine = make_engine()
    outcome = await engine.run("demo-steps", "5", requested_by="U1")
    assert isinstance(outcome, Completed)
    assert outcome.result == "Ticked 5 times."
    state = await engine.state(outcome.run_id)
    assert state.status == "completed" and state.step == 6
    ticks = [m for m in state.messages if isinstance(m, ToolMessage)]
    assert [t.content["i"] for t in ticks] == [0, 1, 2, 3, 4]
    assert [e["args"]["i"] for e in ledger_lines(ledger_path)] == [0, 1, 2, 3, 4]
    events = await Rows(db).events(outcome.run_id)
    # the task, then (assistant, tool result) per tick step, then the final answer
    assert [e.step for e in events] == [0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6]
    assert [e.seq for e in events] == list(range(12))


async def test_bytes_per_step_do_not_grow_with_the_transcript(make_engine, db, ledger_path):
    """Each step appends only its new events; tool results live once, in the ledger."""
    from approvald.runtime.runs.demo import DemoLedger, steps_agent

    engine = make_engine(agents=[steps_agent(DemoLedger(None), payload_bytes=1000)])
    outcome = await engine.run("demo-steps", "40", requested_by="U1")
    assert outcome.status == "completed"
    async def events_and_results(tx):  # type: ignore[no-untyped-def]
        return await tx.events.load(outcome.run_id), (await tx.conn.execute(
            select(func.length(ToolExecution.result)).where(
                ToolExecution.run_id == outcome.run_id))).scalars().all()

    events, results = await Rows(db).in_one_read(events_and_results)
    per_step: dict[int, int] = {}
    for e in events:
        per_step[e.step] = per_step.get(e.step, 0) + len(e.body)
    early, late = per_step[2], per_step[39]
    assert late <= early + 8  # call ids grow by a digit, nothing else
    assert all(len(e.body) < 300 for e in events)  # no event carries the 1 KB payload
    assert all(1000 < n < 1100 for n in results)  # it is stored once, in the ledger


async def test_two_workers_race_for_one_run_one_advances_other_backs_off(make_engine, db):
    gate = asyncio.Event()
    entered = asyncio.Event()

    @tool
    async def slow(ctx: ToolContext) -> str:
        """Blocks until the test lets it go."""
        entered.set()
        await gate.wait()
        return "done"

    agent = Agent(name="slowpoke", instructions="", tools=[slow], model=ScriptedModel.sequence(
        [reply(None, ("slow", {})), reply("finished", turn=1)]))
    a = make_engine(agents=[agent], owner="host-a:1:aa")
    b = make_engine(agents=[agent], owner="host-b:2:bb")
    run_id = await a.start_run("slowpoke", "go", requested_by="U1")
    first = asyncio.create_task(a.advance(run_id))
    await entered.wait()
    second = await b.advance(run_id)
    assert isinstance(second, Busy) and (second.holder or "").startswith("host-a:1:aa/")
    gate.set()
    done = await first
    assert isinstance(done, Completed) and done.result == "finished"
    n = await Rows(db).count("tool_executions")
    assert n == 1


async def test_one_process_two_tasks_one_run(make_engine, db):
    """A worker and a command in the same process must not both advance a run."""
    engine = make_engine()
    run_id = await engine.start_run("demo-steps", "3", requested_by="U1")
    first, second = await asyncio.gather(engine.advance(run_id), engine.advance(run_id))
    assert sorted(type(o).__name__ for o in (first, second)) in (
        ["Busy", "Completed"], ["Completed", "Completed"])
    state = await engine.state(run_id)
    assert state.status == "completed" and state.step == 4


async def test_expired_lease_lets_another_worker_take_over(make_engine, db, clock):
    a = make_engine(owner="host-a:1:aa", lease_ttl=__import__("datetime").timedelta(seconds=30))
    b = make_engine(owner="host-b:2:bb")
    run_id = await a.start_run("demo-steps", "2", requested_by="U1")
    now = clock.now()
    # worker a took the lease, then vanished
    assert await Rows(db).in_one_write(lambda tx: tx.runs.acquire_lease(
        run_id, owner="host-a:1:aa", now=now, until=now + a.lease_ttl))
    assert isinstance(await b.advance(run_id), Busy)
    clock.advance(31)
    outcome = await b.advance(run_id)
    assert isinstance(outcome, Completed)


async def test_cancellation_is_seen_at_the_next_step_boundary(make_engine, db):
    engine_holder: dict[str, Any] = {}
    calls = 0

    @tool
    async def work(ctx: ToolContext, i: int) -> int:
        """Asks for cancellation from inside the second step."""
        nonlocal calls
        calls += 1
        if i == 1:
            status = await engine_holder["e"].cancel(ctx.run_id, actor=Actor("U_OPS", "cli"))
            assert status == "cancel_requested"  # a live worker holds the lease
        return i

    agent = Agent(name="worker", instructions="", tools=[work], model=ScriptedModel(
        lambda msgs: reply(None, ("work", {"i": sum(isinstance(m, AssistantMessage)
                                                    for m in msgs)}),
                           turn=sum(isinstance(m, AssistantMessage) for m in msgs))))
    engine = make_engine(agents=[agent])
    engine_holder["e"] = engine
    outcome = await engine.run("worker", "loop forever", requested_by="U1")
    assert isinstance(outcome, Cancelled)
    assert calls == 2  # the step in progress finished; no third step started
    state = await engine.state(outcome.run_id)
    assert state.status == "cancelled"
    assert sum(isinstance(m, ToolMessage) for m in state.messages) == 2


async def test_cancel_of_an_idle_run_is_immediate_and_final(make_engine):
    engine = make_engine()
    outcome = await engine.run("demo-refund", "Refund order A-1001", requested_by="U_DANA")
    assert outcome.status == "awaiting_approval"
    assert await engine.cancel(outcome.run_id, actor=Actor("U_OPS", "cli")) == "cancelled"
    approvals = await Rows.of(engine).approvals(outcome.run_id)
    assert [a.status for a in approvals] == ["cancelled"]
    from approvald.runtime.kernel.errors import ApprovaldError

    with pytest.raises(ApprovaldError, match="already cancelled"):
        await engine.cancel(outcome.run_id, actor=Actor("U_OPS", "cli"))


def _agent_calling(name: str, *tools: Any, args: dict[str, Any] | None = None) -> Agent:
    return Agent(name="probe", instructions="", tools=list(tools), model=ScriptedModel.sequence(
        [reply(None, (name, args or {})), reply("over", turn=1)]))


async def _observation(engine: Any, agent: Agent) -> Any:
    outcome = await engine.run(agent.name, "probe", requested_by="U1")
    assert isinstance(outcome, Completed), outcome
    state = await engine.state(outcome.run_id)
    return next(m for m in state.messages if isinstance(m, ToolMessage)).content


async def test_unknown_tool_and_invalid_arguments_become_observations(make_engine):
    @tool
    async def add(a: int, b: int) -> int:
        """Adds."""
        return a + b

    engine = make_engine(agents=[_agent_calling("nope", add)])
    obs = await _observation(engine, engine.agent("probe"))
    assert obs["status"] == "error" and "nope" in obs["error"]
    engine = make_engine(agents=[_agent_calling("add", add, args={"a": "x"})])
    obs = await _observation(engine, engine.agent("probe"))
    assert obs["status"] == "invalid_arguments"
    assert {tuple(e["loc"]) for e in obs["errors"]} == {("a",), ("b",)}


async def test_tool_exception_is_an_error_observation_recorded_once(make_engine, db):
    @tool
    async def explode() -> None:
        """Fails."""
        raise RuntimeError("kaboom")

    engine = make_engine(agents=[_agent_calling("explode", explode)])
    obs = await _observation(engine, engine.agent("probe"))
    assert obs == {"status": "error", "error_class": "RuntimeError", "error": "kaboom"}
    async def statuses(tx):  # type: ignore[no-untyped-def]
        return (await tx.conn.execute(select(ToolExecution.status))).scalars().all()

    rows = await Rows(db).in_one_read(statuses)
    assert rows == ["failed"]


async def test_oversized_tool_result_is_refused_with_a_clear_error(make_engine):
    @tool
    async def huge() -> str:
        """Too big."""
        return "x" * 5000

    engine = make_engine(agents=[_agent_calling("huge", huge)], max_payload_bytes=2048)
    obs = await _observation(engine, engine.agent("probe"))
    assert obs["error_class"] == "PayloadTooLarge" and "2048-byte cap" in obs["error"]


async def test_forbidden_by_deployment_policy_never_runs(make_engine, ledger_path):
    policy = PolicyFile(tools={"lookup_order": ToolOverride(policy="forbidden")})
    engine = make_engine(policy=policy)
    outcome = await engine.run("demo-refund", "Refund order A-1001", requested_by="U1")
    state = await engine.state(outcome.run_id)
    obs = next(m for m in state.messages if isinstance(m, ToolMessage))
    assert obs.content["status"] == "forbidden"
    assert ledger_lines(ledger_path) == []


async def test_max_steps_fails_the_run_with_a_reason(make_engine):
    @tool
    async def again() -> int:
        """Loops."""
        return 1

    agent = Agent(name="looper", instructions="", tools=[again], max_steps=3,
                  model=ScriptedModel(lambda m: reply(None, ("again", {}), turn=len(m))))
    engine = make_engine(agents=[agent])
    outcome = await engine.run("looper", "go", requested_by="U1")
    assert isinstance(outcome, Failed) and "3 steps" in outcome.error


async def test_model_error_fails_the_run(make_engine):
    agent = Agent(name="mute", instructions="", tools=[], model=ScriptedModel.sequence([]))
    engine = make_engine(agents=[agent])
    outcome = await engine.run("mute", "go", requested_by="U1")
    assert isinstance(outcome, Failed) and "model error" in outcome.error


async def test_duplicate_or_missing_call_ids_from_the_model_are_made_unique(make_engine, db):
    @tool
    async def echo(x: int) -> int:
        """Echo."""
        return x

    from approvald.runtime.models.base import ModelReply
    from approvald.runtime.record.state import ToolCall

    same = ModelReply(None, (ToolCall(id="call_1", name="echo", arguments={"x": 1}),
                             ToolCall(id="call_1", name="echo", arguments={"x": 2}),
                             ToolCall(id="", name="echo", arguments={"x": 3})))
    agent = Agent(name="dup", instructions="", tools=[echo],
                  model=ScriptedModel.sequence([same, same, reply("ok", turn=2)]))
    engine = make_engine(agents=[agent])
    outcome = await engine.run("dup", "go", requested_by="U1")
    state = await engine.state(outcome.run_id)
    ids = [c.id for m in state.messages if isinstance(m, AssistantMessage)
           for c in m.tool_calls]
    assert len(ids) == len(set(ids)) == 6
    results = [m.content for m in state.messages if isinstance(m, ToolMessage)]
    assert results == [1, 2, 3, 1, 2, 3]


async def test_task_over_the_payload_cap_is_refused_and_nothing_is_written(make_engine, db):
    from approvald.runtime.kernel.errors import PayloadTooLarge

    engine = make_engine(max_payload_bytes=1024)
    with pytest.raises(PayloadTooLarge, match="the task is 2000 bytes"):
        await engine.start_run("demo-steps", "1" * 2000, requested_by="U1")
    assert await Rows(db).runs() == []


async def test_notify_after_writes_an_outbox_notice_with_the_result(make_engine, db):
    engine = make_engine()
    outcome = await engine.run("demo-refund", "Refund order A-1001", requested_by="U_DANA")
    [approval_id] = outcome.approval_ids  # type: ignore[attr-defined]
    await engine.decide(approval_id, actor=Actor("U_ALICE", "slack"), verdict="approve")
    done = await engine.advance(outcome.run_id)
    assert done.status == "completed"
    notices = await Rows(db).outbox("tool.notice")
    assert len(notices) == 1
    assert json.loads(notices[0].payload)["run_id"] == outcome.run_id


async def test_events_table_rejects_a_forked_history(db: Database, make_engine):
    """The (run_id, seq) key makes a second writer's append fail instead of forking."""
    engine = make_engine()
    run_id = await engine.start_run("demo-steps", "1", requested_by="U1")
    from sqlalchemy.exc import IntegrityError

    with pytest.raises(IntegrityError):
        await Rows(db).in_one_write(lambda tx: tx.events.append(
            run_id, 0, 0, [(2, '{"role":"user","content":"fork"}')]))
    n = await Rows(db).count("run_events")
    assert n == 1


# SQLite serves one host: one clock
@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_postgres_leases_follow_the_database_clock_not_a_replicas(db_url, clock):
    """A replica whose clock runs ten minutes ahead cannot take a live lease on PostgreSQL."""
    from datetime import UTC, datetime, timedelta

    from approvald.runtime.engine import EngineConfig, assemble
    from approvald.runtime.kernel.clock import ManualClock
    from approvald.runtime.runs.agent import Registry

    db = Database(db_url)  # the production default: server_time on PostgreSQL
    assert db.server_time
    try:
        ttl = timedelta(seconds=1)
        honest = ManualClock(datetime.now(UTC))
        ahead = ManualClock(datetime.now(UTC) + timedelta(minutes=10))
        steps = steps_agent_for_test()
        a = assemble(db, Registry([steps]), clock=honest, config=EngineConfig(lease_ttl=ttl),
                   owner="host-a:1:aa")
        b = assemble(db, Registry([steps]), clock=ahead, config=EngineConfig(lease_ttl=ttl),
                   owner="host-b:2:bb")
        run_id = await a.start_run("demo-steps", "2", requested_by="U1")
        now = honest.now()
        # replica a holds the lease, by the database's clock
        assert await Rows(db).in_one_write(lambda tx: tx.runs.acquire_lease(
            run_id, owner="host-a:1:aa", now=now, until=now + ttl))
        assert isinstance(await b.advance(run_id), Busy)  # b's fast clock does not matter
        assert [r.id for r in await Rows(db).in_one_read(
            lambda tx: tx.runs.runnable(now=ahead.now()))] == []
        await asyncio.sleep(1.2)  # the lease lapses by the database's clock
        assert isinstance(await b.advance(run_id), Completed)
    finally:
        await db.close()


def steps_agent_for_test():  # type: ignore[no-untyped-def]
    from approvald.runtime.runs.demo import DemoLedger, steps_agent

    return steps_agent(DemoLedger(None))
