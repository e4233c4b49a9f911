"""The HTTP gateway's Tasks extension against a Tasks client nobody here wrote:
``fastmcp-tasks`` (PyPI, the dev extra), whose models parse every task response. Create,
poll, approve, complete; create and cancel; and the -32021 refusal of ``tasks/*`` from a
client that did not declare the extension (the cancel does not cancel)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as types
import pytest
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client

from tests.helpers import Rows
from tests.integration.adapter_helpers import approve_in_slack, pending_request
from tests.integration.slack_harness import harness
from tests.integration.test_mcp_conformance import BIN, REQUIRED, SUITE, _env
from tests.integration.test_mcp_http import (
    files,
    token,
    transfers,
    url,
    wrapped_ledger,  # noqa: F401  (a fixture)
)

pytestmark = pytest.mark.slow


async def test_a_fastmcp_tasks_client_creates_polls_completes_and_cancels(
        db_url: str, tmp_path: Path, ledger: Path) -> None:
    # fastmcp and its Tasks client (docket, redis: about half a second of imports) load in
    # the test that uses them, not in every xdist worker's collection
    from fastmcp import Client as FastMCPClient
    from fastmcp.client.transports import StreamableHttpTransport
    from fastmcp_tasks.client import call_tool_task
    from fastmcp_tasks.client_models import (
        CancelTaskRequest,
        CancelTaskRequestParams,
        ClientGetTaskResult,
        GetTaskRequest,
        GetTaskRequestParams,
    )

    async with harness(db_url, tmp_path, background=False, **files(tmp_path)) as h:
        bearer = await token(h, "dana-agent", face="mcp:bank", requested_by="U_DANA")
        target = url(h.service, "bank")
        transport = StreamableHttpTransport(target, headers={"Authorization": f"Bearer {bearer}"})
        async with FastMCPClient(transport) as client:
            # create: the gated call is a task at once; poll: still working
            task = await call_tool_task(client, "transfer_money", {"to": "ACME", "cents": 10})
            assert task.create_result.status == "working"
            rid = await pending_request(h)
            assert (await task.status()).status == "working" and transfers(ledger) == []
            # approve: the next poll runs the call, once; complete: the server's result
            await approve_in_slack(h, rid)
            done = await task.wait(state="completed", timeout=30)
            assert done.status == "completed", done
            result = await task.result()
            assert not result.is_error and result.data == {"transferred": 10, "to": "ACME"}
            assert transfers(ledger) == [{"to": "ACME", "cents": 10, "memo": ""}]

            # cancel: a task still waiting for its decision is cancelled, nothing runs
            other = await call_tool_task(client, "transfer_money", {"to": "ACME", "cents": 11})
            await pending_request(h)
            await other.cancel()
            assert (await other.status()).status == "cancelled"
            assert len(transfers(ledger)) == 1
            assert next(a.status for a in await Rows.of(h.engine).requests()) == "cancelled"

            # a client without the extension: every tasks/* is -32021, and changes nothing
            third = await call_tool_task(client, "transfer_money", {"to": "ACME", "cents": 12})
            http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {bearer}"}, timeout=30)
            async with http, Client(streamable_http_client(target, http_client=http),
                                    cache=None) as plain:
                for request in (
                        GetTaskRequest(params=GetTaskRequestParams(task_id=third.task_id)),
                        CancelTaskRequest(params=CancelTaskRequestParams(
                            task_id=third.task_id))):
                    with pytest.raises(MCPError) as refused:
                        await plain.session.send_request(request, ClientGetTaskResult)
                    assert refused.value.code == types.MISSING_REQUIRED_CLIENT_CAPABILITY
            assert (await third.status()).status == "working"
            assert next(a.status for a in await Rows.of(h.engine).requests()) == "pending"


async def test_a_typescript_ext_tasks_client_creates_polls_completes_and_cancels(
        db_url: str, tmp_path: Path, ledger: Path) -> None:
    """The same with the TypeScript SDK v2 and ``@modelcontextprotocol/ext-tasks`` (pinned
    in tests/mcp_conformance/, run by tests/mcp_conformance/tasks-client.mjs with the
    pinned Node 22), whose session parses every task response: create, poll, approve
    (here, a click in Slack), complete, cancel, and the -32021 refusal of ``tasks/get``
    and ``tasks/cancel`` from a request that does not declare the extension (the cancel
    cancels nothing). Skipped without the npm packages, failed without them under
    ``APPROVALD_REQUIRE_CONFORMANCE=1``, as the conformance test."""
    node = BIN / "node"
    if not (node.exists() and (SUITE / "node_modules" / "@modelcontextprotocol" /
                               "ext-tasks").exists()):
        reason = ("@modelcontextprotocol/ext-tasks is not installed: npm ci --prefix "
                  "tests/mcp_conformance")
        if REQUIRED:
            pytest.fail(f"{reason} (APPROVALD_REQUIRE_CONFORMANCE=1)")
        pytest.skip(reason)
    async with harness(db_url, tmp_path, background=False, **files(tmp_path)) as h:
        bearer = await token(h, "dana-agent", face="mcp:bank", requested_by="U_DANA")
        proc = await asyncio.create_subprocess_exec(
            str(node), str(SUITE / "tasks-client.mjs"), url(h.service, "bank"), bearer,
            cwd=str(SUITE), env=_env(), stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)
        assert proc.stdout is not None and proc.stderr is not None
        said: dict[str, Any] = {}
        try:
            while "done" not in said:
                line = await asyncio.wait_for(proc.stdout.readline(), 60)
                if not line:
                    break
                step = json.loads(line)
                said[step["step"]] = step
                if step["step"] == "created":  # the call waits: approve it, as a person
                    rid = await pending_request(h)
                    assert transfers(ledger) == []
                    await approve_in_slack(h, rid)
            await asyncio.wait_for(proc.wait(), 60)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        err = (await proc.stderr.read()).decode()
        assert proc.returncode == 0 and "done" in said, (said, err)
        statuses = [a.status for a in await Rows.of(h.engine).requests()]
    assert said["connected"]["era"] == "modern"
    assert said["session"]["capabilities"]["cancellation"] is True
    assert said["created"]["kind"] == "task"
    done = said["completed"]
    assert done["status"] == "completed" and done["seen"][0] == "working", done
    assert done["seen"][-1] == "completed"
    assert done["result"]["structuredContent"] == {"transferred": 10, "to": "ACME"}
    assert transfers(ledger) == [{"to": "ACME", "cents": 10, "memo": ""}]  # ran once
    assert said["cancelled"]["status"] == "cancelled"
    refused = said["refused"]
    assert [r["code"] for r in refused["refusals"]] == [
        types.MISSING_REQUIRED_CLIENT_CAPABILITY] * 2, refused
    assert refused["statusAfter"] == "working"  # the refused cancel cancelled nothing
    # newest first: the second was cancelled, the first ran (the third, refused above, is
    # cancelled by the client itself as it closes its session with that task unsettled)
    assert statuses[1:] == ["cancelled", "approved"]
