"""``approvald approvals redirect``: the call does not run, the model re-plans on guidance."""

from __future__ import annotations

import json

from tests.helpers import Cli


def pause(cli: Cli, task: str = "Refund order A-1001, double charged") -> tuple[str, str]:
    run_id = cli.ok("run", "demo-refund", "--task", task, "--requested-by", "U_DANA").strip()
    [approval_id] = cli.ok("approvals", "list", "--ids", "--run", run_id).split()
    return run_id, approval_id


def test_redirect_replans_and_the_new_request_runs_once_approved(cli: Cli) -> None:
    run_id, first = pause(cli)
    out = cli.ok("approvals", "redirect", first, "--as", "U_ALICE", "--guidance",
                 "Refund only $20, the customer kept one item")
    assert f"approval {first}: redirected by U_ALICE" in out
    assert f"run {run_id}: awaiting_approval" in out  # it asks again, for the new plan
    assert [e["tool"] for e in cli.ledger_lines()] == ["lookup_order"]

    [second] = cli.ok("approvals", "list", "--ids", "--run", run_id).split()
    assert second != first
    shown = cli.json("approvals", "show", second, "--json")
    assert shown["args"]["amount_cents"] == 2000
    old = cli.json("approvals", "show", first, "--json")
    assert (old["status"], old["verdict"], old["reason"], old["decided_by"]) == (
        "redirected", "redirect", "Refund only $20, the customer kept one item", "U_ALICE")
    assert first in cli.ok("approvals", "list", "--status", "redirected", "--ids")

    out = cli.ok("approvals", "approve", second, "--as", "U_ALICE")
    assert f"run {run_id}: completed" in out
    doc = cli.json("runs", "show", run_id, "--json")
    results = [m["content"] for m in doc["transcript"]
               if m["role"] == "tool" and m["name"] == "issue_refund"]
    assert results[0] == {"status": "redirected",
                          "guidance": "Refund only $20, the customer kept one item",
                          "by": "U_ALICE"}
    assert "$20.00" in doc["result"]
    refunds = [e["args"] for e in cli.ledger_lines() if e["tool"] == "issue_refund"]
    assert [r["amount_cents"] for r in refunds] == [2000]

    assert "audit log OK" in cli.ok("audit", "verify")
    entries = [json.loads(line) for line in cli.ok("audit", "export", "--run", run_id)
               .splitlines()]
    [redirected] = [e for e in entries if e["action"] == "redirected"]
    assert redirected["actor"] == "U_ALICE" and redirected["via"].startswith("cli")
    assert redirected["details"]["guidance"] == "Refund only $20, the customer kept one item"


def test_redirect_without_guidance_is_refused_and_changes_nothing(cli: Cli) -> None:
    _, approval_id = pause(cli)
    missing = cli("approvals", "redirect", approval_id, "--as", "U_ALICE")
    assert missing.returncode == 2 and "--guidance" in missing.stderr
    blank = cli("approvals", "redirect", approval_id, "--as", "U_ALICE", "--guidance", "  ")
    assert blank.returncode == 4 and "guidance" in blank.stderr
    assert cli.json("approvals", "show", approval_id, "--json")["status"] == "pending"
    assert [e["tool"] for e in cli.ledger_lines()] == ["lookup_order"]


def test_redirect_of_a_decided_request_is_refused(cli: Cli) -> None:
    _, approval_id = pause(cli)
    cli.ok("approvals", "approve", approval_id, "--as", "U_ALICE")
    late = cli("approvals", "redirect", approval_id, "--as", "U_BOB", "--guidance",
               "Refund $5 instead")
    assert late.returncode == 4 and "already approved" in late.stderr
    assert cli.json("approvals", "show", approval_id, "--json")["status"] == "approved"
    assert [e["args"]["amount_cents"] for e in cli.ledger_lines()
            if e["tool"] == "issue_refund"] == [4200]
    assert "audit log OK" in cli.ok("audit", "verify")


def test_a_repeated_redirect_by_the_same_person_stands(cli: Cli) -> None:
    run_id, approval_id = pause(cli)
    cli.ok("approvals", "redirect", approval_id, "--as", "U_ALICE", "--guidance",
           "No card refund: offer store credit", "--no-resume")
    again = cli.ok("approvals", "redirect", approval_id, "--as", "U_ALICE", "--guidance",
                   "No card refund: offer store credit")
    assert "already redirected by U_ALICE" in again and f"run {run_id}: completed" in again
    result = cli.json("runs", "show", run_id, "--json")["result"]
    assert "did not issue the refund" in result and "offer store credit" in result
