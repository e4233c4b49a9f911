"""Declared sensitive values hold on every path (issue 46 items 2 and 3, issue 48 item 1).

A value the operator's policy (or a tool's code) declares sensitive is masked in whatever
approvald derives from the call, not only in the arguments themselves: the Claude Code
hook's "doing" text quotes the input it gates, and the card, the web queue, the mail and
the CLI documents draw that text. A call the policy runs without asking (``auto``,
``notify_after``, a ``read`` tool) is audited like any other execution, once, with its
declared paths masked, on every face (the agent loop, the HTTP API, an adapter, the MCP
gateway, the hook), and ``approvald trace`` and ``runs show --json`` show it masked.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from approvald.bot import documents
from approvald.bot.claude_code import ClaudeCodeHook
from approvald.bot.mcp.gateway import Gateway, Ran
from approvald.bot.slack import cards
from approvald.bot.web import pages
from approvald.runtime.adapters.gate import Call
from approvald.runtime.engine import Engine
from approvald.runtime.models.scripted import ScriptedModel, reply
from approvald.runtime.policies.policy import PolicyFile
from approvald.runtime.policies.tools import ToolContext, tool
from approvald.runtime.record import sealing
from approvald.runtime.requests import api_tokens
from approvald.runtime.requests.packet import will_run
from approvald.runtime.runs.agent import Agent
from approvald.runtime.runs.external import NewRequest, Report
from approvald.store import types

from tests.helpers import Rows, create_token
from tests.integration.test_claude_code_hook import answer, event, pending

# declared sensitive, and shaped like nothing a detector knows
SECRET = "hunter2-Zq81xLw-vault"
LONG = SECRET + "-" + "k" * 1500  # a value longer than the hook's excerpt (1,200 characters)
KEY = "data-key-one-0123456789abcdef"
POLICY = PolicyFile.model_validate({"tools": {
    "hook:claude-code/Write": {"approvers": ["U_ALICE"], "ttl": "30m",
                               "sensitive": ["args.content"]},
    "hook:claude-code/Bash": {"policy": "auto", "sensitive": ["args.command"]},
    "api:bot/store_secret": {"policy": "auto", "sensitive": ["args.value"]},
    "adapter:support/store_secret": {"policy": "auto", "sensitive": ["args.value"]},
    "mcp:vault/store_secret": {"policy": "auto", "sensitive": ["args.value"]},
}})


def holds(value: Any, secret: str = SECRET) -> list[str]:
    """Where ``value`` (any JSON-like data, or text) holds ``secret`` or a start of it that
    says something (12 characters)."""
    shown = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False,
                                                             default=str)
    needle = secret[:12]
    found, at = [], shown.find(needle)
    while at >= 0:
        found.append(shown[max(0, at - 60):at + 80])
        at = shown.find(needle, at + 1)
    return found


@pytest.fixture
def engine(make_engine: Callable[..., Engine]) -> Engine:
    return make_engine(policy=POLICY)


@pytest.mark.parametrize("content", [SECRET, LONG], ids=["whole", "cut"])
async def test_text_derived_from_a_hooks_input_masks_its_declared_values(
        engine: Engine, content: str) -> None:
    write = {"file_path": "/home/dana/shop/.env", "content": f"{content}\n"}
    ev = event("Write", write)
    verdict, why, _ = answer(await ClaudeCodeHook(engine, ev, requested_by="U_DANA")
                             .pre_tool_use(wait=0))
    assert verdict == "deny" and "was not run" in why  # waiting for a decision
    a = await pending(engine)
    assert a.effective_args() == write  # the request holds the real input
    now = engine.now()
    shown = {
        "packet as stored": json.loads(a.packet),
        "doing": will_run(a).doing,
        "card": cards.approval_card(a, token="t", now=now),
        "compact card": cards.compact_blocks(a, "t", now=now),
        "web queue": pages.request_card(a, csrf="c", token="t", now=now),
        "mail": pages.request_text(a, "https://approvald.example/review/x", slack=True),
        "approvals show --json": documents.approval_document(a),
    }
    assert "writes the file `/home/dana/shop/.env`" in str(shown["doing"])
    for where, value in shown.items():
        assert not holds(value, content), (where, holds(value, content))


async def audit_rows(engine: Engine) -> list[str]:
    """Every audit entry's details as the database holds them."""
    return [str(r[0]) for r in await Rows.of(engine).select(
        "SELECT details FROM audit_log ORDER BY seq")]


async def executions(engine: Engine, run_id: str) -> dict[str, Any]:
    return await Rows.of(engine).executions(run_id)


async def executed_entries(engine: Engine, run_id: str) -> list[dict[str, Any]]:
    return [json.loads(e.details) for e in await Rows.of(engine).audit(run_id=run_id)
            if e.action == "executed"]


async def exported(engine: Engine) -> str:
    return await Rows.of(engine).audit_export()


async def shown_run(engine: Engine, run_id: str) -> dict[str, Any]:
    """``approvald trace --json`` and ``runs show --json`` of ``run_id``."""
    run = await engine.resolve_run(run_id)
    doc = documents.run_document(run, await engine.state(run_id),
                                 await engine.run_approvals(run_id),
                                 await engine.run_masking(run_id))
    return {"trace": (await engine.trace(run_id)).to_document(), "runs show": doc}


async def call_by_face(engine: Engine, face: str) -> str:
    """One call of ``store_secret`` (Bash, for the hook) the policy runs at once, made and
    reported through ``face``; its run id."""
    args = {"name": "db", "value": SECRET}
    if face == "hook":
        bash = {"command": f"vault write secret/db password={SECRET}"}
        hook = ClaudeCodeHook(engine, event("Bash", bash), requested_by="U_DANA")
        assert answer(await hook.pre_tool_use(wait=0))[0] == "allow"
        after = event("Bash", bash, name="PostToolUse",
                      tool_response={"stdout": f"stored {SECRET}"})
        rid = await ClaudeCodeHook(engine, after, requested_by="U_DANA").post_tool_use()
        assert rid is not None
        return rid
    if face == "api":
        made = await create_token(engine, api_tokens.WebhookKeys(
                                  "approvald-test-secret-0123456789"), "bot", created_by="test",
                                  via="test", tools="*")
        doc, _ = await engine.open_request(made.record, NewRequest(
            tool="store_secret", args=args, requested_by="U_DANA",
            packet={"doing": f"stores {SECRET} in the vault"}))
        assert doc["status"] == "approved"
        await engine.report_request(made.record, doc["id"], Report(
            "succeeded", doc["effective_digest"], {"stored": SECRET}))
        return str(doc["id"])
    if face == "adapter":
        gate = engine.approval_gate(name="support")
        call = Call("c-1", "store_secret", args)
        doc = await gate.ask(call, key="k-1", requested_by="U_DANA", framework="test",
                             task=f"keep {SECRET} safe")
        assert doc["status"] == "approved"

        async def run(given: dict[str, Any]) -> dict[str, Any]:
            return {"stored": given["value"]}

        await gate.execute(call, str(doc["id"]), run)
        return str(doc["id"])
    assert face == "mcp"
    gw = Gateway(engine, name="vault", requested_by="U_DANA", server="fake", heartbeat=0.05)

    async def forward(given: dict[str, Any]) -> Ran[str]:
        return Ran(f"stored {given['value']}", "succeeded", {"stored": given["value"]})

    ran = await gw.call("store_secret", args, forward, budget=0)
    assert isinstance(ran, Ran)
    [run] = [r for r in await Rows.of(engine).runs() if r.agent == "external:mcp.vault"]
    return run.id


@pytest.mark.parametrize("face", ["hook", "api", "adapter", "mcp"])
async def test_a_call_nobody_was_asked_about_is_audited_masked_on_every_face(
        engine: Engine, face: str) -> None:
    types.set_codec(sealing.Sealer([sealing.DataKey(KEY)]))
    run_id = await call_by_face(engine, face)
    [done] = await executed_entries(engine, run_id)
    assert done["status"] == "succeeded"
    rows = await audit_rows(engine)
    assert not holds(rows), holds(rows)
    out = await exported(engine)
    assert '"executed"' in out and not holds(out), holds(out)
    shown = await shown_run(engine, run_id)
    assert not holds(shown), holds(shown)
    # the paths the intake resolved are recorded with the call
    [ran] = (await executions(engine, run_id)).values()
    assert ran.sensitive_paths() == (("command",) if face == "hook" else ("value",))


def vault_agent() -> Agent:
    """Looks an account up by its PIN (a read), stores a note (auto) and mails the
    customer (notify after), each with a declared sensitive argument."""

    @tool(permission="read", sensitive=["pin"])
    async def lookup_account(ctx: ToolContext, account: str, pin: str) -> dict[str, Any]:
        """Look an account up."""
        return {"account": account, "checked_with": pin}

    @tool(permission="execute", policy="auto", sensitive=["note"])
    async def store_note(ctx: ToolContext, account: str, note: str) -> str:
        """Keep a note on the account."""
        return f"noted: {note}"

    @tool(permission="execute", policy="notify_after", sensitive=["body"])
    async def mail_customer(ctx: ToolContext, account: str, body: str) -> dict[str, Any]:
        """Mail the customer."""
        return {"sent": True, "body": body}

    return Agent(name="vault", instructions="", tools=[lookup_account, store_note,
                                                        mail_customer],
                 model=ScriptedModel.sequence([
                     reply(None, ("lookup_account", {"account": "AC-1", "pin": SECRET})),
                     reply(None, ("store_note", {"account": "AC-1",
                                                 "note": f"pin is {SECRET}"})),
                     reply(None, ("mail_customer", {"account": "AC-1",
                                                    "body": f"Your code: {SECRET}"})),
                     reply("done", turn=3)]))


async def test_an_agents_read_auto_and_notify_after_calls_are_audited_masked(
        make_engine: Callable[..., Engine]) -> None:
    types.set_codec(sealing.Sealer([sealing.DataKey(KEY)]))
    engine = make_engine(agents=[vault_agent()])
    outcome = await engine.run("vault", "look AC-1 up", requested_by="U_DANA")
    assert outcome.status == "completed", outcome
    done = await executed_entries(engine, outcome.run_id)
    # every execution is audited, once each, under the name the ledger knows it by
    ledger = await executions(engine, outcome.run_id)
    assert sorted(d["idempotency_key"] for d in done) == sorted(
        f"{outcome.run_id}:{c}" for c in ledger)
    assert sorted(d["tool"] for d in done) == ["lookup_account", "mail_customer", "store_note"]
    assert {d["answer"] for d in done} == {"auto", "notify_after"}
    rows = await audit_rows(engine)
    assert not holds(rows), holds(rows)
    shown = await shown_run(engine, outcome.run_id)
    assert not holds(shown), holds(shown)
    assert "[masked]" in json.dumps(shown["trace"])


async def test_the_demo_auto_email_is_audited(make_engine: Callable[..., Engine]) -> None:
    """Issue 48: the demo's notify-after ``send_customer_email`` ran and had no entry."""
    engine = make_engine()
    outcome = await engine.run("demo-refund", "Refund order A-1001", requested_by="U_DANA")
    [aid] = outcome.approval_ids
    from approvald.runtime.approvals.decide import Actor

    await engine.decide(aid, actor=Actor("U_ALICE", "cli"), verdict="approve")
    done = await engine.advance(outcome.run_id)
    assert done.status == "completed", done
    ran = [d["tool"] for d in await executed_entries(engine, outcome.run_id)]
    assert sorted(ran) == ["issue_refund", "lookup_order", "send_customer_email"]
