"""A 2025-era client's ``tools/call`` answered in serve's handler (bot/mcp/fastcall.py, issue
50) is indistinguishable on the wire from the SDK's transport's answer: the same requests,
sent once through each (``HttpGateway.fast`` off, then on, on one ``serve``), get the same
status, the same headers (but ``Date``) and the same bytes, whatever the call (an auto call,
one with progress and logs relayed, a gated or forbidden one, an unknown tool, arguments the
schema refuses, a malformed request, a string id) and whatever the request's headers (no
protocol version, a wrong Accept, Content-Type, Host or Origin, a 2026-07-28 request, a
batch): those the fast path does not take are the SDK's to answer, both times."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.helpers import warm_mcp_server
from tests.integration.adapter_helpers import pending_request
from tests.integration.slack_harness import harness, wait_for
from tests.integration.test_mcp_http import token, url, wrapped_ledger

# serve starts the wrapped MCP server as a process of its own
pytestmark = pytest.mark.slow
ledger = wrapped_ledger  # the fixture server's ledger, in its environment

POLICY = """
[tools."mcp:*/echo"]
policy = "auto"

[tools."mcp:*/monthly_report"]
policy = "auto"

[tools."mcp:*/ask_the_model"]
policy = "auto"

[tools."mcp:*/my_roots"]
policy = "forbidden"

[tools."mcp:*/transfer_money"]
approvers = ["U_ALICE"]
"""
LEGACY = {"Accept": "application/json, text/event-stream",
          "Content-Type": "application/json", "MCP-Protocol-Version": "2025-06-18"}


def call(name: str, arguments: Any = None, *, rid: Any = 7, **params: Any) -> dict[str, Any]:
    said: dict[str, Any] = {"name": name, **params}
    if arguments is not None:
        said["arguments"] = arguments
    return {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": said}


# (what, body, headers): each sent both ways; FAST: those the fast path answers
CASES: list[tuple[str, Any, dict[str, str]]] = [
    ("auto", call("echo", {"text": "hi"}), LEGACY),
    ("no protocol version", call("echo", {"text": "hi"}),
     {k: v for k, v in LEGACY.items() if k != "MCP-Protocol-Version"}),
    ("2025-11-25", call("echo", {"text": "hi"}), {**LEGACY, "MCP-Protocol-Version": "2025-11-25"}),
    ("string id", call("echo", {"text": "hi"}, rid="abc"), LEGACY),
    ("wildcard accept", call("echo", {"text": "hi"}), {**LEGACY, "Accept": "*/*"}),
    ("progress and logs relayed",
     call("monthly_report", {"month": "2026-11"}, _meta={"progressToken": "p-1"}), LEGACY),
    ("a relay with no channel back", call("ask_the_model", {"question": "hi?"}), LEGACY),
    ("forbidden", call("my_roots", {}), LEGACY),
    ("gated, past its wait", call("transfer_money", {"to": "ACME", "cents": 5}), LEGACY),
    ("unknown tool", call("no_such_tool", {}), LEGACY),
    ("arguments the schema refuses", call("echo", {"text": 5}), LEGACY),
    ("params without a name", {"jsonrpc": "2.0", "id": 8, "method": "tools/call",
                               "params": {"arguments": {}}}, LEGACY),
    ("no params", {"jsonrpc": "2.0", "id": 9, "method": "tools/call"}, LEGACY),
    ("not JSON-RPC", {"id": 9, "method": "tools/call", "params": {"name": "echo"}}, LEGACY),
    ("a notification", {"jsonrpc": "2.0", "method": "tools/call",
                        "params": {"name": "echo", "arguments": {"text": "x"}}}, LEGACY),
    ("a batch", [call("echo", {"text": "hi"})], LEGACY),
    ("accepts no event stream", call("echo", {"text": "hi"}),
     {**LEGACY, "Accept": "application/json"}),
    ("not JSON content", call("echo", {"text": "hi"}), {**LEGACY, "Content-Type": "text/plain"}),
    ("a host not allowed", call("echo", {"text": "hi"}), {**LEGACY, "Host": "evil.example"}),
    ("an origin not allowed", call("echo", {"text": "hi"}),
     {**LEGACY, "Origin": "https://evil.example"}),
    ("an origin allowed", call("echo", {"text": "hi"}),
     {**LEGACY, "Origin": "https://ops.example"}),
    ("an unknown protocol version", call("echo", {"text": "hi"}),
     {**LEGACY, "MCP-Protocol-Version": "1999-01-01"}),
]

# what the SDK's transport answers, with the fast path on too
SDK = {"not JSON-RPC", "a notification", "a batch", "accepts no event stream",
       "an unknown protocol version"}


def normalized(body: bytes) -> bytes:
    """The answer, with what differs between two requests of the same call named alike:
    the id of the request each call made (a new one per call once the last has run)."""
    return re.sub(rb"\bx[0-9a-f]{31}\b", b"<id>", body)


async def test_a_tools_call_is_answered_alike_with_and_without_the_fast_path(
        db_url: str, tmp_path: Path, ledger: Path) -> None:
    (tmp_path / "policy.toml").write_text(POLICY)
    (tmp_path / "gateways.toml").write_text(
        f"[gateways.bank]\ncommand = {json.dumps(warm_mcp_server())}\nwait = 0\n"
        "allowed_origins = [\"https://ops.example\"]\n")
    async with harness(db_url, tmp_path, background=False,
                       APPROVALD_POLICY_FILE=str(tmp_path / "policy.toml"),
                       APPROVALD_MCP_GATEWAYS_FILE=str(tmp_path / "gateways.toml")) as h, \
            aiohttp.ClientSession() as http:
        bearer = await token(h, "dana-agent", face="mcp:bank", requested_by="U_DANA")
        assert h.service.mcp is not None
        gateway = h.service.mcp.gateways["bank"]
        fast = gateway.fast
        assert fast is not None  # on by default
        taken: list[str] = []
        real = fast.answer
        what = ""

        async def counted(*args: Any, **kwargs: Any) -> Any:
            made = await real(*args, **kwargs)
            if made is not None:
                taken.append(what)
            return made

        fast.answer = counted  # type: ignore[method-assign]

        async def send(body: Any, headers: dict[str, str]) -> tuple[int, list[Any], bytes]:
            async with http.post(url(h.service, "bank"), data=json.dumps(body).encode(),
                                 headers={"Authorization": f"Bearer {bearer}",
                                          **headers}) as resp:
                said = await resp.read()
                return resp.status, [(k, v) for k, v in resp.raw_headers
                                     if k.lower() != b"date"], normalized(said)

        for what, body, headers in CASES:
            gateway.fast = None
            sdk = await send(body, headers)
            gateway.fast = fast
            ours = await send(body, headers)
            assert ours == sdk, what
        # the fast path answered the calls it is for (and the SDK all the others)
        assert taken == [c[0] for c in CASES if c[0] not in SDK], taken


async def test_a_client_that_goes_away_ends_its_call_as_over_the_sdk(
        db_url: str, tmp_path: Path, ledger: Path) -> None:
    """A gated call waits (up to its gateway's 60 s) for its decision; its client closing
    the connection ends the call's handler, through either path (the SDK's transport
    notices it and cancels the call; the fast path looks every half second)."""
    (tmp_path / "policy.toml").write_text(POLICY)
    (tmp_path / "gateways.toml").write_text(
        f"[gateways.slow]\ncommand = {json.dumps(warm_mcp_server())}\nwait = 60\n")
    async with harness(db_url, tmp_path, background=False,
                       APPROVALD_POLICY_FILE=str(tmp_path / "policy.toml"),
                       APPROVALD_MCP_GATEWAYS_FILE=str(tmp_path / "gateways.toml")) as h:
        bearer = await token(h, "dana-agent", face="mcp:slow", requested_by="U_DANA")
        assert h.service.mcp is not None and h.service.slack is not None
        gateway = h.service.mcp.gateways["slow"]
        fast, upstream = gateway.fast, gateway.upstream
        assert fast is not None and upstream is not None
        calls = upstream.call
        ended: list[str] = []

        async def watched(*args: Any, **kwargs: Any) -> Any:
            try:
                return await calls(*args, **kwargs)
            finally:
                ended.append("ended")

        upstream.call = watched  # type: ignore[method-assign]
        for n, way in enumerate((None, fast)):
            gateway.fast = way
            body = json.dumps(call("transfer_money", {"to": "ACME", "cents": n + 1})).encode()
            reader, writer = await asyncio.open_connection("127.0.0.1", h.service.slack.port)
            writer.write(b"POST /mcp/slow HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"
                         b"Authorization: Bearer %s\r\nContent-Type: application/json\r\n"
                         b"Accept: application/json, text/event-stream\r\n"
                         b"MCP-Protocol-Version: 2025-06-18\r\nContent-Length: %d\r\n\r\n%s"
                         % (h.service.slack.port, bearer.encode(), len(body), body))
            assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
            await pending_request(h, n + 1)  # the call waits for its decision
            writer.close()
            await writer.wait_closed()
            # well before its wait is over (60 s), the call is over
            await wait_for(lambda n=n: len(ended) == n + 1, within=20,
                           what="the call of a client that went away to end")
