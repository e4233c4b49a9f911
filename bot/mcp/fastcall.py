"""A 2025-era client's ``tools/call`` answered in serve's own handler (issue 50).

The SDK's stateless Streamable HTTP transport serves each POST with the machinery of a
session, made and torn down per request: a transport and its message router, a server
task, a dispatcher with its task group and a task for the request, memory streams between
them all, and an SSE response with four tasks of its own. That machinery, not the
decision, was most of an MCP auto decision's CPU (over 1,000 of its Python calls in anyio
alone). This answers the request it is all built around, the one a fleet makes: a POST
whose headers pass every check the SDK makes and whose body is one valid ``tools/call``.
It runs the SDK's own kernel on it (:func:`mcp.server.runner.serve_one`, as the SDK's
stateless path does through its dispatcher: the spec's validation of the request, the
handler, the serialization of its result) under a dispatch context that writes to the
response what the SDK writes: the same headers, the same ``event: message`` frames for
notifications and the reply, the same keep-alive pings, the same errors for what the
handler raises; a client that goes away has its call cancelled, as the SDK's does.
Everything else (another method, a batch, a header the transport's checks refuse, a
2026-07-28 request) is left to the SDK, which answers it as it always did; a Host or Origin
its security check refuses gets that check's own response (checked once, logged once).

The SDK's private names it relies on are listed in :data:`RELIES_ON` (a test names them);
``APPROVALD_MCP_FAST_PATH=0`` serves every request through the SDK.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from datetime import UTC, datetime
from typing import Any

import anyio
from aiohttp import web
from approvald.bot.asgi import GONE_POLL, answer, scope_of
from mcp.server.connection import Connection
from mcp.server.lowlevel import Server
from mcp.server.runner import ServerRunner, aclose_shielded
from mcp.server.streamable_http import CONTENT_TYPE_JSON, CONTENT_TYPE_SSE, check_accept_headers
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecurityMiddleware, TransportSecuritySettings
from mcp.shared.dispatcher import CallOptions
from mcp.shared.exceptions import NoBackChannelError
from mcp.shared.inbound import MCP_PROTOCOL_VERSION_HEADER
from mcp.shared.jsonrpc_dispatcher import (
    handler_exception_to_error_data,
    progress_token_from_params,
)
from mcp.shared.message import MessageMetadata, ServerMessageMetadata
from mcp.shared.transport_context import TransportContext
from mcp_types import (
    DEFAULT_NEGOTIATED_VERSION,
    ErrorData,
    JSONRPCError,
    JSONRPCMessage,
    JSONRPCNotification,
    JSONRPCRequest,
    JSONRPCResponse,
    ProgressToken,
    RequestId,
    jsonrpc_message_adapter,
)
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from sse_starlette import EventSourceResponse, ServerSentEvent
from sse_starlette.event import ensure_bytes
from starlette.requests import Request

log = logging.getLogger("approvald.mcp")

# (where, name): the SDK's private names this module reads
RELIES_ON = (
    ("mcp.server.streamable_http_manager.StreamableHTTPSessionManager", "_lifespan_state"),
)


def missing() -> list[str]:
    """The names of :data:`RELIES_ON` the installed SDK lacks (none: all there)."""
    made = StreamableHTTPSessionManager(Server("approvald-check"), stateless=True)
    return [f"{what}.{name}" for what, name in RELIES_ON if not hasattr(made, name)]


KEEP_PASSED = 64  # header values kept as passing the SDK's checks (then forgotten, all)
SEP = EventSourceResponse.DEFAULT_SEPARATOR
PING = EventSourceResponse.DEFAULT_PING_INTERVAL
# the headers the SDK's stateless transport gives its SSE response (no session id)
TRANSPORT_HEADERS = {"Cache-Control": "no-cache, no-transform", "Connection": "keep-alive",
                     "Content-Type": CONTENT_TYPE_SSE}
STATELESS = TransportContext(kind="streamable-http", can_send_request=False)
GONE = (ConnectionError, anyio.ClosedResourceError, anyio.BrokenResourceError)


def frame(message: JSONRPCMessage) -> bytes:
    """``message`` as the SDK's SSE writer frames it."""
    return ensure_bytes({"event": "message",
                         "data": message.model_dump_json(by_alias=True, exclude_unset=True)},
                        SEP)


class Exchange:
    """The dispatch context of one request answered here: what the handler sends on its
    request's channel is written on the response, framed as the SDK frames it."""

    def __init__(self, response: web.StreamResponse, request_id: RequestId,
                 progress_token: ProgressToken | None, metadata: MessageMetadata) -> None:
        self.response = response
        self._request_id = request_id
        self._progress_token = progress_token
        self._metadata = metadata
        self._closed = False
        self._cancel: anyio.Event | None = None

    @property
    def transport(self) -> TransportContext:
        return STATELESS

    @property
    def can_send_request(self) -> bool:
        return False  # stateless: the client's reply has nowhere to land

    @property
    def request_id(self) -> RequestId | None:
        return self._request_id

    @property
    def message_metadata(self) -> MessageMetadata:
        return self._metadata

    @property
    def cancel_requested(self) -> anyio.Event:
        if self._cancel is None:
            self._cancel = anyio.Event()
        return self._cancel

    @property
    def _dispatcher(self) -> Exchange:
        # what bot.mcp.relay writes a relayed server-to-client request through (the SDK's
        # dispatcher's _write, on its path)
        return self

    def close(self) -> None:
        self._closed = True

    async def _write(self, message: JSONRPCMessage, metadata: MessageMetadata = None) -> None:
        await self.response.write(frame(message))

    async def send_raw_request(self, method: str, params: Mapping[str, Any] | None,
                               opts: CallOptions | None = None) -> dict[str, Any]:
        raise NoBackChannelError(method)

    async def notify(self, method: str, params: Mapping[str, Any] | None,
                     opts: CallOptions | None = None) -> None:
        if self._closed:
            log.debug("dropped %s: dispatch context closed", method)
            return
        msg = JSONRPCNotification(jsonrpc="2.0", method=method, params=dict(params)) \
            if params is not None else JSONRPCNotification(jsonrpc="2.0", method=method)
        try:
            await self._write(msg)
        except GONE:  # fire and forget, as the SDK's: the client went away
            log.debug("dropped %s: response closed", method)

    async def progress(self, progress: float, total: float | None = None,
                       message: str | None = None) -> None:
        if self._progress_token is None:
            return
        params: dict[str, Any] = {"progressToken": self._progress_token, "progress": progress}
        if total is not None:
            params["total"] = total
        if message is not None:
            params["message"] = message
        await self.notify("notifications/progress", params)


class _Watch:
    """While one request is answered: a keep-alive ping every :data:`PING` seconds, as
    the SDK's SSE response sends, and a look every :data:`GONE_POLL` seconds at whether
    the client went away (the call is then cancelled, as the SDK cancels it). Kept in a
    :class:`_Watches`, whose one timer looks at every request answered meanwhile."""

    def __init__(self, request: web.Request, response: web.StreamResponse,
                 ping_at: float) -> None:
        self.request = request
        self.response = response
        self.task = asyncio.current_task()
        self.ping_at = ping_at
        self.gone = False


class _Watches:
    """The requests being answered here, looked at by one timer every :data:`GONE_POLL`
    seconds while there are any (issue 50: two timers per request, set and cancelled,
    were about 45 of an auto decision's Python calls; a call answered at once now costs
    a set's add and discard)."""

    def __init__(self) -> None:
        self._on: set[_Watch] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._pinging: set[asyncio.Task[None]] = set()

    def add(self, request: web.Request, response: web.StreamResponse) -> _Watch:
        loop = asyncio.get_running_loop()
        watch = _Watch(request, response, loop.time() + PING)
        self._on.add(watch)
        if self._timer is None:
            self._timer = loop.call_later(GONE_POLL, self._look)
        return watch

    def discard(self, watch: _Watch) -> None:
        self._on.discard(watch)

    def _look(self) -> None:
        self._timer = None
        if not self._on:
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        for watch in list(self._on):
            transport = watch.request.transport
            if transport is None or transport.is_closing():
                watch.gone = True
                self._on.discard(watch)
                if watch.task is not None:
                    watch.task.cancel()
            elif now >= watch.ping_at:
                watch.ping_at = now + PING
                said = ensure_bytes(ServerSentEvent(comment=f"ping - {datetime.now(UTC)}",
                                                    sep=SEP), SEP)
                task = loop.create_task(_send(watch.response, said))
                self._pinging.add(task)
                task.add_done_callback(self._pinging.discard)
        if self._on:
            self._timer = loop.call_later(GONE_POLL, self._look)


async def _send(response: web.StreamResponse, said: bytes) -> None:
    with contextlib.suppress(*GONE):
        await response.write(said)


async def _nothing() -> AsyncIterator[bytes]:
    return
    yield b""  # pragma: no cover


class FastCall:
    """Answers a gateway's eligible ``tools/call`` POSTs (:meth:`answer`) through
    ``server``'s handlers, as ``manager`` (stateless, ``security``'s checks) would."""

    def __init__(self, server: Server[Any], manager: StreamableHTTPSessionManager,
                 security: TransportSecuritySettings, max_body: int) -> None:
        self.server = server
        self.manager = manager
        self.security = TransportSecurityMiddleware(security)
        self.max_body = max_body
        self._headers: list[tuple[str, str]] | None = None
        self.watches = _Watches()
        # (Content-Type, Host, Origin, Accept) the SDK's checks let through: its checks
        # read nothing else, so a request with the same values passes them again
        self._passed: set[tuple[str | None, ...]] = set()

    def headers(self) -> list[tuple[str, str]]:
        """The SDK's SSE response's headers, as its response makes them (worked out once)."""
        if self._headers is None:
            made = EventSourceResponse(content=_nothing(), headers=TRANSPORT_HEADERS)
            self._headers = [(k.decode("latin-1"), v.decode("latin-1"))
                             for k, v in made.raw_headers]
        return self._headers

    async def answer(self, request: web.Request, body: bytes, said: Any,
                     **scope_extra: Any) -> web.StreamResponse | None:
        """The response to ``request`` (``body``, already read; ``said``, its JSON as
        :func:`pydantic_core.from_json` parses it, the SDK's transport's parser), or
        None when it is not one answered here: the SDK answers it. A request for the
        SDK's stateless transport with a Host or Origin its security check refuses gets
        that check's response, which the SDK's transport gives first."""
        if not (isinstance(said, dict) and said.get("method") == "tools/call") \
                or request.method != "POST" or len(body) > self.max_body:
            return None
        version = request.headers.get(MCP_PROTOCOL_VERSION_HEADER)
        if version is not None and version not in HANDSHAKE_PROTOCOL_VERSIONS:
            return None  # a 2026-07-28 request: the SDK's single-exchange entry
        asgi = Request(scope_of(request, **scope_extra))
        h = request.headers
        seen = (h.get("Content-Type"), h.get("Host"), h.get("Origin"), h.get("Accept"))
        if seen not in self._passed:
            refused = await self.security.validate_request(asgi, is_post=True)
            if refused is not None:  # the SDK's refusal, as its transport answers it first
                return await answer(refused, request, body=body, **scope_extra)
            has_json, has_sse = check_accept_headers(asgi)
            if not (has_json and has_sse) or not _json_content(asgi):
                return None
            if len(self._passed) >= KEEP_PASSED:
                self._passed.clear()
            self._passed.add(seen)
        try:  # ``said`` is the body's JSON: parsed once, by serve's handler
            message = jsonrpc_message_adapter.validate_python(said, by_name=False)
        except ValueError:  # not JSON-RPC (a ValidationError is a ValueError)
            return None
        if not isinstance(message, JSONRPCRequest) or message.method != "tools/call":
            return None
        response = web.StreamResponse(status=200)
        for k, v in self.headers():
            response.headers.add(k, v)
        await response.prepare(request)
        exchange = Exchange(response, message.id, progress_token_from_params(message.params),
                            ServerMessageMetadata(request_context=asgi, can_send_request=True))
        watch = self.watches.add(request, response)
        try:
            reply = await self._reply(message, exchange, version)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if not watch.gone or task is None:
                raise
            task.uncancel()  # the client went away: nothing is written for it
            return response
        finally:
            self.watches.discard(watch)
        with contextlib.suppress(*GONE):
            await exchange._write(reply)
            await response.write_eof()
        return response

    async def _reply(self, message: JSONRPCRequest, exchange: Exchange,
                     version: str | None) -> JSONRPCResponse | JSONRPCError:
        """The handler's answer to ``message``, as the SDK's dispatcher makes it."""
        connection = Connection.from_envelope(
            version if version is not None else DEFAULT_NEGOTIATED_VERSION, None, None)
        try:
            try:  # the SDK's serve_one: its kernel, once, under this dispatch context
                runner = ServerRunner(self.server, connection, self.manager._lifespan_state)
                try:
                    result = await runner.on_request(exchange, message.method, message.params)
                finally:
                    if _holds(connection):  # what a handler entered on it, unwound shielded
                        await aclose_shielded(connection)
            finally:
                exchange.close()
        except Exception as exc:
            error = handler_exception_to_error_data(exc)
            if error is None:
                log.exception("MCP gateway: the handler for %r raised", message.method)
                error = ErrorData(code=0, message=str(exc))  # the SDK's own (v1 compat)
            return JSONRPCError(jsonrpc="2.0", id=message.id, error=error)
        return JSONRPCResponse(jsonrpc="2.0", id=message.id, result=result)


def _holds(connection: Connection) -> bool:
    """Whether ``connection``'s exit stack holds anything to unwind (issue 50: the SDK's
    shielded, bounded unwind of an empty one was about 65 of an auto decision's Python
    calls). A stack whose contents cannot be seen is taken to hold something."""
    held = getattr(connection.exit_stack, "_exit_callbacks", None)
    return held is None or len(held) > 0


def _json_content(request: Request) -> bool:
    """The SDK transport's Content-Type check."""
    content_type = request.headers.get("content-type", "")
    return any(part.strip() == CONTENT_TYPE_JSON
               for part in content_type.split(";")[0].split(","))
