"""One vocabulary of outcomes (issue 48 item 2, design invariant 24): a question about an
approved call the deployed agent cannot run, answered "re-plan" or "abort", is named the
same way by every view (the CLI's list, show, trace and runs show, their JSON documents,
the audit export, the Slack card, App Home's line, the web queue and its mail), never
"approved" or "denied"; and a question's expiry (it has none) is shown the same in
``approvals list`` and ``approvals show``."""

from __future__ import annotations

import asyncio
import json
import textwrap
from typing import Any

import pytest
from approvald.bot.slack import cards
from approvald.bot.web import pages
from approvald.runtime.kernel.vocabulary import WORDS, OutcomeName
from approvald.store.db import Database
from approvald.store.records import ApprovalRecord

from tests.helpers import Cli, Rows

PAYER = '''
from approvald.runtime.runs.agent import Agent
from approvald.runtime.models.scripted import ScriptedModel, assistant_turns, reply
from approvald.runtime.record.state import ToolMessage
from approvald.runtime.policies.tools import tool


def script(messages):
    turn = assistant_turns(messages)
    if isinstance(messages[-1], ToolMessage):
        return reply("Stopped: " + messages[-1].content.get("status", "?"), turn=turn)
    return reply("Paying.", ("{tool}", {{"invoice": "INV-1"}}), turn=turn)


@tool(permission="execute", policy="approve_before")
async def {tool}(invoice: str) -> dict:
    """Pay an invoice."""
    return {{"status": "paid"}}


payer = Agent(name="payer", version="{version}", instructions="Pay the invoice.",
              model=ScriptedModel(script), tools=[{tool}])
'''


@pytest.fixture
def cli(cli: Cli) -> Cli:
    for name, text in (("payer_v1", PAYER.format(tool="pay", version="1")),
                       ("payer_v2", PAYER.format(tool="pay_invoice", version="2"))):
        (cli.workdir / f"{name}.py").write_text(textwrap.dedent(text))
    return cli


def question_answered(cli: Cli, answer: str) -> tuple[str, str]:
    """A run on release 1 paused on ``pay``; release 2 renamed it; the approval of ``pay``
    makes a "cannot run" question, answered ``answer`` by U_ALICE: (run id, question id)."""
    cli.env_extra["APPROVALD_AGENTS"] = "payer_v1"
    run_id = cli.ok("run", "payer", "--task", "Pay INV-1", "--requested-by", "U_DANA").strip()
    [approval_id] = cli.ok("approvals", "list", "--ids", "--run", run_id).split()
    cli.env_extra["APPROVALD_AGENTS"] = "payer_v2"  # the deploy renamed the tool
    cli.ok("approvals", "approve", approval_id, "--as", "U_ALICE", code=3)
    [question] = cli.json("runs", "show", run_id, "--json")["pending"]
    assert question["kind"] == "cannot_run"
    reason = ["--reason", "paid by hand"] if answer == "abort" else []
    out = cli.ok("approvals", "resolve", question["approval_id"], "--as", "U_ALICE",
                 "--outcome", answer, *reason)
    name = {"replan": OutcomeName.REPLANNED, "abort": OutcomeName.ABORTED}[answer]
    assert f"approval {question['approval_id']}: {WORDS[name].words} by U_ALICE" in out
    return run_id, question["approval_id"]


def record(cli: Cli, approval_id: str) -> ApprovalRecord:
    async def read() -> ApprovalRecord:
        db = Database(cli.db_url)
        try:
            a = await Rows(db).approval(approval_id)
        finally:
            await db.close()
        assert a is not None
        return a
    return asyncio.run(read())


def test_list_status_takes_the_outcome_words(cli: Cli) -> None:
    """``approvals list --status`` filters by the outcome every view names (approved,
    approved_with_edits, escalated, ...), never by a raw stored status ("superseded")."""
    started = []
    for n in range(3):
        run_id = cli.ok("run", "demo-refund", "--task", f"Refund order A-10{n}",
                        "--requested-by", "U_DANA").strip()
        [aid] = cli.ok("approvals", "list", "--ids", "--run", run_id).split()
        started.append(aid)
    plain, edited, denied = started
    cli.ok("approvals", "approve", plain, "--as", "U_ALICE", "--no-resume")
    cli.ok("approvals", "edit", edited, "--as", "U_ALICE", "--set", "amount_cents=100",
           "--no-resume")
    cli.ok("approvals", "deny", denied, "--as", "U_ALICE", "--reason", "no", "--no-resume")

    def ids(status: str) -> list[str]:
        return cli.ok("approvals", "list", "--ids", "--status", status).split()

    assert ids("approved") == [plain]
    assert ids("approved_with_edits") == [edited]
    assert ids("denied") == [denied]
    assert ids("pending") == []
    for r in cli.json("approvals", "list", "--status", "approved_with_edits", "--json"):
        assert r["outcome"] == "approved_with_edits"
    refused = cli("approvals", "list", "--status", "superseded")
    assert refused.returncode == 2 and "escalated" in refused.stderr, refused


def texts(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


@pytest.mark.parametrize(("answer", "name", "wrong"), [
    ("replan", OutcomeName.REPLANNED, "approved"),
    ("abort", OutcomeName.ABORTED, "denied"),
])
def test_a_cannot_run_answer_is_named_alike_in_every_view(
        cli: Cli, answer: str, name: OutcomeName, wrong: str) -> None:
    run_id, qid = question_answered(cli, answer)
    said = WORDS[name]

    # approvals list: the outcome's name, and no deadline ("-"), as in show
    [line] = [x for x in cli.ok("approvals", "list", "--all").splitlines() if qid in x]
    assert f" {name.value} " in line and f" {wrong} " not in line
    assert "expires -" in line
    [doc] = [d for d in cli.json("approvals", "list", "--all", "--json") if d["id"] == qid]
    assert doc["outcome"] == name.value and doc["expires_at"] is None
    # --status takes the outcome's word, not the stored status (the question is stored
    # approved or denied): the same words every view shows
    assert qid in cli.ok("approvals", "list", "--ids", "--status", name.value).split()
    assert qid not in cli.ok("approvals", "list", "--ids", "--status", wrong).split()

    # approvals show: the same name and the same missing deadline, text and JSON
    shown = cli.ok("approvals", "show", qid)
    assert f"outcome: {name.value}" in shown and f": {wrong}\n" not in shown
    assert "expires_at: -" in shown
    doc = cli.json("approvals", "show", qid, "--json")
    assert doc["outcome"] == name.value and doc["expires_at"] is None

    # trace: "cannot run pay: re-planned by U_ALICE", never "approved by U_ALICE"
    trace = cli.ok("trace", run_id)
    assert f"cannot run pay: {said.words} by U_ALICE" in trace
    assert f"cannot run pay: {wrong}" not in trace
    [entry] = [e for e in cli.json("trace", run_id, "--json")["entries"]
               if e.get("approval_id") == qid and e["kind"] == "approval"]
    assert entry["outcome"] == name.value

    # runs show: each request's outcome, text and JSON
    assert f"{qid} pay (cannot_run): {name.value}" in cli.ok("runs", "show", run_id)
    [doc] = [d for d in cli.json("runs", "show", run_id, "--json")["approvals"]
             if d["id"] == qid]
    assert doc["outcome"] == name.value

    # the audit export: the answer's entry names the same outcome
    entries = [json.loads(x) for x in cli.ok("audit", "export", "--run", run_id).splitlines()]
    [resolved] = [e for e in entries if e["action"] == "cannot_run_resolved"]
    assert resolved["details"]["outcome"] == name.value

    # Slack: the card's heading and its decision line, App Home's line; the web queue
    # (and the mail that tells the outcome): the same words
    a = record(cli, qid)
    card = cards.approval_card(a, token=None, now=a.requested_at)
    assert card["blocks"][0]["text"]["text"].startswith(said.label)
    assert said.label in texts(card["blocks"]) and said.words in card["text"]
    assert f":{said.emoji}:" in texts(card["blocks"])
    assert said.words in cards.recent_line(a) and wrong not in cards.recent_line(a)
    assert f"was {said.words} by U_ALICE" in pages.outcome_line(a)


def test_the_demo_calls_nobody_was_asked_about_are_audited_and_exported(cli: Cli) -> None:
    """Issue 48 item 1, through the command: the demo's lookup and its customer mail, run
    without asking, each have an ``executed`` entry in the run's export (JSON lines and
    CSV) naming the policy's outcome, as the trace does; every ledger line has one."""
    run_id = cli.ok("run", "demo-refund", "--task", "Refund order A-1001, double charged",
                    "--requested-by", "U_DANA").strip()
    [approval_id] = cli.ok("approvals", "list", "--ids", "--run", run_id).split()
    cli.ok("approvals", "approve", approval_id, "--as", "U_ALICE")
    ran = [e["tool"] for e in cli.ledger_lines()]
    assert ran == ["lookup_order", "issue_refund", "send_customer_email"]
    entries = [json.loads(x) for x in cli.ok("audit", "export", "--run", run_id).splitlines()]
    executed = [e for e in entries if e["action"] == "executed"]
    assert [e["details"]["tool"] for e in executed] == ran
    by_tool = {e["details"]["tool"]: e for e in executed}
    for tool in ("lookup_order", "send_customer_email"):
        e = by_tool[tool]
        assert e["approval_id"] is None and e["details"]["outcome"] == e["details"]["answer"]
    assert by_tool["send_customer_email"]["details"]["outcome"] == OutcomeName.NOTIFY_AFTER
    assert by_tool["issue_refund"]["approval_id"] == approval_id
    rows = cli.ok("audit", "export", "--run", run_id, "--format", "csv").splitlines()
    assert sum(",executed," in r for r in rows) == 3, rows
    trace = cli.json("trace", run_id, "--json")["entries"]
    calls = {e["tool"]: e for e in trace if e["kind"] == "tool_call"}
    assert calls["send_customer_email"]["outcome"] == OutcomeName.NOTIFY_AFTER
    assert calls["issue_refund"]["outcome"] == OutcomeName.APPROVED
    assert "send_customer_email" in cli.ok("runs", "show", run_id)
