"""Issue 50: the runtime's Python on an approval's way from its decision to its completed
run, cut with no change in what it does (the statements: tests/unit/test_click_statements;
the store's own calls: tests/unit/test_store_cpu)."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any

from approvald.runtime.approvals.decide import Actor
from approvald.runtime.kernel import failpoints
from approvald.runtime.kernel.outcomes import Completed
from approvald.store.db import Database

from tests.unit.test_click_statements import paused_refund
from tests.unit.test_decisions import card_token
from tests.unit.test_store_cpu import called


def _calls(frame: Any, seen: Counter[str]) -> None:  # (as ``file:function``)
    code = frame.f_code
    seen[f"{code.co_filename.rsplit('/', 1)[-1]}:{code.co_qualname}"] += 1


def test_a_point_not_armed_is_passed_with_no_python_call() -> None:
    def passes() -> None:
        for name in failpoints.KNOWN:
            failpoints.failpoint(name)

    seen = called(passes)
    assert seen == Counter(), seen
    hit: list[str] = []
    try:  # armed: counted, and acted on at the armed hit, as before
        failpoints.arm("after_intent@2,before_call", hit.append)
        for name in ("after_intent", "before_call", "after_intent", "after_intent",
                     "after_result"):
            failpoints.failpoint(name)
        assert hit == ["before_call", "after_intent"]
        assert (failpoints.hits("after_intent"), failpoints.hits("after_result")) == (3, 0)
    finally:
        failpoints.arm("")
    failpoints.failpoint("after_intent")
    assert failpoints.hits("after_intent") == 0 and hit == ["before_call", "after_intent"]


async def test_a_resumed_run_reads_its_cancel_flag_and_passes_its_failpoints_in_c(
        db: Database, tmp_path: Path) -> None:
    """From the decision to the completed run: no failpoint function called (none is
    armed), and the checkpoints read the cancel flag they get back, not its ``__bool__``."""
    engine, _ = await paused_refund(db, tmp_path)
    seen: Counter[str] = Counter()

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_name in ("failpoint", "__missing__",
                                                          "__bool__"):
            _calls(frame, seen)

    for i in range(2):  # the first: connections opened, statements built, plans made
        paused = await engine.run("demo-refund", f"Refund order A-100{i}, customer was "
                                  "double charged", requested_by="U_DANA")
        approval = await engine.approval(paused.approval_ids[0])  # type: ignore[attr-defined]
        seen.clear()
        sys.setprofile(profile)
        try:
            await engine.decide(approval.id, actor=Actor("U_ALICE", "slack"),
                                verdict="approve", token=card_token(approval))
            outcome = await engine.advance(approval.run_id)
        finally:
            sys.setprofile(None)
        assert isinstance(outcome, Completed)
    assert seen == Counter(), seen


def test_the_blocks_around_a_decision_and_a_run_s_steps_cost_a_call_each_way() -> None:
    """The tracer that records nothing (``serve`` without OTEL_*) opens a span and a run's
    steps with a shared block; a write's wait is the store's block itself: entered and
    left with a call each way, not a generator's five calls."""
    import pytest
    from approvald.runtime.kernel.urgency import Urgency
    from approvald.runtime.record.tracing import Span, Steps, Tracer
    from approvald.store import waiting

    tracer, urgency, got = Tracer(), Urgency(), []

    def blocks() -> None:
        with tracer.span("approval.decision", approval_id="a") as span:
            got.append(span)
        with tracer.steps("r") as steps:
            got.append(steps)
        with urgency.waits(2.0):
            got.append(waiting.since())

    assert called(blocks) == Counter({
        "tracing.py:Tracer.span": 1, "tracing.py:Tracer.steps": 1,
        "tracing.py:_Holding.__enter__": 2, "tracing.py:_Holding.__exit__": 2,
        "waiting.py:waiting.__init__": 1, "waiting.py:waiting.__enter__": 1,
        "waiting.py:waiting.__exit__": 1})
    assert type(got[0]) is Span and type(got[1]) is Steps and got[2] == 2.0
    with pytest.raises(KeyError), tracer.span("x"), tracer.steps("r"):  # let through
        raise KeyError
    assert waiting.since() is None
