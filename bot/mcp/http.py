"""``serve``'s MCP gateways over Streamable HTTP: ``/mcp/<name>`` on its listener.

Each gateway named in ``APPROVALD_MCP_GATEWAYS_FILE`` wraps one MCP server, started by
``serve`` (``command``, over stdio) or reached over Streamable HTTP (``url``), and serves its
tools to remote MCP clients through the SDK's Streamable HTTP transport in stateless mode
(the 2026-07-28 revision, with the Tasks extension: :mod:`bot.mcp.tasks`; clients of earlier
revisions are served as the SDK allows): no
session lives in a process, so any replica answers any request. What is listed and how each
call is gated: :mod:`bot.mcp.upstream`, :mod:`bot.mcp.gateway`; what else passes through
(resources, prompts, completion, logging): :mod:`bot.mcp.front`.

A request is authenticated before anything else: a bearer token made for that gateway
(``approvald tokens create NAME --face mcp:<gateway> --requested-by U…``), else 401; a token
for anything else is a 403. Every call made with a token is made for the person it was made
for, and is that token's: the same call from another token is another request. Then the
SDK checks ``Host`` (421 unless allowed: serve's own address and the file's
``allowed_hosts``) and ``Origin`` (403 unless in ``allowed_origins``; a request without one,
as non-browser clients send, passes). A gated call waits for its decision up to the
gateway's ``wait`` (progress notifications meanwhile, over server-sent events); still
undecided, it is a tool error naming the request, and the same call made again joins it.
"""

from __future__ import annotations

import contextlib
import logging
import shlex
import tomllib
from pathlib import Path
from typing import Annotated, Any

import mcp_types as types
import pydantic_core
from aiohttp import web
from approvald.bot.asgi import answer
from approvald.bot.mcp import fastcall, stdio
from approvald.bot.mcp.fastcall import FastCall
from approvald.bot.mcp.front import Front
from approvald.bot.mcp.gateway import Gateway, Refused
from approvald.bot.mcp.inflight import InFlight
from approvald.bot.mcp.proxy import server_environment
from approvald.bot.mcp.relay import BACK_KEY, SESSION_KEY, TOKEN_KEY, BackChannel, Session
from approvald.bot.mcp.tasks import (
    EXTENSION,
    TaskIds,
    TaskParams,
    Tasks,
    admitted,
    declared,
)
from approvald.bot.mcp.upstream import Upstream
from approvald.runtime import ConfigError, Engine, Source, api_tokens
from approvald.store.repos.external import TokenRecord
from mcp import Client, MCPError, StdioServerParameters
from mcp.client import Transport
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    model_validator,
)

log = logging.getLogger("approvald.mcp")

MAX_BODY = 4 * 1024 * 1024
Name = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9._-]{0,59}$")]


class GatewayConfig(BaseModel):
    """One ``[gateways.NAME]`` table."""

    model_config = ConfigDict(extra="forbid")

    command: list[str] | None = Field(None, min_length=1, description="the MCP server serve "
                                      "starts and speaks to over stdio")
    url: str | None = Field(None, pattern=r"^https?://", description="an MCP server serve "
                            "reaches over Streamable HTTP")
    allowed_hosts: list[str] = Field(default_factory=list, description="Host header values "
                                     "clients may send besides serve's own address "
                                     "(host:port, or host:* for any port)")
    allowed_origins: list[str] = Field(default_factory=list, description="Origin values "
                                       "browsers may send (none by default)")
    wait: float = Field(50.0, ge=0, le=600, description="seconds a gated call waits for its "
                        "decision before it answers with a tool error naming the request")

    @model_validator(mode="after")
    def _one_server(self) -> GatewayConfig:
        if (self.command is None) == (self.url is None):
            raise ValueError("give the MCP server as command = [...] or url = \"...\", "
                             "one of the two")
        return self

    def server(self) -> str:
        return shlex.join(self.command) if self.command else str(self.url)


class GatewaysFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    gateways: dict[Name, GatewayConfig] = Field(default_factory=dict)


def load(path: Path) -> dict[str, GatewayConfig]:
    """The file's gateways; a ConfigError naming the file and the field on any mistake."""
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
        return dict(GatewaysFile.model_validate(raw).gateways)
    except OSError as exc:
        raise ConfigError(f"APPROVALD_MCP_GATEWAYS_FILE: cannot read {path}: "
                          f"{exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"APPROVALD_MCP_GATEWAYS_FILE: {path} is not TOML: {exc}") from None
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(x) for x in err["loc"])
        msg = str(err["msg"]).removeprefix("Value error, ")
        raise ConfigError(f"APPROVALD_MCP_GATEWAYS_FILE: {path}: {where}: {msg}") from None


class HttpGateway:
    """One gateway: its upstream, an SDK server in front of it, and a :class:`Gateway` per
    bearer token (each token's calls are its own, for its person)."""

    def __init__(self, engine: Engine, name: str, config: GatewayConfig, *,
                 secret: str | None = None, fast_path: bool = True) -> None:
        self.e = engine
        self.name = name
        self.config = config
        self.secret = secret  # task ids are MACed under it; without one, no Tasks
        self.tasks: Tasks | None = None
        self.face = f"mcp:{name}"
        self.upstream: Upstream | None = None
        self.manager: StreamableHTTPSessionManager | None = None
        self.fast_path = fast_path
        self.fast: FastCall | None = None  # a 2025-era tools/call, answered without the
        # SDK's per-request transport (bot.mcp.fastcall)
        self._gateways: dict[str, Gateway] = {}
        self.hosts: list[str] = list(config.allowed_hosts)

    async def start(self, stack: contextlib.AsyncExitStack) -> None:
        """Reach the upstream (checking the policy's rules against its tools) and start the
        transport; both end with ``stack``."""
        c = self.config
        target: StdioServerParameters | str | Transport = (
            StdioServerParameters(command=c.command[0], args=c.command[1:],
                                  env=server_environment()) if c.command else str(c.url))
        if isinstance(target, StdioServerParameters) and self.fast_path:
            if gaps := stdio.missing():  # a release of the SDK without them: its transport
                log.warning("MCP gateway %s: its stdio transport is the SDK's: the mcp SDK "
                            "lacks %s", self.name, ", ".join(gaps))
            else:  # the same process and bytes, without the SDK's relay tasks
                target = stdio.stdio_transport(target)
        # a stdio server's one session: what it sends back goes to the client in flight
        inflight = InFlight() if c.command else None
        try:
            client = await stack.enter_async_context(Client(
                target, cache=None, **(inflight.client_options() if inflight else {})))
        except Exception as exc:  # one line that names the gateway, not a task group's dump
            first: BaseException = exc
            while isinstance(first, BaseExceptionGroup) and first.exceptions:
                first = first.exceptions[0]
            raise ConfigError(f"APPROVALD_MCP_GATEWAYS_FILE: gateway {self.name}: cannot "
                              f"reach its MCP server ({c.server()}): "
                              f"{type(first).__name__}: {first}") from None
        self.upstream = Upstream(client, self.name, url=c.url, inflight=inflight)
        await self.upstream.learn_revisions()
        await self.upstream.check_rules(Source("mcp", self.name), self.e.policy_file())
        info = client.server_info
        server: Server[Any] = Server(
            f"approvald-{self.name}", version=info.version if info else "",
            title=f"{(info.title or info.name) if info else self.name} (gated by approvald)",
            instructions=client.instructions,
            on_list_tools=self._list_tools, on_call_tool=self._call_tool)
        Front(self.upstream, lambda ctx: self.gateway_for(_token(ctx)),
              budget=c.wait).register(server)
        if self.secret:
            self.tasks = Tasks(TaskIds(self.secret, self.name), self.upstream)
            server.extensions[EXTENSION] = {}
            for method, handler in (("tasks/get", self._task_get),
                                    ("tasks/update", self._task_update),
                                    ("tasks/cancel", self._task_cancel)):
                server.add_request_handler(method, TaskParams, handler)
            server.add_request_handler("tasks/list", types.PaginatedRequestParams,
                                       self._task_list)
        security = TransportSecuritySettings(
            enable_dns_rebinding_protection=True, allowed_hosts=self.hosts,
            allowed_origins=list(c.allowed_origins))
        self.manager = StreamableHTTPSessionManager(
            server, stateless=True, max_request_body_size=MAX_BODY,
            security_settings=security)
        await stack.enter_async_context(self.manager.run())
        gaps = fastcall.missing() if self.fast_path else []
        if gaps:  # a release of the SDK without them: every request through it
            log.warning("MCP gateway %s: the fast path is off: the mcp SDK lacks %s",
                        self.name, ", ".join(gaps))
        elif self.fast_path:
            self.fast = FastCall(server, self.manager, security, MAX_BODY)
        log.info("MCP gateway %s: serving the tools of %s at /mcp/%s", self.name,
                 c.server(), self.name)

    def allow_own_address(self, host: str, port: int) -> None:
        """serve's listener's own address is always a Host clients may send."""
        for h in {host, "127.0.0.1", "localhost"} if host in ("0.0.0.0", "::") else {host}:
            self.hosts.append(f"[{h}]:{port}" if ":" in h else f"{h}:{port}")

    def gateway_for(self, token: TokenRecord) -> Gateway:
        found = self._gateways.get(token.id)
        if found is None:
            assert token.requested_by is not None  # a face token always has one
            found = self._gateways[token.id] = Gateway(
                self.e, name=self.name, requested_by=token.requested_by,
                server=self.config.server(), bearer=token.name, bearer_token=token)
        return found

    # -- the MCP side --------------------------------------------------------------------
    async def _list_tools(self, ctx: ServerRequestContext[Any],
                          params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        assert self.upstream is not None
        return await self.upstream.list_tools(params.cursor if params else None, ctx)

    async def _call_tool(self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
                         ) -> types.CallToolResult:
        assert self.upstream is not None
        token = _token(ctx)
        gateway = self.gateway_for(token)
        tasks = self.tasks
        if tasks is not None and declared(ctx):  # a task at once, polled until decided
            async def task(pending: Refused) -> dict[str, Any]:
                return await tasks.created(gateway, token, pending)
            made = await self.upstream.call(gateway, ctx, params, budget=0, on_pending=task)
        else:
            made = await self.upstream.call(gateway, ctx, params, budget=self.config.wait)
        # a CreateTaskResult is a dict the SDK passes through as an extension's result
        return made  # type: ignore[return-value]

    def _tasks(self) -> Tasks:
        if self.tasks is None:
            raise MCPError(types.METHOD_NOT_FOUND, "Tasks are off (no APPROVALD_SECRET)")
        return self.tasks

    async def _task_get(self, ctx: ServerRequestContext[Any],
                        params: TaskParams) -> dict[str, Any]:
        admitted(ctx, params)
        token = _token(ctx)
        return await self._tasks().get(self.gateway_for(token), token, params)

    async def _task_update(self, ctx: ServerRequestContext[Any],
                           params: TaskParams) -> dict[str, Any]:
        admitted(ctx, params)
        token = _token(ctx)
        return await self._tasks().update(self.gateway_for(token), token, params)

    async def _task_cancel(self, ctx: ServerRequestContext[Any],
                           params: TaskParams) -> dict[str, Any]:
        admitted(ctx, params)
        token = _token(ctx)
        return await self._tasks().cancel(self.gateway_for(token), token, params)

    async def _task_list(self, ctx: ServerRequestContext[Any],
                         params: types.PaginatedRequestParams) -> dict[str, Any]:
        admitted(ctx, None)
        raise MCPError(types.METHOD_NOT_FOUND, "approvald: tasks are not listed; a task is "
                       "polled by the id its tools/call returned")


def _token(ctx: ServerRequestContext[Any]) -> TokenRecord:
    """The bearer token the request was authenticated with (serve's handler put it in the
    ASGI scope before the SDK saw the request)."""
    token = getattr(ctx.request, "scope", {}).get(TOKEN_KEY)
    if not isinstance(token, TokenRecord):  # never: every request is authenticated
        raise MCPError(types.INVALID_REQUEST, "approvald: no token")
    return token


class HttpGateways:
    """What ``serve`` mounts: ``/mcp/<name>`` for each configured gateway."""

    def __init__(self, engine: Engine, configs: dict[str, GatewayConfig], *,
                 secret: str | None = None, fast_path: bool = True) -> None:
        self.e = engine
        self.gateways = {name: HttpGateway(engine, name, c, secret=secret,
                                           fast_path=fast_path)
                         for name, c in configs.items()}
        self._stack = contextlib.AsyncExitStack()
        # server-to-client requests written on this process's streams, awaiting replies
        self.back = BackChannel()

    async def start(self, host: str, port: int | None) -> None:
        try:
            for g in self.gateways.values():
                if port is not None:
                    g.allow_own_address(host, port)
                await g.start(self._stack)
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self._stack.aclose()

    def add_routes(self, app: web.Application) -> None:
        app.router.add_route("*", "/mcp/{name}", self.handle)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        g = self.gateways.get(request.match_info["name"])
        if g is None or g.manager is None:
            return _error(404, "unknown_gateway", f"no MCP gateway is served at {request.path}")
        header = request.headers.get("Authorization", "")
        # from memory once found live: a tools/call's request checks it is still live
        # (the gateway's checks); every other message reads it again below
        token = await self.e.caller(header, to_open=True)
        if token is None:
            return _unauthorized(g)
        refused = api_tokens.face_refusal(token, g.face)
        if refused is not None:
            return _error(403, "wrong_face", refused)
        body: bytes | None = None
        said: Any = None
        headers: dict[str, str] = {}
        if request.method == "POST" and (request.content_length or 0) <= MAX_BODY:
            body = await _read(request)
            with contextlib.suppress(ValueError):  # parsed once, as the SDK parses it
                said = pydantic_core.from_json(body)
        if not (isinstance(said, dict) and said.get("method") == "tools/call"):
            token = await self.e.caller(header)  # not a call: read now
            if token is None:
                return _unauthorized(g)
        if request.method == "POST" and body is not None:
            if self.back.deliver(token.id, said):  # a reply to a request relayed here
                return web.Response(status=202)
            if isinstance(said, dict) and said.get("method") == "initialize":
                # a 2025-11-25 client's session: what it declared, for its later requests
                with contextlib.suppress(ValueError):
                    caps = types.ClientCapabilities.model_validate(
                        (said.get("params") or {}).get("capabilities") or {})
                    made = Session(caps).encode()
                    if made is not None:
                        headers["Mcp-Session-Id"] = made
        session = Session.decode(request.headers.get("Mcp-Session-Id"))
        scope = {TOKEN_KEY: token, SESSION_KEY: session, BACK_KEY: self.back}
        if g.fast is not None and body is not None:
            fast = await g.fast.answer(request, body, said, **scope)
            if fast is not None:
                return fast
        return await answer(g.manager.handle_request, request, body=body, headers=headers,
                            **scope)


async def _read(request: web.Request) -> bytes:
    """The request's body, up to one byte past MAX_BODY (the SDK refuses a longer one)."""
    chunks: list[bytes] = []
    size = 0
    while size <= MAX_BODY:
        chunk = await request.content.read(64 * 1024)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _unauthorized(g: HttpGateway) -> web.Response:
    return _error(401, "unauthorized", "a valid bearer token is required "
                  f"(`approvald tokens create NAME --face {g.face} --requested-by U…`)",
                  {"WWW-Authenticate": 'Bearer realm="approvald"'})


def _error(status: int, code: str, message: str,
           headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message}}, status=status,
                             headers=headers)
