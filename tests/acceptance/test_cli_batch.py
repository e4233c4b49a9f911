"""Batch decisions through the command: ``approvals approve ID…`` and ``approvals deny
ID… --reason``; each request decided on its own, a refusal stopping no other."""

from __future__ import annotations

from tests.helpers import Cli


def pause(cli: Cli, n: int) -> list[str]:
    """``n`` refund runs waiting for approval; their request ids, oldest first."""
    for i in range(n):
        done = cli("run", "demo-refund", "--task", f"Refund order B-{i}: $30",
                   "--requested-by", "U_DANA")
        assert done.returncode == 0, done.stderr
    return [a["id"] for a in cli.json("approvals", "list", "--json")]


def test_approve_several_some_decided_elsewhere_a_moment_before(cli: Cli) -> None:
    ids = pause(cli, 5)
    cli.ok("approvals", "deny", ids[1], "--as", "U_BOB", "--reason", "duplicate",
           "--no-resume")
    cli.ok("approvals", "approve", ids[3], "--as", "U_BOB", "--no-resume")
    done = cli("approvals", "approve", *ids, ids[0], "--as", "U_ALICE")
    assert done.returncode == 4, done.stderr  # some were refused; the others stand
    lines = done.stdout.splitlines()
    for i in (0, 2, 4):
        assert f"approval {ids[i]}: approved by U_ALICE" in lines
    assert any(line.startswith(f"approval {ids[1]}: refused (not_pending): ") and
               "already denied by U_BOB" in line for line in lines), lines
    assert any(line.startswith(f"approval {ids[3]}: refused (not_pending): ") and
               "already approved by U_BOB" in line for line in lines), lines
    assert "3 of 5 decided; 2 refused" in lines  # the repeated id counted once
    after = {a["id"]: a for a in cli.json("approvals", "list", "--all", "--json")}
    assert [after[i]["status"] for i in ids] == ["approved", "denied", "approved",
                                                  "approved", "approved"]
    assert after[ids[1]]["decided_by"] == after[ids[3]]["decided_by"] == "U_BOB"
    # U_ALICE's three ran (resumed by the command); U_BOB's approval waits for serve
    refunds = [e["idempotency_key"] for e in cli.ledger_lines() if e["tool"] == "issue_refund"]
    assert len(refunds) == 3
    audit = cli.ok("audit", "verify")
    assert "audit log OK" in audit


def test_deny_several_with_one_reason(cli: Cli) -> None:
    ids = pause(cli, 3)
    missing = cli("approvals", "deny", *ids, "--as", "U_ALICE")
    assert missing.returncode == 2 and "--reason" in missing.stderr
    cli.ok("approvals", "deny", *ids, "--as", "U_ALICE", "--reason", "fraud review")
    runs = cli.json("runs", "list", "--json")
    assert {r["status"] for r in runs} == {"completed"}
    assert not [e for e in cli.ledger_lines() if e["tool"] == "issue_refund"]
    assert cli("approvals", "approve", ids[0], ids[1], "--as", "U_ALICE",
               "--digest", "abc").returncode == 2
