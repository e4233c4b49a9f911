"""The MCP gateway end to end: the ``mcp`` SDK's client starts ``approvald mcp-proxy`` (a
real subprocess) wrapping a small MCP server (another one), over stdio; an in-process
``serve`` on the same database posts the cards to the Slack emulator and takes signed
clicks; time moves through a clock file both processes read."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from approvald.bot.slack import cards
from approvald.runtime.approvals.decide import Actor
from approvald.runtime.kernel.clock import FileClock
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp_types import CallToolResult, TextContent

from tests.helpers import Cli, InProcessCli, Rows, warm_approvald, warm_mcp_server
from tests.integration.slack_harness import CHANNEL, Harness, harness, wait_for

# each test here starts approvald (or a browser) as a process of its own
pytestmark = pytest.mark.slow

SERVER = Path(__file__).resolve().parent.parent / "fixtures" / "mcp_server.py"
POLICY = """
[tools."mcp:test/echo"]
policy = "auto"

[tools."mcp:test/transfer_money"]
approvers = ["U_ALICE"]
ttl = "30m"

[[tools."mcp:test/transfer_money".rules]]
when = "args.cents > 1000000"
policy = "forbidden"
reason = "Transfers over $10,000 go through the treasury desk."
"""


class Gated:
    """The proxy's world as a test sees it: the client, the side effects, the database."""

    def __init__(self, h: Harness, client: Client, cli: Cli, ledger: Path) -> None:
        self.h, self.client, self.cli, self.ledger = h, client, cli, ledger

    def transfers(self) -> list[dict[str, Any]]:
        """What the wrapped server really did (one line per transfer_money that ran)."""
        if not self.ledger.exists():
            return []
        return [json.loads(line) for line in self.ledger.read_text().splitlines()]

    async def requests(self, tool: str = "transfer_money") -> list[Any]:
        runs = [r for r in await Rows.of(self.h.engine).runs() if r.agent == "external:mcp.test"]
        found = []
        for r in runs:
            rec = await Rows.of(self.h.engine).external(r.id)
            if rec is not None and rec.tool == tool:
                found.append(rec)
        return found

    async def pending(self, args: dict[str, Any]) -> Any:
        """The approval a gated call of transfer_money with ``args`` waits on, once its
        card is posted."""
        async def opened() -> Any:
            for a in await Rows.of(self.h.engine).requests(status="pending"):
                if a.tool == "transfer_money" and a.effective_args() == args:
                    return a
            return None

        a = await wait_for(opened, within=30, what=f"a request for {args}")
        await self.h.card(a.id)  # serve's drain posts it
        return await self.h.approval(a.id)

    def audit(self, run_id: str) -> list[dict[str, Any]]:
        done = self.cli("audit", "export", "--run", run_id)
        assert done.returncode == 0, done.stderr
        return [json.loads(line) for line in done.stdout.splitlines()]


def text(result: CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, TextContent))


@asynccontextmanager
async def gated(db_url: str, tmp_path: Path) -> AsyncIterator[Gated]:
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    # the proxy is a process of its own (its command line below); the test's own commands
    # (audit export, tokens revoke) run in this one
    cli = InProcessCli(db_url, tmp_path, {"APPROVALD_POLICY_FILE": str(policy)})
    ledger = tmp_path / "transfers.jsonl"
    params = StdioServerParameters(
        command=warm_approvald(),
        args=["mcp-proxy", "--name", "test", "--requested-by", "U_DANA", "--",
              *warm_mcp_server()],
        env=cli.env(MCP_FIXTURE_LEDGER=str(ledger)), cwd=str(tmp_path))
    errlog = tmp_path / "mcp-proxy.stderr"
    # serve and the proxy read one clock file (wall-clock time until a test writes it)
    async with harness(db_url, tmp_path, clock=FileClock(str(cli.clock_file)),
                       APPROVALD_POLICY_FILE=str(policy)) as h:
        with errlog.open("w") as err:
            try:
                async with Client(stdio_client(params, errlog=err), cache=None,
                                  read_timeout_seconds=60) as client:
                    yield Gated(h, client, cli, ledger)
            finally:
                err.flush()
                sys.stderr.write(errlog.read_text())  # shown when a test fails


async def test_tools_pass_through_and_a_gated_call_waits_for_an_approve_click(
        db_url: str, tmp_path: Path) -> None:
    async with gated(db_url, tmp_path) as g:
        listed = {t.name: t for t in (await g.client.list_tools()).tools}
        assert set(listed) == {"echo", "transfer_money", "lookup_order", "monthly_report",
                               "capabilities", "ask_the_model", "confirm_payment",
                               "my_roots"}
        schema = listed["transfer_money"].input_schema
        assert schema["properties"]["cents"]["type"] == "integer"
        assert set(schema["required"]) == {"to", "cents"}

        # the ungated tool answers at once (the policy file says auto)
        echoed = await asyncio.wait_for(g.client.call_tool("echo", {"text": "hi"}), 20)
        assert not echoed.is_error and text(echoed) == "hi"

        # a gated call waits for the decision...
        args = {"to": "acct-1", "cents": 500}
        waits: list[str] = []

        async def progress(_done: float, _total: float | None, message: str | None) -> None:
            waits.append(message or "")

        first = asyncio.ensure_future(g.client.call_tool("transfer_money", args))
        a = await g.pending(args)
        assert not first.done() and g.transfers() == []
        # ...and the same call again while it waits joins its request: no second card
        again = asyncio.ensure_future(g.client.call_tool("transfer_money", args,
                                                         progress_callback=progress))
        await wait_for(lambda: waits, within=30, what="the retry to wait")
        assert "on its card in Slack (channel" in waits[0] and a.run_id in waits[0]
        assert len(await g.requests()) == 1 and not again.done()

        # a signed Approve click from Slack: the call runs once, both callers get its result
        await g.h.slack.click(cards.APPROVE, g.h.value(a), user_id="U_ALICE",
                              channel_id=CHANNEL, message_ts=a.message_ts)
        results = await asyncio.wait_for(asyncio.gather(first, again), 30)
        for r in results:
            assert not r.is_error, text(r)
            assert r.structured_content == {"transferred": 500, "to": "acct-1"}
        assert g.transfers() == [{"to": "acct-1", "cents": 500, "memo": ""}]

        # the audit export: requested -> approved -> executed, with the exact arguments
        entries = await asyncio.to_thread(g.audit, a.run_id)
        actions = [e["action"] for e in entries]
        assert actions == ["requested", "approved", "executed"], actions
        assert all(e["args"] == args for e in entries)
        assert entries[0]["actor"] == "agent:external:mcp.test"
        assert entries[1]["actor"] == "U_ALICE" and entries[1]["via"] == "slack"
        executed = entries[2]
        assert executed["via"] == "mcp" and executed["details"]["status"] == "succeeded"
        assert executed["details"]["result"]["structuredContent"] == {"transferred": 500,
                                                                      "to": "acct-1"}
        assert executed["details"]["idempotency_key"] == f"{a.run_id}:call"
        run = await g.h.run(a.run_id)
        assert run.status == "completed" and run.requested_by == "U_DANA"

        # once it has run, the same call again is a new request, asked about again
        later = asyncio.ensure_future(g.client.call_tool("transfer_money", args))
        b = await g.pending(args)
        assert b.run_id != a.run_id and len(await g.requests()) == 2
        await g.h.slack.click(cards.APPROVE, g.h.value(b), user_id="U_ALICE",
                              channel_id=CHANNEL, message_ts=b.message_ts)
        assert not (await asyncio.wait_for(later, 30)).is_error
        assert len(g.transfers()) == 2


async def test_deny_edit_forbid_and_expiry_reach_the_client(db_url: str,
                                                             tmp_path: Path) -> None:
    async with gated(db_url, tmp_path) as g:
        # a rule forbids it: the rule's reason at once, nothing asked, nothing run
        forbidden = await asyncio.wait_for(
            g.client.call_tool("transfer_money", {"to": "acct-9", "cents": 2_000_000}), 20)
        assert forbidden.is_error
        assert "Transfers over $10,000 go through the treasury desk." in text(forbidden)
        assert await Rows.of(g.h.engine).requests(status="pending") == []

        # denied in Slack, with a reason: a tool error carrying it, nothing ran
        denied_args = {"to": "acct-2", "cents": 700}
        call = asyncio.ensure_future(g.client.call_tool("transfer_money", denied_args))
        a = await g.pending(denied_args)
        await g.h.slack.click(cards.DENY, g.h.value(a), user_id="U_ALICE", channel_id=CHANNEL,
                              message_ts=a.message_ts)
        await wait_for(lambda: g.h.emulator.views(callback_id=cards.DENY_MODAL),
                       what="the deny modal")
        await g.h.slack.submit_view(cards.DENY_MODAL,
                                    {"reason": {"reason_input": "Not this vendor"}},
                                    user_id="U_ALICE")
        denied = await asyncio.wait_for(call, 30)
        assert denied.is_error
        assert "denied by U_ALICE: Not this vendor" in text(denied)
        assert a.run_id in text(denied)

        # edited in Slack (the edit approves): it runs with the edited arguments
        asked = {"to": "acct-3", "cents": 900}
        call = asyncio.ensure_future(g.client.call_tool("transfer_money", asked))
        a = await g.pending(asked)
        await g.h.slack.click(cards.EDIT, g.h.value(a), user_id="U_ALICE", channel_id=CHANNEL,
                              message_ts=a.message_ts)
        await wait_for(lambda: g.h.emulator.views(callback_id=cards.EDIT_MODAL),
                       what="the edit modal")
        edited = {"to": "acct-3", "cents": 800}
        resp = await g.h.slack.submit_view(cards.EDIT_MODAL,
                                           {"args": {"args_input": json.dumps(edited)}},
                                           user_id="U_ALICE")
        assert resp.status == 200
        ran = await asyncio.wait_for(call, 30)
        assert not ran.is_error and ran.structured_content == {"transferred": 800,
                                                               "to": "acct-3"}
        assert g.transfers() == [{"to": "acct-3", "cents": 800, "memo": ""}]
        entries = await asyncio.to_thread(g.audit, a.run_id)
        assert [e["action"] for e in entries] == ["requested", "edited", "approved",
                                                  "executed"]
        assert entries[0]["args"] == asked and entries[-1]["args"] == edited

        # silence: past the 30 minutes the sweep expires it; a tool error, nothing ran
        quiet = {"to": "acct-4", "cents": 100}
        call = asyncio.ensure_future(g.client.call_tool("transfer_money", quiet))
        a = await g.pending(quiet)
        assert a.expires_at is not None
        later = max(a.expires_at, datetime.now(UTC)) + timedelta(minutes=1)
        g.cli.set_time(later)
        await g.h.engine.sweep()
        expired = await asyncio.wait_for(call, 30)
        assert expired.is_error and "expired unanswered" in text(expired)
        assert len(g.transfers()) == 1


async def test_a_revoked_gateway_lets_nothing_through(sqlite_url: str,
                                                      tmp_path: Path) -> None:
    async with gated(sqlite_url, tmp_path) as g:
        assert not (await g.client.call_tool("echo", {"text": "on"})).is_error
        done = await asyncio.to_thread(g.cli, "tokens", "revoke", "mcp.test")
        assert done.returncode == 0, done.stderr
        off = await asyncio.wait_for(
            g.client.call_tool("transfer_money", {"to": "acct-5", "cents": 1}), 20)
        assert off.is_error and "switched off" in text(off)
        assert g.transfers() == []


def test_mcp_proxy_needs_a_server_to_launch(sqlite_url: str, tmp_path: Path) -> None:
    done = Cli(sqlite_url, tmp_path)("mcp-proxy", "--name", "x")
    assert done.returncode == 2 and "after --" in done.stderr
    done = Cli(sqlite_url, tmp_path)("mcp-proxy", "--name", "Not A Name", "--", "true")
    assert done.returncode == 2 and "token name" in done.stderr



async def test_a_tool_the_file_does_not_name_is_asked_about_whatever_agents_have(
        db_url: str, tmp_path: Path) -> None:
    async with gated(db_url, tmp_path) as g:
        # approvald's demo agent has a read tool named lookup_order, which runs unasked for
        # it; the wrapped server's lookup_order is another source's tool, and the policy
        # file does not name mcp:test/lookup_order: it is asked about
        call = asyncio.ensure_future(g.client.call_tool("lookup_order", {"order_id": "A-1"}))

        async def opened() -> Any:
            found = [a for a in await Rows.of(g.h.engine).requests(status="pending")
                     if a.tool == "lookup_order"]
            return found[0] if found else None

        a = await wait_for(opened, within=30, what="a request for lookup_order")
        lookups = Path(str(g.ledger) + ".lookups")
        assert not call.done() and not await asyncio.to_thread(lookups.exists)
        await g.h.engine.decide(a.id, actor=Actor("U_ALICE", "slack"), verdict="deny",
                                reason="not from this client")
        denied = await asyncio.wait_for(call, 30)
        assert denied.is_error and "not from this client" in text(denied)
        assert not await asyncio.to_thread(lookups.exists)


def test_a_rule_that_fails_on_every_call_stops_the_proxy_at_start(sqlite_url: str,
                                                                   tmp_path: Path) -> None:
    # checked against the wrapped server's inputSchema for transfer_money (cents: integer);
    # before, the proxy started and every call of transfer_money was forbidden
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY.replace("args.cents > 1000000", "args.cents > '1000000'"))
    cli = Cli(sqlite_url, tmp_path, {"APPROVALD_POLICY_FILE": str(policy)})
    done = cli("mcp-proxy", "--name", "test", "--", sys.executable, str(SERVER),
               MCP_FIXTURE_LEDGER=str(tmp_path / "transfers.jsonl"))
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line == (f"approvald: APPROVALD_POLICY_FILE: {policy}: "
                    "tools.mcp:test/transfer_money.rules[0].when: args.cents > '1000000': > is not "
                    "defined for an integer (args.cents) and a string ('1000000')")
