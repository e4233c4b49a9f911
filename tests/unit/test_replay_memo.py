"""A replay decides each distinct call once (issue 51: a million entries in seconds), and
what it finds is what deciding every request again finds: the same changes, table and
shadow tallies, the same insights and suggestions."""

from __future__ import annotations

import random
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from approvald.runtime import replay as replay_module
from approvald.runtime.insights import insights
from approvald.runtime.policies.directory import StaticDirectory
from approvald.runtime.policies.intake import Source
from approvald.runtime.policies.policy import ApprovalPolicy, CallPolicy, PolicyFile
from approvald.runtime.policies.rules import argument_fields
from approvald.runtime.record.history import History, Request
from approvald.runtime.replay import Decisions, Declaration, replay

T0 = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)
AGENT = Source("agent", "demo-refund")
CI = Source("api", "ci")
CODE = ApprovalPolicy()  # what the agent's code declares: one object, as a registry's tool

NEW = PolicyFile.model_validate({"tools": {
    "issue_refund": {"approvers": ["U_ALICE"], "rules": [
        {"when": "args.amount_cents <= 5000", "policy": "auto", "mode": "shadow"},
        {"when": "has(args.note) && args.note == 'vip'", "policy": "auto"},
        {"when": "args['amount_cents'] > 60000", "policy": "forbidden"},
        {"when": "args.amount_cents > 30000", "approvers": ["U_BOB", "U_CAROL"], "quorum": 2},
        {"when": "args.flag == true", "policy": "notify_after"}]},
    "api:*/deploy": {"approvers": ["U_BOB"], "rules": [
        {"when": "size(args) > 2", "policy": "forbidden"},  # the whole map: all args key
        {"when": "args.service == 'docs'", "policy": "auto"}]},
    "api:*/restart": {"policy": "auto", "mode": "shadow"},
}})


def declared(source: Source, tool: str) -> Declaration:
    return ("approve_before", CODE) if source.kind == "agent" else None


def seeded_history(n: int = 600) -> list[Request]:
    """Refunds and deploys with repeated arguments, approvals, denials, edits, expiries,
    calls run at once, values a rule cannot read (a missing key) and values that are
    equal in Python but not to a condition (1, 1.0, true)."""
    rng = random.Random(51)
    out: list[Request] = []
    for i in range(n):
        at = T0 + timedelta(minutes=7 * i)
        if rng.random() < 0.7:
            source, tool = AGENT, "issue_refund"
            args: dict[str, Any] = {"order_id": f"A-{rng.randrange(40)}",
                                    "amount_cents": rng.choice((
                                        rng.randrange(100, 9000, 100),
                                        rng.randrange(100, 90000, 2500)))}
            roll = rng.random()
            if roll < 0.1:
                args["note"] = rng.choice(("vip", "regular"))
            elif roll < 0.15:
                args["flag"] = rng.choice((True, 1, 1.0, "true"))
            elif roll < 0.18:
                del args["amount_cents"]  # a rule on it cannot be evaluated: forbidden
            elif roll < 0.2:
                args["amount_cents"] = rng.choice((-0.0, 0.0, 5000.0, 5000))
        else:
            source, tool = CI, rng.choice(("deploy", "restart"))
            args = {"service": rng.choice(("api", "docs", "web"))}
            if rng.random() < 0.2:
                args.update(version="1.2.3", extra={"b": [1, 2], "a": None})
        asked = rng.random() < 0.85
        outcome = rng.choice(("approved", "approved", "approved", "denied", "edited",
                              "expired", "redirected", "standing", "pending")) \
            if asked else rng.choice(("ran", "forbidden"))
        answer = "approve_before" if asked else ("auto" if outcome == "ran" else "forbidden")
        name = source.policy_name(tool)
        who = rng.choice(("U_ALICE", "U_BOB"))
        decided = outcome in ("approved", "edited", "denied", "redirected", "standing")
        out.append(Request(
            key=f"r{i}", at=at, tool=tool, policy_name=name, source=source, shown=args,
            args=args, answer=answer, asked=asked, approvers=[who] if asked else [],
            quorum=1, rule=None, outcome=outcome, edited=outcome == "edited",
            decided_by=who if decided else None,
            decided_at=at + timedelta(minutes=rng.randrange(1, 90)) if decided else None,
            reason="too much" if outcome in ("denied", "redirected") else None,
            asked_of=[who] if asked else [],
            shadow=[{"where": "tools.issue_refund.rules[0]",
                     "when": "args.amount_cents <= 5000", "would": "auto",
                     "approvers": [], "quorum": 1}] if tool == "issue_refund"
            and i % 3 == 0 else []))
    return out


class Plain(Decisions):
    """Every request decided by the intake, nothing remembered: the plain path."""

    def __call__(self, source: Source, tool: str, args: Mapping[str, Any],
                 declared: Declaration) -> CallPolicy:
        self.decided += 1
        return self.intake.resolve(source, tool, args, declared=declared)


def test_a_remembered_decision_is_the_decision_the_intake_makes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    history = seeded_history()
    directory = StaticDirectory({})
    made: list[Decisions] = []

    class Counted(Decisions):
        def __init__(self, *a: Any) -> None:
            super().__init__(*a)
            made.append(self)

    monkeypatch.setattr(replay_module, "Decisions", Counted)
    fast = replay(history, NEW, directory, declared)
    remembered = made[-1].decided
    found = insights(History(history, T0, (1, "0" * 64), 1), NEW, directory, declared,
                     window="30 days", min_requests=3)
    monkeypatch.setattr(replay_module, "Decisions", Plain)
    plain = replay(history, NEW, directory, declared)
    assert fast == plain  # every change (its request and new policy), the table, shadows
    assert found == insights(History(history, T0, (1, "0" * 64), 1), NEW, directory,
                             declared, window="30 days", min_requests=3)
    # the history covers every kind of change, shadow records and both kinds of outcome
    assert {c.change for c in plain.changes} == {"runs_unasked", "forbidden", "asks",
                                                 "approvers"}
    assert plain.dangerous and plain.shadow
    assert {c.now.reason is not None for c in plain.changes if c.change == "forbidden"}
    assert any("cannot be evaluated" in (c.now.reason or "") for c in plain.changes)
    # and it repeats: the intake decided far fewer calls than there are requests
    assert remembered < len(history) // 2


def test_values_equal_in_python_but_not_to_a_condition_are_decided_apart() -> None:
    policy = PolicyFile.model_validate({"tools": {"t": {"rules": [
        {"when": "args.x == true", "policy": "auto"},
        {"when": "string(args.x) == '-0'", "policy": "forbidden"}]}}})
    decide = Decisions(replay_module.Intake(lambda: policy, StaticDirectory({})))
    kinds = [decide(AGENT, "t", {"x": x}, ("approve_before", CODE)).kind
             for x in (True, 1, 1.0, True)]
    assert kinds[0] == kinds[3] == "auto" and "auto" not in kinds[1:3]
    assert decide.decided == 3


def test_the_arguments_a_condition_reads() -> None:
    assert argument_fields("args.amount_cents <= 5000") == {"amount_cents"}
    assert argument_fields("has(args.note) && args['vip tier'] == 'x' || tool == 'y'") \
        == {"note", "vip tier"}
    assert argument_fields("args.items.exists(i, i.price > args.limit)") == {"items", "limit"}
    assert argument_fields("tool == 'deploy'") == frozenset()
    # args read whole, by a computed key, or bound by a macro: cannot be told
    assert argument_fields("size(args) > 2") is None
    assert argument_fields("args[tool] == 1") is None
    assert argument_fields("[1].all(args, args > 0)") is None
    assert argument_fields("'x' in args") is None
