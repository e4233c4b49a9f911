"""A local Slack Web API emulator: a real aiohttp server that slack_sdk clients talk to.

Point ``AsyncWebClient(token=..., base_url=await emulator.start())`` at it and the app's
Slack traffic stays on 127.0.0.1. Besides the Web API (see :data:`bot.sandbox.webapi.METHODS`)
it serves the Socket Mode websocket, ``response_url`` endpoints and Sign in with Slack
(:mod:`bot.sandbox.openid`: the authorize step and ``openid.connect.*``), injects faults, and
records every call so tests can assert on what the app sent. Every route it serves is
behind :class:`bot.sandbox.guard.Guard`: its callers are programs on this machine (and the
sandbox's own page), never another site's page in a browser.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from aiohttp import web
from approvald.bot.http_log import quiet_malformed_requests
from approvald.bot.sandbox.guard import Guard
from approvald.bot.sandbox.hooks import ResponseUrlPost, ResponseUrls
from approvald.bot.sandbox.openid import METHODS as OPENID_METHODS
from approvald.bot.sandbox.openid import OpenIdProvider
from approvald.bot.sandbox.request import Params, SlackError, authorize, pop_token, read_params
from approvald.bot.sandbox.socket_mode import SocketModeHub
from approvald.bot.sandbox.state import (
    JSON,
    Channel,
    SandboxState,
    User,
    UserGroup,
    Workspace,
    clone,
)
from approvald.bot.sandbox.webapi import METHODS, WebApi
from approvald.runtime import Clock, SystemClock

if TYPE_CHECKING:
    from approvald.bot.sandbox.client import SlackClientSim

DownMode = Literal["refuse", "503"]
#: Web API methods that change the workspace (what a watcher of it has to redraw)
CHANGING = frozenset({"chat.postMessage", "chat.update", "chat.delete", "chat.postEphemeral",
                      "views.open", "views.update", "views.publish"})
#: told of every change: the method (or "response_url", "add_message"), its params and answer
ChangeListener = Callable[[str, dict[str, Any], JSON], None]


@dataclass(frozen=True)
class Call:
    """One Web API request as the emulator saw it (the token is never recorded)."""

    method: str
    params: dict[str, Any]
    status: int
    at: datetime
    response: JSON | None = None  # the JSON body; None for plain-text 5xx answers

    @property
    def ok(self) -> bool:
        return bool(self.response and self.response.get("ok"))

    @property
    def error(self) -> str | None:
        return None if self.response is None else self.response.get("error")


@dataclass
class _Fault:
    status: int
    method: str | None
    retry_after: int | None = None


class SlackEmulator:
    """An in-process Slack: Web API over HTTP, Socket Mode over websocket, all in memory.

    ``clock`` (anything with ``now() -> datetime`` in UTC) drives message timestamps,
    trigger expiry and call times, so tests move time instead of sleeping.
    """

    def __init__(self, bot_token: str = "xoxb-test", app_token: str = "xapp-test",
                 signing_secret: str | None = None, clock: Clock | None = None,
                 *, workspace: Workspace | None = None, client_id: str = "1111.2222",
                 client_secret: str = "sandbox-client-secret") -> None:
        self.bot_token = bot_token
        self.app_token = app_token
        self.signing_secret = signing_secret
        self.clock: Clock = clock or SystemClock()
        self.state = SandboxState(workspace or Workspace())
        self.hub = SocketModeHub(self.state.workspace.app_id)
        self.api = WebApi(self.state, self.clock, self.hub.issue_ticket)
        self.hooks = ResponseUrls(self.api)
        #: Sign in with Slack: the authorize step and the openid.connect.* methods
        self.openid = OpenIdProvider(self.state, self.clock, client_id=client_id,
                                     client_secret=client_secret)
        self._calls: list[Call] = []
        self._faults: deque[_Fault] = deque()
        self._delays: dict[str, float] = {}
        self._down: DownMode | None = None
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self._host = "127.0.0.1"
        self._port = 0
        self._listeners: list[ChangeListener] = []
        #: checks every request first; the sandbox page sets its ``page_token``
        self.guard = Guard()

    def on_change(self, listener: ChangeListener) -> None:
        """Call ``listener`` after each successful change to the workspace, before the
        caller gets its answer (so a listener that saves the workspace saves it before the
        app learns a message's ts)."""
        self._listeners.append(listener)

    def _changed(self, method: str, params: dict[str, Any], body: JSON) -> None:
        for listener in self._listeners:
            listener(method, params, body)

    # -- workspace setup ---------------------------------------------------------------------

    @property
    def workspace(self) -> Workspace:
        return self.state.workspace

    def add_channel(self, channel_id: str, name: str | None = None, *,
                    is_private: bool = False) -> None:
        """Make ``channel_id`` known (name defaults to the id in lower case)."""
        self.state.channels[channel_id] = Channel(channel_id, name or channel_id.lower(),
                                                  is_private)

    def add_user(self, user_id: str, name: str, real_name: str | None = None, *,
                 email: str | None = None, is_bot: bool = False, tz: str = "Etc/UTC") -> None:
        """Add a workspace member that users.info and ephemeral messages can find."""
        self.state.users[user_id] = User(user_id, name, real_name or name, email, is_bot, tz)

    def add_usergroup(self, group_id: str, members: list[str], *,
                      handle: str | None = None) -> None:
        """Add a user group whose members usergroups.users.list returns."""
        self.state.usergroups[group_id] = UserGroup(group_id, handle or group_id.lower(),
                                                    list(members))

    def add_message(self, channel: str, text: str, *, user: str,
                    thread_ts: str | None = None) -> str:
        """Post a message as a person (not the bot), e.g. a human reply; returns its ts."""
        found = self.state.channel(channel)
        if found is None:
            raise KeyError(f"unknown channel {channel}")
        ts = self.state.ts.next(self.clock.now())
        message: JSON = {"type": "message", "user": user, "text": text, "ts": ts,
                         "team": self.workspace.team_id}
        if thread_ts:
            self.api.attach_reply(found, message, thread_ts, broadcast=False)
        found.messages.append(message)
        self._changed("add_message", {"channel": found.id}, {"ok": True, "ts": ts})
        return ts

    def delete_message(self, channel: str, ts: str) -> None:
        """Delete a message as a person would (an admin may delete the bot's posts too);
        afterwards chat.update on it answers ``message_not_found``."""
        if not self._channel(channel).remove(ts):
            raise KeyError(f"no message {ts} in {channel}")

    def issue_trigger_id(self, user_id: str | None = None) -> str:
        """Mint a trigger id that views.open accepts for 3 s of emulator-clock time."""
        return self.state.issue_trigger(self.clock.now(), user_id)

    def response_url(self, *, channel: str | None = None, user: str | None = None,
                     message_ts: str | None = None) -> str:
        """A ``response_url`` for an interaction on ``message_ts`` in ``channel``.

        Posts to it are recorded (see :meth:`responses`) and applied like Slack does:
        ``replace_original`` edits the message, ``delete_original`` removes it,
        ``response_type: in_channel`` posts a new one, anything else is ephemeral to ``user``.
        """
        if self._runner is None:
            raise RuntimeError("start the emulator before asking for a response_url")
        return self.hooks.issue(self.root_url, channel=channel, user=user, message_ts=message_ts)

    def client(self, app_url: str) -> SlackClientSim:
        """A signed client that acts as this Slack towards the app at ``app_url``."""
        from approvald.bot.sandbox.client import SlackClientSim

        if not self.signing_secret:
            raise ValueError("the emulator was created without a signing_secret")
        return SlackClientSim(app_url, self.signing_secret, emulator=self)

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self, host: str = "127.0.0.1", port: int = 0, *,
                    app: web.Application | None = None) -> str:
        """Listen on ``host:port`` (0 = any free port); return the Web API base URL.

        ``app`` lets a caller serve its own routes (the sandbox page) beside the Web API;
        :attr:`guard` checks them too.
        """
        app = app or web.Application()
        app.middlewares.insert(0, self.guard.middleware)
        app.router.add_route("*", "/api/{method}", self._handle_api)
        app.router.add_route("*", "/api/{path:.*}", self._handle_not_a_method)
        app.router.add_get("/socket-mode/{ticket}", self._handle_socket)
        app.router.add_post("/response/{hook}", self._handle_response_url)
        app.router.add_get("/openid/connect/authorize", self._handle_authorize)
        quiet_malformed_requests()
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False,
                                     shutdown_timeout=2.0)
        await self._runner.setup()
        self._host = host
        self._site = web.TCPSite(self._runner, host, port)
        await self._site.start()
        self._port = self._runner.addresses[0][1]
        return self.base_url

    async def stop(self) -> None:
        """Close Socket Mode connections and the server. Safe to call twice."""
        await self.hub.close_all()
        if self._runner is not None:
            await self._runner.cleanup()
        self._runner = self._site = None

    @property
    def is_running(self) -> bool:
        return self._runner is not None

    @property
    def root_url(self) -> str:
        """``http://host:port/``; a wildcard bind is shown as loopback, IPv6 in brackets."""
        host = "127.0.0.1" if self._host in ("", "0.0.0.0") else self._host
        host = "[::1]" if host == "::" else (f"[{host}]" if ":" in host else host)
        return f"http://{host}:{self._port}/"

    @property
    def base_url(self) -> str:
        """The Web API base URL, ending in ``/api/`` as slack_sdk's ``base_url`` expects."""
        return f"{self.root_url}api/"

    async def down(self, mode: DownMode = "refuse") -> None:
        """Simulate an outage until :meth:`up`.

        ``"refuse"`` (default) stops listening and drops open connections, so clients get
        a connection error, which is what an unreachable Slack looks like from an app and
        the one failure :meth:`fail_next` cannot produce. ``"503"`` keeps accepting and
        answers every request with HTTP 503, like an overloaded edge. Both close Socket
        Mode connections, as a real outage would.
        """
        self._down = mode
        await self.hub.close_all()
        if mode == "refuse" and self._site is not None and self._runner is not None:
            await self._site.stop()
            self._site = None
            # Stopping the listener leaves keep-alive connections open; cut them too, or
            # a pooled client session would keep reaching the "down" server.
            for connection in (self._runner.server.connections if self._runner.server else []):
                connection.force_close()

    async def up(self) -> None:
        """End an outage started by :meth:`down`; the server listens on the same port."""
        if self._site is None and self._runner is not None:
            self._site = web.TCPSite(self._runner, self._host, self._port)
            await self._site.start()
        self._down = None

    # -- fault injection ---------------------------------------------------------------------

    def fail_next(self, n: int = 1, *, status: int = 500, method: str | None = None) -> None:
        """Answer the next ``n`` Web API calls (to ``method`` only, if given) with ``status``."""
        if not 500 <= status <= 599:
            raise ValueError("fail_next simulates server errors: use a 5xx status")
        self._faults.extend(_Fault(status, method) for _ in range(n))

    def rate_limit_next(self, n: int = 1, retry_after: int = 1, *,
                        method: str | None = None) -> None:
        """Answer the next ``n`` calls with HTTP 429, ``Retry-After`` and ``ratelimited``."""
        self._faults.extend(_Fault(429, method, retry_after) for _ in range(n))

    def delay(self, method: str, seconds: float) -> None:
        """Answer every call to ``method`` ``seconds`` late (0 ends it): a slow Slack."""
        if seconds > 0:
            self._delays[method] = seconds
        else:
            self._delays.pop(method, None)

    def _take_fault(self, method: str) -> _Fault | None:
        for fault in self._faults:
            if fault.method in (None, method):
                self._faults.remove(fault)
                return fault
        return None

    # -- inspection --------------------------------------------------------------------------

    def calls(self, method: str | None = None) -> list[Call]:
        """Recorded Web API calls, oldest first, optionally only those to ``method``."""
        return [c for c in self._calls if method is None or c.method == method]

    def reset_calls(self) -> None:
        self._calls.clear()

    def messages(self, channel: str) -> list[JSON]:
        """Every message in ``channel`` (replies included), oldest first, as copies."""
        return [clone(m) for m in self._channel(channel).messages]

    def last_message(self, channel: str) -> JSON | None:
        """The most recently posted message in ``channel`` (a reply counts), or None."""
        messages = self._channel(channel).messages
        return clone(messages[-1]) if messages else None

    def message(self, channel: str, ts: str) -> JSON | None:
        found = self._channel(channel).find(ts)
        return clone(found) if found else None

    def thread(self, channel: str, ts: str) -> list[JSON]:
        return [clone(m) for m in self.state.thread(self._channel(channel), ts)]

    def ephemeral(self, channel: str, user: str) -> list[JSON]:
        return [clone(m) for m in self.state.ephemerals.get((channel, user), [])]

    def view(self, view_id: str) -> JSON | None:
        found = self.state.views.get(view_id)
        return clone(found) if found else None

    def views(self, *, user_id: str | None = None, callback_id: str | None = None) -> list[JSON]:
        """Opened and published views, oldest first, filtered by owner and callback_id."""
        return [clone(v) for vid, v in self.state.views.items()
                if (user_id is None or self.state.view_users.get(vid) == user_id)
                and (callback_id is None or v.get("callback_id") == callback_id)]

    def home_view(self, user_id: str) -> JSON | None:
        view_id = self.state.home_views.get(user_id)
        return self.view(view_id) if view_id else None

    def responses(self, url: str | None = None) -> list[ResponseUrlPost]:
        """Posts received on response URLs (one URL's, or all), oldest first."""
        return self.hooks.posts(url)

    def _channel(self, channel: str) -> Channel:
        found = self.state.channel(channel)
        if found is None:
            raise KeyError(f"unknown channel {channel}")
        return found

    # -- socket mode -------------------------------------------------------------------------

    # A timeout argument (not asyncio.timeout at the call site) keeps test code short;
    # it bounds a wait on the app under test, which is the point of these helpers.
    async def wait_connected(self, timeout: float = 5.0, *,  # noqa: ASYNC109
                             total: int = 1) -> None:
        """Wait for an app's Socket Mode connection (``total=2``: its first reconnect)."""
        await self.hub.wait_connected(timeout, total=total)

    async def send_envelope(self, type_: str, payload: JSON, *,
                            accepts_response_payload: bool = False,
                            timeout: float = 5.0) -> JSON:  # noqa: ASYNC109
        """Deliver a Socket Mode envelope and return the app's ack ``{"envelope_id", ...}``."""
        return await self.hub.send_envelope(type_, payload, timeout=timeout,
                                            accepts_response_payload=accepts_response_payload)

    # -- HTTP handlers -----------------------------------------------------------------------

    async def _handle_not_a_method(self, request: web.Request) -> web.StreamResponse:
        # "/api//chat.postMessage" (a base URL that already ends in "/" joined with "/") or
        # "/api/": say so in Slack's shape instead of a bare 404 page
        path = request.match_info["path"]
        hint = ("an empty path segment: SLACK_API_URL ends in /api/, so join method names "
                "to it without another /" if path.startswith("/") else "not a Web API method")
        return web.json_response({"ok": False, "error": "unknown_method",
                                  "req_method": path, "detail": hint}, status=404)

    async def _handle_api(self, request: web.Request) -> web.StreamResponse:
        method = request.match_info["method"]
        try:
            values = await read_params(request)
        except SlackError as exc:
            return self._answer(method, {}, exc.body())
        token = pop_token(request, values)
        if self._down is not None:  # "503" mode, or a request that raced a "refuse" stop
            return self._plain(method, values, 503)
        if method in self._delays:
            await asyncio.sleep(self._delays[method])
        fault = self._take_fault(method)
        if fault is not None and fault.retry_after is not None:
            return self._answer(method, values, {"ok": False, "error": "ratelimited"},
                                status=429, headers={"Retry-After": str(fault.retry_after)})
        if fault is not None:
            return self._plain(method, values, fault.status)
        spec = METHODS.get(method)
        if spec is not None and request.method == "GET" and not spec.get:
            return self._plain(method, values, 405)
        if method in OPENID_METHODS:  # client credentials, or the token a sign-in gave
            try:
                body = self.openid.call(method, Params(values), token=token,
                                        authorization=request.headers.get("Authorization", ""))
            except SlackError as exc:
                body = exc.body()
            return self._answer(method, values, body)
        try:
            if spec is not None:
                authorize(token, self.bot_token if spec.token == "bot" else self.app_token,
                           self.app_token if spec.token == "bot" else self.bot_token)
            body = self.api.call(method, Params(values, host=request.host))
        except SlackError as exc:
            body = exc.body()
        if body.get("ok") and method in CHANGING:
            self._changed(method, values, body)
        return self._answer(method, values, body)

    async def _handle_authorize(self, request: web.Request) -> web.StreamResponse:
        if self._down is not None:
            return web.Response(status=503, text="Service Unavailable")
        return self.openid.authorize(request)

    async def _handle_socket(self, request: web.Request) -> web.StreamResponse:
        if self._down is not None:
            return web.Response(status=503, text="Service Unavailable")
        return await self.hub.handle(request)

    async def _handle_response_url(self, request: web.Request) -> web.StreamResponse:
        if self._down is not None:
            return web.Response(status=503, text="Service Unavailable")
        response = await self.hooks.handle(request)
        if response.status == 200:
            self._changed("response_url", {"hook": request.match_info["hook"]}, {"ok": True})
        return response

    def _answer(self, method: str, params: dict[str, Any], body: JSON, *, status: int = 200,
                headers: dict[str, str] | None = None) -> web.Response:
        self._calls.append(Call(method, clone(params), status, self.clock.now(), clone(body)))
        return web.json_response(body, status=status, headers=headers)

    def _plain(self, method: str, params: dict[str, Any], status: int) -> web.Response:
        self._calls.append(Call(method, clone(params), status, self.clock.now()))
        reason = {405: "Method Not Allowed", 500: "Internal Server Error", 502: "Bad Gateway",
                  503: "Service Unavailable", 504: "Gateway Timeout"}.get(status, "Server Error")
        return web.Response(status=status, text=reason)


def seed_defaults(emulator: SlackEmulator) -> None:
    """The sandbox workspace: the README's people, @finance, #approvals (see people.py)."""
    from approvald.bot.sandbox.people import seed

    seed(emulator)


async def run_forever(host: str, port: int) -> None:
    """Run a seeded emulator until cancelled or SIGTERM (``approvald sandbox``)."""
    emulator = SlackEmulator()
    seed_defaults(emulator)
    url = await emulator.start(host, port)
    state = emulator.state
    print(f"Slack sandbox listening: {url}\n"
          f"  bot token {emulator.bot_token}, app token {emulator.app_token}\n"
          f"  channels {' '.join(state.channels)}; users {' '.join(state.users)}; "
          f"group {' '.join(state.usergroups)}", flush=True)
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    with contextlib.suppress(NotImplementedError):  # no signal handlers on Windows loops
        loop.add_signal_handler(signal.SIGTERM, stopped.set)
    try:
        await stopped.wait()
    finally:
        with contextlib.suppress(NotImplementedError):
            loop.remove_signal_handler(signal.SIGTERM)
        await emulator.stop()
