"""A deploy never silently breaks a waiting run (issue 38), through the ``approvald``
command with two releases of an agents module: a run paused on a gated ``pay`` call, the
next release renames the tool (or changes its schema), then the approver approves."""

from __future__ import annotations

import json
import sqlite3
import textwrap
from pathlib import Path

import pytest
from approvald.runtime.record.state import SCHEMA_VERSION

from tests.helpers import Cli, make_cli

# processes, browsers or hundreds of schedules: out of the inner loop (-m 'not slow')
pytestmark = pytest.mark.slow

COMMON = '''
import json
from pathlib import Path

from approvald.runtime.runs.agent import Agent
from approvald.runtime.models.scripted import ScriptedModel, assistant_turns, reply
from approvald.runtime.record.state import ToolMessage
from approvald.runtime.policies.tools import tool


def paid(tool_name, **args):
    with Path("payments.jsonl").open("a") as f:
        f.write(json.dumps({"tool": tool_name, **args}) + "\\n")
    return {"status": "paid"}


def script_for(tool_name, args):
    def script(messages):
        turn = assistant_turns(messages)
        last = messages[-1]
        if isinstance(last, ToolMessage):
            if last.content.get("status") == "not_executed" and last.name != tool_name:
                return reply("Paying with the new tool.", (tool_name, args), turn=turn)
            return reply("Done: " + json.dumps(last.content, sort_keys=True), turn=turn)
        return reply("Paying.", (tool_name, args), turn=turn)
    return script
'''

V1 = COMMON + '''

@tool(permission="execute", policy="approve_before", version="1")
async def pay(invoice: str, amount_cents: int) -> dict:
    """Pay an invoice."""
    return paid("pay", invoice=invoice, amount_cents=amount_cents)


payer = Agent(name="payer", version="1", instructions="Pay the invoice.",
              model=ScriptedModel(script_for("pay", {"invoice": "INV-1", "amount_cents": 500})),
              tools=[pay])
'''

# the tool is renamed, and a currency is now required
V2 = COMMON + '''

@tool(permission="execute", policy="approve_before")
async def pay_invoice(invoice: str, amount_cents: int, currency: str) -> dict:
    """Pay an invoice in a currency."""
    return paid("pay_invoice", invoice=invoice, amount_cents=amount_cents, currency=currency)


payer = Agent(name="payer", version="2", instructions="Pay the invoice.",
              model=ScriptedModel(script_for(
                  "pay_invoice", {"invoice": "INV-1", "amount_cents": 500, "currency": "EUR"})),
              tools=[pay_invoice])
'''

# same name, a schema that still accepts the approved arguments, and a release that says
# its code means what version 1 meant (without that, a changed tool is asked about again:
# tests/unit/test_tool_identity.py)
V2_COMPATIBLE = COMMON + '''

@tool(permission="execute", policy="approve_before", version="2", compatible=["1"])
async def pay(invoice: str, amount_cents: int, memo: str = "") -> dict:
    """Pay an invoice."""
    return paid("pay", invoice=invoice, amount_cents=amount_cents, memo=memo)


payer = Agent(name="payer", version="2", instructions="Pay the invoice.",
              model=ScriptedModel(script_for("pay", {"invoice": "INV-1", "amount_cents": 500})),
              tools=[pay])
'''

# same name, a schema that no longer accepts them
V2_STRICTER = COMMON + '''

@tool(permission="execute", policy="approve_before")
async def pay(invoice: str, amount_cents: int, currency: str) -> dict:
    """Pay an invoice."""
    return paid("pay", invoice=invoice, amount_cents=amount_cents, currency=currency)


payer = Agent(name="payer", version="2", instructions="Pay the invoice.",
              model=ScriptedModel(script_for(
                  "pay", {"invoice": "INV-1", "amount_cents": 500, "currency": "EUR"})),
              tools=[pay])
'''

# the new release, with the previous one still registered for the runs started on it
BOTH = '''
from dataclasses import replace

import payer_v1
import payer_v2

AGENTS = [payer_v2.payer, replace(payer_v1.payer, retired=True)]
'''


@pytest.fixture
def cli(sqlite_url: str, tmp_path: Path) -> Cli:
    for name, text in (("payer_v1", V1), ("payer_v2", V2), ("payer_v2c", V2_COMPATIBLE),
                       ("payer_v2s", V2_STRICTER), ("payer_both", BOTH)):
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(text))
    # in this process: APPROVALD_AGENTS modules are found in the working directory and
    # imported afresh for each command, as a new process would (tests/helpers.py)
    c = make_cli(sqlite_url, tmp_path, in_process=True)
    c.env_extra["PYTHONPATH"] = str(tmp_path)
    return c


def payments(cli: Cli) -> list[dict[str, object]]:
    f = cli.workdir / "payments.jsonl"
    return [json.loads(x) for x in f.read_text().splitlines()] if f.exists() else []


def start_on_v1(cli: Cli) -> tuple[str, str]:
    cli.env_extra["APPROVALD_AGENTS"] = "payer_v1"
    done = cli("run", "payer", "--task", "Pay INV-1", "--requested-by", "U_DANA")
    assert done.returncode == 0, done.stderr
    run_id = done.stdout.strip()
    [pending] = cli.json("approvals", "list", "--json")
    assert pending["tool"] == "pay"
    doc = cli.json("runs", "show", run_id, "--json")
    assert doc["agent_version"] == "1"
    return run_id, pending["id"]


def audit_of(cli: Cli, run_id: str) -> list[dict[str, object]]:
    return [json.loads(x) for x in cli.ok("audit", "export", "--run", run_id).splitlines()]


def test_a_removed_tool_is_never_a_silent_done(cli: Cli) -> None:
    run_id, approval_id = start_on_v1(cli)
    cli.env_extra["APPROVALD_AGENTS"] = "payer_v2"

    # before the approval, the pre-deploy check lists the call and fails the pipeline
    check = cli("deploy-check", "--json")
    assert check.returncode == 1, (check.stdout, check.stderr)
    report = json.loads(check.stdout)
    [item] = report["breaks"]
    assert item["run_id"] == run_id and item["approval_id"] == approval_id
    assert item["tool"] == "pay" and "no such tool" in item["reason"]
    text = cli("deploy-check")
    assert text.returncode == 1 and run_id in text.stdout and "no such tool" in text.stdout

    out = cli.ok("approvals", "approve", approval_id, "--as", "U_ALICE", code=3)
    assert f"run {run_id}: needs_attention" in out
    assert payments(cli) == []
    doc = cli.json("runs", "show", run_id, "--json")
    assert doc["status"] == "needs_attention" and doc["result"] is None
    [question] = doc["pending"]
    assert question["kind"] == "cannot_run" and question["tool"] == "pay"
    reason = "approved call `pay` cannot run on agent payer v2: no such tool"
    entries = audit_of(cli, run_id)
    [not_executed] = [e for e in entries if e["action"] == "not_executed"]
    assert not_executed["details"]["reason"] == reason  # type: ignore[index]
    shown = cli.json("approvals", "show", question["approval_id"], "--json")
    assert reason in json.dumps(shown["packet"])

    # the operator hands the model the error: it re-plans and asks again for the new tool
    out = cli.ok("approvals", "resolve", question["approval_id"], "--as", "U_ALICE",
                 "--outcome", "replan")
    assert f"run {run_id}: awaiting_approval" in out
    doc = cli.json("runs", "show", run_id, "--json")
    assert {"role": "tool", "call_id": "call_0_0", "name": "pay",
            "content": {"status": "not_executed", "reason": reason}} in doc["transcript"]
    [again] = doc["pending"]
    assert again["tool"] == "pay_invoice" and again["args"]["currency"] == "EUR"
    cli.ok("approvals", "approve", again["approval_id"], "--as", "U_ALICE")
    assert payments(cli) == [{"tool": "pay_invoice", "invoice": "INV-1", "amount_cents": 500,
                              "currency": "EUR"}]
    assert cli.json("runs", "show", run_id, "--json")["status"] == "completed"
    assert cli("deploy-check").returncode == 0
    assert "audit log OK" in cli.ok("audit", "verify")


def test_abort_ends_the_run(cli: Cli) -> None:
    run_id, approval_id = start_on_v1(cli)
    cli.env_extra["APPROVALD_AGENTS"] = "payer_v2"
    cli.ok("approvals", "approve", approval_id, "--as", "U_ALICE", code=3)
    [question] = cli.json("runs", "show", run_id, "--json")["pending"]
    cli("approvals", "resolve", question["approval_id"], "--as", "U_ALICE", "--outcome",
        "abort", "--reason", "paid by hand")
    doc = cli.json("runs", "show", run_id, "--json")
    assert doc["status"] == "cancelled" and doc["pending"] == []
    assert payments(cli) == []


def test_the_old_version_registered_beside_the_new_one_finishes_its_runs(cli: Cli) -> None:
    run_id, approval_id = start_on_v1(cli)
    cli.env_extra["APPROVALD_AGENTS"] = "payer_both"
    assert cli("deploy-check").returncode == 0
    out = cli.ok("approvals", "approve", approval_id, "--as", "U_ALICE")
    assert f"run {run_id}: completed" in out
    assert payments(cli) == [{"tool": "pay", "invoice": "INV-1", "amount_cents": 500}]
    # a new run uses the new code
    done = cli("run", "payer", "--task", "Pay INV-1", "--requested-by", "U_DANA")
    assert done.returncode == 0, done.stderr
    new_run = done.stdout.strip()
    doc = cli.json("runs", "show", new_run, "--json")
    assert doc["agent_version"] == "2"
    assert [p["tool"] for p in doc["pending"]] == ["pay_invoice"]


def test_a_schema_that_still_accepts_the_arguments_lets_the_call_run(cli: Cli) -> None:
    run_id, approval_id = start_on_v1(cli)
    cli.env_extra["APPROVALD_AGENTS"] = "payer_v2c"
    assert cli("deploy-check").returncode == 0
    out = cli.ok("approvals", "approve", approval_id, "--as", "U_ALICE")
    assert f"run {run_id}: completed" in out
    assert payments(cli) == [{"tool": "pay", "invoice": "INV-1", "amount_cents": 500,
                              "memo": ""}]


def test_a_schema_that_refuses_the_arguments_is_caught(cli: Cli) -> None:
    run_id, approval_id = start_on_v1(cli)
    cli.env_extra["APPROVALD_AGENTS"] = "payer_v2s"
    check = cli("deploy-check", "--json")
    assert check.returncode == 1
    [item] = json.loads(check.stdout)["breaks"]
    assert "currency" in item["reason"]
    out = cli.ok("approvals", "approve", approval_id, "--as", "U_ALICE", code=3)
    assert f"run {run_id}: needs_attention" in out
    assert payments(cli) == []
    [entry] = [e for e in audit_of(cli, run_id) if e["action"] == "not_executed"]
    assert "currency" in entry["details"]["reason"]  # type: ignore[index]


# -- state written by the previous release ---------------------------------------------------

STATE_V2 = Path(__file__).parent.parent / "fixtures" / "state_v2.json"


def rewrite_events(cli: Cli, run_id: str, rows: list[tuple[int, str]]) -> None:
    """Put the run's transcript back as an older (or newer) release wrote it."""
    path = cli.db_url.split("///", 1)[1]
    with sqlite3.connect(path) as conn:
        conn.execute("DELETE FROM run_events WHERE run_id = ?", (run_id,))
        conn.executemany(
            "INSERT INTO run_events (run_id, seq, step, v, body) VALUES (?, ?, ?, ?, ?)",
            [(run_id, i, max(i - 1, 0) // 2 + (1 if i else 0), v, body)
             for i, (v, body) in enumerate(rows)])


def test_a_run_checkpointed_by_the_previous_state_schema_resumes(cli: Cli) -> None:
    doc = json.loads(STATE_V2.read_text())
    assert doc["schema_version"] == 2 == SCHEMA_VERSION - 1  # the release before this one
    done = cli("run", "demo-refund", "--task", doc["task"], "--requested-by", "U_DANA")
    assert done.returncode == 0, done.stderr
    run_id = done.stdout.strip()
    [pending] = cli.json("approvals", "list", "--json")
    rewrite_events(cli, run_id, [(2, json.dumps(m)) for m in doc["messages"]])
    shown = cli.json("runs", "show", run_id, "--json")
    assert [m["role"] for m in shown["transcript"]] == ["user", "assistant", "tool",
                                                        "assistant"]
    out = cli.ok("approvals", "approve", pending["id"], "--as", "U_ALICE")
    assert f"run {run_id}: completed" in out
    assert [e["tool"] for e in cli.ledger_lines()] == ["lookup_order", "issue_refund",
                                                      "send_customer_email"]

    # state from a newer release is refused, in one line, and changes nothing
    rewrite_events(cli, run_id, [(SCHEMA_VERSION + 1, json.dumps(doc["messages"][0]))])
    refused = cli("runs", "show", run_id, "--json")
    assert refused.returncode == 2, (refused.returncode, refused.stderr)
    assert len(refused.stderr.strip().splitlines()) == 1
    assert "newer than this approvald supports" in refused.stderr
