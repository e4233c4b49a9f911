"""Crash tests: real ``approvald`` processes SIGKILLed at each durability boundary.

After ``approvald recover`` every run completes, no step is lost, and the demo ledger
(the outside world's own record) shows each side effect exactly once.
"""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

import pytest

from tests.helpers import Cli, Rows, make_cli

# processes, browsers or hundreds of schedules: out of the inner loop (-m 'not slow')
pytestmark = pytest.mark.slow

KILLED = -signal.SIGKILL


@pytest.fixture
def cli(db_url: str, tmp_path: Path) -> Cli:
    return make_cli(db_url, tmp_path, in_process=True)  # a failpoint's call: a subprocess


def assert_ticks_once(cli: Cli, run_id: str, n: int) -> None:
    doc = cli.json("runs", "show", run_id, "--json")
    assert doc["status"] == "completed", doc
    assert doc["result"] == f"Ticked {n} times."
    calls = [c["arguments"]["i"] for m in doc["transcript"] if m["role"] == "assistant"
             for c in m.get("tool_calls", [])]
    results = [m["content"]["i"] for m in doc["transcript"] if m["role"] == "tool"]
    assert calls == results == list(range(n))  # no step lost, none repeated
    ticks = [e["args"]["i"] for e in cli.ledger_lines() if e["tool"] == "tick"]
    assert ticks == list(range(n))  # each side effect exactly once


@pytest.mark.parametrize("point", ["mid_model_call", "after_intent", "before_result",
                                   "after_result", "before_checkpoint", "after_checkpoint"])
def test_sigkill_at_each_boundary_then_recover(cli: Cli, point: str) -> None:
    done = cli("run", "demo-steps", "--task", "5", failpoints=f"{point}@3")
    assert done.returncode == KILLED, done.stderr
    run_id = done.stdout.strip()
    doc = cli.json("runs", "show", run_id, "--json")
    assert doc["status"] == "running" and doc["step"] in (2, 3)
    recovered = cli("recover")
    assert recovered.returncode == 0, recovered.stderr
    assert f"run {run_id}: completed" in recovered.stdout
    assert_ticks_once(cli, run_id, 5)


def test_a_second_recover_finds_nothing_to_do(cli: Cli) -> None:
    done = cli("run", "demo-steps", "--task", "3", failpoints="after_result@2")
    assert done.returncode == KILLED, done.stderr  # the failpoint fired: there is a crash
    run_id = done.stdout.strip()
    cli.ok("recover")
    assert "recovered 0 run(s)" in cli("recover").stderr
    assert_ticks_once(cli, run_id, 3)


def test_two_recover_processes_race_and_each_run_advances_once(cli: Cli) -> None:
    runs = []
    for _ in range(6):
        done = cli("run", "demo-steps", "--task", "4", failpoints="before_checkpoint@2")
        assert done.returncode == KILLED
        runs.append(done.stdout.strip())
    procs = [cli.spawn("recover") for _ in range(2)]
    for p in procs:
        p.communicate(timeout=60)
        assert p.returncode == 0
    for run_id in runs:
        doc = cli.json("runs", "show", run_id, "--json")
        assert doc["status"] == "completed"
    by_run: dict[str, list[int]] = {}
    for e in cli.ledger_lines():
        by_run.setdefault(e["idempotency_key"].split(":")[0], []).append(e["args"]["i"])
    assert by_run == {r: [0, 1, 2, 3] for r in runs}


def pause_refund(cli: Cli) -> tuple[str, str]:
    run_id = cli.ok("run", "demo-refund", "--task", "Refund order A-1001",
                    "--requested-by", "U_DANA").strip()
    [approval] = cli.json("approvals", "list", "--json")
    return run_id, approval["id"]


def refunds(cli: Cli) -> list[dict[str, object]]:
    return [e for e in cli.ledger_lines() if e["tool"] == "issue_refund"]


@pytest.mark.parametrize("point", ["after_decision", "after_intent", "before_result",
                                   "after_result", "before_checkpoint"])
def test_crash_after_approving_refund_runs_exactly_once(cli: Cli, point: str) -> None:
    run_id, approval_id = pause_refund(cli)
    done = cli("approvals", "approve", approval_id, "--as", "U_ALICE", failpoints=point)
    assert done.returncode == KILLED, (done.stdout, done.stderr)
    recovered = cli("recover")
    assert recovered.returncode == 0, recovered.stderr
    doc = cli.json("runs", "show", run_id, "--json")
    assert doc["status"] == "completed" and "was issued" in doc["result"]
    assert len(refunds(cli)) == 1
    assert [e["tool"] for e in cli.ledger_lines()] == ["lookup_order", "issue_refund",
                                                      "send_customer_email"]
    approval = cli.json("approvals", "show", approval_id, "--json")
    assert approval["status"] == "approved" and approval["decided_by"] == "U_ALICE"


def test_a_double_approve_after_a_crash_is_refused(cli: Cli) -> None:
    _run_id, approval_id = pause_refund(cli)
    crashed = cli("approvals", "approve", approval_id, "--as", "U_ALICE",
                  failpoints="after_decision")
    assert crashed.returncode == KILLED, crashed.stderr  # died after committing, not before
    again = cli("approvals", "approve", approval_id, "--as", "U_BOB")
    assert again.returncode == 4 and "already approved by U_ALICE" in again.stderr
    cli.ok("recover")
    assert len(refunds(cli)) == 1


def test_unknown_outcome_of_a_non_idempotent_tool_is_reported_not_rerun(cli: Cli) -> None:
    """send_customer_email has no reconcile hook: a human must say what happened."""
    run_id, approval_id = pause_refund(cli)
    done = cli("approvals", "approve", approval_id, "--as", "U_ALICE",
               failpoints="before_result@2")  # 1st result: the refund; 2nd: the email
    assert done.returncode == KILLED
    recovered = cli("recover")
    assert recovered.returncode == 3, recovered.stdout
    assert f"run {run_id}: needs_attention" in recovered.stdout
    doc = cli.json("runs", "show", run_id, "--json")
    assert doc["status"] == "needs_attention"
    [question] = doc["pending"]
    assert question["kind"] == "outcome_unknown" and question["tool"] == "send_customer_email"
    emails = [e for e in cli.ledger_lines() if e["tool"] == "send_customer_email"]
    assert len(emails) == 1  # it did happen; nobody re-ran it
    assert "1 need attention" in cli("recover").stderr  # reported again, still not re-run
    answered = cli("approvals", "resolve", question["approval_id"], "--as", "U_ALICE",
                   "--outcome", "mark_done", "--reason", "customer confirmed the email")
    assert answered.returncode == 0, answered.stderr
    doc = cli.json("runs", "show", run_id, "--json")
    assert doc["status"] == "completed"
    assert len([e for e in cli.ledger_lines() if e["tool"] == "send_customer_email"]) == 1
    assert len(refunds(cli)) == 1
    trail = [json.loads(x)["action"] for x in cli.ok("audit", "export", "--run", run_id)
             .splitlines()]
    assert "outcome_unknown" in trail and "outcome_resolved" in trail


def test_crash_between_request_commit_and_delivery_delivers_once(cli: Cli, db_url: str) -> None:
    done = cli("run", "demo-refund", "--task", "Refund order A-1001", "--requested-by", "U_DANA",
               failpoints="after_commit_before_post")
    assert done.returncode == KILLED
    [approval] = cli.json("approvals", "list", "--json")

    async def drain_twice() -> list[int]:
        from approvald.runtime.engine import assemble
        from approvald.runtime.runs.agent import Registry
        from approvald.store.db import Database

        class Recorder:
            def __init__(self) -> None:
                self.rows: list[int] = []

            async def deliver(self, row):  # type: ignore[no-untyped-def]
                self.rows.append(row.id)
                return {"ok": True}

        db = Database(db_url)
        rec = Recorder()
        drain = assemble(db, Registry()).drain(rec)
        await drain.drain_once()
        await drain.drain_once()
        rows = await Rows(db).outbox()
        await db.close()
        assert [(r.kind, r.status, r.attempts) for r in rows] == [
            ("approval.requested", "delivered", 1)]
        assert json.loads(rows[0].payload)["approval_id"] == approval["id"]
        return rec.rows

    assert len(asyncio.run(drain_twice())) == 1
