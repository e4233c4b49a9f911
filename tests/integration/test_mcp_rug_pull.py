"""An approval of an MCP gateway's call binds the upstream tool's identity (issue 46 item 7):
an upstream server that changes the tool between the approval and the call (a "rug pull")
does not get the old approval applied to the new tool. The ``mcp`` SDK's client starts
``approvald mcp-proxy`` (a real subprocess) wrapping a real MCP server (another one) that
swaps in release 2 of ``transfer_money`` (another input schema and description) when told."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest
from approvald.bot.slack import cards
from approvald.runtime.kernel import binding
from approvald.runtime.policies.tools import ToolIdentity

from tests.helpers import Rows
from tests.integration.adapter_helpers import approve_in_slack, pending_request
from tests.integration.slack_harness import CHANNEL, harness
from tests.integration.test_mcp_gateway import gated, text
from tests.integration.test_mcp_http import (
    files,
    rpc,
    token,
    transfers,
    url,
    wrapped_ledger,  # noqa: F401  (a fixture)
)

pytestmark = pytest.mark.slow


async def test_an_upstream_tool_changed_after_its_approval_does_not_run_and_is_asked_afresh(
        db_url: str, tmp_path: Path) -> None:
    async with gated(db_url, tmp_path) as g:
        release = Path(str(g.ledger) + ".release")
        listed = {t.name: t for t in (await g.client.list_tools()).tools}
        assert "dollars" not in str(listed["transfer_money"].input_schema)

        # unchanged between the approval and the call: it runs, once
        args = {"to": "acct-1", "cents": 500}
        call = asyncio.ensure_future(g.client.call_tool("transfer_money", args))
        a = await g.pending(args)
        # the approval binds the upstream tool's identity: its listed entry's digest
        assert a.tool_version is not None and a.tool_version.startswith("mcp:")
        assert a.tool_schema is not None
        await g.h.slack.click(cards.APPROVE, g.h.value(a), user_id="U_ALICE",
                              channel_id=CHANNEL, message_ts=a.message_ts)
        done = await asyncio.wait_for(call, 30)
        assert not done.is_error, text(done)
        assert g.transfers() == [{"to": "acct-1", "cents": 500, "memo": ""}]

        # asked about under release 1...
        args = {"to": "acct-2", "cents": 700}
        call = asyncio.ensure_future(g.client.call_tool("transfer_money", args))
        b = await g.pending(args)
        assert (b.tool_version, b.tool_schema) == (a.tool_version, a.tool_schema)
        # ...the server swaps in release 2 (700 now means $700), then the approval comes
        await asyncio.to_thread(release.write_text, "2")
        await g.h.slack.click(cards.APPROVE, g.h.value(b), user_id="U_ALICE",
                              channel_id=CHANNEL, message_ts=b.message_ts)
        refused = await asyncio.wait_for(call, 30)
        assert refused.is_error
        said = text(refused)
        assert "transfer_money did not run" in said and "changed" in said, said
        assert "input schema" in said and "asked afresh" in said, said
        assert len(g.transfers()) == 1  # release 2 never ran on release 1's approval
        run = await g.h.run(b.run_id)
        assert run.status == "cancelled"

        # the audit says why, with both identities as bindings (never their digests)
        entries = await asyncio.to_thread(g.audit, b.run_id)
        [closed] = [e for e in entries if e["action"] == "cancelled"]
        details = closed["details"]
        assert details["code"] == "tool_changed" and closed["actor"] == "system:tool-identity"
        approved, current = details["approved_identity"], details["current_identity"]
        b_now = await Rows.of(g.h.engine).approval(b.id)
        assert b_now is not None and b_now.tool_version is not None
        asked = ToolIdentity(b_now.tool_version, str(b_now.tool_schema))
        assert approved == binding.shown(asked.digest()) and current != approved
        assert len(current) == 64
        exported = str(entries)  # no plain digest of either identity leaves the database
        assert asked.digest() not in exported and b_now.tool_version[4:] not in exported
        assert str(b_now.tool_schema) not in exported

        # the same call made again is asked afresh, about release 2, and runs once
        again = asyncio.ensure_future(g.client.call_tool("transfer_money", args))
        c = await g.pending(args)
        assert c.run_id != b.run_id
        assert c.tool_version != b.tool_version and c.tool_schema != b.tool_schema
        await g.h.slack.click(cards.APPROVE, g.h.value(c), user_id="U_ALICE",
                              channel_id=CHANNEL, message_ts=c.message_ts)
        ran = await asyncio.wait_for(again, 30)
        assert not ran.is_error, text(ran)
        assert g.transfers()[1:] == [{"to": "acct-2", "cents": 700, "memo": "", "release": 2}]


async def test_a_task_polled_after_its_tool_changed_completes_with_the_refusal(
        db_url: str, tmp_path: Path, ledger: Path) -> None:
    """The same over Streamable HTTP, collected by a Tasks client's ``tasks/get``."""
    release = Path(str(ledger) + ".release")
    async with harness(db_url, tmp_path, background=False, **files(tmp_path)) as h, \
            aiohttp.ClientSession() as http:
        dana = await token(h, "dana-agent", face="mcp:bank", requested_by="U_DANA")
        target = url(h.service, "bank")
        call = {"name": "transfer_money", "arguments": {"to": "ACME", "cents": 400}}
        made = (await rpc(http, target, dana, "tools/call", call))["result"]
        rid = await pending_request(h)
        await asyncio.to_thread(release.write_text, "2")  # the rug pull, before the click
        await approve_in_slack(h, rid)
        done = (await rpc(http, target, dana, "tasks/get", {"taskId": made["taskId"]}))
        result = done["result"]
        assert result["status"] == "completed" and result["result"]["isError"] is True, done
        said = result["result"]["content"][0]["text"]
        assert "changed the tool since the call was approved" in said, said
        assert transfers(ledger) == []
        assert (await h.run(rid)).status == "cancelled"
        # polled again: still not run, now a cancelled task saying why
        again = (await rpc(http, target, dana, "tasks/get", {"taskId": made["taskId"]}))
        assert again["result"]["status"] == "cancelled", again
        assert "changed since" in again["result"]["statusMessage"] and transfers(ledger) == []

        # the same call made again is asked afresh, and runs once on the tool as it is now
        fresh = (await rpc(http, target, dana, "tools/call", call))["result"]
        assert fresh["taskId"] != made["taskId"]
        rid2 = await pending_request(h)
        assert rid2 != rid
        await approve_in_slack(h, rid2)
        ran = (await rpc(http, target, dana, "tasks/get", {"taskId": fresh["taskId"]}))
        assert ran["result"]["status"] == "completed", ran
        assert ran["result"]["result"]["isError"] is False, ran
        assert transfers(ledger) == [{"to": "ACME", "cents": 400, "memo": "", "release": 2}]
