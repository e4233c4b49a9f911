"""What a stdio server sends back during a call reaches the client that made it (issue 49):
sampling, elicitation and roots requests, progress and log messages, through ``serve``'s
gateway (over Streamable HTTP) and ``mcp-proxy`` (over stdio), each in front of the
fixture server (tests/fixtures/mcp_server.py, a real subprocess) speaking only 2025-11-25
(``--legacy``), the revision whose servers send such requests. One stdio session serves
every client: a request made while two clients' calls are in flight, or none, names no
client, and the server is told so at once instead of waiting."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as types
import pytest
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from tests.helpers import Cli, warm_approvald, warm_mcp_server
from tests.integration.adapter_helpers import approve_in_slack, pending_request
from tests.integration.slack_harness import harness
from tests.integration.test_mcp_http import (
    bank_gateway,
    text,
    token,
    url,
    wrapped_ledger,  # noqa: F401  (a fixture)
)

pytestmark = pytest.mark.slow

POLICY = """
[tools."mcp:*/monthly_report"]
approvers = ["U_ALICE"]

[tools."mcp:*/ask_the_model"]
policy = "auto"

[tools."mcp:*/confirm_payment"]
policy = "auto"

[tools."mcp:*/my_roots"]
policy = "auto"
"""
def legacy_server() -> list[str]:
    """The fixture server's command, in its --legacy mode."""
    return [*warm_mcp_server(), "--legacy"]


def gateways(tmp_path: Path) -> dict[str, str]:
    return bank_gateway(tmp_path, POLICY, command=legacy_server())


class Asked:
    """A client's answers to the server, and what it was asked."""

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.release = asyncio.Event()
        self.release.set()
        self.waiting = asyncio.Event()

    async def sample(self, context: Any, params: types.CreateMessageRequestParams) -> Any:
        content = params.messages[0].content
        assert isinstance(content, types.TextContent)
        self.asked.append(content.text)
        self.waiting.set()
        await self.release.wait()
        return types.CreateMessageResult(role="assistant", model="test-model",
                                         content=types.TextContent(type="text", text="42"))

    async def elicit(self, context: Any, params: types.ElicitRequestParams) -> Any:
        self.asked.append(params.message)
        return types.ElicitResult(action="accept", content={"confirm": True})

    async def roots(self, context: Any) -> Any:
        self.asked.append("roots")
        return types.ListRootsResult(roots=[types.Root(uri="file:///home/dana/books")])

    def options(self) -> dict[str, Any]:
        return {"sampling_callback": self.sample, "elicitation_callback": self.elicit,
                "list_roots_callback": self.roots}


@asynccontextmanager
async def http_client(target: str, bearer: str, **options: Any) -> AsyncIterator[Client]:
    """A 2025-11-25 client of ``serve``'s gateway (its replies go back in its session)."""
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {bearer}"}, timeout=60)
    async with http, Client(streamable_http_client(target, http_client=http), cache=None,
                            mode="legacy", **options) as c:
        yield c


async def test_a_stdio_servers_requests_progress_and_logs_reach_the_client_of_the_call(
        db_url: str, tmp_path: Path, ledger: Path) -> None:
    asked = Asked()
    progress: list[str | None] = []
    logged: list[Any] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(message)

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        logged.append(params.data)

    async with harness(db_url, tmp_path, background=False, **gateways(tmp_path)) as h:
        bearer = await token(h, "dana-agent", face="mcp:bank", requested_by="U_DANA")
        async with http_client(url(h.service, "bank"), bearer, logging_callback=on_log,
                               **asked.options()) as c:
            said = [text(await asyncio.wait_for(c.call_tool(tool, args), 30)) for tool, args
                    in (("ask_the_model", {"question": "what is six times seven?"}),
                        ("confirm_payment", {"amount": 12}), ("my_roots", {}))]
            # a gated call: the server's progress and log once it is approved and runs
            call = asyncio.create_task(c.session.call_tool(
                "monthly_report", {"month": "2026-03"}, progress_callback=on_progress))
            await approve_in_slack(h, await pending_request(h))
            done = await asyncio.wait_for(call, 30)
    assert said == ["the model says: 42", "payment confirmed", "file:///home/dana/books"]
    assert asked.asked == ["what is six times seven?", "Pay 12 EUR?", "roots"]
    assert not done.is_error, done
    assert progress[-3:] == ["section 1 of 3", "section 2 of 3", "section 3 of 3"]
    assert logged == ["report for 2026-03 built"]


async def test_a_stdio_servers_request_no_one_client_is_in_flight_for_is_refused_at_once(
        db_url: str, tmp_path: Path, ledger: Path) -> None:
    """Dana's call is in flight (its sampling request relayed to her, unanswered yet) when
    Erin's call asks to sample too: two clients' calls are in flight on the one stdio
    session, so Erin's is refused at once, saying why, and Dana's still gets its answer. A
    client that did not declare sampling is not asked, and the server is told why."""
    dana, erin = Asked(), Asked()
    dana.release.clear()
    async with harness(db_url, tmp_path, background=False, **gateways(tmp_path)) as h:
        target = url(h.service, "bank")
        bearer_d = await token(h, "dana-agent", face="mcp:bank", requested_by="U_DANA")
        bearer_e = await token(h, "erin-agent", face="mcp:bank", requested_by="U_ERIN")
        async with http_client(target, bearer_d, **dana.options()) as cd, \
                http_client(target, bearer_e, **erin.options()) as ce, \
                http_client(target, bearer_e) as mute:
            first = asyncio.create_task(cd.call_tool("ask_the_model", {"question": "first?"}))
            await asyncio.wait_for(dana.waiting.wait(), 30)
            # the server's error (its tool raised on the gateway's answer), passed on as it is
            with pytest.raises(MCPError, match="requests of 2 clients are in flight"):
                await asyncio.wait_for(ce.call_tool("ask_the_model", {"question": "2nd?"}), 30)
            dana.release.set()
            answered = await asyncio.wait_for(first, 30)
            with pytest.raises(MCPError, match="did not declare the sampling capability"):
                await asyncio.wait_for(mute.call_tool("ask_the_model", {"question": "3rd?"}),
                                       30)
    assert not answered.is_error and text(answered) == "the model says: 42"
    assert dana.asked == ["first?"] and erin.asked == []


async def test_mcp_proxy_relays_a_stdio_servers_sampling_to_its_client(
        db_url: str, tmp_path: Path, ledger: Path) -> None:
    """``mcp-proxy``: its one client's call samples through it, and the server's log
    message during a call reaches it."""
    asked = Asked()
    logged: list[Any] = []

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        logged.append(params.data)

    (tmp_path / "policy.toml").write_text(POLICY.replace('"mcp:*/monthly_report"]\n'
                                                         'approvers = ["U_ALICE"]',
                                                         '"mcp:*/monthly_report"]\n'
                                                         'policy = "auto"'))
    cli = Cli(db_url, tmp_path, {"APPROVALD_POLICY_FILE": str(tmp_path / "policy.toml")})
    params = StdioServerParameters(
        command=warm_approvald(), args=["mcp-proxy", "--name", "test", "--requested-by", "U_DANA",
                                 "--", *legacy_server()],
        env=cli.env(MCP_FIXTURE_LEDGER=str(ledger)), cwd=str(tmp_path))
    errlog = tmp_path / "mcp-proxy.stderr"
    async with harness(db_url, tmp_path, background=False,
                       APPROVALD_POLICY_FILE=str(tmp_path / "policy.toml")):
        with errlog.open("w") as err:
            try:
                async with Client(stdio_client(params, errlog=err), cache=None,
                                  mode="legacy", read_timeout_seconds=60,
                                  logging_callback=on_log, **asked.options()) as c:
                    said = text(await c.call_tool("ask_the_model",
                                                  {"question": "six by seven?"}))
                    roots = text(await c.call_tool("my_roots", {}))
                    report = await c.call_tool("monthly_report", {"month": "2026-04"})
            finally:
                err.flush()
                sys.stderr.write(errlog.read_text())
    assert said == "the model says: 42" and roots == "file:///home/dana/books"
    assert not report.is_error
    assert asked.asked == ["six by seven?", "roots"]
    assert logged == ["report for 2026-04 built"]
