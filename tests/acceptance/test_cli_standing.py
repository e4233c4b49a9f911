"""Standing approvals through the command: granted with ``approvals approve --standing``,
listed, shown, granted again for a quorum, revoked; time moved through the clock file."""

from __future__ import annotations

import json
from datetime import timedelta

from tests.helpers import Cli

UP_TO_50 = "args.order_id == 'A-1001' && args.amount_cents <= 5000"


def refund(cli: Cli, amount: str) -> tuple[str, str]:
    """Start a refund of order A-1001; (run id, what the run came to)."""
    done = cli("run", "demo-refund", "--task", f"Refund order A-1001: {amount}",
               "--requested-by", "U_DANA")
    assert done.returncode == 0, done.stderr
    status = done.stderr.strip().splitlines()[-1]
    return done.stdout.strip(), status


def test_grant_use_expire_and_revoke(cli: Cli) -> None:
    run_id, status = refund(cli, "$30")
    assert "awaiting_approval" in status
    [a] = cli.json("approvals", "list", "--json")
    out = cli.ok("approvals", "approve", a["id"], "--as", "U_ALICE", "--standing", "30m",
                 "--scope", "condition", "--when", UP_TO_50)
    assert f"approval {a['id']}: approved by U_ALICE" in out
    assert f"run {run_id}: completed" in out
    [s] = cli.json("standing", "list", "--json")
    assert (s["state"], s["grants"], s["quorum"], s["uses"]) == ("active", ["U_ALICE"], 1, 0)
    assert s["scope"] == f"calls where {UP_TO_50}"
    for amount in ("$20", "$45", "$50"):
        _, status = refund(cli, amount)
        assert "completed" in status  # no card, no waiting
    _, status = refund(cli, "$60")
    assert "awaiting_approval" in status
    shown = cli.json("standing", "show", s["id"], "--json")
    assert shown["uses"] == 3
    audit = [json.loads(x) for x in cli.ok("audit", "export").splitlines()]
    uses = [e for e in audit if e["action"] == "approved" and e["actor"].startswith("standing:")]
    assert [e["details"]["standing_approval"] for e in uses] == [s["id"]] * 3
    assert "audit log OK" in cli.ok("audit", "verify")
    # revoke: the next match asks at once
    assert "revoked by U_BOB after 3 uses" in cli.ok("standing", "revoke", s["id"], "--as",
                                                     "U_BOB", "--reason", "enough")
    _, status = refund(cli, "$10")
    assert "awaiting_approval" in status
    assert cli.json("standing", "list", "--json") == []
    assert [x["state"] for x in cli.json("standing", "list", "--all", "--json")] == ["revoked"]
    again = cli("standing", "revoke", s["id"], "--as", "U_BOB")
    assert again.returncode == 4 and "already revoked" in again.stderr


def test_the_window_runs_out(cli: Cli) -> None:
    refund(cli, "$30")
    [a] = cli.json("approvals", "list", "--json")
    cli.ok("approvals", "approve", a["id"], "--as", "U_ALICE", "--standing", "15m",
           "--scope", "fields", "--fields", "order_id")
    _, status = refund(cli, "$99")
    assert "completed" in status  # the same order, any amount: the scope says so
    cli.advance_time(timedelta(minutes=16))
    _, status = refund(cli, "$5")
    assert "awaiting_approval" in status
    [s] = cli.json("standing", "list", "--all", "--json")
    assert (s["state"], s["uses"]) == ("expired", 1)


def test_bad_grants_change_nothing(cli: Cli) -> None:
    refund(cli, "$30")
    [a] = cli.json("approvals", "list", "--json")
    too_long = cli("approvals", "approve", a["id"], "--as", "U_ALICE", "--standing", "9h")
    assert too_long.returncode == 4 and "lasts 15m to 1h00m" in too_long.stderr
    not_covering = cli("approvals", "approve", a["id"], "--as", "U_ALICE", "--standing", "30m",
                       "--scope", "condition", "--when", "args.amount_cents < 100")
    assert not_covering.returncode == 2
    assert "does not cover the request it is granted on" in not_covering.stderr
    bad = cli("approvals", "approve", a["id"], "--as", "U_ALICE", "--standing", "30m",
              "--scope", "condition", "--when", "args.amount_cents >> 1")
    assert bad.returncode == 2 and "not a valid CEL expression" in bad.stderr
    assert [x["status"] for x in cli.json("approvals", "list", "--json")] == ["pending"]
    assert cli.json("standing", "list", "--all", "--json") == []
