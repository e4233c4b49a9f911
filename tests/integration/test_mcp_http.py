"""The MCP gateway over Streamable HTTP (issue 39): ``serve`` mounts ``/mcp/<name>`` in
front of a small MCP server it starts (a real subprocess), the ``mcp`` SDK's client calls
it over HTTP with a bearer token made for that gateway, and decisions are signed Slack
clicks and modal submissions through the emulator."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import httpx2
import pytest
from approvald.bot.api.service import webhook_keys
from approvald.bot.config import Settings
from approvald.bot.serve import Service
from approvald.bot.wiring import open_database
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult, TextContent

from tests.helpers import Rows, create_token, warm_mcp_server
from tests.integration.adapter_helpers import (
    approve_in_slack,
    deny_in_slack,
    pending_request,
)
from tests.integration.slack_harness import Harness, harness, settings_for

# serve starts the wrapped MCP server as a process of its own
pytestmark = pytest.mark.slow

SERVER = Path(__file__).resolve().parent.parent / "fixtures" / "mcp_server.py"
POLICY = """
[tools."mcp:*/echo"]
policy = "auto"

[tools."mcp:*/transfer_money"]
approvers = ["U_ALICE"]
ttl = "30m"

[[tools."mcp:*/transfer_money".rules]]   # the server does not say so: still asked
when = "has(annotations.readOnlyHint) && annotations.readOnlyHint"
policy = "auto"

[tools."mcp:*/lookup_order"]
approvers = ["U_ALICE"]

[[tools."mcp:*/lookup_order".rules]]     # the operator trusts this server's read-only hint
when = "has(annotations.readOnlyHint) && annotations.readOnlyHint"
policy = "auto"
"""


def files(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "policy.toml").write_text(POLICY)
    command = json.dumps(warm_mcp_server())
    (tmp_path / "gateways.toml").write_text(
        f"[gateways.bank]\ncommand = {command}\nwait = 30\n"
        f"allowed_origins = [\"https://ops.example\"]\n\n"
        f"[gateways.quick]\ncommand = {command}\nwait = 0\n")
    return {"APPROVALD_POLICY_FILE": str(tmp_path / "policy.toml"),
            "APPROVALD_MCP_GATEWAYS_FILE": str(tmp_path / "gateways.toml")}


async def token(h: Harness, name: str, **scope: Any) -> str:
    keys = webhook_keys(h.service.settings)
    assert keys is not None
    made = await create_token(h.engine, keys, name,
                              created_by="test", via="test", **scope)
    return made.token


def url(service: Service, gateway: str) -> str:
    assert service.slack is not None
    return f"http://127.0.0.1:{service.slack.port}/mcp/{gateway}"


@asynccontextmanager
async def client(target: str, bearer: str) -> AsyncIterator[Client]:
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {bearer}"}, timeout=60)
    async with http, Client(streamable_http_client(target, http_client=http),
                            cache=None) as c:
        yield c


def text(result: CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, TextContent))


def transfers(ledger: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in ledger.read_text().splitlines()] if ledger.exists() else []




def bank_gateway(tmp_path: Path, policy: str, *, command: list[str] | None = None,
                 upstream: str | None = None) -> dict[str, str]:
    """``serve``'s one gateway, ``bank``, in front of the fixture server: started by
    ``command`` (by default the fixture server over stdio) or reached at ``upstream`` (a
    URL), with ``policy`` as the operator's policy file; the environment naming both."""
    where = f'url = "{upstream}"' if upstream else \
        f"command = {json.dumps(command or warm_mcp_server())}"
    (tmp_path / "policy.toml").write_text(policy)
    (tmp_path / "gateways.toml").write_text(f"[gateways.bank]\n{where}\nwait = 30\n")
    return {"APPROVALD_POLICY_FILE": str(tmp_path / "policy.toml"),
            "APPROVALD_MCP_GATEWAYS_FILE": str(tmp_path / "gateways.toml")}


@pytest.fixture(name="ledger")
def wrapped_ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The fixture server's ledger of transfers (and reads), in the wrapped server's
    environment: the ``ledger`` fixture of every MCP test module (import this)."""
    path = tmp_path / "transfers.jsonl"
    monkeypatch.setenv("MCP_FIXTURE_LEDGER", str(path))  # the wrapped server's environment
    return path


async def test_a_remote_client_is_gated_by_slack_over_streamable_http(
        db_url: str, tmp_path: Path, ledger: Path) -> None:
    async with harness(db_url, tmp_path, background=False, **files(tmp_path)) as h:
        bearer = await token(h, "dana-agent", face="mcp:bank", requested_by="U_DANA")
        assert "/mcp/bank (the MCP gateway bank" in h.service.describe()
        async with client(url(h.service, "bank"), bearer) as c:
            listed = {t.name for t in (await c.list_tools()).tools}
            assert {"echo", "transfer_money"} <= listed
            # an ungated tool answers at once
            said = await c.call_tool("echo", {"text": "hi"})
            assert not said.is_error and text(said) == "hi"
            # a rule of the operator's reads the server's annotations
            looked = await c.call_tool("lookup_order", {"order_id": "A-1"})
            assert not looked.is_error and "shipped" in text(looked)

            # a gated one waits for a signed click, then runs once with what was approved
            call = asyncio.create_task(c.call_tool("transfer_money",
                                                   {"to": "ACME", "cents": 500}))
            rid = await pending_request(h)
            await approve_in_slack(h, rid)
            done = await asyncio.wait_for(call, 30)
            assert not done.is_error, text(done)
            assert transfers(ledger) == [{"to": "ACME", "cents": 500, "memo": ""}]
            [a] = await Rows.of(h.engine).approvals(rid)
            assert a.requested_by == "U_DANA" and "dana-agent" in a.packet

            # a deny returns the reason as a tool error; nothing runs
            call = asyncio.create_task(c.call_tool("transfer_money",
                                                   {"to": "EVIL", "cents": 900}))
            denied = await pending_request(h)
            await deny_in_slack(h, denied, "not a vendor of ours")
            refused = await asyncio.wait_for(call, 30)
            assert refused.is_error and "not a vendor of ours" in text(refused)
            assert len(transfers(ledger)) == 1


async def test_past_its_wait_a_call_names_its_request_and_the_retry_joins_it(
        db_url: str, tmp_path: Path, ledger: Path) -> None:
    async with harness(db_url, tmp_path, background=False, **files(tmp_path)) as h:
        dana = await token(h, "dana-agent", face="mcp:quick", requested_by="U_DANA")
        mallory = await token(h, "mallory-agent", face="mcp:quick", requested_by="U_MALLORY")
        args = {"to": "ACME", "cents": 700}
        async with client(url(h.service, "quick"), dana) as c:
            first = await c.call_tool("transfer_money", args)
            rid = await pending_request(h)
            assert first.is_error and rid in text(first) and "same call again" in text(first)
            assert (await c.call_tool("transfer_money", args)).is_error  # joins: no new card
            assert len(await Rows.of(h.engine).requests()) == 1
            await approve_in_slack(h, rid)
            ran = await c.call_tool("transfer_money", args)
            assert not ran.is_error and transfers(ledger) == [{**args, "memo": ""}]
        # someone else's token making the same call asks for itself, as its own person
        async with client(url(h.service, "quick"), mallory) as c:
            assert (await c.call_tool("transfer_money", args)).is_error
        pending = await Rows.of(h.engine).requests(status="pending")
        assert [a.requested_by for a in pending] == ["U_MALLORY"]


async def test_tokens_hosts_and_origins_are_checked_before_anything_is_asked(
        db_url: str, tmp_path: Path, ledger: Path) -> None:
    async with harness(db_url, tmp_path, background=False, **files(tmp_path)) as h, \
            aiohttp.ClientSession() as http:
        bank = await token(h, "dana-agent", face="mcp:bank", requested_by="U_DANA")
        other = await token(h, "dana-quick", face="mcp:quick", requested_by="U_DANA")
        api = await token(h, "deploy-bot", tools="*")
        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
        target = url(h.service, "bank")

        async def post(bearer: str | None, **headers: str) -> int:
            if bearer:
                headers["Authorization"] = f"Bearer {bearer}"
            async with http.post(target, json=body, headers={
                    "Accept": "application/json, text/event-stream", **headers}) as resp:
                return resp.status

        assert await post(None) == 401
        assert await post("apd_" + "x" * 43) == 401
        assert await post(api) == 403  # an API token calls no gateway
        assert await post(other) == 403  # nor does another gateway's
        assert await post(bank, Origin="https://evil.example") == 403
        assert await post(bank, Host="evil.example") == 421
        assert await post(bank, Origin="https://ops.example") < 400
        async with http.post(url(h.service, "nope"), json=body) as resp:
            assert resp.status == 404
        # an MCP gateway token is no API token either
        async with http.get(target.replace("/mcp/bank", "/v1/requests/x"),
                            headers={"Authorization": f"Bearer {bank}"}) as resp:
            assert resp.status == 403
        assert await Rows.of(h.engine).requests() == []


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_two_replicas_answer_one_client_in_turn(
        db_url: str, tmp_path: Path, ledger: Path) -> None:
    """Stateless: each request of one client goes to the other replica, and the gated call
    approved through one replica's Slack face is answered by the other."""
    env = files(tmp_path)
    async with harness(db_url, tmp_path, background=False, **env) as h:
        settings: Settings = settings_for(h.service.settings.slack_api_url, db_url,
                                          tmp_path / "ledger2.jsonl", **env)
        db = await open_database(settings, quiet=True)
        second = Service(settings, db)
        try:
            await second.start(background=False)
            bearer = await token(h, "dana-agent", face="mcp:quick", requested_by="U_DANA")
            urls = [url(h.service, "quick"), url(second, "quick")]
            args = {"to": "ACME", "cents": 300}
            answers: list[CallToolResult] = []
            for i in range(4):  # list on one, call on the other, and so on
                async with client(urls[i % 2], bearer) as c:
                    assert "transfer_money" in {t.name for t in (await c.list_tools()).tools}
                    answers.append(await c.call_tool("transfer_money", args))
                if i == 1:
                    await approve_in_slack(h, await pending_request(h))
            assert [a.is_error for a in answers] == [True, True, False, True]
            assert transfers(ledger) == [{**args, "memo": ""}]
            await approve_in_slack(h, await pending_request(h))  # the fourth call's request

            # a task made on one replica is polled, and its call run, on the other
            async with aiohttp.ClientSession() as http:
                made = await rpc(http, urls[0], bearer, "tools/call", {
                    "name": "transfer_money", "arguments": {"to": "ACME", "cents": 301}})
                tid = made["result"]["taskId"]
                await approve_in_slack(h, await pending_request(h))
                done = await rpc(http, urls[1], bearer, "tasks/get", {"taskId": tid})
                assert done["result"]["status"] == "completed", done
                assert (await rpc(http, urls[0], bearer, "tasks/get", {"taskId": tid})
                        )["result"]["result"] == done["result"]["result"]
            assert [t["cents"] for t in transfers(ledger)] == [300, 301]
        finally:
            await second.stop()
            await db.close()


PAGE = Path(__file__).resolve().parents[2] / "docs" / "how-to" / "mcp-gateway.md"


async def test_the_guides_client_example_runs_as_written(
        sqlite_url: str, tmp_path: Path, ledger: Path) -> None:
    """docs/how-to/mcp-gateway.md's Python client, run as a reader runs it."""
    found = re.search(r"<!-- run-by: tests/integration/test_mcp_http.py -->\n```python\n"
                      r"(.*?)```", PAGE.read_text(encoding="utf-8"), re.DOTALL)
    assert found, "docs/how-to/mcp-gateway.md lost its client example"
    async with harness(sqlite_url, tmp_path, background=False, **files(tmp_path)) as h:
        bearer = await token(h, "dana-agent", face="mcp:bank", requested_by="U_DANA")
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", found.group(1), stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "APPROVALD_MCP_URL": url(h.service, "bank"),
                 "APPROVALD_MCP_TOKEN": bearer})
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, err.decode()
        lines = out.decode().splitlines()
        assert "transfer_money" in lines[0] and lines[1] == "hello through approvald"


# -- the Tasks extension, spoken as a 2026-07-28 client does (one POST per request) -------

TASKS = "io.modelcontextprotocol/tasks"


async def rpc(http: aiohttp.ClientSession, target: str, bearer: str, method: str,
              params: dict[str, Any], *, tasks: bool = True,
              name: str | None = None) -> dict[str, Any]:
    """One JSON-RPC request; its response (read from JSON or from the event stream).
    ``Mcp-Name`` is the task's id or the tool's name unless ``name`` says otherwise."""
    caps: dict[str, Any] = {"extensions": {TASKS: {}}} if tasks else {}
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": {"name": "test", "version": "1"},
            "io.modelcontextprotocol/clientCapabilities": caps}
    headers = {"Authorization": f"Bearer {bearer}", "Content-Type": "application/json",
               "Accept": "application/json, text/event-stream",
               "MCP-Protocol-Version": "2026-07-28", "Mcp-Method": method}
    name = name or params.get("taskId") or params.get("name")
    if name:
        headers["Mcp-Name"] = str(name)
    body = {"jsonrpc": "2.0", "id": 7, "method": method, "params": {**params, "_meta": meta}}
    async with http.post(target, json=body, headers=headers) as resp:
        raw = await resp.text()
        assert resp.status < 500, raw
        if resp.content_type == "text/event-stream":
            for line in raw.splitlines():
                if line.startswith("data:") and '"id":7' in line.replace(" ", ""):
                    found: dict[str, Any] = json.loads(line[5:])
                    return found
            raise AssertionError(f"no response in the stream: {raw[:500]}")
        answer: dict[str, Any] = json.loads(raw)
        return answer


async def test_a_client_with_tasks_gets_a_task_that_completes_after_the_click(
        db_url: str, tmp_path: Path, ledger: Path) -> None:
    async with harness(db_url, tmp_path, background=False, **files(tmp_path)) as h, \
            aiohttp.ClientSession() as http:
        dana = await token(h, "dana-agent", face="mcp:bank", requested_by="U_DANA")
        mallory = await token(h, "mallory-agent", face="mcp:bank", requested_by="U_MALLORY")
        target = url(h.service, "bank")
        discovered = await rpc(http, target, dana, "server/discover", {})
        assert TASKS in discovered["result"]["capabilities"]["extensions"], discovered
        # an ungated call is answered as usual, even to a client with Tasks
        echo = await rpc(http, target, dana, "tools/call",
                         {"name": "echo", "arguments": {"text": "hi"}})
        assert echo["result"]["content"][0]["text"] == "hi"

        made = await rpc(http, target, dana, "tools/call",
                         {"name": "transfer_money", "arguments": {"to": "ACME", "cents": 400}})
        task = made["result"]
        assert (task["resultType"], task["status"]) == ("task", "working"), made
        assert "waiting for approval" in task["statusMessage"] and task["ttlMs"] > 0
        rid = await pending_request(h)
        assert task["taskId"].startswith(rid + ".")
        polled = await rpc(http, target, dana, "tasks/get", {"taskId": task["taskId"]})
        assert polled["result"]["status"] == "working" and transfers(ledger) == []
        # another token cannot see it, nor make up a task id
        for other, tid in ((mallory, task["taskId"]), (dana, rid + "." + "0" * 32)):
            refused = await rpc(http, target, other, "tasks/get", {"taskId": tid})
            assert "error" in refused, refused

        await approve_in_slack(h, rid)
        done = await rpc(http, target, dana, "tasks/get", {"taskId": task["taskId"]})
        assert done["result"]["status"] == "completed", done
        assert done["result"]["result"]["isError"] is False
        assert transfers(ledger) == [{"to": "ACME", "cents": 400, "memo": ""}]
        again = await rpc(http, target, dana, "tasks/get", {"taskId": task["taskId"]})
        assert again["result"]["result"] == done["result"]["result"]  # recorded: not re-run
        assert len(transfers(ledger)) == 1

        # denied: completed, with the reason as a tool error; cancelled: cancelled
        made = await rpc(http, target, dana, "tools/call",
                         {"name": "transfer_money", "arguments": {"to": "EVIL", "cents": 1}})
        await deny_in_slack(h, await pending_request(h), "not a vendor")
        denied = await rpc(http, target, dana, "tasks/get", {"taskId": made["result"]["taskId"]})
        assert denied["result"]["status"] == "completed"
        assert denied["result"]["result"]["isError"] is True
        assert "not a vendor" in denied["result"]["result"]["content"][0]["text"]
        made = await rpc(http, target, dana, "tools/call",
                         {"name": "transfer_money", "arguments": {"to": "X", "cents": 2}})
        tid = made["result"]["taskId"]
        assert (await rpc(http, target, dana, "tasks/cancel", {"taskId": tid}))["result"] \
            .get("resultType") == "complete"
        cancelled = await rpc(http, target, dana, "tasks/get", {"taskId": tid})
        assert cancelled["result"]["status"] == "cancelled", cancelled
        assert len(transfers(ledger)) == 1

        # a client without the extension waits (this gateway: up to 30 s) as before
        waiting = asyncio.create_task(rpc(
            http, target, dana, "tools/call",
            {"name": "transfer_money", "arguments": {"to": "ACME", "cents": 401}},
            tasks=False))
        await approve_in_slack(h, await pending_request(h))
        plain = await asyncio.wait_for(waiting, 30)
        assert plain["result"]["isError"] is False
        assert plain["result"].get("resultType", "complete") == "complete"
        assert len(transfers(ledger)) == 2


async def test_a_gateway_whose_server_cannot_be_reached_stops_serve_saying_which(
        sqlite_url: str, tmp_path: Path) -> None:
    from approvald.runtime.kernel.errors import ConfigError

    (tmp_path / "gateways.toml").write_text(
        '[gateways.files]\ncommand = ["/nonexistent/mcp-server"]\n')
    with pytest.raises(ConfigError, match="gateway files: cannot reach its MCP server"):
        async with harness(sqlite_url, tmp_path, background=False,
                           APPROVALD_MCP_GATEWAYS_FILE=str(tmp_path / "gateways.toml")):
            pass
    (tmp_path / "gateways.toml").write_text('[gateways.files]\nurl = "ftp://x"\n')
    with pytest.raises(ConfigError, match=r"gateways\.files\.url"):
        async with harness(sqlite_url, tmp_path, background=False,
                           APPROVALD_MCP_GATEWAYS_FILE=str(tmp_path / "gateways.toml")):
            pass


async def test_tasks_methods_answer_only_clients_that_declared_the_extension(
        db_url: str, tmp_path: Path, ledger: Path) -> None:
    """Every ``tasks/*`` method from a client that did not declare the extension is error
    -32021 (naming the extension), and changes nothing: the cancel does not cancel."""
    async with harness(db_url, tmp_path, background=False, **files(tmp_path)) as h, \
            aiohttp.ClientSession() as http:
        dana = await token(h, "dana-agent", face="mcp:bank", requested_by="U_DANA")
        target = url(h.service, "bank")
        made = await rpc(http, target, dana, "tools/call",
                         {"name": "transfer_money", "arguments": {"to": "ACME", "cents": 5}})
        tid = made["result"]["taskId"]
        for method in ("tasks/get", "tasks/update", "tasks/cancel", "tasks/list"):
            refused = await rpc(http, target, dana, method, {"taskId": tid}, tasks=False)
            assert refused.get("error", {}).get("code") == -32021, (method, refused)
            assert refused["error"]["data"]["requiredCapabilities"] == {
                "extensions": {TASKS: {}}}, refused
        assert [a.status for a in await Rows.of(h.engine).requests()] == ["pending"]
        still = await rpc(http, target, dana, "tasks/get", {"taskId": tid})
        assert still["result"]["status"] == "working", still


async def test_a_tasks_mcp_name_header_must_name_the_task(
        db_url: str, tmp_path: Path, ledger: Path) -> None:
    """``Mcp-Name`` on ``tasks/*`` is the task's id; another one is error -32020 and the
    method does nothing (SEP-2663 routing headers)."""
    async with harness(db_url, tmp_path, background=False, **files(tmp_path)) as h, \
            aiohttp.ClientSession() as http:
        dana = await token(h, "dana-agent", face="mcp:bank", requested_by="U_DANA")
        target = url(h.service, "bank")
        made = await rpc(http, target, dana, "tools/call",
                         {"name": "transfer_money", "arguments": {"to": "ACME", "cents": 6}})
        tid = made["result"]["taskId"]
        for method in ("tasks/get", "tasks/update", "tasks/cancel"):
            wrong = await rpc(http, target, dana, method, {"taskId": tid},
                              name="another-task")
            assert wrong.get("error", {}).get("code") == -32020, (method, wrong)
        assert [a.status for a in await Rows.of(h.engine).requests()] == ["pending"]


async def test_a_completed_tasks_last_update_is_when_its_call_finished(
        db_url: str, tmp_path: Path, ledger: Path) -> None:
    async with harness(db_url, tmp_path, background=False, **files(tmp_path)) as h, \
            aiohttp.ClientSession() as http:
        dana = await token(h, "dana-agent", face="mcp:bank", requested_by="U_DANA")
        target = url(h.service, "bank")
        made = await rpc(http, target, dana, "tools/call",
                         {"name": "transfer_money", "arguments": {"to": "ACME", "cents": 7}})
        tid = made["result"]["taskId"]
        rid = await pending_request(h)
        await approve_in_slack(h, rid)
        done = (await rpc(http, target, dana, "tasks/get", {"taskId": tid}))["result"]
        assert done["status"] == "completed", done
        assert h.service.mcp is not None
        record = await Rows.of(h.engine).token_from_header(f"Bearer {dana}")
        assert record is not None
        gateway = h.service.mcp.gateways["bank"].gateway_for(record)
        doc = await h.engine.request_document(await gateway.token(), rid)
        assert doc["decision"]["decided_at"] < doc["result"]["reported_at"]
        assert done["lastUpdatedAt"] == doc["result"]["reported_at"], (done, doc)
        again = (await rpc(http, target, dana, "tasks/get", {"taskId": tid}))["result"]
        assert again["lastUpdatedAt"] == doc["result"]["reported_at"]


async def test_a_bearer_revoked_after_it_was_kept_runs_nothing(
        db_url: str, tmp_path: Path, ledger: Path) -> None:
    """The bearer token of a ``tools/call`` is kept once found live (its request's
    statement checks it); revoked, every other message is refused at once (read afresh:
    a 401), a call is refused with nothing asked or run, and the token is forgotten (the
    next call: a 401)."""
    from tests.helpers import revoke_token
    async with harness(db_url, tmp_path, background=False, **files(tmp_path)) as h, \
            aiohttp.ClientSession() as http:
        dana = await token(h, "dana-agent", face="mcp:bank", requested_by="U_DANA")
        target = url(h.service, "bank")
        echo = await rpc(http, target, dana, "tools/call",
                         {"name": "echo", "arguments": {"text": "hi"}})
        assert echo["result"]["content"][0]["text"] == "hi", echo
        await revoke_token(h.engine, "dana-agent", by="test", via="test")
        listed = await rpc(http, target, dana, "tools/list", {})
        assert listed["error"]["code"] == "unauthorized", listed
        runs = len(await Rows.of(h.engine).runs(limit=100))
        called = await rpc(http, target, dana, "tools/call",
                           {"name": "echo", "arguments": {"text": "again"}})
        assert "again" not in json.dumps(called), called
        assert "revoked" in json.dumps(called), called
        again = await rpc(http, target, dana, "tools/call",
                          {"name": "echo", "arguments": {"text": "again"}})
        assert again["error"]["code"] == "unauthorized", again
        assert len(await Rows.of(h.engine).runs(limit=100)) == runs
