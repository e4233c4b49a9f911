"""``approvald mcp-proxy``: an MCP server (stdio) in front of an MCP server it launches.

Built on the official ``mcp`` SDK: a low-level :class:`mcp.server.lowlevel.Server` speaks
to the MCP client over this process's stdin/stdout, and a :class:`mcp.Client` speaks to
the wrapped server, started as a subprocess over its own pipes. What is passed through and
how each call is gated: :mod:`bot.mcp.upstream`.
"""

from __future__ import annotations

import logging
import os
import shlex
from collections.abc import Sequence
from typing import Any

import mcp_types as types
from approvald.bot.mcp.front import Front
from approvald.bot.mcp.gateway import Gateway
from approvald.bot.mcp.inflight import InFlight
from approvald.bot.mcp.upstream import Upstream
from approvald.runtime import ConfigError
from mcp import Client, StdioServerParameters
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


class Proxy:
    """One MCP client on stdio, one wrapped server, the gateway between them."""

    def __init__(self, gateway: Gateway, command: Sequence[str]) -> None:
        self.gateway = gateway
        self.command = list(command)
        self.params = StdioServerParameters(command=self.command[0], args=self.command[1:],
                                            env=server_environment())
        self.upstream: Upstream | None = None

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
        inflight = InFlight()  # what the server sends back goes to the client's call
        async with Client(self.params, cache=None, **inflight.client_options()) as client:
            self.upstream = Upstream(client, self.gateway.name, inflight=inflight)
            await self.upstream.check_rules(self.gateway.source, self.gateway.e.policy_file())
            upstream = client
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
            Front(self.upstream, lambda ctx: self.gateway).register(server)
            log.info("mcp-proxy %s: serving the tools of %s", self.gateway.name,
                     shlex.join(self.command))
            async with stdio_server() as (read, write):
                await server.run(read, write, server.create_initialization_options())

    # -- tools/list and tools/call: the wrapped server's, gated ---------------------------
    async def _list_tools(self, ctx: ServerRequestContext[Any],
                          params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        assert self.upstream is not None
        return await self.upstream.list_tools(params.cursor if params else None, ctx)

    async def _call_tool(self, ctx: ServerRequestContext[Any],
                         params: types.CallToolRequestParams) -> types.CallToolResult:
        assert self.upstream is not None
        result = await self.upstream.call(self.gateway, ctx, params)
        assert not isinstance(result, dict)  # no on_pending: never a task
        return result
