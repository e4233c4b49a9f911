"""``--as`` and ``--requested-by`` take Slack user ids only, in Slack's form, as users type them."""

from __future__ import annotations

import sqlite3
from contextlib import closing

import pytest

from tests.helpers import Cli


def start_refund(cli: Cli, requested_by: str = "U_DANA") -> tuple[str, str]:
    done = cli("run", "demo-refund", "--task", "Refund order A-1001, double charged",
               "--requested-by", requested_by)
    assert done.returncode == 0, done.stderr
    [pending] = cli.json("approvals", "list", "--json")
    return done.stdout.strip(), pending["id"]


def audit_trail(cli: Cli) -> list[tuple[int, str, str]]:
    """The audit log's rows, read straight from the database file."""
    path = cli.db_url.removeprefix("sqlite+aiosqlite:///")
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
        rows = conn.execute("SELECT seq, action, actor FROM audit_log ORDER BY seq").fetchall()
    return [(int(seq), str(action), str(actor)) for seq, action, actor in rows]


def one_line(stderr: str) -> str:
    lines = [x for x in stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def assert_untouched(cli: Cli, run_id: str, approval_id: str,
                     trail: list[tuple[int, str, str]]) -> None:
    shown = cli.json("approvals", "show", approval_id, "--json")
    assert shown["status"] == "pending" and shown["decided_by"] is None
    assert shown["votes"] == [] and shown["edited_args"] is None
    assert audit_trail(cli) == trail
    assert cli.json("runs", "show", run_id, "--json")["status"] == "awaiting_approval"
    assert [e["tool"] for e in cli.ledger_lines()] == ["lookup_order"]


@pytest.mark.parametrize("who", ["", "   ", "<!channel>"])
def test_as_must_be_a_slack_user_id(cli: Cli, who: str) -> None:
    run_id, approval_id = start_refund(cli)
    before = audit_trail(cli)
    done = cli("approvals", "approve", approval_id, "--as", who)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert one_line(done.stderr) == (
        f"--as: {who!r} is not a Slack user id (expected U… or W…, e.g. U024BE7LH)")
    assert done.stdout == ""
    assert_untouched(cli, run_id, approval_id, before)


def test_every_decide_command_checks_as(cli: Cli) -> None:
    run_id, approval_id = start_refund(cli)
    before = audit_trail(cli)
    for command in (["deny", "--reason", "no"],
                    ["edit", "--args", '{"order_id": "A-1001", "amount_cents": 1, "reason": "x"}'],
                    ["resolve", "--outcome", "abort", "--reason", "no"]):
        done = cli("approvals", command[0], approval_id, "--as", "<!channel>", *command[1:])
        assert done.returncode == 2, (command, done.stdout, done.stderr)
        assert one_line(done.stderr).startswith("--as: '<!channel>' is not a Slack user id")
    assert_untouched(cli, run_id, approval_id, before)


def test_as_in_lower_case_is_the_same_person_so_self_approval_is_refused(cli: Cli) -> None:
    _, approval_id = start_refund(cli, requested_by="U_DANA")
    before = audit_trail(cli)
    done = cli("approvals", "approve", approval_id, "--as", "u_dana")
    assert done.returncode == 4, (done.stdout, done.stderr)
    assert "U_DANA started this run and may not approve its calls" in one_line(done.stderr)
    assert cli.json("approvals", "show", approval_id, "--json")["status"] == "pending"
    added = audit_trail(cli)[len(before):]  # a refusal may be audited; a decision may not
    assert not {action for _, action, _ in added} & {"approved", "denied", "voted", "edited"}
    assert [e["tool"] for e in cli.ledger_lines()] == ["lookup_order"]


def test_as_is_normalised_and_recorded_in_slack_form(cli: Cli) -> None:
    run_id, approval_id = start_refund(cli)
    out = cli.ok("approvals", "approve", approval_id, "--as", " u_alice ")
    assert f"approval {approval_id}: approved by U_ALICE" in out
    assert f"run {run_id}: completed" in out
    shown = cli.json("approvals", "show", approval_id, "--json")
    assert shown["status"] == "approved" and shown["decided_by"] == "U_ALICE"
    assert [v["actor"] for v in shown["votes"]] == ["U_ALICE"]
    assert [actor for _, action, actor in audit_trail(cli) if action == "approved"] == [
        "U_ALICE"]


def test_a_pasted_mention_is_the_user_it_mentions(cli: Cli) -> None:
    _, approval_id = start_refund(cli)
    cli.ok("approvals", "approve", approval_id, "--as", "<@U_ALICE|alice>", "--no-resume")
    assert cli.json("approvals", "show", approval_id, "--json")["decided_by"] == "U_ALICE"


@pytest.mark.parametrize("who", ["", "   ", "<!channel>", "cli:dana", "dana"])
def test_requested_by_must_be_a_slack_user_id_when_given(cli: Cli, who: str) -> None:
    done = cli("run", "demo-refund", "--task", "Refund order A-1001", "--requested-by", who)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert one_line(done.stderr) == (
        f"--requested-by: {who!r} is not a Slack user id (expected U… or W…, e.g. U024BE7LH)")
    assert done.stdout == ""
    assert cli.json("runs", "list", "--json") == []
    assert cli.ledger_lines() == []


def test_requested_by_is_normalised_and_defaults_to_the_operator(cli: Cli) -> None:
    run_id, approval_id = start_refund(cli, requested_by="u_dana")
    assert cli.json("runs", "show", run_id, "--json")["requested_by"] == "U_DANA"
    refused = cli("approvals", "approve", approval_id, "--as", "U_DANA")
    assert refused.returncode == 4 and "self" not in refused.stdout
    assert "U_DANA started this run" in refused.stderr
    default = cli("run", "demo-refund", "--task", "Refund order A-1002")
    assert default.returncode == 0, default.stderr
    requested = cli.json("runs", "show", default.stdout.strip(), "--json")["requested_by"]
    assert requested.startswith("cli:")
