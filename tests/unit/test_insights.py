"""Shadow rules decide nothing and say what they would have decided; the insights'
suggestions come from a unanimous record and are replayed before they are offered
(issue 51)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from approvald.runtime.insights import insights
from approvald.runtime.policies.directory import StaticDirectory
from approvald.runtime.policies.intake import Source
from approvald.runtime.policies.policy import ApprovalPolicy, PolicyFile
from approvald.runtime.record.history import History, Request
from approvald.runtime.replay import replay

T0 = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)
AGENT = Source("agent", "demo-refund")
SHADOWED = PolicyFile.model_validate({"tools": {
    "issue_refund": {"approvers": ["U_ALICE"], "rules": [
        {"when": "args.amount_cents <= 5000", "policy": "auto", "mode": "shadow"},
        {"when": "args.amount_cents > 100000", "policy": "forbidden"}]},
    "api:*/deploy": {"policy": "forbidden", "mode": "shadow"},
}})


CURRENT = PolicyFile.model_validate({"tools": {"issue_refund": {"approvers": ["U_ALICE"]}}})


def declared(source: Source, tool: str) -> tuple[str, ApprovalPolicy] | None:
    return ("approve_before", ApprovalPolicy()) if source.kind == "agent" else None


def request(i: int, amount: int, outcome: str, *, minutes: float = 3.0) -> Request:
    at = T0 + timedelta(hours=i)
    args = {"order_id": f"A-{i}", "amount_cents": amount, "reason": "double charge"}
    return Request(key=f"a{i}", at=at, tool="issue_refund", policy_name="issue_refund",
                   source=AGENT, shown=args, args=args, answer="approve_before", asked=True,
                   approvers=["U_ALICE"], asked_of=["U_ALICE"], outcome=outcome,
                   edited=outcome == "edited", decided_by="U_ALICE",
                   decided_at=at + timedelta(minutes=minutes),
                   reason="too much" if outcome == "denied" else None)


def seeded() -> list[Request]:
    """214 refunds of at most $49.90 approved in 3 minutes; 20 larger ones denied."""
    small = [request(i, 100 + i * 22, "approved") for i in range(214)]
    large = [request(300 + i, 7500 + i * 500, "denied", minutes=20) for i in range(20)]
    return small + large


def test_a_shadow_rule_decides_nothing_and_says_what_it_would_have_decided() -> None:
    small = SHADOWED.for_call("issue_refund", "approve_before", ApprovalPolicy(),
                              {"amount_cents": 400})
    assert (small.kind, small.approval.approvers, small.rule) == (
        "approve_before", ["U_ALICE"], None)
    [shadow] = small.shadow
    assert shadow.record() == {"where": "tools.issue_refund.rules[0]",
                               "when": "args.amount_cents <= 5000", "would": "auto",
                               "approvers": ["U_ALICE"], "quorum": 1}
    # an enforced rule that decides first leaves the shadow rule after it unreached
    huge = SHADOWED.for_call("issue_refund", "approve_before", ApprovalPolicy(),
                             {"amount_cents": 500000})
    assert (huge.kind, huge.shadow) == ("forbidden", ())
    # a shadow entry: the call gets [default], the entry's verdict is recorded
    deploy = SHADOWED.for_call("api:ci/deploy", *SHADOWED.default_policy(),
                               {"service": "api"})
    assert deploy.kind == "approve_before"
    assert [(s.where, s.kind) for s in deploy.shadow] == [("tools.api:*/deploy",
                                                           "forbidden")]


def test_a_file_without_shadows_keeps_its_digest_and_records_none() -> None:
    plain = {"tools": {"issue_refund": {"approvers": ["U_ALICE"], "rules": [
        {"when": "args.amount_cents <= 5000", "policy": "auto"}]}}}
    named = {"tools": {"issue_refund": {"approvers": ["U_ALICE"], "mode": "enforce",
                                        "rules": [{"when": "args.amount_cents <= 5000",
                                                   "policy": "auto", "mode": "enforce"}]}}}
    a, b = PolicyFile.model_validate(plain), PolicyFile.model_validate(named)
    assert "mode" not in str(a.model_dump(mode="json"))
    assert a.digest != b.digest  # naming the mode is a change of the file, if no change
    assert a.for_call("issue_refund", "approve_before", ApprovalPolicy(),
                      {"amount_cents": 1}).shadow == ()
    assert b.for_call("issue_refund", "approve_before", ApprovalPolicy(),
                      {"amount_cents": 1}).kind == "auto"


def test_the_record_supports_a_rule_and_it_is_offered_as_a_snippet() -> None:
    history = History(seeded(), T0, (1, "0" * 64), 1)
    found = insights(history, CURRENT, StaticDirectory({}), declared,
                     window="30 days")
    [s] = found.suggestions
    assert s.text == ("issue_refund with amount_cents ≤ 5000: 214 of 214 approved in "
                      "30 days, median 3 min: a rule `args.amount_cents <= 5000 → auto` "
                      "would have saved 214 asks; replayed, it would have run 0 calls a "
                      "person denied or edited")
    assert s.snippet == ('[[tools.issue_refund.rules]]\nwhen = "args.amount_cents <= 5000"'
                         '\npolicy = "auto"')
    # the snippet, pasted, is a file that loads and runs those calls without asking
    pasted = PolicyFile.model_validate({"tools": {"issue_refund": {
        "approvers": ["U_ALICE"], "rules": [{"when": s.when, "policy": "auto"}]}}})
    again = replay(seeded(), pasted, StaticDirectory({}), declared)
    assert (len(again.changes), len(again.dangerous)) == (214, 0)
    [tool] = found.tools
    doc = tool.document()
    assert (doc["requests"], doc["approve_rate"], doc["deny_rate"]) == (234, 0.9145, 0.0855)
    # 214 of 234 were decided in 3 minutes: the 90th percentile is one of them
    assert (doc["median_seconds"], doc["p90_seconds"]) == (180.0, 180.0)
    assert doc["top_denial_reasons"] == [{"reason": "too much", "count": 20}]
    assert doc["deciders"] == {"U_ALICE": 234} and doc["asked_of"] == {"U_ALICE": 234}


def test_no_suggestion_when_one_matching_request_was_denied() -> None:
    record = [request(999, 150, "denied"), *seeded()]
    found = insights(History(record, T0, (1, "0" * 64), 1), CURRENT,
                     StaticDirectory({}), declared, window="30 days")
    assert found.suggestions == []
    # nor when one was edited: the call as asked was not what a person let run
    record = [request(999, 150, "edited"), *seeded()]
    found = insights(History(record, T0, (1, "0" * 64), 1), CURRENT,
                     StaticDirectory({}), declared, window="30 days")
    assert found.suggestions == []
