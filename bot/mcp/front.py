"""Everything but the tool calls a gateway passes through: resources, prompts, completion
and logging, as the upstream offers them (a capability the upstream lacks is not offered).

Resources and prompts are named in the operator's policy like tools:
``mcp:<gateway>/resource:<uri>`` (a glob such as ``mcp:files/resource:file:///etc/*``) and
``mcp:<gateway>/prompt:<name>``, with rules that see ``args.uri`` (a resource) or the
prompt's arguments. They are readable by default (the intake lets through what the file
does not name, :meth:`runtime.policies.intake.Source.reads_by_default`), and an operator can gate a
read (it waits for its decision like a call) or forbid it (refused with the reason, never
reaching the upstream). Every read is a request through the same intake as a call, and
audited. A read whose decision does not come within the gateway's wait is an error naming
its request; the same read again joins it.

Listing (``resources/list``, ``resources/templates/list``, ``prompts/list``) and
``completion/complete`` are passed through ungated: they read names, not contents.
Subscriptions are not offered: a 2025-11-25 ``resources/subscribe`` delivers its updates on
a session's stream, which a stateless gateway does not keep.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import mcp_types as types
from approvald.bot.mcp.gateway import Forward, Gateway, Ran, Refused
from approvald.bot.mcp.upstream import Upstream
from approvald.runtime import TOOL_LIMIT
from mcp import MCPError
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server

GatewayFor = Callable[[ServerRequestContext[Any]], Gateway]


class Front:
    """The pass-through handlers of one gateway's MCP server, registered on ``server``
    for what the upstream offers. ``gateway_for`` is the :class:`Gateway` a request is
    gated by (over HTTP, its bearer token's); ``budget`` the seconds a gated read waits."""

    def __init__(self, upstream: Upstream, gateway_for: GatewayFor,
                 budget: float | None = None) -> None:
        self.upstream = upstream
        self.gateway_for = gateway_for
        self.budget = budget

    def register(self, server: Server[Any]) -> None:
        offered = self.upstream.offered
        if offered("resources"):
            server.add_request_handler("resources/list", types.PaginatedRequestParams,
                                       self._list_resources)
            server.add_request_handler("resources/templates/list",
                                       types.PaginatedRequestParams, self._list_templates)
            server.add_request_handler("resources/read", types.ReadResourceRequestParams,
                                       self._read_resource)
        if offered("prompts"):
            server.add_request_handler("prompts/list", types.PaginatedRequestParams,
                                       self._list_prompts)
            server.add_request_handler("prompts/get", types.GetPromptRequestParams,
                                       self._get_prompt)
        if offered("completions"):
            server.add_request_handler("completion/complete", types.CompleteRequestParams,
                                       self._complete)
        if offered("logging"):
            server.add_request_handler("logging/setLevel", types.SetLevelRequestParams,
                                       self._set_level)

    # -- listing: passed through ------------------------------------------------------
    async def _list_resources(self, ctx: ServerRequestContext[Any],
                              params: types.PaginatedRequestParams) -> types.ListResourcesResult:
        async with self.upstream.session(ctx) as client:
            return await client.session.list_resources(params=params)

    async def _list_templates(self, ctx: ServerRequestContext[Any],
                              params: types.PaginatedRequestParams
                              ) -> types.ListResourceTemplatesResult:
        async with self.upstream.session(ctx) as client:
            return await client.session.list_resource_templates(params=params)

    async def _list_prompts(self, ctx: ServerRequestContext[Any],
                            params: types.PaginatedRequestParams) -> types.ListPromptsResult:
        async with self.upstream.session(ctx) as client:
            return await client.session.list_prompts(params=params)

    async def _complete(self, ctx: ServerRequestContext[Any],
                        params: types.CompleteRequestParams) -> types.CompleteResult:
        async with self.upstream.session(ctx) as client:
            return await client.session.complete(
                params.ref, params.argument.model_dump(by_alias=True),
                context_arguments=params.context.arguments if params.context else None)

    async def _set_level(self, ctx: ServerRequestContext[Any],
                         params: types.SetLevelRequestParams) -> types.EmptyResult:
        # a stdio server's one session takes the level; over HTTP each request has a session
        # of its own, which hears every level (and a 2026-07-28 request its own opt-in)
        if self.upstream.url is not None:
            return types.EmptyResult()
        return await self.upstream.client.session.set_logging_level(params.level)

    # -- reads: named in the policy, readable by default -------------------------------
    async def _read_resource(self, ctx: ServerRequestContext[Any],
                             params: types.ReadResourceRequestParams) -> Any:
        uri = str(params.uri)

        async def read(args: dict[str, Any]) -> Ran[Any]:
            async with self.upstream.forwarding(ctx) as client:
                return await _ran(client.session.read_resource(
                    str(args["uri"]), input_responses=params.input_responses,
                    request_state=params.request_state, allow_input_required=True))

        return await self._gated(ctx, f"resource:{uri}", {"uri": uri}, read)

    async def _get_prompt(self, ctx: ServerRequestContext[Any],
                          params: types.GetPromptRequestParams) -> Any:
        async def get(args: dict[str, Any]) -> Ran[Any]:
            async with self.upstream.forwarding(ctx) as client:
                return await _ran(client.session.get_prompt(
                    params.name, {k: str(v) for k, v in args.items()},
                    input_responses=params.input_responses,
                    request_state=params.request_state, allow_input_required=True))

        return await self._gated(ctx, f"prompt:{params.name}", dict(params.arguments or {}),
                                 get)

    async def _gated(self, ctx: ServerRequestContext[Any], name: str, args: dict[str, Any],
                     forward: Forward[Any]) -> Any:
        if len(name.encode()) > TOOL_LIMIT:
            raise MCPError(types.INVALID_PARAMS, f"approvald: {name[:60]}… is too long to be "
                           f"named in a request ({len(name.encode())} bytes, at most "
                           f"{TOOL_LIMIT} with its prefix). Nothing was read.")
        gateway = self.gateway_for(ctx)
        started = time.monotonic()

        async def waiting(doc: dict[str, Any]) -> None:
            await ctx.session.report_progress(round(time.monotonic() - started, 1),
                                              message=await gateway.progress(doc))

        outcome = await gateway.call(name, args, forward, waiting=waiting, budget=self.budget)
        if isinstance(outcome, Refused):
            raise MCPError(types.INVALID_REQUEST, outcome.message,
                           {"status": outcome.status, "request": outcome.request_id})
        if isinstance(outcome.value, MCPError):
            raise outcome.value
        return outcome.value


async def _ran(request: Awaitable[types.Result]) -> Ran[Any]:
    """What came of one request upstream; the server's error is kept, for the client to get
    as it is (caught inside the session, before its task group wraps it)."""
    try:
        result = await request
    except MCPError as exc:
        return Ran(exc, "failed", {"error": exc.error.model_dump(mode="json",
                                                                 exclude_none=True)},
                   exc.message)
    return Ran(result, "succeeded",
               result.model_dump(mode="json", by_alias=True, exclude_none=True))
