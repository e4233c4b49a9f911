"""``approvald trace``, run as a user runs it: text, JSON and HTML timelines of a refund."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from tests.helpers import Cli

EVIL = "<script>window.pwned = 1</script>"


def refund(cli: Cli, verdict: str, *extra: str,
           task: str = "Refund order A-1001, double charged") -> tuple[str, str]:
    done = cli("run", "demo-refund", "--task", task, "--requested-by", "U_DANA")
    assert done.returncode == 0, done.stderr
    run_id = done.stdout.strip()
    [pending] = cli.json("approvals", "list", "--json")
    cli.advance_time(timedelta(minutes=7))
    cli.ok("approvals", verdict, pending["id"], "--as", "U_ALICE", *extra)
    return run_id, pending["id"]


def test_trace_of_an_approved_refund_as_text_and_json(cli: Cli) -> None:
    run_id, approval_id = refund(cli, "approve")
    out = cli.ok("trace", run_id[:8])  # a unique prefix, like the other commands
    assert out.startswith(f"run {run_id}  demo-refund  completed\n")
    assert "issue_refund: approved by U_ALICE  after 7m 0s" in out
    assert f"idempotency key {run_id}:call_1_0" in out
    assert 'args {"order_id": "A-1001", "amount_cents": 4200, "reason": "duplicate charge"}' \
        in out
    assert "model step 1: asks for lookup_order  [ScriptedModel, instructions " in out
    assert "approvals: 1, humans took 7m 0s" in out

    doc = cli.json("trace", run_id, "--json")
    assert doc == cli.json("trace", run_id, "--format", "json")
    assert {"run_id", "agent", "status", "task", "started_at", "ended_at", "totals",
            "entries"} <= set(doc)
    kinds = [e["kind"] for e in doc["entries"]]
    assert kinds.count("model_step") == 4 and kinds.count("tool_call") == 3
    [ask] = [e for e in doc["entries"] if e["kind"] == "approval"]
    assert ask["approval_id"] == approval_id and ask["decided_by"] == "U_ALICE"
    assert ask["wait_ms"] == 420_000.0 and ask["decided_via"].startswith("cli:")
    assert ask["effective_digest"] == ask["digest"] and len(ask["digest"]) == 64
    [executed] = [e for e in doc["entries"] if e["kind"] == "tool_call"
                  and e["tool"] == "issue_refund"]
    assert executed["status"] == "succeeded" and executed["attempts"] == 1
    assert executed["idempotency_key"] == f"{run_id}:call_1_0" and "latency_ms" in executed
    steps = [e for e in doc["entries"] if e["kind"] == "model_step"]
    assert all(s["model"] == "ScriptedModel" and "latency_ms" in s
               and s["instructions_version"] == doc["instructions_version"] for s in steps)


def test_trace_of_a_denied_refund_as_an_html_file(cli: Cli, tmp_path: Path) -> None:
    run_id, _ = refund(cli, "deny", "--reason", f"no {EVIL}", task=f"Refund order A-1 {EVIL}")
    page = tmp_path / "trace.html"
    assert cli.ok("trace", run_id, "--format", "html", "-o", str(page)) == ""
    html = page.read_text()
    assert html.startswith("<!DOCTYPE html>") and "<script" not in html
    assert "no &lt;script&gt;window.pwned = 1&lt;/script&gt;" in html
    assert "issue_refund: denied by U_ALICE" in html
    assert 'data-lane="humans"' in html and 'data-kind="approval"' in html
    assert cli.ok("trace", run_id, "--format", "html") == html  # stdout without -o


@pytest.mark.parametrize(("args", "code", "says"), [
    (("trace", "0" * 32), 2, "approvald: no run " + "0" * 32),
    (("trace", "x", "--format", "pdf"), 2, "invalid choice: 'pdf'"),
    (("trace", "x", "--json", "--format", "html"), 2, "ask for different things"),
])
def test_trace_errors_are_one_line(cli: Cli, args: tuple[str, ...], code: int,
                                   says: str) -> None:
    done = cli(*args)
    assert done.returncode == code and says in done.stderr, done.stderr
    assert done.stderr.strip().count("\n") <= 1 and done.stdout == ""  # (+ the db created)
