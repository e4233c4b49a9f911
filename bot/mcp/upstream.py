"""The MCP server a gateway wraps, and one gated ``tools/call`` against it: what the stdio
gateway (``approvald mcp-proxy``) and the Streamable HTTP one (``serve``'s ``/mcp/<name>``)
share.

``tools/list`` is passed through (names, descriptions, input and output schemas,
annotations). Each ``tools/call`` is checked against the tool's input schema (arguments the
server would refuse are refused before anyone is asked), gated by a
:class:`bot.mcp.gateway.Gateway`, and forwarded with the arguments approved. Whatever the
gateway refuses reaches the client as a tool error (``isError: true``) whose text says why.
Tool annotations (``readOnlyHint``, ``destructiveHint``) come from the server, not the
operator: they are shown on cards and never change a policy.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import mcp_types as types
from approvald.bot.mcp.gateway import Forward, Gateway, Ran, Refused
from approvald.runtime.intake import Source
from jsonschema import SchemaError
from jsonschema.validators import validator_for
from mcp import Client, MCPError
from mcp.server.context import ServerRequestContext

log = logging.getLogger("approvald.mcp")
# what a call still waiting for its decision at its budget is answered with instead
OnPending = Callable[[Refused], Awaitable[dict[str, Any]]]


def error_result(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)],
                                is_error=True)


def _text_of(result: types.CallToolResult) -> str:
    parts = [c.text for c in result.content if isinstance(c, types.TextContent)]
    return "\n".join(parts)[:4000] or "the tool reported an error"


def hints(tool: types.Tool) -> str:
    """What the server says of the tool (shown to the approver, never trusted)."""
    a = tool.annotations
    if a is None:
        return ""
    said = [name for name, on in (("read-only", a.read_only_hint),
                                   ("destructive", a.destructive_hint),
                                   ("idempotent", a.idempotent_hint),
                                   ("open-world", a.open_world_hint)) if on]
    return f" (the server calls it {', '.join(said)})" if said else ""


class Upstream:
    """One wrapped MCP server, reached through an entered :class:`mcp.Client`: its tools
    (listed as the client pages through them, refreshed when an unknown one is called),
    their schemas, and forwarding a call."""

    def __init__(self, client: Client, name: str) -> None:
        self.client = client
        self.name = name
        self.tools: dict[str, types.Tool] = {}
        self.descriptions: dict[str, str] = {}  # tool -> its description, for cards
        self.annotations: dict[str, dict[str, Any]] = {}  # tool -> its annotations

    async def check_rules(self, gateway_source: Source, policy: Any) -> None:
        """Refuse to start on a policy rule that would fail on every call of its tool: each
        listed tool's rules are checked against its input schema (a ConfigError line)."""
        kind, base = policy.default_policy()  # what the file's entries for this source apply over
        cursor: str | None = None
        for _ in range(100):
            page = await self.client.list_tools(cursor=cursor)
            self._keep(page.tools)
            for tool in page.tools:
                policy.check(gateway_source.policy_name(tool.name), kind, base,
                             tool.input_schema)
            cursor = page.next_cursor
            if cursor is None:
                break

    def _keep(self, tools: Sequence[types.Tool]) -> None:
        for tool in tools:
            self.tools[tool.name] = tool
            if tool.annotations is not None:
                self.annotations[tool.name] = tool.annotations.model_dump(
                    by_alias=True, exclude_none=True, mode="json")
            said = ((tool.description or "")[:1000] + hints(tool)).strip()
            if said:
                self.descriptions[tool.name] = said

    async def list_tools(self, cursor: str | None) -> types.ListToolsResult:
        page = await self.client.list_tools(cursor=cursor)
        self._keep(page.tools)
        return types.ListToolsResult(tools=page.tools, next_cursor=page.next_cursor)

    async def tool(self, name: str) -> types.Tool | None:
        if name not in self.tools:  # not listed yet (or since added): walk the listing
            cursor: str | None = None
            for _ in range(100):
                page = await self.client.list_tools(cursor=cursor)
                self._keep(page.tools)
                cursor = page.next_cursor
                if cursor is None or name in self.tools:
                    break
        return self.tools.get(name)

    @staticmethod
    def invalid(tool: types.Tool, args: dict[str, Any]) -> str | None:
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

    def forward(self, name: str) -> Forward[types.CallToolResult]:
        async def forward(args: dict[str, Any]) -> Ran[types.CallToolResult]:
            try:
                result = await self.client.call_tool(name, args)
            except MCPError as exc:  # the server answered with an error: the call failed
                return Ran(error_result(f"{name} failed: {exc.message}"), "failed",
                           {"error": {"code": exc.code, "message": exc.message}},
                           exc.message)
            record = result.model_dump(mode="json", by_alias=True, exclude_none=True)
            if result.is_error:
                return Ran(result, "failed", record, _text_of(result))
            return Ran(result, "succeeded", record)

        return forward

    async def call(self, gateway: Gateway, ctx: ServerRequestContext[Any],
                   params: types.CallToolRequestParams, *, budget: float | None = None,
                   on_pending: OnPending | None = None) -> types.CallToolResult | dict[str, Any]:
        """One ``tools/call``, gated by ``gateway`` (``budget``: seconds it waits for a
        decision before answering with a tool error naming the request, which the same
        call made again joins, or with what ``on_pending`` makes of it; None, until
        decided)."""
        name, args = params.name, dict(params.arguments or {})
        tool = await self.tool(name)
        if tool is None:
            raise MCPError(types.INVALID_PARAMS, f"Unknown tool: {name}")
        problem = self.invalid(tool, args)
        if problem is not None:  # the server would refuse them: nobody is asked
            return error_result(f"approvald: invalid arguments for {name}: {problem}. "
                                "Nothing was asked or executed.")
        gateway.descriptions.update(self.descriptions)
        gateway.annotations.update(self.annotations)
        started = time.monotonic()

        async def waiting(doc: dict[str, Any]) -> None:
            # keeps clients that reset their timeout on progress waiting
            await ctx.session.report_progress(round(time.monotonic() - started, 1),
                                              message=await gateway.progress(doc))

        try:
            outcome = await gateway.call(name, args, self.forward(name), waiting=waiting,
                                         budget=budget)
        except Exception as exc:
            log.warning("MCP gateway %s: %s failed in the gateway", gateway.name, name,
                        exc_info=True)
            return error_result(f"approvald: {name} failed: {type(exc).__name__}: {exc}. "
                                "If it had started, its outcome is unknown and it will not "
                                "be run again.")
        if isinstance(outcome, Refused):
            if outcome.status == "pending" and on_pending is not None:
                return await on_pending(outcome)
            return error_result(outcome.message)
        result: types.CallToolResult = outcome.value
        return result
