"""What the upstream sends back while one request of a client is served, relayed to that
client: progress, log messages, and server-to-client requests (sampling, elicitation,
roots), with the capabilities that client declared declared upstream.

A :class:`Relay` belongs to one request of one client (its SDK request context). It gives
the upstream :class:`mcp.Client` made for that request (:meth:`Upstream.session`) the
callbacks the client's own capabilities call for, and nothing more: a server that offers a
tool only to clients that can sample sees the gateway sample only for a client that can.

What cannot be relayed says so rather than pretending: a server-to-client request needs a
channel back to the client that the client's reply can come in on, which a 2025-11-25
client of a stateless gateway does not have (its reply would be a later POST, with no
session to land in); the server gets an error naming the reason. A 2026-07-28 server asks
with an ``input_required`` result instead, which is passed back to the client as it is.
"""

from __future__ import annotations

import logging
from typing import Any

import mcp_types as types
from mcp.client.session import ClientRequestContext
from mcp.server.connection import allowed_log_levels
from mcp.server.context import ServerRequestContext
from mcp.shared.message import ServerMessageMetadata
from mcp_types import LOG_LEVEL_META_KEY
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

log = logging.getLogger("approvald.mcp")

NO_BACK_CHANNEL = ("approvald's MCP gateway cannot relay {what} to its client: the client's "
                   "connection has no channel back to it (a 2025-11-25 client of a stateless "
                   "gateway; a 2026-07-28 client is asked with an input_required result)")


class Relay:
    """The relays for one client request (``ctx``): pass :meth:`client_options` to the
    upstream client made for it, and :meth:`progress` to the calls that report progress."""

    def __init__(self, ctx: ServerRequestContext[Any]) -> None:
        self.ctx = ctx
        self.modern = ctx.protocol_version in MODERN_PROTOCOL_VERSIONS
        meta: dict[str, Any] = dict(ctx.meta or {})
        self.wants_progress = any(k in meta for k in ("progressToken", "progress_token"))
        self.log_level: types.LoggingLevel | None = meta.get(LOG_LEVEL_META_KEY)
        self.levels = allowed_log_levels(ctx.protocol_version, ctx.meta)

    @property
    def capabilities(self) -> types.ClientCapabilities | None:
        return self.ctx.session.client_capabilities

    def client_options(self) -> dict[str, Any]:
        """:class:`mcp.Client` keyword arguments: the client's capabilities, as callbacks
        relaying to it, and its log level."""
        caps = self.capabilities
        out: dict[str, Any] = {"logging_callback": self.log_message,
                               # a 2025-11-25 client hears every level (that era's default
                               # until logging/setLevel, which a stateless gateway cannot
                               # keep); a 2026-07-28 one what it opted in to on this request
                               "log_level": self.log_level if self.modern else "debug"}
        if caps is not None and caps.sampling is not None:
            out["sampling_callback"] = self.sample
            out["sampling_capabilities"] = caps.sampling
        if caps is not None and caps.elicitation is not None:
            out["elicitation_callback"] = self.elicit
        if caps is not None and caps.roots is not None:
            out["list_roots_callback"] = self.roots
        return out

    async def progress(self, progress: float, total: float | None,
                       message: str | None) -> None:
        """The upstream's progress on this request, as the client's own."""
        await self.ctx.session.report_progress(progress, total, message)

    async def log_message(self, params: types.LoggingMessageNotificationParams) -> None:
        if params.level not in self.levels:
            return  # a 2026-07-28 client did not opt in to this level on this request
        await self.ctx.session.send_notification(
            types.LoggingMessageNotification(params=params),
            related_request_id=self.ctx.request_id)

    async def _ask(self, request: types.ServerRequest, result: type[Any],
                   what: str) -> Any:
        if not self.ctx.session.can_send_request:
            return types.ErrorData(code=types.INVALID_REQUEST,
                                   message=NO_BACK_CHANNEL.format(what=what))
        try:
            return await self.ctx.session.send_request(
                request, result,
                metadata=ServerMessageMetadata(related_request_id=self.ctx.request_id))
        except Exception as exc:  # the client's error, or its channel gone: the server's
            log.info("MCP gateway: %s could not be relayed: %s", what, exc)
            return types.ErrorData(code=types.INTERNAL_ERROR,
                                   message=f"relaying {what} to the client failed: {exc}")

    async def sample(self, context: ClientRequestContext,
                     params: types.CreateMessageRequestParams) -> Any:
        return await self._ask(types.CreateMessageRequest(params=params),
                               types.CreateMessageResult, "sampling/createMessage")

    async def elicit(self, context: ClientRequestContext,
                     params: types.ElicitRequestParams) -> Any:
        return await self._ask(types.ElicitRequest(params=params), types.ElicitResult,
                               "elicitation/create")

    async def roots(self, context: ClientRequestContext) -> Any:
        return await self._ask(types.ListRootsRequest(), types.ListRootsResult, "roots/list")
