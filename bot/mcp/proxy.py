"""``approvald mcp-proxy``: an MCP server (stdio) in front of an MCP server it launches.

Built on the official ``mcp`` SDK: a low-level :class:`mcp.server.lowlevel.Server` speaks
to the MCP client over this process's stdin/stdout, and a :class:`mcp.Client` speaks to
the wrapped server, started as a subprocess over its own pipes. ``tools/list`` is passed
through (names, descriptions, input and output schemas, annotations); each ``tools/call``
is gated by :class:`bot.mcp.gateway.Gateway` first. Whatever the gateway refuses reaches
the client as a tool error (``isError: true``) whose text says why; an unknown tool or
arguments that do not fit the tool's input schema are refused before anything is asked.
"""

from __future__ import annotations

import logging
import os
import shlex
import time
from collections.abc import Sequence
from typing import Any

import mcp_types as types
from approvald.bot.mcp.gateway import Forward, Gateway, Ran, Refused
from approvald.runtime.errors import ConfigError
from jsonschema import SchemaError
from jsonschema.validators import validator_for
from mcp import Client, MCPError, StdioServerParameters
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

log = logging.getLogger("approvald.mcp")

# what the wrapped server is not given of this process's environment: approvald's own
# settings and secrets (the database, the Slack tokens, the signing keys)
PRIVATE_ENV = ("APPROVALD_", "SLACK_")


def server_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The wrapped server's environment: this one's, less approvald's settings."""
    env = dict(os.environ if environ is None else environ)
    return {k: v for k, v in env.items() if not k.startswith(PRIVATE_ENV)}


def error_result(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)],
                                is_error=True)


def _text_of(result: types.CallToolResult) -> str:
    parts = [c.text for c in result.content if isinstance(c, types.TextContent)]
    return "\n".join(parts)[:4000] or "the tool reported an error"


class Proxy:
    """One MCP client on stdio, one wrapped server, the gateway between them."""

    def __init__(self, gateway: Gateway, command: Sequence[str]) -> None:
        self.gateway = gateway
        self.command = list(command)
        self.params = StdioServerParameters(command=self.command[0], args=self.command[1:],
                                            env=server_environment())
        self.tools: dict[str, types.Tool] = {}
        self.upstream: Client | None = None

    async def serve(self) -> None:
        """Start the wrapped server, then serve the client on stdio until it hangs up."""
        await self.gateway.token()  # a revoked gateway says so before anything starts
        try:
            await self._serve()
        except* (BrokenPipeError, ConnectionResetError):  # the client went away mid-answer
            log.info("mcp-proxy %s: the client hung up", self.gateway.name)
        except* ConfigError as refused:  # a rule refused at start: one line, not a group
            first: BaseException = refused  # nested in the SDK's task groups
            while isinstance(first, BaseExceptionGroup):
                first = first.exceptions[0]
            raise first from None

    async def _serve(self) -> None:
        async with Client(self.params, cache=None) as upstream:
            self.upstream = upstream
            await self._check_rules()
            info = upstream.server_info
            server: Server[Any] = Server(
                f"approvald-{self.gateway.name}",
                version=info.version if info else "",
                title=f"{(info.title or info.name) if info else self.gateway.name}"
                      " (gated by approvald)",
                instructions=upstream.instructions,
                on_list_tools=self._list_tools,
                on_call_tool=self._call_tool,
            )
            log.info("mcp-proxy %s: serving the tools of %s", self.gateway.name,
                     shlex.join(self.command))
            async with stdio_server() as (read, write):
                await server.run(read, write, server.create_initialization_options())

    # -- tools/list ---------------------------------------------------------------------
    async def _check_rules(self) -> None:
        """Refuse to start on a policy rule that would fail on every call of its tool: each
        listed tool's rules are checked against its input schema (a ConfigError line)."""
        assert self.upstream is not None
        policy = self.gateway.e.registry.policy
        kind, base = policy.default_policy()  # what the file's entries for this source apply over
        cursor: str | None = None
        for _ in range(100):
            page = await self.upstream.list_tools(cursor=cursor)
            self._keep(page.tools)
            for tool in page.tools:
                policy.check(self.gateway.source.policy_name(tool.name), kind, base,
                             tool.input_schema)
            cursor = page.next_cursor
            if cursor is None:
                break

    def _keep(self, tools: Sequence[types.Tool]) -> None:
        for tool in tools:
            self.tools[tool.name] = tool
            if tool.description:
                self.gateway.descriptions[tool.name] = tool.description[:1000]

    async def _list_tools(self, ctx: ServerRequestContext[Any],
                          params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        assert self.upstream is not None
        page = await self.upstream.list_tools(cursor=params.cursor if params else None)
        self._keep(page.tools)
        return types.ListToolsResult(tools=page.tools, next_cursor=page.next_cursor)

    async def _tool(self, name: str) -> types.Tool | None:
        if name not in self.tools:  # not listed yet (or since added): walk the listing
            assert self.upstream is not None
            cursor: str | None = None
            for _ in range(100):
                page = await self.upstream.list_tools(cursor=cursor)
                self._keep(page.tools)
                cursor = page.next_cursor
                if cursor is None or name in self.tools:
                    break
        return self.tools.get(name)

    # -- tools/call ---------------------------------------------------------------------
    async def _call_tool(self, ctx: ServerRequestContext[Any],
                         params: types.CallToolRequestParams) -> types.CallToolResult:
        name, args = params.name, dict(params.arguments or {})
        tool = await self._tool(name)
        if tool is None:
            raise MCPError(types.INVALID_PARAMS, f"Unknown tool: {name}")
        problem = self._invalid(tool, args)
        if problem is not None:  # the server would refuse them: nobody is asked
            return error_result(f"approvald: invalid arguments for {name}: {problem}. "
                                "Nothing was asked or executed.")
        started = time.monotonic()

        async def waiting(doc: dict[str, Any]) -> None:
            # keeps clients that reset their timeout on progress waiting
            await ctx.session.report_progress(round(time.monotonic() - started, 1),
                                              message=await self.gateway.progress(doc))

        try:
            outcome = await self.gateway.call(name, args, self._forward(name),
                                              waiting=waiting)
        except Exception as exc:
            log.warning("mcp-proxy %s: %s failed in the gateway", self.gateway.name, name,
                        exc_info=True)
            return error_result(f"approvald: {name} failed: {type(exc).__name__}: {exc}. "
                                "If it had started, its outcome is unknown and it will not "
                                "be run again.")
        if isinstance(outcome, Refused):
            return error_result(outcome.message)
        result: types.CallToolResult = outcome.value
        return result

    def _invalid(self, tool: types.Tool, args: dict[str, Any]) -> str | None:
        schema = tool.input_schema
        try:
            validator = validator_for(schema)(schema)
            error = next(iter(validator.iter_errors(args)), None)
        except SchemaError:
            return None  # the server's own schema is broken: let the server judge
        if error is None:
            return None
        where = "/".join(str(p) for p in error.absolute_path)
        return f"{where}: {error.message}" if where else error.message

    def _forward(self, name: str) -> Forward[types.CallToolResult]:
        async def forward(args: dict[str, Any]) -> Ran[types.CallToolResult]:
            assert self.upstream is not None
            try:
                result = await self.upstream.call_tool(name, args)
            except MCPError as exc:  # the server answered with an error: the call failed
                return Ran(error_result(f"{name} failed: {exc.message}"), "failed",
                           {"error": {"code": exc.code, "message": exc.message}},
                           exc.message)
            record = result.model_dump(mode="json", by_alias=True, exclude_none=True)
            if result.is_error:
                return Ran(result, "failed", record, _text_of(result))
            return Ran(result, "succeeded", record)

        return forward
