"""The MCP server a gateway wraps, and one gated ``tools/call`` against it: what the stdio
gateway (``approvald mcp-proxy``) and the Streamable HTTP one (``serve``'s ``/mcp/<name>``)
share.

One upstream session per client request. A server reached over Streamable HTTP gets, for
each request of a client, an :class:`mcp.Client` of its own (:meth:`Upstream.session`),
which declares that client's capabilities and relays what the server sends back to that
client (:mod:`bot.mcp.relay`): the gateway holds no session of its own clients (it is
stateless, any replica answers any request), and a shared upstream session could declare
only one set of capabilities and deliver a log line or a sampling request to nobody in
particular. On 2026-07-28 the request's own envelope says it all, so no round trip is added
(the version and capabilities first discovered are reused); a 2025-11-25 server gets an
``initialize`` per request. A server ``serve`` or ``mcp-proxy`` starts over stdio is one
process with one session: every request goes through it, with progress relayed per
request, and what else the server sends back given to the client whose forwarded request
is in flight, when it can be told (:mod:`bot.mcp.inflight`).

``tools/list`` is passed through (names, descriptions, input and output schemas,
annotations). Each ``tools/call`` is checked against the tool's input schema (arguments the
server would refuse are refused before anyone is asked), gated by a
:class:`bot.mcp.gateway.Gateway`, and forwarded with the arguments approved. Whatever the
gateway refuses reaches the client as a tool error (``isError: true``) whose text says why.
Tool annotations (``readOnlyHint``, ``destructiveHint``) come from the server, not the
operator: they are shown on cards and never change a policy.

A gated call's request binds the tool's identity (:func:`identity`), and an approved call is
forwarded only if the server still lists the tool with that identity (:meth:`Upstream.identify`
lists its tools afresh just before: see :mod:`bot.mcp.gateway`).
"""

from __future__ import annotations

import contextlib
import logging
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import httpx2
import mcp_types as types
from approvald.bot.mcp.gateway import Forward, Gateway, Identify, Ran, Refused
from approvald.bot.mcp.inflight import InFlight
from approvald.bot.mcp.relay import Relay
from approvald.runtime import GONE, Source, ToolIdentity, canonical_json, sha256_hex
from jsonschema import SchemaError
from jsonschema.validators import validator_for
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client
from mcp.server.context import ServerRequestContext
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

log = logging.getLogger("approvald.mcp")
# what a call still waiting for its decision at its budget is answered with instead
OnPending = Callable[[Refused], Awaitable[dict[str, Any]]]


def error_result(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)],
                                is_error=True)


def _text_of(result: types.CallToolResult) -> str:
    parts = [c.text for c in result.content if isinstance(c, types.TextContent)]
    return "\n".join(parts)[:4000] or "the tool reported an error"


# what a tool's identity covers: everything its server says about what the tool does and
# takes and gives back, which a model chooses it by, an approver reads, or a policy's rules
# read. Not its icons, its ``_meta`` or its ``execution`` (how it may be invoked, as a
# task or not): presentation and transport, which change nothing a call does
IDENTITY_FIELDS = ("name", "title", "description", "inputSchema", "outputSchema",
                   "annotations")


def identity(tool: types.Tool) -> ToolIdentity:
    """An upstream tool's identity, which its calls' approvals bind: its version is
    ``mcp:`` and a digest of its ``tools/list`` entry's :data:`IDENTITY_FIELDS`, its schema
    a digest of its input schema. Full-length digests (60 and 64 hex characters): the
    server is not trusted, and a shorter one is a collision it could search for."""
    entry = tool.model_dump(mode="json", by_alias=True, exclude_none=True)
    said = {k: entry[k] for k in IDENTITY_FIELDS if k in entry}
    return ToolIdentity("mcp:" + sha256_hex(canonical_json(said))[:60],
                        sha256_hex(canonical_json(tool.input_schema)))


def http_client(tls: ssl.SSLContext) -> httpx2.AsyncClient:
    """The HTTP client of one session with a Streamable HTTP server: the SDK transport's
    own when given none (its timeouts: 30 s, 5 min for a stream's reads;
    ``tests/unit/test_mcp_sdk_reliance.py`` checks it), with ``tls``."""
    return httpx2.AsyncClient(timeout=httpx2.Timeout(30.0, read=300.0), verify=tls)


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


class Checked:
    """Each listed tool entry's identity and input-schema validator, worked out once per
    entry (issue 50: every ``tools/call`` checked its arguments with a validator built for
    it, and digested its tool's entry, anew). A listing that gives the tool again gives a
    new entry, which is worked out again: what is kept is never another entry's."""

    def __init__(self) -> None:
        self._by_name: dict[str, tuple[types.Tool, ToolIdentity, Any]] = {}

    def of(self, tool: types.Tool) -> tuple[ToolIdentity, Any]:
        """(``tool``'s identity, its input schema's validator: None for a schema the
        validator cannot even be made for)."""
        kept = self._by_name.get(tool.name)
        if kept is None or kept[0] is not tool:
            schema = tool.input_schema
            try:
                validator: Any = validator_for(schema)(schema)
            except SchemaError:
                validator = None
            kept = self._by_name[tool.name] = (tool, identity(tool), validator)
        return kept[1], kept[2]

    def forget(self, name: str) -> None:
        self._by_name.pop(name, None)


class Upstream:
    """One wrapped MCP server, reached through an entered :class:`mcp.Client`: its tools
    (listed as the client pages through them, refreshed when an unknown one is called),
    their schemas, and forwarding a call."""

    def __init__(self, client: Client, name: str, *, url: str | None = None,
                 inflight: InFlight | None = None) -> None:
        self.client = client  # the first session: start-up checks, and a stdio server's all
        self.name = name
        self.url = url  # a Streamable HTTP server: a session per client request
        # a stdio server: the client requests forwarded on its one session (its client was
        # made with inflight.client_options()), whose clients what it sends back goes to
        self.inflight = inflight
        version = client.protocol_version
        # what server/discover said, reused by each 2026-07-28 request's session (no round
        # trip); None: the server speaks only the 2025-11-25 revision
        self.discover = types.DiscoverResult(
            supported_versions=[version], capabilities=client.server_capabilities,
            instructions=client.instructions) if version in MODERN_PROTOCOL_VERSIONS else None
        # what the server offers, in each revision it speaks (a 2026-07-28 server may offer a
        # 2025-11-25 client more: logging, which 2026-07-28 deprecates)
        self.offers = [client.server_capabilities]
        self.tools: dict[str, types.Tool] = {}
        self.descriptions: dict[str, str] = {}  # tool -> its description, for cards
        self.annotations: dict[str, dict[str, Any]] = {}  # tool -> its annotations
        self.identities: dict[str, ToolIdentity] = {}  # tool -> its identity, as listed
        self.checked = Checked()  # each entry called: its identity and validator, once
        self._tls: ssl.SSLContext | None = None  # see tls()

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
            self.identities[tool.name] = identity(tool)
            if tool.annotations is not None:
                self.annotations[tool.name] = tool.annotations.model_dump(
                    by_alias=True, exclude_none=True, mode="json")
            said = ((tool.description or "")[:1000] + hints(tool)).strip()
            if said:
                self.descriptions[tool.name] = said

    async def learn_revisions(self) -> None:
        """A Streamable HTTP server that speaks 2026-07-28 is asked once what it offers a
        2025-11-25 client too, whose requests go to it in that revision."""
        if self.url is not None and self.discover is not None:
            async with Client(self.url, cache=None, mode="legacy") as legacy:
                self.offers.append(legacy.server_capabilities)

    def offered(self, capability: str) -> bool:
        """Whether the server offers ``capability`` (``resources``, ``logging``...) in any
        revision it speaks."""
        return any(getattr(caps, capability, None) is not None for caps in self.offers)

    @contextlib.asynccontextmanager
    async def session(self, ctx: ServerRequestContext[Any] | None) -> AsyncIterator[Client]:
        """The upstream session that serves one client request (``ctx``): a Streamable HTTP
        server's own for it, declaring the client's capabilities and relaying to it; a
        stdio server's one session otherwise."""
        if self.url is None or ctx is None:
            yield self.client
            return
        relay = Relay(ctx)
        # the server hears the client's own revision where it speaks it: a 2025-11-25
        # client's request goes upstream as 2025-11-25 (an initialize, then the request)
        modern = relay.modern and self.discover is not None
        async with http_client(self.tls()) as http, \
                Client(streamable_http_client(self.url, http_client=http), cache=None,
                       mode=ctx.protocol_version if modern else "legacy",
                       prior_discover=self.discover if modern else None,
                       **relay.client_options()) as client:
            yield client

    def tls(self) -> ssl.SSLContext:
        """The TLS context of the HTTP client each session makes, made once: made per
        session (as the SDK's transport does when given no client), its CA bundle was
        loaded on every call forwarded, about 19 ms of CPU each (issue 50)."""
        if self._tls is None:
            self._tls = httpx2.create_ssl_context()
        return self._tls

    @contextlib.asynccontextmanager
    async def forwarding(self, ctx: ServerRequestContext[Any] | None,
                         relay: Relay | None = None) -> AsyncIterator[Client]:
        """The upstream session a client request (``ctx``) is forwarded on: as
        :meth:`session`, and on a stdio server's one session, the request counted in flight
        while it runs (what the server sends back meanwhile may be for its client)."""
        async with self.session(ctx) as client:
            if self.url is not None or ctx is None or self.inflight is None:
                yield client
                return
            with self.inflight.forwarding(relay or Relay(ctx)):
                yield client

    async def list_tools(self, cursor: str | None,
                         ctx: ServerRequestContext[Any] | None = None) -> types.ListToolsResult:
        """A page of the tools the server lists for this client (with its capabilities)."""
        async with self.session(ctx) as client:
            page = await client.list_tools(cursor=cursor)
        self._keep(page.tools)
        return types.ListToolsResult(tools=page.tools, next_cursor=page.next_cursor)

    async def tool(self, name: str,
                   ctx: ServerRequestContext[Any] | None = None) -> types.Tool | None:
        if name not in self.tools:  # not listed yet (or since added): walk the listing
            cursor: str | None = None
            async with self.session(ctx) as client:
                for _ in range(100):
                    page = await client.list_tools(cursor=cursor)
                    self._keep(page.tools)
                    cursor = page.next_cursor
                    if cursor is None or name in self.tools:
                        break
        return self.tools.get(name)

    def identify(self, name: str, ctx: ServerRequestContext[Any] | None = None) -> Identify:
        """How the identity of tool ``name`` now is found, just before an approved call of
        it is forwarded: the server's tools listed afresh (on the session of the client
        request ``ctx``), :data:`runtime.policies.tools.GONE` if it no longer lists the tool. What
        the listing says is kept, so the same call made again is asked about the tool as
        it is now."""
        async def identify() -> ToolIdentity:
            found: types.Tool | None = None
            cursor: str | None = None
            async with self.session(ctx) as client:
                for _ in range(100):
                    page = await client.list_tools(cursor=cursor)
                    self._keep(page.tools)
                    found = next((t for t in page.tools if t.name == name), found)
                    cursor = page.next_cursor
                    if cursor is None or found is not None:
                        break
            if found is None:  # no longer listed: its cached entries go too
                self.tools.pop(name, None)
                self.identities.pop(name, None)
                self.checked.forget(name)
                return GONE
            return identity(found)

        return identify

    @staticmethod
    def invalid(tool: types.Tool, args: dict[str, Any], validator: Any = None) -> str | None:
        """What is wrong with ``args`` by ``tool``'s input schema (None: nothing);
        ``validator``: the schema's, made before (:class:`Checked`)."""
        schema = tool.input_schema
        try:
            if validator is None:
                validator = validator_for(schema)(schema)
            error = next(iter(validator.iter_errors(args)), None)
        except SchemaError:
            return None  # the server's own schema is broken: let the server judge
        if error is None:
            return None
        where = "/".join(str(p) for p in error.absolute_path)
        return f"{where}: {error.message}" if where else error.message

    def forward(self, name: str, ctx: ServerRequestContext[Any] | None = None,
                params: types.CallToolRequestParams | None = None) -> Forward[Any]:
        """How an approved call of ``name`` is made: on the session of the client request
        ``ctx`` that runs it, its progress and what the server sends back relayed to that
        client; a 2026-07-28 server's ``input_required`` result passed back as it is, and
        the client's answers to one (``params``) passed on."""
        async def forward(args: dict[str, Any]) -> Ran[Any]:
            relay = Relay(ctx) if ctx is not None else None
            async with self.forwarding(ctx, relay) as client:
                try:
                    result = await client.session.call_tool(
                        name, args,
                        progress_callback=relay.progress if relay and relay.wants_progress
                        else None,
                        input_responses=params.input_responses if params else None,
                        request_state=params.request_state if params else None,
                        allow_input_required=True, allow_claimed=True)
                except MCPError as exc:  # the server's error: the client gets it as it is
                    return Ran(exc, "failed", {"error": exc.error.model_dump(
                        mode="json", exclude_none=True)}, exc.message)
            record = result.model_dump(mode="json", by_alias=True, exclude_none=True)
            if isinstance(result, types.CallToolResult) and result.is_error:
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
        tool = await self.tool(name, ctx)
        if tool is None:
            raise MCPError(types.INVALID_PARAMS, f"Unknown tool: {name}")
        checked, validator = self.checked.of(tool)
        problem = self.invalid(tool, args, validator)
        if problem is not None:  # the server would refuse them: nobody is asked
            return error_result(f"approvald: invalid arguments for {name}: {problem}. "
                                "Nothing was asked or executed.")
        gateway.descriptions.update(self.descriptions)
        gateway.annotations.update(self.annotations)
        # the identity of the entry the arguments were checked against (and the card shows)
        gateway.identities[name] = checked
        started = time.monotonic()

        async def waiting(doc: dict[str, Any]) -> None:
            # keeps clients that reset their timeout on progress waiting
            await ctx.session.report_progress(round(time.monotonic() - started, 1),
                                              message=await gateway.progress(doc))

        try:
            outcome = await gateway.call(name, args, self.forward(name, ctx, params),
                                         waiting=waiting, budget=budget,
                                         identify=self.identify(name, ctx))
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
        if isinstance(outcome.value, MCPError):  # the server's own error, passed on as it is
            raise outcome.value
        result: types.CallToolResult = outcome.value  # or a 2026-07-28 input_required
        return result
