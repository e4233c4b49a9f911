"""``/review`` on the sandbox page's origin: ``serve``'s own web review queue, passed through.

The queue is served by the ``serve`` the sandbox runs (its :class:`~bot.web.service.WebFace`,
on serve's HTTP listener), with the sandbox page's URL as its public URL, as a deployment
serves it behind a TLS proxy. This is that proxy: each request under ``/review`` goes to
serve's listener as it came (method, path, body, cookies, content type) and its answer
comes back as it was (status, cookies, the queue's own security headers), so the sign-in
links the sandbox's mailbox shows, the session cookie and every form work on the page's
origin.

The sandbox's :class:`~bot.sandbox.guard.Guard` has checked the request's ``Host`` and
``Origin`` first (this listener's own, or none); an ``Origin`` that passed is sent on as
the queue's public origin, so the page opened as ``localhost`` works like ``127.0.0.1``.
A request without one is sent without one: the queue refuses such a POST itself.
"""

from __future__ import annotations

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

TIMEOUT = 30.0
FORWARDED = ("Content-Type", "Cookie", "Accept", "Accept-Language")
# hop by hop, or worked out again for the answer as it is sent here
DROPPED = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length",
                     "content-encoding", "date", "server"})


class ReviewProxy:
    """Passes ``/review`` requests to serve's listener at ``target`` (set once serve is
    up; until then the answer is 503)."""

    def __init__(self) -> None:
        self.target: str | None = None  # http://127.0.0.1:PORT, serve's listener
        self.origin: str | None = None  # the queue's public origin
        self._http: aiohttp.ClientSession | None = None

    def add_to(self, app: web.Application) -> None:
        app.router.add_route("*", "/review", self.forward)
        app.router.add_route("*", "/review/{tail:.*}", self.forward)

    def attach(self, target: str, public_url: str) -> None:
        self.target = target.rstrip("/")
        parsed = URL(public_url)
        self.origin = str(parsed.origin())

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()

    async def forward(self, request: web.Request) -> web.StreamResponse:
        if self.target is None or self.origin is None:
            return web.Response(status=503, text="the review queue is still starting")
        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT),
                                               auto_decompress=False)
        headers = {k: v for k in FORWARDED if (v := request.headers.get(k)) is not None}
        if "Origin" in request.headers:  # the guard let it through: this page's own
            headers["Origin"] = self.origin
        body = await request.read()
        url = URL(self.target + request.rel_url.raw_path_qs, encoded=True)
        try:
            async with self._http.request(request.method, url, data=body or None,
                                          headers=headers, allow_redirects=False) as answer:
                data = await answer.read()
                out = CIMultiDict((k, v) for k, v in answer.headers.items()
                                  if k.lower() not in DROPPED)
                status = answer.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            return web.Response(status=502, text=f"the review queue did not answer: {exc}")
        return web.Response(status=status, body=data, headers=out)
