"""The ``approvald`` command, run as a user runs it, against a real database file."""

from __future__ import annotations

import json
import signal
from datetime import timedelta
from pathlib import Path

import pytest
from approvald.store import migrate

from tests.acceptance.conftest import wait_until
from tests.helpers import Cli, InProcessCli


def start_refund(cli: Cli, task: str = "Refund order A-1001, double charged") -> tuple[str, str]:
    done = cli("run", "demo-refund", "--task", task, "--requested-by", "U_DANA")
    assert done.returncode == 0, done.stderr
    run_id = done.stdout.strip()
    assert len(run_id) == 32 and f"run {run_id}: awaiting_approval" in done.stderr
    [pending] = cli.json("approvals", "list", "--json")
    assert {"id", "run_id", "tool", "args", "digest", "status", "expires_at",
            "approvers"} <= set(pending)
    assert pending["run_id"] == run_id and pending["status"] == "pending"
    return run_id, pending["id"]


def test_refund_approved_end_to_end(cli: Cli) -> None:
    run_id, approval_id = start_refund(cli)
    doc = cli.json("runs", "show", run_id, "--json")
    assert doc["status"] == "awaiting_approval" and doc["result"] is None
    assert doc["pending"] == [{"approval_id": approval_id, "kind": "tool_call",
                               "tool": "issue_refund",
                               "args": {"order_id": "A-1001", "amount_cents": 4200,
                                        "reason": "duplicate charge"},
                               "impact": "$42.00 goes back to the customer's card for order "
                                         "A-1001.",
                               "expires_at": doc["pending"][0]["expires_at"],
                               "approvers": []}]
    out = cli.ok("approvals", "approve", approval_id, "--as", "U_ALICE")
    assert f"approval {approval_id}: approved by U_ALICE" in out
    assert f"run {run_id}: completed" in out
    doc = cli.json("runs", "show", run_id, "--json")
    assert {"id", "agent", "status", "step", "requested_by", "result", "pending",
            "transcript"} <= set(doc)
    assert doc["status"] == "completed" and doc["pending"] == []
    assert doc["result"].startswith("Refund rf_") and "was issued" in doc["result"]
    assert [e["tool"] for e in cli.ledger_lines()] == ["lookup_order", "issue_refund",
                                                      "send_customer_email"]
    roles = [m["role"] for m in doc["transcript"]]
    assert roles == ["user", "assistant", "tool", "assistant", "tool", "assistant", "tool",
                     "assistant"]
    # the policy in force when the run started, the request, the approval
    # requested, approved, and the three executions: the lookup, the refund, the mail
    assert "audit log OK: 6 entries" in cli.ok("audit", "verify")


def test_refund_denied_reason_reaches_the_model(cli: Cli) -> None:
    run_id, approval_id = start_refund(cli)
    out = cli.ok("approvals", "deny", approval_id, "--as", "U_ALICE", "--reason",
                 "Customer already got store credit")
    assert f"run {run_id}: completed" in out
    doc = cli.json("runs", "show", run_id, "--json")
    denied = [m for m in doc["transcript"] if m["role"] == "tool" and m["name"] == "issue_refund"]
    assert denied[0]["content"] == {"status": "denied",
                                    "reason": "Customer already got store credit",
                                    "by": "U_ALICE"}
    assert '"Customer already got store credit"' in doc["result"]
    assert [e["tool"] for e in cli.ledger_lines()] == ["lookup_order"]


def test_refund_expires_and_is_cancelled(cli: Cli) -> None:
    policy = cli.workdir / "policy.toml"
    policy.write_text('[tools.issue_refund]\nttl = "30m"\non_expire = "cancel"\n')
    cli.env_extra["APPROVALD_POLICY_FILE"] = str(policy)
    run_id, approval_id = start_refund(cli)
    cli.advance_time(timedelta(minutes=29))
    assert "0 expired" in cli.ok("approvals", "sweep")
    cli.advance_time(timedelta(minutes=2))
    out = cli.ok("approvals", "sweep")
    assert "1 expired" in out and f"run {run_id}: completed" in out
    doc = cli.json("runs", "show", run_id, "--json")
    assert {"role": "tool", "call_id": "call_1_0", "name": "issue_refund",
            "content": {"status": "expired"}} in doc["transcript"]
    assert "expired" in doc["result"]
    late = cli("approvals", "approve", approval_id, "--as", "U_ALICE")
    assert late.returncode == 4 and "expired" in late.stderr
    assert [e["tool"] for e in cli.ledger_lines()] == ["lookup_order"]


def test_edit_with_bad_json_or_bad_schema_is_refused(cli: Cli) -> None:
    run_id, approval_id = start_refund(cli)
    bad_json = cli("approvals", "edit", approval_id, "--as", "U_ALICE", "--args", "{nope")
    assert bad_json.returncode == 2 and "--args is not valid JSON" in bad_json.stderr
    bad_schema = cli("approvals", "edit", approval_id, "--as", "U_ALICE", "--args",
                     '{"order_id": "A-1001", "amount_cents": "all of it", "reason": "x"}')
    assert bad_schema.returncode == 4 and "amount_cents" in bad_schema.stderr
    assert cli.json("approvals", "show", approval_id, "--json")["status"] == "pending"
    ok = cli("approvals", "edit", approval_id, "--as", "U_ALICE", "--args",
             '{"order_id": "A-1001", "amount_cents": 1000, "reason": "partial"}')
    assert ok.returncode == 0, ok.stderr
    refund = [e for e in cli.ledger_lines() if e["tool"] == "issue_refund"]
    assert [r["args"]["amount_cents"] for r in refund] == [1000]
    exported = [json.loads(x) for x in cli.ok("audit", "export", "--run", run_id).splitlines()]
    edited = next(x for x in exported if x["action"] == "edited")
    assert edited["args"]["amount_cents"] == 1000
    assert edited["details"]["original_args"]["amount_cents"] == 4200


def test_edit_one_field_with_set_keeps_the_others(cli: Cli) -> None:
    """Issue 48 item 9: `--args '{"amount_cents": 2000}'` replaced every argument and was
    refused for the missing order_id; `--set FIELD=VALUE` changes one, the way a person
    edits a field, and the tool's schema checks the whole."""
    _, approval_id = start_refund(cli)
    bad = cli("approvals", "edit", approval_id, "--as", "U_ALICE", "--set",
              "amount_cents=all of it")
    assert bad.returncode == 4 and "amount_cents" in bad.stderr
    nowhere = cli("approvals", "edit", approval_id, "--as", "U_ALICE", "--set", "amount_cents")
    assert nowhere.returncode == 2 and "expected FIELD=VALUE" in nowhere.stderr
    both = cli("approvals", "edit", approval_id, "--as", "U_ALICE", "--set", "a=1", "--args",
               "{}")
    assert both.returncode == 2 and "not allowed with argument" in both.stderr
    assert cli.json("approvals", "show", approval_id, "--json")["status"] == "pending"
    ok = cli("approvals", "edit", approval_id, "--as", "U_ALICE", "--set", "amount_cents=2000",
             "--set", "reason=second charge only")
    assert ok.returncode == 0, ok.stderr
    [refund] = [e for e in cli.ledger_lines() if e["tool"] == "issue_refund"]
    assert refund["args"] == {"order_id": "A-1001", "amount_cents": 2000,
                              "reason": "second charge only"}
    assert "it replaces the arguments whole (one left out is not kept)" in " ".join(
        cli.ok("approvals", "edit", "--help").split())


def test_cancel_a_waiting_run(cli: Cli) -> None:
    run_id, approval_id = start_refund(cli)
    assert f"run {run_id}: cancelled" in cli.ok("runs", "cancel", run_id[:10])
    assert cli.json("approvals", "show", approval_id, "--json")["status"] == "cancelled"
    again = cli("runs", "cancel", run_id)
    assert again.returncode == 2 and "already cancelled" in again.stderr


@pytest.mark.parametrize("args,env,message", [
    (["run", "no-such-agent", "--task", "x"], {}, "unknown agent 'no-such-agent' (known: "),
    (["runs", "show", "0123456789abcdef"], {}, "no run 0123456789abcdef"),
    (["approvals", "approve", "nope", "--as", "U_ALICE"], {},
     "nope is too short to name an approval"),
    (["runs", "list"], {"APPROVALD_DATABASE_URL": "mysql://db/x"}, "unsupported database"),
    (["runs", "list"], {"APPROVALD_DATABASE_URL": "::::"}, "not a database URL"),
    (["runs", "list"], {"APPROVALD_PORT": "eighty"}, "APPROVALD_PORT: "),
    (["runs", "list"], {"APPROVALD_POLICY_FILE": "/nonexistent.toml"}, "does not exist"),
    (["frobnicate"], {}, "invalid choice: 'frobnicate'"),
    (["approvals", "deny", "x", "--as", "U1"], {}, "--reason"),
    # serve runs as a process of its own (OWN_PROCESS in tests/helpers.py)
    *[pytest.param(*case, marks=pytest.mark.slow) for case in [
        (["serve"], {"SLACK_BOT_TOKEN": "xoxb-1"}, "SLACK_SIGNING_SECRET is not set"),
        (["serve"], {"SLACK_SIGNING_SECRET": "s" * 32}, "SLACK_BOT_TOKEN is not set"),
        (["serve"], {"SLACK_BOT_TOKEN": "xoxb-1", "SLACK_APP_TOKEN": "xapp-1"},
         "APPROVALD_CHANNEL is not set"),
        (["serve"], {"SLACK_API_URL": "ftp://nope"}, "SLACK_API_URL: "),
        (["serve"], {"SLACK_BOT_TOKEN": "xoxb-1", "SLACK_APP_TOKEN": "xapp-1",
                     "APPROVALD_CHANNEL": "C1"}, "APPROVALD_SECRET is not set or shorter"),
    ]],
])
def test_user_mistakes_are_one_line_and_nonzero(cli: Cli, args: list[str],
                                                env: dict[str, str], message: str) -> None:
    done = cli(*args, **env)
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = [x for x in done.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and message in lines[0], done.stderr
    assert "Traceback" not in done.stderr


def test_db_upgrade_and_runs_list(cli: Cli, tmp_path: Path) -> None:
    fresh = InProcessCli(db_url=f"sqlite+aiosqlite:///{tmp_path / 'fresh.db'}", workdir=tmp_path)
    done = fresh("db", "upgrade")
    assert done.returncode == 0 and f"is at schema {migrate.HEAD}" in done.stdout
    assert fresh.ok("runs", "list").strip() == "no runs"
    run_id, _ = start_refund(cli)
    listed = cli.json("runs", "list", "--json")
    assert [r["id"] for r in listed] == [run_id]
    assert run_id in cli.ok("runs", "list")


@pytest.mark.slow  # starts a process
def test_serve_resumes_a_decision_made_elsewhere_and_stops_on_sigterm(cli: Cli) -> None:
    run_id, approval_id = start_refund(cli)
    server = cli.spawn("serve", APPROVALD_POLL_INTERVAL="0.2", APPROVALD_LOG_LEVEL="INFO")
    try:
        cli.ok("approvals", "approve", approval_id, "--as", "U_ALICE", "--no-resume")
        wait_until(lambda: cli.json("runs", "show", run_id, "--json")["status"] == "completed",
                   within=30, what="serve to resume the run")
    finally:
        server.send_signal(signal.SIGTERM)
        _, err = server.communicate(timeout=30)
    assert server.returncode == 0, err
    assert "approvald: serving on" in err and "approvald: stopped" in err
    # the mode and where requests are decided, and that no HTTP listener serves /v1
    assert "approvald: mode: Slack is not configured" in err, err
    assert "approvald: http: no HTTP listener" in err, err
    assert len([e for e in cli.ledger_lines() if e["tool"] == "issue_refund"]) == 1
