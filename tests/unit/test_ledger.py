"""The execution ledger: a recorded result is reused; an unknown outcome is never blindly re-run."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from approvald.runtime.approvals.decide import Actor
from approvald.runtime.kernel import failpoints
from approvald.runtime.kernel.errors import DecisionRefused
from approvald.runtime.kernel.outcomes import Cancelled, Completed, NeedsAttention
from approvald.runtime.models.scripted import ScriptedModel, reply
from approvald.runtime.policies.tools import Reconciled, ToolContext, tool
from approvald.runtime.runs.agent import Agent
from approvald.store.models import ToolExecution
from sqlalchemy import select

from tests.helpers import Crash, Rows
from tests.helpers import crash as _crash


def charge_agent(calls: list[dict[str, Any]], *, idempotent: bool = False,
                 reconcile: Any = None) -> Agent:
    @tool(permission="execute", policy="auto", idempotent=idempotent, reconcile=reconcile)
    async def charge(ctx: ToolContext, cents: int) -> dict[str, Any]:
        """Charges a card."""
        calls.append({"key": ctx.idempotency_key, "attempt": ctx.attempt})
        return {"charged": cents}

    return Agent(name="charger", instructions="", tools=[charge], model=ScriptedModel.sequence(
        [reply(None, ("charge", {"cents": 500})), reply("charged", turn=1)]))


async def crash_then_resume(engine, point: str = "before_result") -> str:
    failpoints.arm(point, _crash)
    run_id = await engine.start_run("charger", "charge", requested_by="U_DANA")
    with pytest.raises(Crash):
        await engine.advance(run_id)
    failpoints.arm("")
    return run_id


async def test_recorded_result_is_reused_not_rerun(make_engine):
    calls: list[dict[str, Any]] = []
    engine = make_engine(agents=[charge_agent(calls)])
    run_id = await crash_then_resume(engine, "after_result")
    outcome = await engine.advance(run_id)
    assert isinstance(outcome, Completed) and len(calls) == 1


async def test_unknown_outcome_asks_a_human_and_retry_reruns_under_the_same_key(make_engine, db):
    calls: list[dict[str, Any]] = []
    engine = make_engine(agents=[charge_agent(calls)])
    run_id = await crash_then_resume(engine)
    outcome = await engine.advance(run_id)
    assert isinstance(outcome, NeedsAttention) and outcome.call_id == "call_0_0"
    assert len(calls) == 1
    again = await engine.advance(run_id)
    assert again.status == "needs_attention" and len(calls) == 1
    async def question_and_status(tx):  # type: ignore[no-untyped-def]
        return (await tx.approvals.for_run(run_id),
                (await tx.conn.execute(select(ToolExecution.status))).scalar())

    approvals, status = await Rows(db).in_one_read(question_and_status)
    [question] = [a for a in approvals if a.status == "pending"]
    assert question.kind == "outcome_unknown" and status == "unknown"
    with pytest.raises(DecisionRefused) as err:
        await engine.decide(question.id, actor=Actor("U_OPS", "slack"), verdict="approve")
    assert err.value.reason == "wrong_kind"
    decision = await engine.decide(question.id, actor=Actor("U_OPS", "slack"), verdict="retry")
    assert decision.run_ready
    done = await engine.advance(run_id)
    assert isinstance(done, Completed)
    assert [c["attempt"] for c in calls] == [1, 2]
    assert calls[0]["key"] == calls[1]["key"] == f"{run_id}:call_0_0"


async def test_mark_done_records_the_outcome_without_running_it(make_engine):
    calls: list[dict[str, Any]] = []
    engine = make_engine(agents=[charge_agent(calls)])
    run_id = await crash_then_resume(engine)
    outcome = await engine.advance(run_id)
    qid = await _question(engine, run_id)
    await engine.decide(qid, actor=Actor("U_OPS", "slack"), verdict="mark_done",
                        reason="the card statement shows it")
    done = await engine.advance(outcome.run_id)
    assert isinstance(done, Completed) and len(calls) == 1
    state = await engine.state(run_id)
    obs = state.messages[2].content  # type: ignore[union-attr]
    assert obs == {"status": "done", "confirmed_by": "U_OPS",
                   "note": "the card statement shows it"}


async def test_abort_cancels_the_run(make_engine):
    calls: list[dict[str, Any]] = []
    engine = make_engine(agents=[charge_agent(calls)])
    run_id = await crash_then_resume(engine)
    await engine.advance(run_id)
    qid = await _question(engine, run_id)
    with pytest.raises(DecisionRefused) as err:
        await engine.decide(qid, actor=Actor("U_OPS", "slack"), verdict="abort")
    assert err.value.reason == "reason_required"
    await engine.decide(qid, actor=Actor("U_OPS", "slack"), verdict="abort", reason="unsure")
    assert isinstance(await engine.advance(run_id), Cancelled)
    assert len(calls) == 1


async def test_idempotent_tools_are_rerun_under_the_same_key(make_engine):
    calls: list[dict[str, Any]] = []
    engine = make_engine(agents=[charge_agent(calls, idempotent=True)])
    run_id = await crash_then_resume(engine)
    assert isinstance(await engine.advance(run_id), Completed)
    assert len(calls) == 2 and calls[0]["key"] == calls[1]["key"]


@pytest.mark.parametrize("verdict,expected_calls,status", [
    (Reconciled(happened=True, result={"charged": 500, "from": "provider"}), 1, "completed"),
    (Reconciled(happened=False), 2, "completed"),
    (None, 1, "needs_attention"),
])
async def test_reconcile_hook_decides(make_engine, verdict, expected_calls, status):
    calls: list[dict[str, Any]] = []

    async def reconcile(ctx: ToolContext, args: dict[str, Any]) -> Reconciled | None:
        assert ctx.idempotency_key.endswith(":call_0_0") and args == {"cents": 500}
        return verdict

    engine = make_engine(agents=[charge_agent(calls, reconcile=reconcile)])
    run_id = await crash_then_resume(engine)
    outcome = await engine.advance(run_id)
    assert outcome.status == status and len(calls) == expected_calls
    if verdict is not None and verdict.happened:
        state = await engine.state(run_id)
        assert state.messages[2].content == {"charged": 500, "from": "provider"}  # type: ignore[union-attr]


async def test_a_crashed_step_replays_the_journaled_reply_not_a_new_model_call(make_engine):
    """A real model would answer differently the second time; the journal prevents that."""
    calls: list[dict[str, Any]] = []
    agent = charge_agent(calls, idempotent=True)
    engine = make_engine(agents=[agent])
    run_id = await crash_then_resume(engine, "after_result")
    model = agent.model
    before = model.calls  # type: ignore[attr-defined]
    await engine.advance(run_id)
    assert model.calls == before + 1  # only the final turn; step 1 came from the journal
    assert len(calls) == 1


async def _question(engine, run_id: str) -> str:
    [q] = [a for a in await Rows.of(engine).approvals(run_id) if a.status == "pending"]
    return q.id


# -- results that ride in the step's checkpoint (issue 14: a cheaper step) ---------------

async def _executions(db, run_id: str) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    return await Rows(db).executions(run_id)  # type: ignore[no-any-return]


async def test_an_idempotent_call_has_no_intent_row_and_reruns_after_a_crash(make_engine, db):
    calls: list[dict[str, Any]] = []
    engine = make_engine(agents=[charge_agent(calls, idempotent=True)])
    run_id = await crash_then_resume(engine, "before_checkpoint")
    assert len(calls) == 1 and await _executions(db, run_id) == {}  # nothing was committed
    assert isinstance(await engine.advance(run_id), Completed)
    assert len(calls) == 2
    [rec] = (await _executions(db, run_id)).values()
    assert rec.status == "succeeded" and rec.result_value() == {"charged": 500}


async def test_the_last_calls_result_commits_with_the_checkpoint(make_engine, db):
    calls: list[dict[str, Any]] = []
    engine = make_engine(agents=[charge_agent(calls)])
    run_id = await crash_then_resume(engine, "before_checkpoint")
    [rec] = (await _executions(db, run_id)).values()
    assert rec.status == "started" and rec.result is None  # the intent alone is durable
    # ... and is settled like any unknown outcome: a person is asked, nothing re-runs
    outcome = await engine.advance(run_id)
    assert isinstance(outcome, NeedsAttention) and len(calls) == 1


async def test_a_call_that_others_follow_commits_its_result_before_the_next_starts(
        make_engine, db):
    calls: list[dict[str, Any]] = []

    @tool(permission="execute", policy="auto")
    async def charge(ctx: ToolContext, cents: int) -> dict[str, Any]:
        """Charges a card."""
        calls.append({"key": ctx.idempotency_key, "cents": cents})
        return {"charged": cents}

    agent = Agent(name="charger", instructions="", tools=[charge], model=ScriptedModel.sequence(
        [reply(None, ("charge", {"cents": 1}), ("charge", {"cents": 2})),
         reply("charged", turn=1)]))
    engine = make_engine(agents=[agent])
    run_id = await crash_then_resume(engine, "before_checkpoint")
    recs = await _executions(db, run_id)
    assert [(r.status, r.result_value() if r.result else None)
            for r in sorted(recs.values(), key=lambda r: r.call_id)] == [
        ("succeeded", {"charged": 1}), ("started", None)]


async def test_a_lease_lost_at_the_checkpoint_still_records_what_ran(make_engine, db, clock):
    calls: list[int] = []
    box: dict[str, Any] = {}

    @tool(permission="execute", policy="auto")
    async def charge(ctx: ToolContext, cents: int) -> dict[str, Any]:
        """Charges a card, while another worker takes the run over."""
        calls.append(cents)
        await Rows.of(box["engine"]).update_run(
            ctx.run_id, lease_owner="elsewhere/1",
            lease_expires_at=clock.now() + timedelta(hours=1))
        return {"charged": cents}

    agent = Agent(name="charger", instructions="", tools=[charge], model=ScriptedModel.sequence(
        [reply(None, ("charge", {"cents": 500})), reply("charged", turn=1)]))
    engine = box["engine"] = make_engine(agents=[agent])
    run_id = await engine.start_run("charger", "charge", requested_by="U_DANA")
    outcome = await engine.advance(run_id)
    assert outcome.status == "running" and calls == [500]  # it stopped: not its run now
    [rec] = (await _executions(db, run_id)).values()
    assert rec.status == "succeeded" and rec.result_value() == {"charged": 500}


async def told_of(make_engine, result: Any) -> tuple[str, list[Any]]:
    """Run an agent whose one auto tool returns ``result`` to completion; its run id and
    what the model read of the call."""
    from approvald.runtime.record.state import ToolMessage

    told: list[Any] = []

    @tool(permission="execute", policy="auto")
    async def give(ctx: ToolContext) -> Any:
        """Returns the value under test."""
        return result

    def script(messages: Any) -> Any:
        seen = [m.content for m in messages if isinstance(m, ToolMessage)]
        if not seen:
            return reply(None, ("give", {}))
        told.extend(seen)
        return reply("ok", turn=1)

    engine = make_engine(agents=[Agent(name="giver", instructions="", tools=[give],
                                       model=ScriptedModel(script))])
    run_id = await engine.start_run("giver", "give", requested_by="U_DANA")
    assert isinstance(await engine.advance(run_id), Completed)
    return run_id, told


@pytest.mark.parametrize("result", ["deployed web", "", "caf\u00e9 \u2603", 7, 2.5, -0.0, True,
                                    None, ("a", 1), {"n": (1, 2)}, [{"x": None}]])
async def test_the_model_reads_a_result_as_stored(make_engine, result: Any) -> None:
    """What the model reads of a fresh result is its stored JSON text read back: a string,
    a number, a bool or None as itself without decoding it again (issue 50), a tuple as
    the list it is stored as."""
    import json

    _, seen = await told_of(make_engine, result)
    stored = json.loads(json.dumps(result, ensure_ascii=False))
    assert seen == [stored] and type(seen[0]) is type(stored)


@pytest.mark.parametrize("result", [{"s": "\ud800"}, object()], ids=["lone-surrogate", "object"])
async def test_a_result_that_cannot_be_stored_reaches_the_model_as_a_failed_call(
        make_engine, db, result: Any) -> None:
    """A result JSON cannot hold as UTF-8 text (a lone surrogate: json.dumps takes it, the
    database cannot store it) is the call's recorded failure, ``UnserializableResult``,
    like any result that is not JSON: the run goes on to the model's next turn, not into a
    retry loop."""
    run_id, told = await told_of(make_engine, result)
    assert len(told) == 1 and "UnserializableResult" in str(told[0])
    rows = (await Rows(db).executions(run_id)).values()
    assert [(r.status, r.error_class) for r in rows] == [("failed", "UnserializableResult")]
