"""Sealed by schema, masked on every path (issue 46 items 2-4): one scenario through every
face, with a data key set, and nothing secret left in clear anywhere.

``serve`` (in this process, with the Slack emulator, mail on a loopback SMTP server, the
web review queue and an MCP gateway over HTTP in front of a real MCP server subprocess)
sees: the card agent's refund approved in Slack (a card number and a declared
authorisation code in its arguments) and another one mailed to its approvers and approved
on the web queue; an agent whose read, auto and notify-after calls carry a declared
secret; a framework adapter paused on a gated call and resumed; an MCP client with Tasks
whose gated transfer completes after its click, and whose auto call runs at once; Claude
Code's hook asking about a Write (approved) and running an auto Bash command.

Then every table and column of the database as stored, the SQLite file and its
write-ahead log read as bytes, every log record, and what people saw (Slack, the queue,
the mail) hold neither the card number, nor the declared values, nor 12 characters of
them in a row.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from approvald.bot.claude_code import ClaudeCodeHook
from approvald.runtime.adapters.gate import Call

from tests.helpers import Rows, warm_mcp_server
from tests.integration.adapter_helpers import approve_in_slack, pending_request
from tests.integration.slack_harness import Harness, wait_for
from tests.integration.test_claude_code_hook import answer, event
from tests.integration.test_declared_paths import SECRET, holds, vault_agent
from tests.integration.test_mcp_http import rpc, token, url
from tests.integration.test_sealed_at_rest import KEY_1, files_hold_secrets, stored
from tests.integration.test_sensitive_args import (
    AUTH,
    CARD,
    card_agent,
    decide_in_slack,
    ended,
    leaks,
    slack_saw,
)
from tests.integration.web_helpers import Browser, form_fields, smtp_server, web_harness

# serve starts the wrapped MCP server as a process of its own
pytestmark = pytest.mark.slow

POLICY = """
[tools.refund_card]                  # the card agent's tool declares card_number and auth.*
approvers = ["U_ALICE"]
channels = ["slack", "email"]

[tools."hook:claude-code/Write"]
approvers = ["U_ALICE"]
sensitive = ["args.content"]

[tools."hook:claude-code/Bash"]
policy = "auto"
sensitive = ["args.command"]

[tools."mcp:*/transfer_money"]
approvers = ["U_ALICE"]
sensitive = ["args.memo"]

[tools."mcp:*/echo"]
policy = "auto"
sensitive = ["args.text"]

[tools."adapter:*/refund_order"]
approvers = ["U_ALICE"]
sensitive = ["args.note"]
"""


# the agents serve loads from this module (APPROVALD_AGENTS), so that the policy file may
# name their tools (the module serve imports is not the one pytest runs: nothing is shared)
AGENTS = [card_agent([]), vault_agent()]


def secrets_in(value: Any) -> list[str]:
    """Where ``value`` holds the card's digits, the authorisation code or the secret."""
    return leaks(value) + holds(value) + holds(value, AUTH)


def bytes_hold_secrets(db_url: str) -> list[str]:
    """The SQLite file and its WAL, as bytes: the card, the code, the secret."""
    found = files_hold_secrets(db_url)
    if db_url.startswith("sqlite"):
        path = Path(db_url.split("///", 1)[1])
        for f in (path, path.with_name(path.name + "-wal")):
            if f.exists() and SECRET[:12].encode() in f.read_bytes():
                found.append(f"{f.name}: the declared secret")
    return found


async def through_the_card_agent(h: Harness, browser: Browser, inbox: Any) -> list[Any]:
    """A refund approved in Slack, one mailed and approved on the web queue; the pages and
    mails people saw."""
    seen: list[Any] = []
    first = await h.pause_refund(agent="card-refund", task="Refund A-1 please")
    await h.card(first.approval_ids[0])
    await decide_in_slack(h, first.approval_ids[0], "approve")
    await wait_for(lambda: ended(h, first.run_id), what="the Slack-approved refund")
    assert (await h.run(first.run_id)).status == "completed", await h.run(first.run_id)
    second = await h.pause_refund(agent="card-refund", task="Refund A-2 please")
    [aid] = second.approval_ids
    await wait_for(lambda: inbox.to("approvals@example.com"), what="the request's mail")
    await browser.sign_in(inbox, "alice@example.com")
    status, page = await browser.get(f"/review/requests/{aid}")
    assert status == 200 and "refund_card" in page, page
    seen.append(page)
    status, _ = await browser.post(f"/review/requests/{aid}", form_fields(
        page, action=f"/review/requests/{aid}", verdict="approve"))
    assert status == 303
    await wait_for(lambda: ended(h, second.run_id), what="the web-approved refund")
    assert (await h.run(second.run_id)).status == "completed"
    seen += [m.as_string() for m in inbox.messages]
    return seen


async def through_an_agents_auto_calls(h: Harness) -> None:
    outcome = await h.engine.run("vault", "look AC-1 up", requested_by="U_DANA")
    await wait_for(lambda: ended(h, outcome.run_id), what="the vault agent")
    assert (await h.run(outcome.run_id)).status == "completed"


async def through_an_adapter(h: Harness) -> None:
    gate = h.engine.approval_gate(name="support")
    call = Call("call-A-9", "refund_order", {"order": "A-9", "cents": 900,
                                             "note": f"card {CARD}, code {SECRET}"})
    pause = await gate.pause("test", "conv-1", requested_by="U_DANA",
                             state={"messages": [f"refund A-9 to {CARD}"]}, calls=[call],
                             task=f"Refund A-9 ({SECRET})")
    doc = await gate.ask(call, key="conv-1:call-A-9", requested_by="U_DANA",
                         framework="test", task=f"Refund A-9 ({SECRET})")
    await approve_in_slack(h, str(doc["id"]))

    async def run(given: dict[str, Any]) -> str:
        return f"refunded, {given['note']}"

    done = await gate.execute(call, str(doc["id"]), run)
    assert done.result.startswith("refunded")
    await gate.finish(pause.id, {"output": done.result})


async def through_mcp_tasks(h: Harness, http: aiohttp.ClientSession) -> None:
    bearer = await token(h, "dana-agent", face="mcp:bank", requested_by="U_DANA")
    target = url(h.service, "bank")
    echo = await rpc(http, target, bearer, "tools/call",
                     {"name": "echo", "arguments": {"text": f"echo {SECRET}"}})
    assert "result" in echo, echo
    made = await rpc(http, target, bearer, "tools/call", {
        "name": "transfer_money",
        "arguments": {"to": "ACME", "cents": 400, "memo": f"card {CARD} ref {SECRET}"}})
    task = made["result"]
    assert task["resultType"] == "task", made
    await approve_in_slack(h, await pending_request(h))
    done = await rpc(http, target, bearer, "tasks/get", {"taskId": task["taskId"]})
    assert done["result"]["status"] == "completed", done


async def through_the_hook(h: Harness) -> None:
    write = {"file_path": "/home/dana/shop/.env",
             "content": f"DB_PASSWORD={SECRET}\nCARD={CARD}\n"}
    asking = asyncio.ensure_future(
        ClaudeCodeHook(h.engine, event("Write", write), requested_by="U_DANA")
        .pre_tool_use(wait=30))
    await approve_in_slack(h, await pending_request(h))
    assert answer(await asking)[0] == "allow"
    ran = event("Write", write, name="PostToolUse", tool_response={"filePath": ".env"})
    assert await ClaudeCodeHook(h.engine, ran, requested_by="U_DANA").post_tool_use()
    bash = {"command": f"vault write secret/db password={SECRET}"}
    hook = ClaudeCodeHook(h.engine, event("Bash", bash, use="toolu_02"),
                          requested_by="U_DANA")
    assert answer(await hook.pre_tool_use(wait=5))[0] == "allow"
    ran = event("Bash", bash, name="PostToolUse", use="toolu_02",
                tool_response={"stdout": f"stored {SECRET}"})
    assert await ClaudeCodeHook(h.engine, ran, requested_by="U_DANA").post_tool_use()


async def test_no_secret_is_in_clear_anywhere_after_every_face_was_used(
        db_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    caplog.set_level(logging.DEBUG)
    ledger = tmp_path / "transfers.jsonl"  # what the wrapped MCP server really did
    monkeypatch.setenv("MCP_FIXTURE_LEDGER", str(ledger))
    (tmp_path / "policy.toml").write_text(POLICY)
    command = json.dumps(warm_mcp_server())
    (tmp_path / "gateways.toml").write_text(f"[gateways.bank]\ncommand = {command}\nwait = 0\n")
    env = {"APPROVALD_POLICY_FILE": str(tmp_path / "policy.toml"),
           "APPROVALD_MCP_GATEWAYS_FILE": str(tmp_path / "gateways.toml"),
           "APPROVALD_DATA_KEY": KEY_1,
           "APPROVALD_AGENTS": "tests.integration.test_sealed_everywhere"}
    seen: list[Any] = []
    async with smtp_server() as (inbox, smtp_port), \
            web_harness(db_url, tmp_path, smtp_port=smtp_port, **env) as (h, base), \
            aiohttp.ClientSession() as http:
        browser = Browser(base)
        try:
            seen += await through_the_card_agent(h, browser, inbox)
            await through_an_agents_auto_calls(h)
            await through_an_adapter(h)
            await through_mcp_tasks(h, http)
            await through_the_hook(h)
            status, page = await browser.get("/review")
            assert status == 200, page
            seen.append(page)
        finally:
            await browser.close()
        seen += slack_saw(h)
        # every execution has its entry, and no entry quotes a secret
        entries = [e for e in await Rows.of(h.engine).audit()]
        ran = [json.loads(e.details)["tool"] for e in entries if e.action == "executed"]
        assert {"refund_card", "lookup_account", "store_note", "mail_customer",
                "refund_order", "echo", "transfer_money", "Write", "Bash"} <= set(ran), ran
    # the tools had the real values (what the database and the people did not)
    assert holds(ledger.read_text()) and leaks(ledger.read_text())
    assert not secrets_in(seen), secrets_in(seen)
    rows = await stored(db_url)
    assert "$sealed" in rows and not secrets_in(rows), secrets_in(rows)
    assert not bytes_hold_secrets(db_url), bytes_hold_secrets(db_url)
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert len(caplog.records) > 10  # logs were taken
    assert not secrets_in(logged), secrets_in(logged)
