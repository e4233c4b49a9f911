"""What the MCP gateway passes through besides the gated call (issue 49): resources and
prompts named in the policy (readable by default, gated or forbidden like a call), progress
and log messages relayed on the call's stream while a gated call waits and after it is
approved, and the client's own capabilities declared to the server. ``serve``'s gateway in
front of the fixture server (tests/fixtures/mcp_server.py, a real subprocess, over stdio or
over Streamable HTTP), the ``mcp`` SDK's client over HTTP with a bearer token, decisions as
signed Slack clicks through the emulator; the server's own record of the reads it served
says what reached it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as types
import pytest
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client

from tests.helpers import Rows, free_port, warm_mcp_server
from tests.integration.adapter_helpers import approve_in_slack, deny_in_slack, pending_request
from tests.integration.slack_harness import harness
from tests.integration.test_mcp_http import (
    bank_gateway,
    client,
    token,
    url,
    wrapped_ledger,  # noqa: F401  (a fixture)
)

pytestmark = pytest.mark.slow

POLICY = """
[tools."mcp:*/resource:bank://statements/*"]   # a month's statement: asked about
approvers = ["U_ALICE"]

[tools."mcp:*/resource:*"]                     # any other resource: read, but not keys
policy = "auto"
[[tools."mcp:*/resource:*".rules]]
when = "args.uri.startsWith('bank://keys/')"
policy = "forbidden"
reason = "Signing keys are never read through an agent."

[tools."mcp:*/monthly_report"]
approvers = ["U_ALICE"]

[tools."mcp:*/capabilities"]
policy = "auto"

[tools."mcp:*/ask_the_model"]
policy = "auto"
"""


def reads(ledger: Path) -> list[str]:
    path = Path(f"{ledger}.reads")
    return [json.loads(x)["uri"] for x in path.read_text().splitlines()] \
        if path.exists() else []



@asynccontextmanager
async def http_server() -> AsyncIterator[str]:
    """The fixture server over Streamable HTTP, as a gateway's ``url``."""
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        *warm_mcp_server(), "--http", str(port),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    try:
        for _ in range(200):
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                await asyncio.sleep(0.05)
                continue
            writer.close()
            await writer.wait_closed()
            break
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        await proc.wait()


def gateways(tmp_path: Path, upstream: str | None = None) -> dict[str, str]:
    return bank_gateway(tmp_path, POLICY, upstream=upstream)


def text_of(result: types.ReadResourceResult) -> str:
    return "".join(c.text for c in result.contents if isinstance(c, types.TextResourceContents))


async def test_resource_reads_are_named_in_the_policy_gated_or_forbidden_like_calls(
        db_url: str, tmp_path: Path, ledger: Path) -> None:
    async with harness(db_url, tmp_path, background=False, **gateways(tmp_path)) as h:
        bearer = await token(h, "dana-agent", face="mcp:bank", requested_by="U_DANA")
        async with client(url(h.service, "bank"), bearer) as c:
            listed = {str(r.uri) for r in (await c.list_resources()).resources}
            assert "bank://balance" in listed
            templates = await c.list_resource_templates()
            assert [t.uri_template for t in templates.resource_templates] == [
                "bank://statements/{month}"]
            assert "dispute" in {p.name for p in (await c.list_prompts()).prompts}
            got = await c.get_prompt("dispute", {"order_id": "A-7"})
            assert "A-7" in str(got.messages[0].content)

            # named by nobody: readable at once (through the intake, audited)
            assert text_of(await c.read_resource("bank://balance")) == "balance: 1200 EUR"
            assert reads(ledger) == ["bank://balance"]

            # forbidden: refused with the reason; the server never hears of it
            with pytest.raises(MCPError, match="Signing keys are never read"):
                await c.read_resource("bank://keys/signing")
            assert reads(ledger) == ["bank://balance"]

            # gated: waits for a signed click, reads nothing before it
            read = asyncio.create_task(c.read_resource("bank://statements/2026-01"))
            rid = await pending_request(h)
            [a] = await Rows.of(h.engine).approvals(rid)
            assert a.tool == "resource:bank://statements/2026-01"
            assert reads(ledger) == ["bank://balance"] and not read.done()
            await approve_in_slack(h, rid)
            assert "3 transfers" in text_of(await asyncio.wait_for(read, 30))
            assert reads(ledger) == ["bank://balance", "bank://statements/2026-01"]

            # denied: the reason, and nothing read
            read = asyncio.create_task(c.read_resource("bank://statements/2026-02"))
            await deny_in_slack(h, await pending_request(h), "not this month")
            with pytest.raises(MCPError, match="not this month"):
                await asyncio.wait_for(read, 30)
            assert reads(ledger) == ["bank://balance", "bank://statements/2026-01"]
        actions = [e.action for e in await Rows.of(h.engine).audit()]
        assert actions.count("executed") >= 3  # the reads that ran, each in the audit log


async def test_progress_and_log_messages_are_relayed_while_a_call_waits_and_after(
        db_url: str, tmp_path: Path, ledger: Path) -> None:
    async with http_server() as upstream, \
            harness(db_url, tmp_path, background=False, **gateways(tmp_path, upstream)) as h:
        bearer = await token(h, "dana-agent", face="mcp:bank", requested_by="U_DANA")
        progress: list[str | None] = []
        logged: list[Any] = []

        async def on_progress(value: float, total: float | None, message: str | None) -> None:
            progress.append(message)

        async def on_log(params: types.LoggingMessageNotificationParams) -> None:
            logged.append(params.data)

        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {bearer}"}, timeout=60)
        async with http, Client(streamable_http_client(url(h.service, "bank"),
                                                       http_client=http),
                                cache=None, logging_callback=on_log, log_level="info") as c:
            call = asyncio.create_task(c.session.call_tool(
                "monthly_report", {"month": "2026-03"}, progress_callback=on_progress))
            rid = await pending_request(h)
            await approve_in_slack(h, rid)
            done = await asyncio.wait_for(call, 30)
        assert isinstance(done, types.CallToolResult) and not done.is_error
        # the gateway's own while it waited (at once, then each heartbeat), then the server's
        assert progress[-3:] == ["section 1 of 3", "section 2 of 3", "section 3 of 3"]
        assert logged == ["report for 2026-03 built"]


async def test_the_clients_own_capabilities_are_declared_to_the_server(
        db_url: str, tmp_path: Path, ledger: Path) -> None:
    async def sample(context: Any, params: types.CreateMessageRequestParams) -> Any:
        raise AssertionError("not asked")

    async with http_server() as upstream, \
            harness(db_url, tmp_path, background=False, **gateways(tmp_path, upstream)) as h:
        bearer = await token(h, "dana-agent", face="mcp:bank", requested_by="U_DANA")
        said: list[Any] = []
        for callback in (sample, None):
            http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {bearer}"}, timeout=60)
            async with http, Client(streamable_http_client(url(h.service, "bank"),
                                                           http_client=http),
                                    cache=None, sampling_callback=callback) as c:
                result = await c.call_tool("capabilities", {})
                said.append(result.structured_content)
        assert said == [{"sampling": True, "elicitation": False},
                        {"sampling": False, "elicitation": False}]


async def test_a_resource_with_a_2000_character_uri_is_read_gated_and_recorded(
        db_url: str, tmp_path: Path, ledger: Path) -> None:
    """A resource URI is the caller's (a server's template takes any value): one of 2,000
    characters is named in its request, asked about, read and recorded whole, on both
    databases (each column that holds a caller's name or URI is text, not a short string)."""
    uri = "bank://statements/" + "m" * (2000 - len("bank://statements/"))
    assert len(uri) == 2000
    async with harness(db_url, tmp_path, background=False, **gateways(tmp_path)) as h:
        bearer = await token(h, "dana-agent", face="mcp:bank", requested_by="U_DANA")
        async with client(url(h.service, "bank"), bearer) as c:
            read = asyncio.create_task(c.read_resource(uri))
            rid = await pending_request(h)
            [a] = await Rows.of(h.engine).approvals(rid)
            assert a.tool == f"resource:{uri}"
            await approve_in_slack(h, rid)
            assert text_of(await asyncio.wait_for(read, 30)).endswith(": 3 transfers")
            assert reads(ledger) == [uri]
        [executed] = [e for e in await Rows.of(h.engine).audit() if e.action == "executed"]
        assert uri in json.dumps(executed.details)


async def test_a_2025_11_25_clients_sampling_is_relayed_back_to_it_over_its_session(
        db_url: str, tmp_path: Path, ledger: Path) -> None:
    """A 2025-11-25 client (the initialize handshake) of the stateless gateway: what it
    declared at its initialize is declared upstream on each of its requests (the session id
    the gateway gave it carries it), and the server's sampling request during a call reaches
    it on the call's stream; its reply, a later POST of its session, goes back to the
    server, whose result the call returns. A client that cannot sample is declared none."""
    asked: list[str] = []

    async def sample(context: Any, params: types.CreateMessageRequestParams) -> Any:
        content = params.messages[0].content
        assert isinstance(content, types.TextContent)
        asked.append(content.text)
        return types.CreateMessageResult(role="assistant", model="test-model",
                                         content=types.TextContent(type="text", text="42"))

    async with http_server() as upstream, \
            harness(db_url, tmp_path, background=False, **gateways(tmp_path, upstream)) as h:
        bearer = await token(h, "dana-agent", face="mcp:bank", requested_by="U_DANA")
        said: list[Any] = []
        for callback in (sample, None):
            http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {bearer}"}, timeout=60)
            async with http, Client(streamable_http_client(url(h.service, "bank"),
                                                           http_client=http),
                                    cache=None, mode="legacy", sampling_callback=callback) as c:
                said.append((await c.call_tool("capabilities", {})).structured_content)
                if callback is not None:
                    answered = await asyncio.wait_for(
                        c.call_tool("ask_the_model", {"question": "what is six times seven?"}),
                        30)
                    assert not answered.is_error, answered
                    assert answered.content[0].text == "the model says: 42"  # type: ignore[union-attr]
        assert asked == ["what is six times seven?"]
        assert said == [{"sampling": True, "elicitation": False},
                        {"sampling": False, "elicitation": False}]


async def test_the_sessions_with_a_url_server_load_its_tls_context_once(
        db_url: str, tmp_path: Path, ledger: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each client request has a session of its own with a Streamable HTTP server, and an
    HTTP client of its own; their TLS context (its CA bundle read, about 19 ms of CPU) is
    made once, not per session (issue 50)."""
    import httpcore2

    async with http_server() as upstream, \
            harness(db_url, tmp_path, background=False, **gateways(tmp_path, upstream)) as h:
        bearer = await token(h, "dana-agent", face="mcp:bank", requested_by="U_DANA")
        made: list[bool] = []
        real = httpcore2.default_ssl_context

        def counted(*args: Any, **kwargs: Any) -> Any:
            made.append(True)
            return real(*args, **kwargs)

        async with client(url(h.service, "bank"), bearer) as c:  # its own context made
            monkeypatch.setattr(httpcore2, "default_ssl_context", counted)
            for _ in range(3):  # each call: a listing's session and the call's
                said = await c.call_tool("capabilities", {})
                assert not said.is_error
        assert len(made) == 1, made
