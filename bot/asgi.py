"""An ASGI application answering one aiohttp request: how ``serve``'s listener (aiohttp)
serves what a library ships as ASGI (the MCP SDK's Streamable HTTP transport), on the same
port, with streamed (server-sent event) answers written as they come."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from aiohttp import web

Message = MutableMapping[str, Any]
Asgi = Callable[[MutableMapping[str, Any], Callable[[], Awaitable[Message]],
                 Callable[[Message], Awaitable[None]]], Awaitable[None]]
CHUNK = 64 * 1024
GONE_POLL = 0.5  # s between looks at whether the client went away, once the body is read


async def answer(app: Asgi, request: web.Request, *, body: bytes | None = None,
                 headers: dict[str, str] | None = None,
                 **scope_extra: Any) -> web.StreamResponse:
    """Run ``app`` on ``request`` (``scope_extra``: keys added to the ASGI scope) and
    return the response it wrote; ``body``: the request's body, read already by the
    caller; ``headers``: added to the response."""
    scope = scope_of(request, **scope_extra)
    finished = asyncio.Event()
    body_read = False
    response: web.StreamResponse | None = None

    async def receive() -> Message:
        nonlocal body_read
        if not body_read and body is not None:
            body_read = True
            return {"type": "http.request", "body": body, "more_body": False}
        if not body_read:
            chunk = await request.content.read(CHUNK)
            body_read = request.content.at_eof()
            return {"type": "http.request", "body": chunk, "more_body": not body_read}
        # after the body, a receive waits for the client to go (or the answer to end)
        while not finished.is_set():
            if request.transport is None or request.transport.is_closing():
                break
            try:
                await asyncio.wait_for(finished.wait(), GONE_POLL)
            except TimeoutError:
                pass
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        nonlocal response
        if message["type"] == "http.response.start":
            said = [(k.decode("latin-1"), v.decode("latin-1"))
                    for k, v in message.get("headers", [])]
            response = web.StreamResponse(status=int(message["status"]))
            for k, v in [*said, *(headers or {}).items()]:
                response.headers.add(k, v)
            await response.prepare(request)
        elif message["type"] == "http.response.body":
            assert response is not None, "a body before the response started"
            out = message.get("body", b"")
            if out:
                await response.write(out)
            if not message.get("more_body", False):
                await response.write_eof()
                finished.set()

    try:
        await app(scope, receive, send)
    finally:
        finished.set()
    if response is None:  # the app answered nothing: a bug in it, said as one
        return web.Response(status=500, text="no response")
    return response


def scope_of(request: web.Request, **scope_extra: Any) -> dict[str, Any]:
    """The ASGI scope of ``request`` (``scope_extra``: keys added to it)."""
    peer = request.transport.get_extra_info("peername") if request.transport else None
    sock = request.transport.get_extra_info("sockname") if request.transport else None
    return {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": f"{request.version.major}.{request.version.minor}",
        "method": request.method, "scheme": request.scheme, "path": request.path,
        "raw_path": request.raw_path.split("?", 1)[0].encode(),
        "query_string": request.query_string.encode(), "root_path": "",
        "headers": [(k.lower(), v) for k, v in request.raw_headers],
        "client": tuple(peer[:2]) if peer else None,
        "server": tuple(sock[:2]) if sock else None,
        **scope_extra,
    }
