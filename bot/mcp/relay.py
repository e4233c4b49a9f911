"""What the upstream sends back while one request of a client is served, relayed to that
client: progress, log messages, and server-to-client requests (sampling, elicitation,
roots), with the capabilities that client declared declared upstream.

A :class:`Relay` belongs to one request of one client (its SDK request context). It gives
the upstream :class:`mcp.Client` made for that request (:meth:`Upstream.session`) the
callbacks the client's own capabilities call for, and nothing more: a server that offers a
tool only to clients that can sample sees the gateway sample only for a client that can.

A server-to-client request (``sampling/createMessage``, ``elicitation/create``,
``roots/list``) goes to the client on the stream of the request it belongs to, and needs a
way back for the client's reply. A 2025-11-25 client of ``serve``'s stateless gateway
replies in a later POST of the session the gateway named at its ``initialize``
(:class:`Sessions`: the session id carries what the client declared, so any replica knows
its capabilities): the gateway writes the request on the call's stream under an id of its
own and waits for the POST that answers that id (:class:`BackChannel`, in the process that
holds the call's stream; with several replicas, a load balancer keeps a session's POSTs on
one replica, by ``Mcp-Session-Id``). A client with no such session is told nothing, and
the server gets an error naming the reason. A 2026-07-28 server asks with an
``input_required`` result instead, which is passed back to the client as it is.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import secrets
from dataclasses import dataclass, field
from typing import Any

import mcp_types as types
from mcp.client.session import ClientRequestContext
from mcp.server.connection import allowed_log_levels
from mcp.server.context import ServerRequestContext
from mcp.shared.message import ServerMessageMetadata
from mcp_types import LOG_LEVEL_META_KEY, JSONRPCRequest
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

log = logging.getLogger("approvald.mcp")

NO_BACK_CHANNEL = ("approvald's MCP gateway cannot relay {what} to its client: the client's "
                   "connection has no channel back to it (a 2025-11-25 client without the "
                   "session its initialize was given; a 2026-07-28 client is asked with an "
                   "input_required result)")
TOKEN_KEY = "approvald.token"  # the ASGI scope's key for the request's bearer token
SESSION_KEY = "approvald.session"  # the ASGI scope's key for the request's Session
BACK_KEY = "approvald.back"  # the ASGI scope's key for the process's BackChannel
SESSION_PREFIX = "ad1."
MAX_SESSION = 4096  # characters of a session id (what a client declared, encoded)
REPLY_WAIT = 600.0  # s a relayed request waits for the client's reply at most


@dataclass(frozen=True)
class Session:
    """What a 2025-11-25 client declared at its ``initialize``, carried in the session id
    the gateway gave it (no state kept: any replica reads it from the request)."""

    capabilities: types.ClientCapabilities

    def encode(self) -> str | None:
        raw = json.dumps(self.capabilities.model_dump(mode="json", by_alias=True,
                                                      exclude_none=True),
                         separators=(",", ":"), sort_keys=True).encode()
        said = SESSION_PREFIX + base64.urlsafe_b64encode(raw).decode().rstrip("=")
        return said if len(said) <= MAX_SESSION else None

    @classmethod
    def decode(cls, said: str | None) -> Session | None:
        """The session a request names, or None (none, or not one the gateway gave)."""
        if not said or not said.startswith(SESSION_PREFIX) or len(said) > MAX_SESSION:
            return None
        body = said.removeprefix(SESSION_PREFIX)
        try:
            raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
            return cls(types.ClientCapabilities.model_validate(json.loads(raw)))
        except (binascii.Error, ValueError):
            return None


@dataclass
class BackChannel:
    """The server-to-client requests this process wrote on its clients' streams, by the
    id it gave each, awaiting the POST that answers it (from the same bearer token)."""

    waiting: dict[str, tuple[str, asyncio.Future[dict[str, Any]]]] = field(
        default_factory=dict)

    def open(self, token_id: str) -> tuple[str, asyncio.Future[dict[str, Any]]]:
        rid = f"approvald-{secrets.token_urlsafe(16)}"
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.waiting[rid] = (token_id, future)
        return rid, future

    def close(self, rid: str) -> None:
        self.waiting.pop(rid, None)

    def deliver(self, token_id: str, body: Any) -> bool:
        """Whether ``body`` (a POST's JSON) is the reply, or replies, to requests written
        here for this token; each is handed to its waiter."""
        replies = body if isinstance(body, list) else [body]
        if not replies or not all(
                isinstance(r, dict) and "method" not in r and ("result" in r or "error" in r)
                and isinstance(r.get("id"), str) and r["id"] in self.waiting
                and self.waiting[r["id"]][0] == token_id for r in replies):
            return False
        for r in replies:
            _, future = self.waiting.pop(r["id"])
            if not future.done():
                future.set_result(r)
        return True


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
    def scope(self) -> dict[str, Any]:
        scope = getattr(self.ctx.request, "scope", None)
        return scope if isinstance(scope, dict) else {}

    @property
    def capabilities(self) -> types.ClientCapabilities | None:
        """What the client declared: on its request (2026-07-28, or a session the SDK
        keeps), else at the initialize of the session its request names."""
        caps = self.ctx.session.client_capabilities
        if caps is None:
            session = self.scope.get(SESSION_KEY)
            caps = session.capabilities if isinstance(session, Session) else None
        return caps

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
            back, session = self.scope.get(BACK_KEY), self.scope.get(SESSION_KEY)
            token = getattr(self.scope.get(TOKEN_KEY), "id", None)
            if isinstance(back, BackChannel) and isinstance(session, Session) and token:
                return await self._ask_back(back, token, request, result, what)
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

    async def _ask_back(self, back: BackChannel, token_id: str, request: types.ServerRequest,
                        result: type[Any], what: str) -> Any:
        """``request`` written on this request's stream under an id of the gateway's, and
        the client's reply, which comes in a POST of its session (:class:`BackChannel`)."""
        rid, future = back.open(token_id)
        sent = request.model_dump(mode="json", by_alias=True, exclude_none=True)
        message = JSONRPCRequest(jsonrpc="2.0", id=rid, method=sent["method"],
                                 params=sent.get("params"))
        try:
            # the SDK's stateless transport has no reply path of its own, so it refuses to
            # send a request (can_send_request): write it as the request's own message
            dispatcher = self.ctx.session._request_outbound._dispatcher  # type: ignore[attr-defined]
            await dispatcher._write(message, ServerMessageMetadata(
                related_request_id=self.ctx.request_id))
            reply = await asyncio.wait_for(future, REPLY_WAIT)
        except Exception as exc:  # the stream gone, no reply in time: the server is told
            log.info("MCP gateway: %s could not be relayed: %s", what, exc)
            return types.ErrorData(code=types.INTERNAL_ERROR,
                                   message=f"relaying {what} to the client failed: "
                                           f"{type(exc).__name__} {exc}".strip())
        finally:
            back.close(rid)
        if "error" in reply:
            try:
                return types.ErrorData.model_validate(reply["error"])
            except ValueError:
                return types.ErrorData(code=types.INTERNAL_ERROR,
                                       message=f"the client's error to {what} is malformed")
        try:
            return result.model_validate(reply["result"])
        except ValueError as exc:
            return types.ErrorData(code=types.INVALID_PARAMS,
                                   message=f"the client's answer to {what} is invalid: {exc}")
