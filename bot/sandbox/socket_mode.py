"""Socket Mode stand-in: the websocket end Slack keeps open to an app.

Slack's protocol, as implemented here: after connecting, the app gets a ``hello`` message;
Slack then pushes envelopes ``{"envelope_id", "type", "payload",
"accepts_response_payload"}`` (types ``events_api``, ``interactive``, ``slash_commands``)
and the app must answer each with ``{"envelope_id": ..., "payload": ... optional}``.
A ``disconnect`` message asks the app to fetch a fresh URL and reconnect.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import uuid
from collections.abc import Callable
from typing import Any

from aiohttp import WSCloseCode, WSMsgType, web

JSON = dict[str, Any]


class SocketModeHub:
    """Accepts app websocket connections and exchanges envelopes and acks with them."""

    def __init__(self, app_id: str) -> None:
        self.app_id = app_id
        self.received: list[JSON] = []  # every JSON message the app sent, acks included
        self.connections_opened = 0  # total accepted, so tests can tell a reconnect happened
        self._tickets: set[str] = set()
        self._connections: list[web.WebSocketResponse] = []
        self._pending: dict[str, asyncio.Future[JSON]] = {}
        self._changed = asyncio.Condition()  # notified whenever a connection opens or closes

    @property
    def connection_count(self) -> int:
        return len(self._connections)

    def issue_ticket(self) -> str:
        """A new connection id for an ``apps.connections.open`` URL.

        Tickets stay valid for the emulator's lifetime: slack_sdk retries a failed connect
        with the URL it already has, and a test should not fail on that detail.
        """
        ticket = secrets.token_hex(8)
        self._tickets.add(ticket)
        return ticket

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """aiohttp handler for ``GET /socket-mode/{ticket}``."""
        if request.match_info["ticket"] not in self._tickets:
            return web.Response(status=404, text="unknown socket mode ticket")
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        try:
            await ws.send_json(self._hello())
            self._connections.append(ws)  # only now: "connected" means hello was sent
            self.connections_opened += 1
            await self._notify()
            async for message in ws:
                if message.type == WSMsgType.TEXT:
                    self._on_text(message.data)
        finally:
            if ws in self._connections:
                self._connections.remove(ws)
                await self._notify()
        return ws

    # A timeout argument (not asyncio.timeout at the call site) keeps test code short;
    # it bounds a wait on the app under test, which is the point of these helpers.
    async def wait_connected(self, timeout: float = 5.0, *,  # noqa: ASYNC109
                             total: int = 1) -> None:
        """Wait until a connection is open and ``total`` have been accepted so far.

        ``total=2`` waits for a reconnect: the first connection's replacement.
        """
        try:
            async with asyncio.timeout(timeout):
                await self._wait_for(lambda: bool(self._connections)
                                     and self.connections_opened >= total)
        except TimeoutError:
            raise TimeoutError(f"no Socket Mode connection #{total} within {timeout}s") from None

    async def send_envelope(self, type_: str, payload: JSON, *,
                            accepts_response_payload: bool = False,
                            timeout: float = 5.0) -> JSON:  # noqa: ASYNC109
        """Push one envelope to the newest connection and return the app's ack message.

        Raises TimeoutError when no app is connected or no ack arrives within ``timeout``.
        """
        envelope_id = str(uuid.uuid4())
        envelope: JSON = {"envelope_id": envelope_id, "type": type_, "payload": payload,
                          "accepts_response_payload": accepts_response_payload}
        if type_ == "events_api":  # Slack tells event handlers whether this is a redelivery
            envelope.update(retry_attempt=0, retry_reason="")
        ack: asyncio.Future[JSON] = asyncio.get_running_loop().create_future()
        self._pending[envelope_id] = ack
        try:
            async with asyncio.timeout(timeout):
                await self._wait_for(lambda: bool(self._connections))
                await self._connections[-1].send_json(envelope)
                return await ack
        except TimeoutError:
            raise TimeoutError(f"no ack for {type_} envelope {envelope_id} "
                               f"within {timeout}s") from None
        finally:
            self._pending.pop(envelope_id, None)

    async def request_reconnect(self, reason: str = "refresh_requested") -> None:
        """Send Slack's ``disconnect`` message; SDK clients fetch a new URL and reconnect."""
        message = {"type": "disconnect", "reason": reason,
                   "debug_info": {"host": "applink-sandbox"}}
        for ws in list(self._connections):
            with contextlib.suppress(ConnectionError):
                await ws.send_json(message)

    async def close_all(self) -> None:
        """Close every connection, as an outage or shutdown would."""
        for ws in list(self._connections):
            await ws.close(code=WSCloseCode.GOING_AWAY, message=b"sandbox going away")
        for future in self._pending.values():
            if not future.done():
                future.set_exception(ConnectionError("Socket Mode connection closed"))

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def _wait_for(self, predicate: Callable[[], bool]) -> None:
        async with self._changed:
            await self._changed.wait_for(predicate)

    def _hello(self) -> JSON:
        return {"type": "hello", "num_connections": len(self._connections) + 1,
                "debug_info": {"host": "applink-sandbox", "build_number": 1,
                               "approximate_connection_time": 18060},
                "connection_info": {"app_id": self.app_id}}

    def _on_text(self, data: str) -> None:
        try:
            message = json.loads(data)
        except json.JSONDecodeError:
            return  # Slack ignores junk frames too; the test sees it missing from `received`
        if not isinstance(message, dict):
            return
        self.received.append(message)
        future = self._pending.get(str(message.get("envelope_id")))
        if future is not None and not future.done():
            future.set_result(message)
