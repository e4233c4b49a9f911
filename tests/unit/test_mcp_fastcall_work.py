"""What a ``tools/call`` answered in serve's handler (bot/mcp/fastcall.py) no longer does
per request (issue 50), and what it still does: the SDK's header checks are made once per
set of header values (a refusal every time); one timer looks at every request answered
(pings and a client gone still reach each one); the connection's exit stack is unwound
only when a handler entered something on it (and then it is); the body's JSON is the one
serve's handler parsed. Through an SDK server of one tool behind aiohttp, in process."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import mcp_types as types
import pydantic_core
import pytest
from aiohttp import web
from approvald.bot.mcp import fastcall
from approvald.bot.mcp.fastcall import FastCall
from mcp.server.connection import Connection
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings

HEADERS = {"Accept": "application/json, text/event-stream",
           "Content-Type": "application/json", "MCP-Protocol-Version": "2025-06-18"}
NOT_HERE = 599  # the test app's answer when the fast path leaves a request to the SDK


def call(name: str, rid: int = 1) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "method": "tools/call",
            "params": {"name": name, "arguments": {}}}


class App:
    """An SDK server whose ``tools/call`` runs :attr:`handlers`, a FastCall in front of it,
    and a route that answers through it (``/said``: a body that is not JSON beside the
    JSON serve's handler parsed)."""

    def __init__(self) -> None:
        self.handlers: dict[str, Callable[[], Any]] = {}
        self.server: Server[Any] = Server("t", on_call_tool=self._call)
        security = TransportSecuritySettings(enable_dns_rebinding_protection=True,
                                             allowed_hosts=["127.0.0.1:*"])
        self.manager = StreamableHTTPSessionManager(self.server, stateless=True,
                                                    security_settings=security)
        self.fast = FastCall(self.server, self.manager, security, 1 << 20)

    async def _call(self, ctx: ServerRequestContext[Any],
                    params: types.CallToolRequestParams) -> types.CallToolResult:
        said = await self.handlers[params.name]()
        return types.CallToolResult(content=[types.TextContent(type="text", text=str(said))])

    async def route(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        said = pydantic_core.from_json(body)
        if request.path == "/said":
            body = b"not json"
        made = await self.fast.answer(request, body, said)
        return made if made is not None else web.Response(status=NOT_HERE)


class Client:
    """Requests to the test app, served as serve serves (aiohttp's runner: a client that
    goes away does not cancel the handler, unlike aiohttp's TestServer)."""

    def __init__(self, http: aiohttp.ClientSession, base: str) -> None:
        self.http = http
        self.base = base

    async def post(self, path: str, **kwargs: Any) -> aiohttp.ClientResponse:
        return await self.http.post(self.base + path, **kwargs)


@contextlib.asynccontextmanager
async def served() -> AsyncIterator[tuple[App, Client]]:
    app = App()
    web_app = web.Application()
    web_app.router.add_post("/mcp", app.route)
    web_app.router.add_post("/said", app.route)
    runner = web.AppRunner(web_app, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with app.manager.run(), aiohttp.ClientSession() as http:
            yield app, Client(http, f"http://127.0.0.1:{port}")
    finally:
        await runner.cleanup()


async def post(client: Client, body: Any, headers: dict[str, str] = HEADERS,
               path: str = "/mcp") -> tuple[int, bytes]:
    async with await client.post(path, json=body, headers=headers) as resp:
        return resp.status, await resp.read()


async def test_the_sdks_header_checks_are_made_once_per_set_of_values() -> None:
    async with served() as (app, client):
        app.handlers["echo"] = lambda: _now("hi")
        checked: list[str | None] = []
        real = app.fast.security.validate_request

        async def counted(request: Any, is_post: bool = False) -> Any:
            checked.append(request.headers.get("host"))
            return await real(request, is_post=is_post)

        app.fast.security.validate_request = counted  # type: ignore[method-assign]
        for i in range(5):
            status, said = await post(client, call("echo", i))
            assert status == 200 and b'"text":"hi"' in said
        assert len(checked) == 1
        await post(client, call("echo"), {**HEADERS, "Accept": "*/*"})  # other values
        assert len(checked) == 2
        for _ in range(2):  # a refusal is the SDK's, every time
            status, said = await post(client, call("echo"), {**HEADERS, "Host": "evil.example"})
            assert (status, said) == (421, b"Invalid Host header")
            status, _ = await post(client, call("echo"), {**HEADERS, "Origin": "https://x.example"})
            assert status == 403
            status, _ = await post(client, call("echo"), {**HEADERS, "Accept": "application/json"})
            assert status == NOT_HERE  # no event stream accepted: the SDK's to answer
        assert len(checked) == 8
        await post(client, call("echo"))
        assert len(checked) == 8


async def _now(value: Any) -> Any:
    return value


async def test_one_timer_looks_at_every_request_answered() -> None:
    async with served() as (app, client):
        app.handlers["echo"] = lambda: _now("hi")
        loop = asyncio.get_running_loop()
        real = loop.call_at
        timers: list[Any] = []

        def counted(when: float, callback: Any, *args: Any, **kwargs: Any) -> Any:
            if getattr(callback, "__module__", None) == fastcall.__name__:
                timers.append(callback)
            return real(when, callback, *args, **kwargs)

        loop.call_at = counted  # type: ignore[method-assign]
        try:
            for i in range(10):
                assert (await post(client, call("echo", i)))[0] == 200
        finally:
            del loop.call_at
        assert len(timers) == 1  # not two per request


async def test_a_waiting_call_is_pinged_and_one_whose_client_went_away_is_cancelled(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fastcall, "PING", 0.0)  # due at the first look
    monkeypatch.setattr(fastcall, "GONE_POLL", 0.01)
    async with served() as (app, client):
        go_on, ended = asyncio.Event(), asyncio.Event()

        async def waits() -> str:
            try:
                await go_on.wait()
                return "done"
            finally:
                ended.set()

        app.handlers["waits"] = waits
        resp = await client.post("/mcp", json=call("waits"), headers=HEADERS)
        assert resp.status == 200
        seen = b""

        async def pinged() -> None:
            nonlocal seen
            while seen.count(b": ping") < 2:  # one look, then the next
                seen += await resp.content.readany()

        await asyncio.wait_for(pinged(), 10)
        go_on.set()
        rest = await resp.read()
        assert b'"text":"done"' in rest
        # a client that goes away: its call is cancelled at the next look
        go_on.clear()
        ended.clear()
        resp = await client.post("/mcp", json=call("waits", 2), headers=HEADERS)
        assert resp.status == 200
        resp.close()
        await asyncio.wait_for(ended.wait(), 10)
        assert not go_on.is_set()
        assert not app.fast.watches._on


async def test_the_connection_is_unwound_only_when_a_handler_entered_something(
        monkeypatch: pytest.MonkeyPatch) -> None:
    unwound: list[int] = []
    real = fastcall.aclose_shielded

    async def counted(connection: Connection) -> None:
        unwound.append(1)
        await real(connection)

    made: list[Connection] = []

    class Kept(Connection):
        @classmethod
        def from_envelope(cls, *args: Any, **kwargs: Any) -> Connection:
            made.append(Connection.from_envelope(*args, **kwargs))
            return made[-1]

    monkeypatch.setattr(fastcall, "aclose_shielded", counted)
    monkeypatch.setattr(fastcall, "Connection", Kept)
    ran: list[str] = []

    async def holds() -> str:
        made[-1].exit_stack.callback(ran.append, "unwound")
        return "held"

    async with served() as (app, client):
        app.handlers["echo"] = lambda: _now("hi")
        app.handlers["holds"] = holds
        assert (await post(client, call("echo")))[0] == 200
        assert unwound == []
        status, said = await post(client, call("holds"))
        assert status == 200 and b'"text":"held"' in said
        assert unwound == [1] and ran == ["unwound"]


async def test_the_body_is_the_json_serves_handler_parsed() -> None:
    async with served() as (app, client):
        app.handlers["echo"] = lambda: _now("hi")
        status, said = await post(client, call("echo"), path="/said")
        assert status == 200 and b'"text":"hi"' in said
