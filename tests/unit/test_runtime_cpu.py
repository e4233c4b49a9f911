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


def _calls(frame: Any, seen: Counter[str]) -> None:  # (as ``file:function``)
    code = frame.f_code
    seen[f"{code.co_filename.rsplit('/', 1)[-1]}:{code.co_qualname}"] += 1


def test_a_point_not_armed_is_passed_with_no_python_call() -> None:
    seen: Counter[str] = Counter()

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            _calls(frame, seen)

    sys.setprofile(profile)
    try:
        for name in failpoints.KNOWN:
            failpoints.failpoint(name)
    finally:
        sys.setprofile(None)
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
