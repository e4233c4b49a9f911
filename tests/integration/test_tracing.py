"""OpenTelemetry traces: a signed Slack click, the decision it records and the run it
resumes are one trace; with tracing off nothing is recorded anywhere."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from approvald.bot.slack import cards
from approvald.bot.tracing import from_environment
from approvald.runtime.approvals.decide import Actor
from approvald.runtime.kernel import failpoints
from approvald.runtime.kernel.errors import ConfigError
from approvald.runtime.kernel.outcomes import Completed, NeedsAttention, Paused
from approvald.runtime.record.tracing import OtelTracer, Tracer
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.helpers import Crash, Rows, crash, parts
from tests.integration.slack_harness import CHANNEL, TASK, harness, wait_for
from tests.unit.test_attempts import Provider, pay_agent

A = "approvald."


@pytest.fixture
def exported() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    """A provider of the test's own (the global one is never set) and what it exported."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


def named(spans: tuple[ReadableSpan, ...] | list[ReadableSpan], name: str,
          **attrs: object) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name
            and all(s.attributes.get(A + k) == v for k, v in attrs.items())]


def ids(span: ReadableSpan) -> tuple[int, int]:
    ctx = span.get_span_context()
    assert ctx is not None
    return ctx.trace_id, ctx.span_id


def parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


async def test_click_decision_and_resumed_tool_call_are_one_trace(sqlite_url, tmp_path,
                                                                  exported) -> None:
    provider, exporter = exported
    async with harness(sqlite_url, tmp_path, tracer=OtelTracer(provider)) as h:
        paused = await h.pause_refund()
        run_id = paused.run_id
        [aid] = paused.approval_ids
        await h.card(aid)
        a = await h.approval(aid)
        before = exporter.get_finished_spans()
        # the first advance traced its steps: lookup_order ran, issue_refund was gated
        [lookup] = named(before, "tool.call", tool="lookup_order", run_id=run_id)
        assert lookup.attributes[A + "status"] == "succeeded"
        assert lookup.attributes[A + "policy"] == "auto"
        assert not named(before, "tool.call", tool="issue_refund")
        assert named(before, "model.call", run_id=run_id, model="ScriptedModel")

        resp = await h.slack.click(cards.APPROVE, h.value(a), user_id="U_ALICE",
                                   channel_id=CHANNEL, message_ts=a.message_ts)
        assert resp.status == 200
        done = await wait_for(lambda: _completed(h, run_id), what="the run to complete")
        # the last step's span ends just after its checkpoint: wait for it too
        spans = await wait_for(lambda: _through_step(exporter, run_id, done.step),
                               what="the last step's span")

    [click] = named(spans, "slack.click", approval_id=aid)
    trace_id, click_id = ids(click)
    assert click.parent is None  # a click starts its trace
    assert click.attributes[A + "user"] == "U_ALICE"
    assert click.attributes[A + "outcome"] == "approved"

    [decision] = named(spans, "approval.decision", approval_id=aid)
    assert ids(decision)[0] == trace_id and parent_id(decision) == click_id
    assert decision.attributes[A + "outcome"] == "approved"
    assert decision.attributes[A + "run_id"] == run_id
    assert decision.attributes[A + "run_ready"] is True
    decision_id = ids(decision)[1]

    [wait] = named(spans, "approval.wait", approval_id=aid)
    assert ids(wait)[0] == trace_id and parent_id(wait) == decision_id
    assert wait.start_time == int(a.requested_at.timestamp() * 1_000_000_000)
    assert wait.end_time is not None and wait.end_time >= wait.start_time

    # every step of the resumed run is a child of the decision, in the click's trace
    steps = [s for s in named(spans, "run.step", run_id=run_id) if ids(s)[0] == trace_id]
    assert steps and all(parent_id(s) == decision_id for s in steps)
    assert {s.attributes[A + "step"] for s in steps} == set(range(2, done.step + 1))
    [resumed] = [s for s in steps if s.attributes[A + "resumed"]]
    assert resumed.attributes[A + "step"] == 2 and resumed.attributes[A + "agent"] \
        == "demo-refund"
    assert not resumed.links  # its parent is the decision: nothing to link

    [refund] = named(spans, "tool.call", tool="issue_refund")
    assert ids(refund)[0] == trace_id and parent_id(refund) == ids(resumed)[1]
    assert refund.attributes[A + "approval_id"] == aid
    assert refund.attributes[A + "policy"] == "approve_before"
    assert refund.attributes[A + "status"] == "succeeded"
    call_id = refund.attributes[A + "call_id"]
    assert refund.attributes[A + "idempotency_key"] == f"{run_id}:{call_id}"

    # model calls after the resume hang under their steps, in the same trace
    step_ids = {ids(s)[1] for s in steps}
    later = [m for m in named(spans, "model.call", run_id=run_id) if ids(m)[0] == trace_id]
    assert later and all(parent_id(m) in step_ids for m in later)

    # the steps before the click are not in the click's trace
    assert all(ids(s)[0] != trace_id for s in named(before, "run.step"))


@pytest.mark.parametrize("verdict", ["approve", "deny"])
async def test_a_run_resumed_by_another_process_links_the_decision(make_engine, exported,
                                                                   verdict: str) -> None:
    """The deciding process dies before it advances the run; another (its own engine and
    tracer, nothing in memory about the decision) resumes it from the database. The
    resumed step starts a trace of its own and links the decision that resolved its call,
    whose trace context the decision stored with the request."""
    provider, exporter = exported
    deciding = make_engine(tracer=OtelTracer(provider))
    resuming = make_engine(tracer=OtelTracer(provider))
    outcome = await deciding.run("demo-refund", TASK, requested_by="U_DANA")
    assert isinstance(outcome, Paused)
    [aid] = outcome.approval_ids
    with provider.get_tracer("test").start_as_current_span("slack.click"):
        decision = await deciding.decide(aid, actor=Actor("U_ALICE", "slack"),
                                         verdict=verdict, reason="not this order")
    assert decision.run_ready
    assert isinstance(await resuming.advance(outcome.run_id), Completed)
    spans = exporter.get_finished_spans()
    [click] = named(spans, "slack.click")
    [decided] = named(spans, "approval.decision", approval_id=aid)
    assert ids(decided)[0] == ids(click)[0]
    resumed = [s for s in named(spans, "run.step", run_id=outcome.run_id)
               if s.attributes[A + "resumed"]]
    assert len(resumed) == 1
    [step] = resumed
    assert ids(step)[0] != ids(click)[0]  # a trace of its own, not the click's
    assert [(link.context.trace_id, link.context.span_id) for link in step.links] \
        == [ids(decided)]
    [link] = step.links
    assert link.attributes == {A + "approval_id": aid}
    refunds = named(spans, "tool.call", tool="issue_refund")
    if verdict == "approve":  # the approved call runs under the linked step
        assert [parent_id(r) for r in refunds] == [ids(step)[1]]
    else:
        assert refunds == []
    # an advance that resolves no decided call links nothing
    assert all(not s.links for s in named(spans, "run.step") if s is not step)


@pytest.mark.parametrize("verdict", ["retry", "mark_done"])
async def test_an_answer_about_an_unknown_outcome_is_linked_by_the_resuming_process(
        make_engine, db, exported, verdict: str) -> None:
    """Nobody knows whether a payment went through (the process died between the
    provider's answer and recording it); a person answers the question in one process,
    another resumes the run. The resuming step links the answer's span, as it links an
    approval's, so the trace shows who settled the call and that the step followed."""
    provider, exporter = exported
    payments = Provider()
    answering = make_engine(agents=[pay_agent(payments, reconcile=False)],
                            tracer=OtelTracer(provider))
    resuming = make_engine(agents=[pay_agent(payments, reconcile=False)],
                           tracer=OtelTracer(provider))
    run_id = await answering.start_run("payer", "pay", requested_by="U_DANA")
    failpoints.arm("before_result", crash)  # the provider charged; the result is lost
    try:
        with pytest.raises(Crash):
            await answering.advance(run_id)
    finally:
        failpoints.arm("")
    assert isinstance(await answering.advance(run_id), NeedsAttention)
    [question] = [a for a in await Rows(db).approvals(run_id)
                  if a.kind == "outcome_unknown" and a.status == "pending"]
    with provider.get_tracer("test").start_as_current_span("slack.click"):
        decision = await answering.decide(question.id, actor=Actor("U_OPS", "slack"),
                                          verdict=verdict, reason="checked the provider")
    assert decision.run_ready
    exporter.clear()  # only the resumption from here on
    assert isinstance(await resuming.advance(run_id), Completed)
    spans = exporter.get_finished_spans()
    [resumed] = [s for s in named(spans, "run.step", run_id=run_id)
                 if s.attributes[A + "resumed"]]
    answered = await Rows(db).approval(question.id)
    assert answered is not None and answered.decision_trace is not None
    assert [(format(lk.context.trace_id, "032x"), format(lk.context.span_id, "016x"),
             dict(lk.attributes or {})) for lk in resumed.links] \
        == [(*answered.decision_trace.split("-")[1:3], {A + "approval_id": question.id})]
    assert len(payments.charges) == (2 if verdict == "retry" else 1)
    assert all(not s.links for s in spans if s is not resumed)


def test_a_link_to_nothing_valid_is_not_made(exported) -> None:
    """A stored traceparent that names no valid span (hand-edited, a future version's
    format) links nothing and stops nothing; a well-formed one from another trace does."""
    provider, exporter = exported
    tracer = OtelTracer(provider)
    other = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with tracer.span("run.step"):
        for bad in ("", "garbage", "00-00000000000000000000000000000000-b7ad6b7169203331-01"):
            tracer.link(bad, approval_id="a1")
        tracer.link(other, approval_id="a2")
        here = tracer.traceparent()
    [step] = exporter.get_finished_spans()
    assert [(format(lk.context.span_id, "016x"), dict(lk.attributes or {}))
            for lk in step.links] == [("b7ad6b7169203331", {A + "approval_id": "a2"})]
    assert here is not None and here.split("-")[2] == format(ids(step)[1], "016x")
    assert Tracer().traceparent() is None


async def test_a_refused_click_is_traced_and_resumes_nothing(sqlite_url, tmp_path,
                                                             exported) -> None:
    provider, exporter = exported
    async with harness(sqlite_url, tmp_path, tracer=OtelTracer(provider)) as h:
        paused = await h.pause_refund()  # U_DANA started it: she may not approve it
        [aid] = paused.approval_ids
        await h.card(aid)
        a = await h.approval(aid)
        resp = await h.slack.click(cards.APPROVE, h.value(a), user_id="U_DANA",
                                   channel_id=CHANNEL, message_ts=a.message_ts)
        assert resp.status == 200
        spans = exporter.get_finished_spans()
        assert (await h.approval(aid)).status == "pending"
    [click] = named(spans, "slack.click", approval_id=aid)
    [decision] = named(spans, "approval.decision", approval_id=aid)
    assert parent_id(decision) == ids(click)[1]
    assert decision.attributes[A + "outcome"] == "refused:self_approval"
    assert click.attributes[A + "outcome"] == "refused:self_approval"
    assert not named(spans, "approval.wait")
    assert all(ids(s)[0] != ids(click)[0] for s in named(spans, "run.step"))


async def test_tracing_off_records_nothing(make_engine, exported,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    provider, exporter = exported
    # whatever asks OpenTelemetry for its global provider gets the test's one
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: provider)
    engine = make_engine()
    assert type(parts(engine).tracer) is Tracer and not parts(engine).tracer.enabled
    outcome = await engine.run("demo-refund", TASK, requested_by="U_DANA")
    assert isinstance(outcome, Paused)
    await engine.decide(outcome.approval_ids[0], actor=Actor("U_ALICE", "slack"),
                        verdict="approve")
    assert isinstance(await engine.advance(outcome.run_id), Completed)
    assert exporter.get_finished_spans() == ()

    # the same flow with the tracer on records into that provider (the check can fail)
    engine = make_engine(tracer=OtelTracer())
    again = await engine.run("demo-refund", TASK, requested_by="U_DANA")
    assert isinstance(again, Paused)
    assert named(exporter.get_finished_spans(), "run.step", run_id=again.run_id)


@pytest.mark.slow  # starts a process
def test_nothing_imports_opentelemetry_unless_tracing_is_on(tmp_path: Path) -> None:
    code = ("import sys\n"
            "import approvald.bot.serve, approvald.bot.slack.handlers\n"
            "import approvald.runtime.engine, approvald.runtime.runs.runner\n"
            "from approvald.bot.tracing import from_environment\n"
            "t = from_environment({})\n"
            "assert not t.tracer.enabled and t.provider is None\n"
            "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=tmp_path, check=False, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("env", [
    {},
    {"OTEL_SERVICE_NAME": "approvald-eu"},  # names the service; exports nowhere
    {"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"},
    {"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "console"},
])
def test_tracing_is_off_unless_otel_variables_ask(env: dict[str, str]) -> None:
    tracing = from_environment(env)
    assert type(tracing.tracer) is Tracer and tracing.provider is None


async def test_otel_traces_exporter_turns_tracing_on(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES"):  # the resource reads them
        monkeypatch.delenv(var, raising=False)
    tracing = from_environment({"OTEL_TRACES_EXPORTER": "console"})
    try:
        assert isinstance(tracing.tracer, OtelTracer) and tracing.provider is not None
        assert tracing.provider.resource.attributes["service.name"] == "approvald"
    finally:
        await tracing.shutdown()
    assert tracing.provider is None


@pytest.mark.parametrize(("env", "variable"), [
    ({"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317",
      "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "OTEL_EXPORTER_OTLP_PROTOCOL"),
])
def test_a_tracing_setting_approvald_cannot_honour_stops_start_up(env, variable) -> None:
    with pytest.raises(ConfigError) as caught:
        from_environment(env)
    assert str(caught.value).startswith(f"{variable}:")


async def _completed(h, run_id: str):
    run = await h.run(run_id)
    return run if run.status == "completed" else None


def _through_step(exporter: InMemorySpanExporter, run_id: str, last: int):
    spans = exporter.get_finished_spans()
    return spans if named(spans, "run.step", run_id=run_id, step=last) else None
