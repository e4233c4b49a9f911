"""What a stdio server sends back on its one session, given to the client whose call caused
it: server-to-client requests (sampling, elicitation, roots) and log messages.

A server ``serve`` or ``mcp-proxy`` starts over stdio is one process with one session,
made before any client is known, which every client's requests share. Progress is the
call's own (its progress token is the upstream request's id, so the SDK hands each
notification to that call's :class:`bot.mcp.relay.Relay`). A 2025-11-25 server-to-client
request or log message names no request on the wire: the ``related_request_id`` a server
passes its SDK only routes an HTTP stream, over stdio it is not written. So the gateway
attributes one to the client requests whose forwarding is in flight on the session
(:meth:`InFlight.forwarding`: a tool call, a resource read, a prompt):

- all of them made by one client connection (one call, or ``mcp-proxy``'s one client
  making several): it is relayed to that client, by the newest of them (its
  :class:`Relay`, as over HTTP: on that request's stream, a 2025-11-25 HTTP client's reply
  by its session's back channel), if that client declared the capability, else the server
  is told it did not;
- none, or several clients' at once: the server gets an error saying why at once (a
  request is never left waiting), and a log message is dropped.

The session declares ``sampling``, ``elicitation`` and ``roots`` (the gateway can relay
them), so a server lists what it lists to such a client, to every client; the one that
cannot answer is refused per request. A 2026-07-28 server asks with an ``input_required``
result instead, which is the call's own result and needs none of this.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
from collections.abc import Iterator
from typing import Any

import mcp_types as types
from approvald.bot.mcp.relay import Relay
from mcp.client.session import ClientRequestContext

log = logging.getLogger("approvald.mcp")

NOBODY = ("approvald's MCP gateway cannot relay {what}: no client request is in flight on "
          "this server's stdio session, so there is no client it could be for")
AMBIGUOUS = ("approvald's MCP gateway cannot relay {what}: requests of {n} clients are in "
             "flight on this server's stdio session, and a stdio message does not say which "
             "one it belongs to")
UNDECLARED = ("approvald's MCP gateway cannot relay {what}: the client whose request is in "
              "flight did not declare the {capability} capability")


class InFlight:
    """The client requests being forwarded on one stdio session, and the callbacks its
    :class:`mcp.Client` is made with (:meth:`client_options`), which relay to them."""

    def __init__(self) -> None:
        self._relays: dict[int, Relay] = {}
        self._ids = itertools.count()

    @contextlib.contextmanager
    def forwarding(self, relay: Relay) -> Iterator[None]:
        """While a client request (``relay``'s) is forwarded on the session."""
        key = next(self._ids)
        self._relays[key] = relay
        try:
            yield
        finally:
            del self._relays[key]

    def owner(self, what: str) -> Relay | types.ErrorData:
        """The relay of the client a message of the server belongs to, or why none."""
        if not self._relays:
            return types.ErrorData(code=types.INVALID_REQUEST, message=NOBODY.format(what=what))
        clients = {id(r.ctx.session) for r in self._relays.values()}
        if len(clients) > 1:
            return types.ErrorData(code=types.INVALID_REQUEST,
                                   message=AMBIGUOUS.format(what=what, n=len(clients)))
        return self._relays[max(self._relays)]

    def client_options(self) -> dict[str, Any]:
        """:class:`mcp.Client` keyword arguments for the stdio session."""
        return {"sampling_callback": self.sample, "elicitation_callback": self.elicit,
                "list_roots_callback": self.roots, "logging_callback": self.log_message}

    def _declared(self, what: str, capability: str) -> Relay | types.ErrorData:
        relay = self.owner(what)
        if isinstance(relay, types.ErrorData):
            log.info("MCP gateway: %s", relay.message)
            return relay
        caps = relay.capabilities
        if caps is None or getattr(caps, capability, None) is None:
            return types.ErrorData(code=types.INVALID_REQUEST, message=UNDECLARED.format(
                what=what, capability=capability))
        return relay

    async def sample(self, context: ClientRequestContext,
                     params: types.CreateMessageRequestParams) -> Any:
        relay = self._declared("sampling/createMessage", "sampling")
        return relay if isinstance(relay, types.ErrorData) else \
            await relay.sample(context, params)

    async def elicit(self, context: ClientRequestContext,
                     params: types.ElicitRequestParams) -> Any:
        relay = self._declared("elicitation/create", "elicitation")
        return relay if isinstance(relay, types.ErrorData) else \
            await relay.elicit(context, params)

    async def roots(self, context: ClientRequestContext) -> Any:
        relay = self._declared("roots/list", "roots")
        return relay if isinstance(relay, types.ErrorData) else await relay.roots(context)

    async def log_message(self, params: types.LoggingMessageNotificationParams) -> None:
        relay = self.owner("a log message")
        if isinstance(relay, types.ErrorData):
            log.debug("MCP gateway: a log message of the server dropped: %s", relay.message)
            return
        await relay.log_message(params)
