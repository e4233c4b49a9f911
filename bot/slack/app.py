"""The Slack face of ``approvald serve``: a slack-bolt ``AsyncApp`` over HTTP or Socket Mode.

HTTP mode (``SLACK_SIGNING_SECRET``): events, interactivity and the slash command arrive
at ``POST /slack/events``. The signature and timestamp are checked on the raw bytes before
anything parses the body: an unauthenticated request gets 401 and is never parsed, an
authenticated one that does not parse gets 400, neither reaches a listener. That check is
the only one (:mod:`.transport`): the app is built with bolt's documented switch for a
check made in front of it, ``request_verification_enabled=False``. Socket Mode
(``SLACK_APP_TOKEN``): the app dials out over a websocket, no public URL needed. Web API
calls go to ``SLACK_API_URL``.

Starting binds the HTTP listener (a local act) and nothing else; :meth:`SlackService.connect`
then checks the bot token with ``auth.test`` and, in Socket Mode, opens the websocket, in
the background, retrying with backoff while Slack is unreachable. A token Slack refuses
outright stops start-up (:class:`SlackRefused`); an unreachable Slack never does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web
from approvald.bot.config import Settings
from approvald.bot.http_log import quiet_malformed_requests
from approvald.bot.slack.delivery import SlackDeliverer
from approvald.bot.slack.direct import DirectFront
from approvald.bot.slack.directory import SlackDirectory
from approvald.bot.slack.handlers import Handlers
from approvald.bot.slack.mrkdwn import json_dumps
from approvald.bot.slack.threads import ThreadFollower
from approvald.bot.slack.transport import RawBodyVerifier, events_handler
from approvald.runtime import ConfigError, Engine
from slack_bolt.async_app import AsyncApp
from slack_bolt.logger import get_bolt_app_logger
from slack_bolt.middleware.authorization.async_single_team_authorization import (
    AsyncSingleTeamAuthorization,
)
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.builtin_async_handlers import async_default_handlers
from slack_sdk.web.async_client import AsyncWebClient
from slack_sdk.web.internal_utils import get_user_agent

if TYPE_CHECKING:  # imported where it is used: only Socket Mode needs it
    from slack_bolt.adapter.socket_mode.aiohttp import AsyncSocketModeHandler

log = logging.getLogger("approvald.slack")
MAX_REQUEST_BYTES = 1024 * 1024  # Slack's own payloads are far smaller; refuse floods
# Slack's answers that refuse a token outright: no retry can fix them, a person must
REFUSED = frozenset({"invalid_auth", "not_authed", "token_revoked", "account_inactive",
                     "token_expired", "not_allowed_token_type"})
CONNECT_TIMEOUT = 15.0  # one connect attempt (auth.test, then the websocket), at most
BACKOFF_BASE = 1.0
BACKOFF_MAX = 30.0
CLOSE_TIMEOUT = 3.0  # closing the websocket, or the listener's last requests, at most


class SlackRefused(ConfigError):
    """Slack refused a token (``invalid_auth`` and the like): fix it, then restart."""


def backoff(failures: int, *, base: float = BACKOFF_BASE, cap: float = BACKOFF_MAX) -> float:
    """Seconds to wait after ``failures`` failed attempts in a row: doubling from ``base``
    up to ``cap``, then spread over the upper half so that replicas do not retry in step."""
    delay = min(cap, base * 2.0 ** min(failures - 1, 30))
    return delay / 2 + random.random() * delay / 2


def _refusal(exc: SlackApiError, variable: str) -> SlackRefused | None:
    data = exc.response.data if isinstance(exc.response.data, dict) else {}
    error = data.get("error")
    if error not in REFUSED:
        return None
    return SlackRefused(f"Slack refused {variable} ({error}): set a valid token and restart")


def _why(exc: BaseException) -> str:
    """A failed connect attempt in a few words (no traceback: the cause is elsewhere)."""
    if isinstance(exc, SlackApiError):
        data = exc.response.data if isinstance(exc.response.data, dict) else {}
        error = data.get("error")
        return f"HTTP {exc.response.status_code}" + (f", {error}" if error else "")
    if isinstance(exc, TimeoutError):
        return f"no answer within {CONNECT_TIMEOUT:.0f} s"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def check_slack_settings(s: Settings) -> None:
    """One line naming the first missing Slack setting."""
    if s.slack_bot_token is None:
        raise ConfigError("SLACK_BOT_TOKEN is not set (needed whenever Slack is configured)")
    if s.slack_app_token is None and s.slack_signing_secret is None:
        raise ConfigError("SLACK_SIGNING_SECRET is not set (or set SLACK_APP_TOKEN for "
                          "Socket Mode)")
    if not s.channel:
        raise ConfigError("APPROVALD_CHANNEL is not set (the channel approval cards go to)")
    secret = s.token_secret()
    if not secret or len(secret.encode()) < 16:
        raise ConfigError("APPROVALD_SECRET is not set or shorter than 16 characters "
                          "(the key approval-button tokens are derived from)")


class _DropTokenNotice(logging.Filter):
    # bolt reads SLACK_BOT_TOKEN itself and then notes that our client's token wins;
    # that is exactly the intent, so the notice is noise in every start-up log
    def filter(self, record: logging.LogRecord) -> bool:
        return "`token` will be unused" not in record.getMessage()


def leveled(name: str) -> logging.Logger:
    """The logger ``name`` with its level set to the one it inherits now.

    slack_sdk and bolt test ``logger.level <= DEBUG`` (not ``isEnabledFor``) before they
    build a debug line, and a logger left at NOTSET (0) passes that test whatever the
    configuration: every Web API call formatted its whole request (a card's blocks
    included) and its answer into a line no handler took, and bolt named each middleware
    a click went through. Set when the face is built, after logging is configured, so a
    face built at DEBUG still logs all of it.
    """
    logger = logging.getLogger(name)
    logger.setLevel(logging.NOTSET)
    logger.setLevel(logger.getEffectiveLevel())
    return logger


def _bolt_logger() -> logging.Logger:
    logger = leveled("approvald.slack.bolt")
    if not any(isinstance(f, _DropTokenNotice) for f in logger.filters):
        logger.addFilter(_DropTokenNotice())
    return logger


class _NoTraceback(logging.Filter):
    # slack_sdk logs every failed Socket Mode reconnect with a traceback, every few seconds
    # for as long as Slack is away; the message already names the error, so keep that
    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info:
            record.msg, record.args = record.getMessage(), None
            record.exc_info = record.exc_text = None
            if record.levelno > logging.WARNING:
                record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def _socket_logger() -> logging.Logger:
    logger = leveled("approvald.slack.socket")
    if not any(isinstance(f, _NoTraceback) for f in logger.filters):
        logger.addFilter(_NoTraceback())
    return logger


# slack_sdk's User-Agent: the package, Python's and the system's versions, none of which
# changes while the process runs (each client bolt built read the platform again)
_USER_AGENT = get_user_agent()


class FaceApp(AsyncApp):
    """bolt's ``AsyncApp``, each request's context made as its ``_init_context`` makes it,
    but for the request's own Web API client: a copy of the app's client, not one built
    (bolt builds one for every request, reading the platform's versions and the proxy
    variables of the environment again, ~30 Python calls a click). The copy holds what
    the constructor would put there: the app's client's settings, its session and
    logger, a team id of the request's own, a list of retry handlers of its own; the
    proxy the app's client read from the environment when it was made.
    ``tests/unit/test_slack_face_cpu.py`` holds the two to the same context."""

    def _init_context(self, req: AsyncBoltRequest) -> None:
        req.context["logger"] = get_bolt_app_logger(app_name=self.name,
                                                    base_logger=self._base_logger)
        req.context["token"] = self._token
        req.context["client"] = request_client(self._async_client, self._token,
                                               req.context.team_id)
        req.context["listener_runner"] = self.listener_runner


def request_client(app_client: AsyncWebClient, token: str | None,
                   team_id: str | None) -> AsyncWebClient:
    """What ``AsyncWebClient(token=token, <app_client's settings>, team_id=team_id)``
    makes, as bolt's ``_init_context`` calls it, without the constructor."""
    client: AsyncWebClient = AsyncWebClient.__new__(AsyncWebClient)
    client.__dict__.update(vars(app_client))
    client.token = None if token is None else token.strip()
    client.headers["User-Agent"] = _USER_AGENT  # (the app's headers: bolt shares them too)
    client.default_params = {} if team_id is None else {"team_id": team_id}
    handlers = app_client.retry_handlers
    client.retry_handlers = (handlers.copy() if handlers is not None
                             else async_default_handlers())
    return client


class SlackWeb:
    """The Slack Web API as one process uses it: its client, the directory of user groups
    read through it (made before the engine, which takes the directory), and one pooled
    HTTP session (without it slack_sdk opens a new connection per call), opened when the
    face starts so that nothing is left to close if start-up stops before."""

    def __init__(self, settings: Settings) -> None:
        check_slack_settings(settings)
        assert settings.slack_bot_token is not None
        self.client = AsyncWebClient(token=settings.slack_bot_token.get_secret_value(),
                                     base_url=settings.slack_api_url,
                                     logger=leveled("approvald.slack.web"))
        self.directory = SlackDirectory(self.client)
        self.http: aiohttp.ClientSession | None = None

    def open(self) -> None:
        if self.http is None:
            # json_serialize: json.dumps's text, in one C call (slack_sdk sends json=)
            self.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30),
                                              json_serialize=json_dumps)
            self.client.session = self.http

    async def close(self) -> None:
        if self.http is not None:
            await self.http.close()
            self.http = None
            self.client.session = None


class SlackService:
    def __init__(self, settings: Settings, engine: Engine, slack_web: SlackWeb, *,
                 ops_routes: Callable[[web.Application], None] | None = None) -> None:
        check_slack_settings(settings)
        self.ops_routes = ops_routes  # /healthz, /readyz, /v1 (see bot/metrics.py)
        if not engine.signs_buttons:
            raise ConfigError("APPROVALD_SECRET is not set or shorter than 16 characters "
                              "(the key approval-button tokens are derived from)")
        assert settings.slack_bot_token is not None and settings.channel is not None
        self.settings = settings
        self.engine = engine
        self.web = slack_web
        self.client = slack_web.client
        socket = settings.slack_app_token is not None
        self.mode = "Socket Mode" if socket else f"HTTP on port {settings.port}"
        secret = settings.slack_signing_secret
        self.app = FaceApp(
            # the name bolt gives itself otherwise (its caller's file name: its loggers are
            # "app.py" and "app.py:<listener>"), without the inspect.stack() that finds it:
            # that reads every frame's source line and looks each frame's module up among
            # all loaded ones, ~3 ms of CPU an app under pytest's deep stacks
            name="app.py",
            client=self.client,
            logger=_bolt_logger(),
            signing_secret=None if secret is None else secret.get_secret_value(),
            # the signature of an HTTP request is checked once, on its raw bytes, in front
            # of the app (bot/slack/transport.py): bolt's documented switch for that case
            request_verification_enabled=False,
            # listeners ack, then hand their work to tasks (see bot/slack/listeners.py): the
            # response goes out as soon as the listener returns, with no polling for it
            process_before_response=True,
            # two of bolt's global middleware, run on every click, have nothing to act on
            # here: its own bot's events are ignored for the listeners of events it can
            # send (messages), and a workflow step's token attached for function
            # listeners; the face has neither (app_home_opened is a person's event:
            # tests/unit/test_click_cpu.py holds the listeners to that)
            ignoring_self_events_enabled=False,
            attaching_function_token_enabled=False,
        )
        self.handlers = Handlers(engine)
        self.handlers.register(self.app)
        # the direct buttons (Approve...) reach their listeners without bolt's building of
        # every argument for each matcher and listener (bot/slack/direct.py)
        direct = self.handlers.direct_clicks()
        self.app.use(direct)
        # and, over HTTP, in front of bolt's dispatch where it would do nothing else
        self.front = DirectFront(self.app, direct)
        ops = settings.ops_channel or settings.channel
        self.deliverer = SlackDeliverer(engine, self.client, channel=settings.channel,
                                        ops_channel=ops, audit_channel=settings.audit_channel,
                                        fast_path=settings.slack_fast_path)
        self.threads = ThreadFollower(engine, self.client, channel=ops,
                                      permalink=self.deliverer._permalink,
                                      callers=settings.caller_threads == "asked")
        self._runner: web.AppRunner | None = None
        self._socket: AsyncSocketModeHandler | None = None
        self.port: int | None = None
        self.identity: dict[str, Any] | None = None  # auth.test's answer, once it came
        self.connected = False  # the token checked and, in Socket Mode, the socket open
        self.tried = asyncio.Event()  # the first connect attempt is over, however it ended

    def web_app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_REQUEST_BYTES)

        # Without a signing secret (Socket Mode alone) nothing sent here can be authenticated,
        # so every request gets the same 401 as a forged one, not a 404: one rule for the
        # route, and the fix it points at (set SLACK_SIGNING_SECRET) is the one that makes
        # HTTP events work. Socket Mode does not serve this route in the first place.
        secret = self.settings.slack_signing_secret
        verifier = None if secret is None else RawBodyVerifier(secret.get_secret_value())
        events = events_handler(self.app, verifier, self.front)

        async def health(_request: web.Request) -> web.StreamResponse:
            # the durable parts run whether or not Slack is reachable: this stays ok
            return web.json_response({"ok": True, "mode": self.mode,
                                      "slack": "connected" if self.connected else "connecting"})

        app.router.add_post("/slack/events", events)
        if self.ops_routes is not None:
            self.ops_routes(app)
        else:
            app.router.add_get("/healthz", health)
        return app

    def status(self) -> dict[str, Any]:
        """What ``/healthz`` says about the Slack face."""
        return {"mode": self.mode, "slack": "connected" if self.connected else "connecting"}

    async def start(self) -> None:
        """Set the face up without talking to Slack: bind the HTTP listener (HTTP mode) or
        prepare the Socket Mode client. :meth:`connect` does the talking."""
        self.web.open()
        if self.settings.slack_app_token is not None:
            from slack_bolt.adapter.socket_mode.aiohttp import AsyncSocketModeHandler

            self._socket = AsyncSocketModeHandler(
                self.app, self.settings.slack_app_token.get_secret_value(),
                logger=_socket_logger(), web_client=self.client)
            return
        # in-flight requests get a few seconds to finish when the listener closes
        quiet_malformed_requests()
        self._runner = web.AppRunner(self.web_app(), access_log=None,
                                     shutdown_timeout=CLOSE_TIMEOUT)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.settings.host, self.settings.port)
        try:
            await site.start()
        except OSError as exc:  # the port is taken, or not ours to bind
            raise ConfigError(f"APPROVALD_HOST/APPROVALD_PORT: cannot listen on "
                              f"{self.settings.host}:{self.settings.port}: "
                              f"{os.strerror(exc.errno) if exc.errno else exc}") from None
        bound = self._runner.addresses  # the sockets' names: (host, port, ...) each
        self.port = int(bound[0][1]) if bound else self.settings.port
        self.mode = f"HTTP on port {self.port}"

    async def connect(self, stop: asyncio.Event) -> None:
        """Check the bot token with ``auth.test``, then (Socket Mode) open the websocket.

        While Slack is unreachable (refused connection, timeout, HTTP 5xx) try again with
        exponential backoff and jitter, one WARNING line per failure, until connected or
        ``stop`` is set. Raises :class:`SlackRefused` when Slack refuses a token.
        """
        failures = 0
        while not stop.is_set():
            try:
                async with asyncio.timeout(CONNECT_TIMEOUT):
                    if self.identity is None:
                        self.identity = await self._check_token()
                    if self._socket is not None:
                        await self._open_socket()
            except SlackRefused:
                self.tried.set()
                raise
            except Exception as exc:  # Slack is away; it comes back, the token stays valid
                failures += 1
                delay = backoff(failures)
                log.warning("cannot reach Slack at %s (%s); trying again in %.1f s",
                            self.settings.slack_api_url, _why(exc), delay)
                self.tried.set()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
                continue
            self.connected = True
            self.tried.set()
            who = self.identity or {}
            log.info("connected to Slack as %s in %s (%s)", who.get("user", "?"),
                     who.get("team", "?"), self.mode)
            return

    async def _check_token(self) -> dict[str, Any]:
        try:
            resp = await self.client.auth_test()
        except SlackApiError as exc:
            refused = _refusal(exc, "SLACK_BOT_TOKEN")
            if refused is not None:
                raise refused from None
            raise
        self._share_identity(resp)
        return dict(resp.data) if isinstance(resp.data, dict) else {}

    def _share_identity(self, resp: Any) -> None:
        """Hand bolt's single-team authorization the ``auth.test`` answer the face just
        got for the same token. Bolt asks ``auth.test`` itself on a request until one
        answer came, so after a start every request of a first burst (Slack's retries of
        clicks made while serve was down) waited on a Web API round trip of its own, and
        all of them went bolt's whole way (bot/slack/direct.py waits for that answer)."""
        for middleware in getattr(self.app, "_async_middleware_list", ()):
            if (isinstance(middleware, AsyncSingleTeamAuthorization)
                    and middleware.auth_test_result is None):
                middleware.auth_test_result = resp

    async def _open_socket(self) -> None:
        assert self.settings.slack_app_token is not None and self._socket is not None
        client = self._socket.client
        try:  # what slack_sdk's connect would do first, but failing here, not retrying
            resp = await self.client.apps_connections_open(
                app_token=self.settings.slack_app_token.get_secret_value())
        except SlackApiError as exc:
            refused = _refusal(exc, "SLACK_APP_TOKEN")
            if refused is not None:
                raise refused from None
            raise
        client.wss_uri = resp["url"]
        try:
            # slack_bolt leaves connect_async/close_async unannotated
            await self._socket.connect_async()  # type: ignore[no-untyped-call]
        except BaseException:
            client.wss_uri = None  # the next attempt asks for a fresh URL
            raise

    async def stop(self, *, within: float = 30.0) -> None:
        """Give work handed off after acks up to ``within`` seconds (then cancel it), and
        close the websocket or listener and the HTTP session, each in bounded time."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.handlers.drain(), within)
        if self._socket is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(
                    self._socket.close_async(), CLOSE_TIMEOUT)  # type: ignore[no-untyped-call]
        if self._runner is not None:
            await self._runner.cleanup()
        await self.web.close()
