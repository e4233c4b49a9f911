"""A replay's intake resolves a call once per set of its rules' outcomes (issue 51): calls
whose arguments differ but whose every rule (in force and shadow) holds alike, or fails
alike with the same error, get the one decision, the decision the intake makes for each."""

from __future__ import annotations

from typing import Any

from approvald.runtime import replay as replay_module
from approvald.runtime.policies.directory import StaticDirectory
from approvald.runtime.policies.intake import Intake, Source
from approvald.runtime.policies.policy import ApprovalPolicy, PolicyFile
from approvald.runtime.replay import Decisions

AGENT = Source("agent", "demo-refund")
CI = Source("api", "ci")
CODE = ApprovalPolicy()

POLICY = PolicyFile.model_validate({"tools": {
    "issue_refund": {"approvers": ["U_ALICE"], "rules": [
        {"when": "args.amount_cents <= 5000", "policy": "auto", "mode": "shadow"},
        {"when": "args.amount_cents > 60000", "policy": "forbidden"},
        {"when": "args.amount_cents > 30000", "approvers": ["U_BOB"]}]},
    "api:*/deploy": {"rules": [{"when": "size(args) > 1", "policy": "forbidden"}]},
}})


class Counting(Intake):
    def __init__(self, *a: Any) -> None:
        super().__init__(*a)
        self.resolved = 0

    def resolve(self, *a: Any, **k: Any) -> Any:
        self.resolved += 1
        return super().resolve(*a, **k)


def test_calls_whose_rules_hold_alike_are_resolved_once() -> None:
    intake = Counting(lambda: POLICY, StaticDirectory({}))
    plain = Intake(lambda: POLICY, StaticDirectory({}))
    decide = Decisions(intake)
    calls: list[tuple[Source, str, dict[str, Any]]] = []
    for amount in [*range(100, 90000, 700), 5000, 5000.0, "x", None]:
        calls.append((AGENT, "issue_refund", {"amount_cents": amount, "order_id": "A-1"}))
    calls.append((AGENT, "issue_refund", {"order_id": "A-2"}))  # cannot be evaluated
    calls.append((AGENT, "issue_refund", {"order_id": "A-3"}))
    for service in ("api", "docs", "web"):
        calls.append((CI, "deploy", {"service": service}))
        calls.append((CI, "deploy", {"service": service, "version": "1"}))
    for source, tool, args in calls:
        declared = ("approve_before", CODE) if source.kind == "agent" else None
        got = decide(source, tool, args, declared)
        assert got == plain.resolve(source, tool, args, declared=declared), args
    # the distinct calls are still told apart, each decided
    assert decide.decided == len(calls) - 2  # 5000 twice, and the second call without it
    # but the intake resolved one per set of outcomes: far fewer
    assert intake.resolved <= 12, intake.resolved
    assert replay_module.Decisions is Decisions


def test_no_collection_runs_while_a_replay_or_the_insights_work() -> None:
    """(issue 51: at a million entries the collections cost the insights as much as their
    own work; runtime.kernel.collector)"""
    import gc
    from datetime import UTC, datetime

    from approvald.runtime.insights import insights
    from approvald.runtime.record.history import History
    from approvald.runtime.replay import replay

    from tests.unit.test_replay_memo import NEW, declared, seeded_history

    history = seeded_history(200)
    collected: list[int] = []

    def seen(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collected.append(info["generation"])

    directory = StaticDirectory({})
    window = History(history, datetime(2026, 11, 1, tzinfo=UTC), (1, "0" * 64), 1)
    threshold = gc.get_threshold()
    gc.collect()
    gc.set_threshold(1)  # any allocation of a tracked object would collect
    try:
        gc.callbacks.append(seen)
        done = replay(history, NEW, directory, declared)
        gc.callbacks.remove(seen)
        in_replay = list(collected)
        gc.callbacks.append(seen)
        found = insights(window, NEW, directory, declared, window="30 days", min_requests=3)
        gc.callbacks.remove(seen)
        in_insights = collected[len(in_replay):]
    finally:
        if seen in gc.callbacks:
            gc.callbacks.remove(seen)
        gc.set_threshold(*threshold)
    assert gc.isenabled()
    # (at most the few its own start and end allocate, outside the pause: thousands
    # without it)
    assert len(in_replay) <= 10 and len(in_insights) <= 10, (in_replay, in_insights)
    assert done.requests == 200 and found.requests == 200
