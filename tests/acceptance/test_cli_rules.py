"""Rules on arguments, as an operator meets them through the ``approvald`` command: a
policy file with three bands (a small refund runs, a huge one is refused, a large one
needs two people from finance), an edit that would cross a band, a bad expression."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import Cli

# the bands, with the finance group's members (the CLI has no Slack to ask)
RULES = (Path(__file__).parents[1] / "fixtures" / "refund_rules.toml").read_text() + """
[groups]
S_FINANCE = ["U_BOB", "U_CAROL"]
"""
FINANCE = "tools.issue_refund.rules[2]: args.amount_cents > 100000"


@pytest.fixture
def cli(cli: Cli, tmp_path: Path) -> Cli:
    """The shared ``cli`` with the rules' policy file."""
    policy = tmp_path / "policy.toml"
    policy.write_text(RULES)
    cli.env_extra["APPROVALD_POLICY_FILE"] = str(policy)
    return cli


def refund(cli: Cli, amount: str, order: str = "A-1") -> str:
    done = cli("run", "demo-refund", "--task", f"Refund order {order}: {amount}",
               "--requested-by", "U_DANA")
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def pending(cli: Cli, run_id: str) -> dict:
    [a] = [a for a in cli.json("approvals", "list", "--json") if a["run_id"] == run_id]
    return a


def test_three_bands(cli: Cli) -> None:
    # $15: the auto band, no request, the refund runs at once
    small = refund(cli, "$15")
    doc = cli.json("runs", "show", small, "--json")
    assert doc["status"] == "completed" and "was issued" in doc["result"]
    assert cli.json("approvals", "list", "--json") == []
    # $20,000: forbidden, the model is told the rule's reason and nothing is asked
    huge = refund(cli, "$20,000", order="B-2")
    doc = cli.json("runs", "show", huge, "--json")
    assert doc["status"] == "completed"
    refusal = next(m for m in doc["transcript"] if m["role"] == "tool"
                   and m["name"] == "issue_refund")
    assert refusal["content"] == {
        "status": "forbidden",
        "reason": "Refunds over $10,000 go through the finance system."}
    assert cli.json("approvals", "list", "--json") == []
    # $2,000: two people from finance; the rule is in the request, on show and in the audit
    large = refund(cli, "$2,000", order="C-3")
    a = pending(cli, large)
    assert a["approvers"] == ["S_FINANCE"]
    shown = cli.json("approvals", "show", a["id"], "--json")
    assert shown["quorum"] == 2 and shown["rule"] == FINANCE
    assert f"  policy rule: {FINANCE}" in cli.ok("approvals", "show", a["id"])
    outsider = cli("approvals", "approve", a["id"], "--as", "U_ALICE")
    assert outsider.returncode != 0 and "U_ALICE" in outsider.stderr
    assert "approved by U_BOB" not in cli.ok("approvals", "approve", a["id"], "--as", "U_BOB")
    assert pending(cli, large)["status"] == "pending"  # one of two
    assert f"run {large}: completed" in cli.ok("approvals", "approve", a["id"], "--as",
                                              "U_CAROL")
    refunds = [e["args"]["amount_cents"] for e in cli.ledger_lines()
               if e["tool"] == "issue_refund"]
    assert refunds == [1500, 200000]  # the $20,000 one never ran
    requested = [e for e in map(json.loads, cli.ok("audit", "export").splitlines())
                 if e["action"] == "requested"]
    assert [e["details"].get("rule") for e in requested] == [FINANCE]
    # $500: no rule matches, the tool's own policy (anyone but the requester, one vote)
    mid = refund(cli, "$500", order="D-4")
    b = pending(cli, mid)
    assert b["approvers"] == [] and cli.json("approvals", "show", b["id"], "--json")[
        "rule"] is None


@pytest.mark.parametrize(("cents", "refused"), [
    (1500, "the edited arguments fall under policy rule tools.issue_refund.rules[0]: "
           "args.amount_cents <= 2000, which runs them with no approval (auto)"),
    (2_000_000, "the edited arguments are forbidden (Refunds over $10,000 go through the "
                "finance system.)"),
    (200_000, "the edited arguments fall under policy rule " + FINANCE + ", not under "
              "issue_refund's own policy as the request's do"),
])
def test_an_edit_that_crosses_a_band_is_refused(cli: Cli, cents: int, refused: str) -> None:
    run_id = refund(cli, "$500")
    a = pending(cli, run_id)
    args = json.dumps({**a["args"], "amount_cents": cents})
    done = cli("approvals", "edit", a["id"], "--as", "U_ALICE", "--args", args)
    assert done.returncode != 0
    assert refused in done.stderr
    assert "an edit cannot move a call to other rules" in done.stderr
    after = cli.json("approvals", "show", a["id"], "--json")
    assert after["status"] == "pending" and after["edited_args"] is None
    # within the band, the edit is the editor's approval as before
    within = json.dumps({**a["args"], "amount_cents": 40000})
    assert f"run {run_id}: completed" in cli.ok("approvals", "edit", a["id"], "--as",
                                               "U_ALICE", "--args", within)
    assert [e["args"]["amount_cents"] for e in cli.ledger_lines()
            if e["tool"] == "issue_refund"] == [40000]


@pytest.mark.parametrize(("rule", "error"), [
    ('when = "args.amount_cents >> 1"\npolicy = "auto"',
     "tools.issue_refund.rules[0].when: not a valid CEL expression: at 1:20: Syntax error: "
     "extraneous input '>'"),
    ('when = "amount_cents > 1"\npolicy = "auto"',
     "tools.issue_refund.rules[0].when: unknown name amount_cents (a condition sees args, "
     "tool and annotations)"),
    ('when = "args.amount_cents > 1"\nreason = "no"',
     "tools.issue_refund.rules[0]: reason goes with policy = 'forbidden'"),
    ('when = "args.amount_cents > 1"\napprovers = ["U_BOB"]\nquorum = 2',
     "tools.issue_refund.rules[0]: quorum 2 needs more approvers than the 1 listed"),
    ('policy = "auto"', "tools.issue_refund.rules[0].when: Field required"),
    # a rule that fails on every call of its tool (and so would forbid them all) is
    # refused against the tool's schema
    ('when = "args.cnets > 100"\napprovers = ["U_BOB"]',
     "tools.issue_refund.rules[0].when: args.cnets: issue_refund has no argument 'cnets' "
     "(arguments: order_id, amount_cents, reason)"),
    ("when = \"args.amount_cents <= '2000'\"\npolicy = \"auto\"",
     "tools.issue_refund.rules[0].when: args.amount_cents <= '2000': <= is not defined for "
     "an integer (args.amount_cents) and a string ('2000')"),
])
def test_a_bad_rule_stops_start_up_with_one_line(cli: Cli, tmp_path: Path, rule: str,
                                                 error: str) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(f"[[tools.issue_refund.rules]]\n{rule}\n")
    cli.env_extra["APPROVALD_POLICY_FILE"] = str(bad)
    done = cli("run", "demo-refund", "--task", "Refund order A-1", "--requested-by", "U_DANA")
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(f"approvald: APPROVALD_POLICY_FILE: {bad}: ")
    assert line.endswith(error) if "CEL" in error else error in line
    del cli.env_extra["APPROVALD_POLICY_FILE"]
    assert cli.json("runs", "list", "--json") == []
