"""Who may reach the sandbox's listener: its own page, and programs on this machine.

Every route the emulator serves (the Web API, Socket Mode, response URLs, and in
``approvald sandbox`` the page and its ``/ui/`` routes) passes one check first:

* ``Host`` must name this listener: ``127.0.0.1``, ``localhost`` or ``[::1]``, or the
  address the connection actually arrived on, with the listening port. A DNS name rebound
  to 127.0.0.1 (``Host: evil.example:8300``) is refused, so a page on that name can read
  nothing, not even the page that carries the token.
* an ``Origin`` header, when a request has one, must be this listener's own origin
  (``http://`` + its ``Host``): no browser call from another site gets in, not even a
  "simple" cross-origin POST that needs no preflight. Slack clients send no ``Origin``.

The page's routes (under ``/ui/``) also need the token the served page embeds, a fresh
random one per start, in the ``X-Approvald-Sandbox`` header (reads too: ``/ui/state``
shows the cards), and a POST there must be ``application/json`` whose ``Referer``, when
it has one and no ``Origin``, is the page's own origin. The Web API keeps Slack's rules:
form or JSON bodies and the bot or app token.

A refusal is a 403 (415 for a body that is not JSON) with ``{"ok": false, "error"}``
naming what was wrong; the route never runs, so nothing changes.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Awaitable, Callable

from aiohttp import web
from yarl import URL

TOKEN_HEADER = "X-Approvald-Sandbox"
PAGE_PREFIX = "/ui/"
LOOPBACK = frozenset({"127.0.0.1", "localhost", "[::1]"})
_READS = frozenset({"GET", "HEAD"})

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _split(host: str) -> tuple[str, int] | None:
    """``name:port`` (or ``[v6]:port``, or a bare name for port 80), lower-cased."""
    host = host.strip().lower()
    if host.startswith("["):
        name, bracket, rest = host.partition("]")
        name, port = name + bracket, rest.removeprefix(":") if rest else "80"
        if rest and not rest.startswith(":"):
            return None
    else:
        name, colon, port = host.rpartition(":")
        if not colon:
            name, port = host, "80"
    if not name or not port.isdigit() or not port.isascii():
        return None
    return name, int(port)


def _address(ip: str) -> str:
    """How an address appears in a ``Host`` header: IPv6 in brackets, a mapped IPv4 bare."""
    try:
        parsed = ipaddress.ip_address(ip.split("%", 1)[0])
    except ValueError:
        return ip.lower()
    if isinstance(parsed, ipaddress.IPv6Address):
        if parsed.ipv4_mapped is not None:
            return str(parsed.ipv4_mapped)
        return f"[{parsed}]"
    return str(parsed)


def _refuse(status: int, error: str) -> web.Response:
    return web.json_response({"ok": False, "error": error}, status=status,
                             headers={"Cache-Control": "no-store"})


class Guard:
    """The check every request to the sandbox's listener passes (see the module doc).

    ``page_token`` is set by whoever serves the page under ``/ui/`` (None: no page, as in
    ``approvald sandbox --slack-only``).
    """

    def __init__(self, page_token: str | None = None) -> None:
        self.page_token = page_token

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        refusal = self.check(request)
        if refusal is not None:
            return refusal
        response = await handler(request)
        if not response.prepared:  # an event stream has sent its headers already
            response.headers.setdefault("X-Content-Type-Options", "nosniff")
            if request.path.startswith(PAGE_PREFIX):
                response.headers.setdefault("Cache-Control", "no-store")
        return response

    def check(self, request: web.Request) -> web.Response | None:
        """None when ``request`` may go on; else the refusal to answer with."""
        given = request.headers.get("Host", "")
        host = _split(given)
        # the address and port this connection reached: the port a Host must name
        local = request.transport.get_extra_info("sockname") if request.transport else None
        port: int | None = None
        names = LOOPBACK
        if isinstance(local, tuple) and len(local) >= 2:
            port, names = int(local[1]), LOOPBACK | {_address(str(local[0]))}
        if host is None or host[0] not in names or host[1] != port:
            shown = given[:100] or "(none)"
            return _refuse(403, f"Host {shown!r} is not this sandbox's address: open it as "
                                f"http://127.0.0.1:{port}/ (it answers to 127.0.0.1, "
                                "localhost, [::1] or its own IP address, never another DNS "
                                "name, so that another site's page cannot reach it)")
        own = f"http://{host[0]}:{host[1]}"
        origin = request.headers.get("Origin")
        if origin is not None and not self._same(origin, own):
            return _refuse(403, f"Origin {origin[:100]!r} is not this sandbox's page "
                                f"({own}): another site's page may not call it")
        if self.page_token is None or not request.path.startswith(PAGE_PREFIX):
            return None
        token = request.headers.get(TOKEN_HEADER, "")
        if not hmac.compare_digest(token.encode("utf-8", "surrogateescape"),
                                   self.page_token.encode()):
            return _refuse(403, f"missing or wrong {TOKEN_HEADER} token: reload the page "
                                "(each start of the sandbox gives its page a new one)")
        if request.method in _READS:
            return None
        referer = request.headers.get("Referer")
        if origin is None and referer is not None and not self._same(referer, own):
            return _refuse(403, f"Referer {referer[:100]!r} is not this sandbox's page "
                                f"({own}): another site's page may not call it")
        if request.content_type != "application/json":
            return _refuse(415, f"the body must be application/json, not "
                                f"{request.content_type or '(none)'}")
        return None

    @staticmethod
    def _same(url: str, own: str) -> bool:
        """Whether ``url`` (an Origin, or a Referer's page) is on the origin ``own``."""
        try:
            parsed = URL(url)
            if parsed.scheme != "http" or not parsed.host:
                return False
            host = f"[{parsed.host}]" if ":" in parsed.host else parsed.host
            return f"http://{host.lower()}:{parsed.port}" == own
        except ValueError:
            return False
