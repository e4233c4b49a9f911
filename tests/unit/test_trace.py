"""A run's trace: model steps, tool calls, approvals and transitions, in order, with times."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from approvald.bot import trace_view
from approvald.runtime.approvals.decide import Actor
from approvald.runtime.kernel.clock import ManualClock
from approvald.runtime.kernel.outcomes import Completed, Paused
from approvald.runtime.models.base import ModelReply, Usage
from approvald.runtime.models.openai import OpenAIChatModel
from approvald.runtime.models.scripted import ScriptedModel, reply
from approvald.runtime.policies.tools import tool
from approvald.runtime.record.state import AssistantMessage, ToolCall, UserMessage
from approvald.runtime.runs.agent import Agent
from approvald.runtime.runs.demo import DemoLedger, refund_agent
from approvald.runtime.trace import Trace, build_trace, load_trace
from approvald.store.db import Database
from approvald.store.records import RunRecord

from tests.helpers import Rows

ALICE = Actor("U_ALICE", "slack")
TASK = "Refund order A-1001, customer was double charged"


async def refund_run(make_engine, clock: ManualClock, *, verdict: str,
                     reason: str | None = None, task: str = TASK) -> tuple[str, str]:
    engine = make_engine()
    paused = await engine.run("demo-refund", task, requested_by="U_DANA")
    assert isinstance(paused, Paused)
    [aid] = paused.approval_ids
    clock.advance(timedelta(minutes=10))
    await engine.decide(aid, actor=ALICE, verdict=verdict, reason=reason)
    clock.advance(timedelta(seconds=3))
    done = await engine.advance(paused.run_id)
    assert isinstance(done, Completed), done
    return paused.run_id, aid


def kinds(trace: Trace) -> list[tuple[str, str]]:
    return [(e.kind, e.tool or e.action or str(e.step)) for e in trace.entries]


async def test_an_approved_refund_reads_as_a_timeline(make_engine, db: Database,
                                                      clock: ManualClock) -> None:
    start = clock.now()
    run_id, aid = await refund_run(make_engine, clock, verdict="approve")
    trace = await load_trace(db, run_id, now=clock.now())

    # the test clock stands still while a step runs: entries of one instant keep the
    # transcript's order, then the audit log's
    assert kinds(trace) == [
        ("transition", "started"),
        ("model_step", "1"), ("tool_call", "lookup_order"), ("model_step", "2"),
        ("transition", "executed"), ("transition", "requested"), ("approval", "issue_refund"),
        ("transition", "approved"),
        ("tool_call", "issue_refund"), ("model_step", "3"), ("tool_call", "send_customer_email"),
        ("model_step", "4"), ("transition", "executed"), ("transition", "executed"),
        ("transition", "completed"),
    ]
    steps = [e for e in trace.entries if e.kind == "model_step"]
    agent = refund_agent(DemoLedger(None))
    assert [e.step for e in steps] == list(range(1, len(steps) + 1))
    assert all(e.model == "ScriptedModel" and e.instructions_version
               == agent.instructions_version and e.latency_ms is not None
               and e.latency_ms >= 0 and e.end is not None and not e.estimated for e in steps)
    assert steps[0].calls == ["lookup_order"] and steps[-1].calls == []

    calls = {e.tool: e for e in trace.entries if e.kind == "tool_call"}
    assert set(calls) == {"lookup_order", "issue_refund", "send_customer_email"}
    refund = calls["issue_refund"]
    assert refund.arguments == {"order_id": "A-1001", "amount_cents": 4200,
                                "reason": "duplicate charge"}
    assert refund.status == "succeeded" and refund.attempts == 1
    assert refund.idempotency_key == f"{run_id}:{refund.call_id}"
    assert refund.result_summary is not None and '"status":"issued"' in refund.result_summary
    assert refund.latency_ms is not None and refund.error_class is None
    assert refund.start == start + timedelta(minutes=10, seconds=3)  # ran after the decision

    [ask] = [e for e in trace.entries if e.kind == "approval"]
    assert ask.approval_id == aid and ask.status == "approved"
    assert ask.decided_by == "U_ALICE" and ask.decided_via == "slack"
    assert ask.start == start and ask.decided_at == start + timedelta(minutes=10)
    assert ask.wait_ms == 600_000.0 and ask.pending is False
    assert ask.digest and ask.effective_digest == ask.digest
    assert [(v.actor, v.verdict, v.counts) for v in ask.votes or []] == [
        ("U_ALICE", "approve", True)]

    actions = [e.action for e in trace.entries if e.kind == "transition"]
    assert actions == ["started", "executed", "requested", "approved", "executed", "executed",
                       "completed"]
    # ordered by time: the request is waited on before the refund runs
    order = [e.kind + ":" + (e.tool or e.action or "") for e in trace.entries]
    assert order.index("approval:issue_refund") < order.index("tool_call:issue_refund")
    assert [e.start for e in trace.entries] == sorted(e.start for e in trace.entries)
    assert trace.totals.approvals == 1 and trace.totals.human_wait_ms == 600_000.0
    assert trace.totals.tool_calls == 3 and trace.totals.model_steps == len(steps)
    assert trace.totals.input_tokens is None and trace.totals.cost_usd is None

    doc = json.loads(json.dumps(trace.to_document()))
    assert doc["run_id"] == run_id and doc["status"] == "completed"
    assert "cost_usd" not in doc["entries"][1]  # unknown values are left out, not null


async def test_a_denied_refund_shows_who_denied_why_and_that_nothing_ran(
        make_engine, db: Database, clock: ManualClock) -> None:
    run_id, _ = await refund_run(make_engine, clock, verdict="deny",
                                 reason="store credit already given")
    trace = await load_trace(db, run_id, now=clock.now())
    [refund] = [e for e in trace.entries if e.tool == "issue_refund" and e.kind == "tool_call"]
    assert refund.status == "denied" and refund.latency_ms is None
    assert refund.attempts is None and refund.error_class is None
    assert refund.result_summary is not None and "store credit already given" in \
        refund.result_summary
    [ask] = [e for e in trace.entries if e.kind == "approval"]
    assert ask.status == "denied" and ask.decided_by == "U_ALICE"
    assert ask.reason == "store credit already given" and ask.wait_ms == 600_000.0
    assert "denied" in [e.action for e in trace.entries if e.kind == "transition"]
    assert "issue_refund" not in [e.tool for e in trace.entries
                                  if e.kind == "tool_call" and e.status == "succeeded"]
    out = trace_view.text(trace)
    assert "issue_refund: denied by U_ALICE  after 10m 0s" in out
    assert "reason store credit already given" in out


async def test_a_pending_request_waits_until_now(make_engine, db: Database,
                                                 clock: ManualClock) -> None:
    engine = make_engine()
    paused = await engine.run("demo-refund", TASK, requested_by="U_DANA")
    assert isinstance(paused, Paused)
    clock.advance(timedelta(minutes=5))
    trace = await load_trace(db, paused.run_id, now=clock.now())
    [ask] = [e for e in trace.entries if e.kind == "approval"]
    assert ask.pending is True and ask.wait_ms == 300_000.0 and ask.decided_by is None
    [refund] = [e for e in trace.entries if e.tool == "issue_refund" and e.kind == "tool_call"]
    assert refund.status == "awaiting_approval"


async def test_token_counts_and_cost_are_recorded_where_the_model_reports_them(
        make_engine, db: Database, clock: ManualClock) -> None:
    @tool(permission="read")
    async def look(q: str) -> dict[str, Any]:
        """Look something up."""
        return {"q": q}

    first = reply(None, ("look", {"q": "x"}))
    model = ScriptedModel.sequence([
        ModelReply(content=None, tool_calls=first.tool_calls,
                   usage=Usage(input_tokens=120, output_tokens=15, cost_usd=0.0012)),
        ModelReply(content="done", usage=Usage(input_tokens=150, output_tokens=4)),
    ])
    agent = Agent(name="metered", instructions="Be brief.", model=model, tools=[look])
    engine = make_engine(agents=[agent])
    done = await engine.run("metered", "look x", requested_by="U_DANA")
    assert isinstance(done, Completed)
    trace = await load_trace(db, done.run_id, now=clock.now())
    steps = [e for e in trace.entries if e.kind == "model_step"]
    assert [(e.input_tokens, e.output_tokens, e.cost_usd) for e in steps] == [
        (120, 15, 0.0012), (150, 4, None)]
    assert steps[0].instructions_version == agent.instructions_version
    assert (trace.totals.input_tokens, trace.totals.output_tokens) == (270, 19)
    assert trace.totals.cost_usd == 0.0012
    assert "tokens 120 in / 15 out, $0.0012" in trace_view.text(trace)
    # the stored event leaves out what was not reported
    events = await Rows(db).events(done.run_id)
    last = json.loads(events[-1].body)
    assert last["meta"]["input_tokens"] == 150 and "cost_usd" not in last["meta"]


@pytest.mark.parametrize(("usage", "price", "want"), [
    ({"prompt_tokens": 1000, "completion_tokens": 200}, None, (1000, 200, None)),
    ({"prompt_tokens": 1000, "completion_tokens": 200}, (2.5, 10.0), (1000, 200, 0.0045)),
    ({"prompt_tokens": 10, "completion_tokens": 2, "cost": 0.5}, (2.5, 10.0), (10, 2, 0.5)),
    ({"prompt_tokens": "many"}, (2.5, 10.0), None),
    (None, (2.5, 10.0), None),
])
def test_the_openai_adapter_reads_usage_and_never_invents_a_price(
        usage: Any, price: Any, want: Any) -> None:
    model = OpenAIChatModel("gpt-test", api_key="k", price_per_million=price)
    data: dict[str, Any] = {"choices": [{"message": {"role": "assistant", "content": "hi"}}]}
    if usage is not None:
        data["usage"] = usage
    got = model._parse(data).usage
    if want is None:
        assert got is None
    else:
        assert got is not None
        assert (got.input_tokens, got.output_tokens) == want[:2]
        assert got.cost_usd == pytest.approx(want[2]) if want[2] is not None \
            else got.cost_usd is None


def _run(run_id: str = "r" * 32, **over: Any) -> RunRecord:
    now = ManualClock().now()
    base: dict[str, Any] = dict(
        id=run_id, agent="demo-refund", status="completed", step=1, next_seq=3, task="t",
        requested_by="U_DANA", instructions_version="v1", result="ok", error=None,
        inflight=None, cancel_requested=False, cancel_requested_by=None, cancel_reason=None,
        lease_owner=None, lease_expires_at=None, wait_until=None, wait_reason=None,
        failures=0, created_at=now, updated_at=now + timedelta(seconds=5))
    base.update(over)
    return RunRecord(**base)


def test_replies_recorded_before_model_steps_were_have_estimated_times() -> None:
    run = _run()
    messages = [UserMessage(content="t"),
                AssistantMessage(content=None, tool_calls=[
                    ToolCall(id="c1", name="lookup_order", arguments={"order_id": "A-1"})]),
                AssistantMessage(content="ok")]
    trace = build_trace(run, messages, {}, [], {}, [], now=run.updated_at)
    steps = [e for e in trace.entries if e.kind == "model_step"]
    assert all(e.estimated and e.start == run.created_at and e.model is None for e in steps)
    [call] = [e for e in trace.entries if e.kind == "tool_call"]
    assert call.estimated and call.status == "pending"
    assert "~" in trace_view.text(trace)


def test_agent_text_in_the_html_page_is_inert() -> None:
    evil = '<script>alert("x")</script><img src=x onerror=alert(1)>'
    run = _run(task=f"Refund {evil}", result=evil)
    messages = [UserMessage(content=run.task),
                AssistantMessage(content=evil, tool_calls=[
                    ToolCall(id="c1", name="lookup_order", arguments={"order_id": evil})]),
                AssistantMessage(content=evil)]
    page = trace_view.html(build_trace(run, messages, {}, [], {}, [], now=run.updated_at))
    assert "<script" not in page and "<img" not in page  # no element of theirs, only text
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page
    assert "http://" not in page and "https://" not in page  # self-contained
    assert page.count('class="lane"') == 3


async def test_a_step_names_its_instructions_only_where_a_redeploy_changed_them(
        make_engine, db: Database, clock: ManualClock) -> None:
    def agent(instructions: str) -> Agent:
        return Agent(name="writer", instructions=instructions, tools=[],
                     model=ScriptedModel.sequence([reply("first", turn=0),
                                                   reply("second", turn=1)]))

    old, new = agent("Be brief."), agent("Be brief and kind.")
    assert old.instructions_version != new.instructions_version
    run_id = await make_engine(agents=[old]).start_run("writer", "hi", requested_by="U1")
    assert isinstance(await make_engine(agents=[new]).advance(run_id), Completed)
    [event] = [e for e in await Rows(db).events(run_id) if '"assistant"' in e.body]
    # the run row keeps the version it started with; the step says it ran on another
    assert json.loads(event.body)["meta"]["instructions_version"] == new.instructions_version
    [step] = [e for e in (await load_trace(db, run_id, now=clock.now())).entries
              if e.kind == "model_step"]
    assert step.instructions_version == new.instructions_version
