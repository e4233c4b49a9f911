"""What the ``approvald`` command says agrees with what the audit log records (issue 33):
a repeat of one's own decision, a ``--digest`` that names no version of the arguments, an
edit that approves; ids named by a prefix the same way by every command; people and
reasons told once, each sentence ending once."""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers import Cli


def pause(cli: Cli, task: str = "Refund order A-1001, double charged") -> tuple[str, str]:
    run_id = cli.ok("run", "demo-refund", "--task", task, "--requested-by", "U_DANA").strip()
    [approval_id] = cli.ok("approvals", "list", "--ids", "--run", run_id).split()
    return run_id, approval_id


def audit(cli: Cli, run_id: str) -> list[dict]:
    return [json.loads(x) for x in cli.ok("audit", "export", "--run", run_id).splitlines()]


def test_repeating_ones_own_approval_is_idempotent_in_the_reply_and_the_record(
        cli: Cli) -> None:
    run_id, approval_id = pause(cli)
    cli.ok("approvals", "approve", approval_id, "--as", "U_ALICE")
    again = cli("approvals", "approve", approval_id, "--as", "U_ALICE")
    assert again.returncode == 0, again.stderr
    assert "already approved by U_ALICE" in again.stdout and "stands" in again.stdout
    entries = [e for e in audit(cli, run_id)
               if e["approval_id"] == approval_id and e["action"] != "executed"]
    assert [e["action"] for e in entries] == ["requested", "approved", "repeated"]
    assert entries[-1]["actor"] == "U_ALICE"
    assert entries[-1]["details"]["verdict"] == "approve"
    # someone else's approval of a decided request is refused, and recorded as refused
    other = cli("approvals", "approve", approval_id, "--as", "U_BOB")
    assert other.returncode == 4 and "already approved" in other.stderr
    assert audit(cli, run_id)[-1]["action"] == "refused"
    # so is a different verdict by the same person
    changed = cli("approvals", "deny", approval_id, "--as", "U_ALICE", "--reason", "no")
    assert changed.returncode == 4
    assert audit(cli, run_id)[-1]["details"]["reason"] == "not_pending"
    assert len([e for e in cli.ledger_lines() if e["tool"] == "issue_refund"]) == 1


def test_a_repeated_denial_stands_and_is_recorded_as_a_repeat(cli: Cli) -> None:
    run_id, approval_id = pause(cli)
    cli.ok("approvals", "deny", approval_id, "--as", "U_ALICE", "--reason", "no")
    again = cli.ok("approvals", "deny", approval_id, "--as", "U_ALICE", "--reason", "no")
    assert "already denied by U_ALICE" in again and "stands" in again
    assert audit(cli, run_id)[-1]["action"] == "repeated"


def test_a_digest_that_matches_no_version_of_the_arguments_is_its_own_error(
        cli: Cli, tmp_path: Path) -> None:
    (tmp_path / "policy.toml").write_text('[tools.issue_refund]\nquorum = 2\n')
    cli.env_extra["APPROVALD_POLICY_FILE"] = str(tmp_path / "policy.toml")
    run_id, approval_id = pause(cli)
    digest = cli.json("approvals", "show", approval_id, "--json")["digest"]
    typo = "0123456789ab" if not digest.startswith("0123") else "fedcba987654"
    refused = cli("approvals", "approve", approval_id, "--as", "U_ALICE", "--digest", typo)
    assert refused.returncode == 4
    assert "changed" not in refused.stderr
    assert f"no version of the arguments of approval {approval_id} has a digest starting " \
           f"with {typo}" in refused.stderr
    last = audit(cli, run_id)[-1]
    assert last["action"] == "refused" and last["details"]["reason"] == "unknown_digest"
    # a digest the arguments had before an edit is still "they changed"
    cli.ok("approvals", "edit", approval_id, "--as", "U_BOB", "--no-resume", "--args",
           '{"order_id": "A-1001", "amount_cents": 100, "reason": "partial"}')
    stale = cli("approvals", "approve", approval_id, "--as", "U_CAROL", "--digest",
                digest[:12])
    assert stale.returncode == 4 and "changed" in stale.stderr
    assert audit(cli, run_id)[-1]["details"]["reason"] == "stale_card"


def test_an_edit_says_it_approved_with_edits(cli: Cli) -> None:
    _, approval_id = pause(cli)
    out = cli.ok("approvals", "edit", approval_id, "--as", "U_ALICE", "--no-resume", "--args",
                 '{"order_id": "A-1001", "amount_cents": 100, "reason": "partial"}')
    assert f"approval {approval_id}: approved with edits by U_ALICE" in out


def test_a_denials_summary_ends_once_and_names_no_raw_id(cli: Cli) -> None:
    run_id, approval_id = pause(cli)
    cli.ok("approvals", "deny", approval_id, "--as", "U_BOB", "--reason",
           "Customer was refunded twice, not again.")
    result = cli.json("runs", "show", run_id, "--json")["result"]
    assert result.endswith('saying "Customer was refunded twice, not again."'), result
    assert '."' + "." not in result and "U_BOB" not in result
