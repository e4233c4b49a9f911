"""The audit log, the expiry of a decision and cancels, from the ``approvald`` command."""

from __future__ import annotations

import csv
import io
import json
import sqlite3
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import Cli

KEY = "an-audit-key-from-the-vault-0123456789"


@pytest.fixture
def cli(cli: Cli) -> Cli:
    """The shared ``cli`` with an audit key."""
    cli.env_extra["APPROVALD_AUDIT_KEY"] = KEY
    return cli


def pause(cli: Cli, task: str = "Refund order A-1001, double charged") -> tuple[str, str]:
    run_id = cli.ok("run", "demo-refund", "--task", task, "--requested-by", "U_DANA").strip()
    [approval_id] = cli.ok("approvals", "list", "--ids", "--run", run_id).split()
    return run_id, approval_id


def db_path(cli: Cli) -> str:
    return cli.db_url.split("///", 1)[1]


def test_verify_prints_the_head_and_a_recorded_head_proves_the_past(cli: Cli) -> None:
    _, approval_id = pause(cli)
    cli.ok("approvals", "approve", approval_id, "--as", "U_ALICE")
    out = cli.ok("audit", "verify")
    head = out.splitlines()[0].removeprefix("head ")
    # the policy in force (first recorded), the lookup, the request, the approval, the
    # refund and the customer's mail (every execution has its entry)
    assert head.startswith("6:") and len(head) == 2 + 64
    assert "audit log OK: 6 entries, chain intact (keyed)" in out
    pause(cli, "Refund order B-2002")  # the log goes on; the recorded head stays provable
    assert "passes through the recorded head" in cli.ok("audit", "verify", "--expect", head)

    # someone with write access drops the newest entries and moves the head back
    with sqlite3.connect(db_path(cli)) as conn:
        conn.execute("DELETE FROM audit_log WHERE seq > 3")
        seq3 = conn.execute("SELECT hash FROM audit_log WHERE seq = 3").fetchone()[0]
        conn.execute("UPDATE audit_head SET seq = 3, hash = ?", (seq3,))
    # the chain alone cannot tell; the tables can (the approval is in them, not in it)...
    cut = cli("audit", "verify")
    assert cut.returncode == 5 and f"approval {approval_id}: status approved" in cut.stdout
    done = cli("audit", "verify", "--expect", head)
    assert done.returncode == 5  # ...and the recorded head can
    assert "entries 4-6 were deleted" in done.stdout
    bad = cli("audit", "verify", "--expect", "3:zz")
    assert bad.returncode == 2 and "--expect" in bad.stderr


def test_a_forged_decider_is_named_by_verify_and_every_view(cli: Cli) -> None:
    run_id, approval_id = pause(cli)
    cli.ok("approvals", "approve", approval_id, "--as", "U_ALICE")
    with sqlite3.connect(db_path(cli)) as conn:
        conn.execute("UPDATE approvals SET decided_by = 'U_MALLORY' WHERE id = ?",
                     (approval_id,))
    done = cli("audit", "verify")
    assert done.returncode == 5
    assert (f"audit log BROKEN: approval {approval_id}: decided_by U_MALLORY is not the "
            "decider the audit log records (U_ALICE)") in done.stdout
    shown = cli.ok("approvals", "show", approval_id)
    assert "disagrees with the audit log" in shown and "(U_ALICE)" in shown
    assert "disagrees with the audit log" in cli.ok("runs", "show", run_id)
    assert "DISAGREES WITH THE AUDIT LOG" in cli.ok("trace", run_id)


def test_an_export_file_is_verified_by_whoever_holds_it_and_the_key(
        cli: Cli, tmp_path: Path) -> None:
    run_id, approval_id = pause(cli)
    cli.ok("approvals", "approve", approval_id, "--as", "U_ALICE")
    head = cli.ok("audit", "verify").splitlines()[0].removeprefix("head ")
    export = tmp_path / "audit.jsonl"
    done = cli("audit", "export", "-o", str(export))
    assert done.returncode == 0 and done.stderr == ""
    ok = cli("audit", "verify", "--file", str(export), "--expect", head)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ok.stdout.splitlines()[0] == f"head {head}"
    assert "export OK: 6 entries, chain intact (keyed)" in ok.stdout
    assert "passes through the recorded head" in ok.stdout
    # a filtered export: each entry proven, the gaps named
    one = tmp_path / "run.jsonl"
    cli.ok("audit", "export", "--run", run_id, "-o", str(one))
    part = cli("audit", "verify", "--file", str(one))
    assert part.returncode == 0 and "not in this export" in part.stdout, part.stdout
    # without the key: it cannot be verified, which is not "broken"
    keyless = replace(cli, env_extra={})
    for args in (("--file", str(export)), ()):
        unkeyed = keyless("audit", "verify", *args)
        assert unkeyed.returncode == 7, unkeyed.stdout + unkeyed.stderr
        assert "NOT VERIFIED" in unkeyed.stdout and "BROKEN" not in unkeyed.stdout
        assert "no key was given" in unkeyed.stdout
    # an edited line of the file is named
    lines = export.read_text().splitlines()
    row = json.loads(lines[3])
    row["actor"] = "U_MALLORY"
    lines[3] = json.dumps(row)
    forged = tmp_path / "forged.jsonl"
    forged.write_text("\n".join(lines) + "\n")
    bad = cli("audit", "verify", "--file", str(forged))
    assert bad.returncode == 5 and f"entry {row['seq']} (" in bad.stdout and "was edited" \
        in bad.stdout, bad.stdout
    garbage = tmp_path / "audit.csv"
    cli.ok("audit", "export", "--format", "csv", "-o", str(garbage))
    unreadable = cli("audit", "verify", "--file", str(garbage))
    assert unreadable.returncode == 2 and "line 1" in unreadable.stderr


def test_an_exported_binding_is_proven_by_the_export_mac(cli: Cli, tmp_path: Path) -> None:
    """An export shows bindings, never the plain digests its chain MACs cover (invariant
    20); each row's export MAC (recipe v1) proves it, bindings included, with the key: a
    binding swapped or edited in the file is named by ``audit verify --file``."""
    _, approval_id = pause(cli)
    cli.ok("approvals", "approve", approval_id, "--as", "U_ALICE")
    export = tmp_path / "audit.jsonl"
    cli.ok("audit", "export", "-o", str(export))
    rows = [json.loads(x) for x in export.read_text().splitlines()]
    with sqlite3.connect(db_path(cli)) as conn:
        [(plain,)] = conn.execute("SELECT digest FROM approvals WHERE id = ?", (approval_id,))
    text = export.read_text()
    assert plain not in text  # no plain digest of arguments leaves the database
    approved = next(r for r in rows if r["action"] == "approved")
    assert approved["digest"] and approved["digest"] != plain
    assert all(r["export_mac"].startswith("v1:") for r in rows)
    assert cli("audit", "verify", "--file", str(export)).returncode == 0

    def forged(change: Callable[[dict[str, Any]], None]) -> str:
        lines = export.read_text().splitlines()
        i = next(n for n, x in enumerate(lines) if json.loads(x)["action"] == "approved")
        row = json.loads(lines[i])
        change(row)
        lines[i] = json.dumps(row)
        path = tmp_path / "forged.jsonl"
        path.write_text("\n".join(lines) + "\n")
        done = cli("audit", "verify", "--file", str(path))
        assert done.returncode == 5, done.stdout
        return done.stdout

    def other_binding(row: dict[str, Any]) -> None:
        row["digest"] = "0" * 64

    said = forged(other_binding)
    assert f"export BROKEN: entry {approved['seq']} (approved by U_ALICE" in said, said
    assert "export MAC" in said and "bindings" in said, said

    def drop_mac(row: dict[str, Any]) -> None:  # passed off as an old, as-recorded row
        del row["export_mac"]

    assert "carries no export MAC" in forged(drop_mac)


def test_an_export_of_a_log_that_does_not_verify_says_so(cli: Cli, tmp_path: Path) -> None:
    _, approval_id = pause(cli)
    cli.ok("approvals", "approve", approval_id, "--as", "U_ALICE")
    with sqlite3.connect(db_path(cli)) as conn:
        conn.execute("UPDATE approvals SET decided_by = 'U_MALLORY' WHERE id = ?",
                     (approval_id,))
    done = cli("audit", "export", "-o", str(tmp_path / "audit.jsonl"))
    assert done.returncode == 5
    assert "does not verify" in done.stderr and "U_MALLORY" in done.stderr
    assert (tmp_path / "audit.jsonl").read_text().count("\n") == 6  # written all the same


def test_without_the_key_a_rewritten_log_is_broken(cli: Cli) -> None:
    _, approval_id = pause(cli)
    cli.ok("approvals", "approve", approval_id, "--as", "U_ALICE")
    with sqlite3.connect(db_path(cli)) as conn:  # an edit, with the old hash left in place
        conn.execute("UPDATE audit_log SET actor = 'U_MALLORY' WHERE action = 'approved'")
    done = cli("audit", "verify")
    assert done.returncode == 5 and "was edited" in done.stdout
    assert done.stdout.startswith("head 6:")
    wrong_key = cli("audit", "verify", APPROVALD_AUDIT_KEY="not-the-key-0123456789abcdef")
    assert wrong_key.returncode == 5 and "was not given" in wrong_key.stdout


def test_an_expired_request_cannot_be_approved_from_the_cli(cli: Cli, tmp_path: Path) -> None:
    (tmp_path / "policy.toml").write_text('[tools.issue_refund]\nttl = "2s"\nreminders = []\n')
    cli.env_extra["APPROVALD_POLICY_FILE"] = str(tmp_path / "policy.toml")
    run_id, approval_id = pause(cli)
    cli.advance_time(timedelta(seconds=4))  # no sweep runs
    done = cli("approvals", "approve", approval_id, "--as", "U_ALICE")
    assert done.returncode == 4 and "expired" in done.stderr
    doc = cli.json("approvals", "show", approval_id, "--json")
    assert doc["status"] == "expired"
    assert [e for e in cli.ledger_lines() if e["tool"] == "issue_refund"] == []
    cli.ok("recover")
    assert "expired" in cli.json("runs", "show", run_id, "--json")["result"]


def test_cancel_records_who_and_why_and_the_export_neutralises_formulas(cli: Cli) -> None:
    run_id, _ = pause(cli)
    out = cli.ok("runs", "cancel", run_id, "--reason", "=HYPERLINK(\"http://evil\",\"x\")")
    assert f"run {run_id}: cancelled" in out
    doc = cli.json("runs", "show", run_id, "--json")
    assert doc["status"] == "cancelled" and doc["cancel_reason"].startswith("=HYPERLINK")
    assert doc["cancel_requested_by"].startswith("cli:")
    rows = list(csv.DictReader(io.StringIO(cli.ok("audit", "export", "--format", "csv"))))
    cancelled = [r for r in rows if r["action"] == "cancelled"]
    assert cancelled and all(r["reason"].startswith("'=HYPERLINK") for r in cancelled)


def test_a_pinned_digest_refuses_arguments_that_changed(cli: Cli, tmp_path: Path) -> None:
    (tmp_path / "policy.toml").write_text(
        '[tools.issue_refund]\napprovers = ["U_ALICE", "U_BOB"]\nquorum = 2\n')
    cli.env_extra["APPROVALD_POLICY_FILE"] = str(tmp_path / "policy.toml")
    _, approval_id = pause(cli)
    seen = cli.json("approvals", "show", approval_id, "--json")["digest"][:12]
    cli.ok("approvals", "approve", approval_id, "--as", "U_ALICE")
    out = cli.ok("approvals", "edit", approval_id, "--as", "U_BOB", "--args",
                 '{"order_id": "A-1001", "amount_cents": 100, "reason": "partial"}')
    assert "earlier approvals by U_ALICE were on the previous arguments" in out
    refused = cli("approvals", "approve", approval_id, "--as", "U_ALICE", "--digest", seen)
    assert refused.returncode == 4 and "changed" in refused.stderr
    shown = cli.ok("approvals", "show", approval_id)
    assert "does not count" in shown
    done = cli.ok("approvals", "approve", approval_id, "--as", "U_ALICE")
    assert "approved with edits by U_ALICE" in done  # U_BOB's edit: its outcome everywhere
    [refund] = [e for e in cli.ledger_lines() if e["tool"] == "issue_refund"]
    assert refund["args"]["amount_cents"] == 100


@pytest.mark.slow  # starts a process
def test_repeating_a_decision_after_a_crash_says_it_stands_and_resumes_the_run(
        cli: Cli) -> None:
    run_id, approval_id = pause(cli)
    crashed = cli("approvals", "approve", approval_id, "--as", "U_ALICE",
                  failpoints="after_decision")  # committed, then the process died
    assert crashed.returncode == -9
    assert cli.json("runs", "show", run_id, "--json")["status"] == "running"
    again = cli("approvals", "approve", approval_id, "--as", "U_ALICE")
    assert again.returncode == 0, again.stderr
    assert "already approved by U_ALICE" in again.stdout and "stands" in again.stdout
    assert f"run {run_id}: completed" in again.stdout
    assert len([e for e in cli.ledger_lines() if e["tool"] == "issue_refund"]) == 1
    other = cli("approvals", "deny", approval_id, "--as", "U_ALICE", "--reason", "no")
    assert other.returncode == 4  # a different decision is still refused


def test_runs_show_says_why_and_until_when_a_run_waits(cli: Cli, tmp_path: Path) -> None:
    (tmp_path / "flaky.py").write_text('''
from approvald.runtime.runs.agent import Agent
from approvald.runtime.kernel.errors import ModelUnavailable


class Down:
    async def complete(self, **kw):
        raise ModelUnavailable("provider answered HTTP 429: slow down", retry_after=120)


AGENTS = [Agent(name="flaky", instructions="", model=Down(), tools=[])]
''')
    cli.env_extra.update(APPROVALD_AGENTS="flaky", PYTHONPATH=str(tmp_path))
    done = cli("run", "flaky", "--task", "hello")
    assert done.returncode == 6, done.stderr  # not failed: it waits, and serve resumes it
    run_id = done.stdout.strip()
    assert "waiting until" in done.stderr and "429" in done.stderr
    doc = cli.json("runs", "show", run_id, "--json")
    assert doc["status"] == "running" and "429" in doc["waiting"]["reason"]
    assert "waiting until" in cli.ok("runs", "list")
