"""The Slack face of ``approvald serve``: a slack-bolt ``AsyncApp`` over HTTP or Socket Mode.

HTTP mode (``SLACK_SIGNING_SECRET``): events, interactivity and the slash command arrive
at ``POST /slack/events``; bolt verifies each request's signature and timestamp (a bad or
stale one gets 401 and reaches no listener). Socket Mode (``SLACK_APP_TOKEN``): the app
dials out over a websocket, no public URL needed. Web API calls go to ``SLACK_API_URL``.
"""

from __future__ import annotations

import logging
from typing import Any

import aiohttp
from aiohttp import web
from slack_bolt.adapter.aiohttp import to_aiohttp_response, to_bolt_request
from slack_bolt.async_app import AsyncApp
from slack_sdk.web.async_client import AsyncWebClient

from bot.config import Settings
from bot.delivery import SlackDeliverer
from bot.directory import SlackDirectory
from bot.handlers import Handlers
from bot.threads import ThreadFollower
from runtime.engine import Engine
from runtime.errors import ConfigError

log = logging.getLogger("approvald.slack")
MAX_REQUEST_BYTES = 1024 * 1024  # Slack's own payloads are far smaller; refuse floods


def check_slack_settings(s: Settings) -> None:
    """One line naming the first missing Slack setting."""
    if s.slack_bot_token is None:
        raise ConfigError("SLACK_BOT_TOKEN is not set (needed whenever Slack is configured)")
    if s.slack_app_token is None and s.slack_signing_secret is None:
        raise ConfigError("SLACK_SIGNING_SECRET is not set (or set SLACK_APP_TOKEN for "
                          "Socket Mode)")
    if not s.channel:
        raise ConfigError("APPROVALD_CHANNEL is not set (the channel approval cards go to)")


class _DropTokenNotice(logging.Filter):
    # bolt reads SLACK_BOT_TOKEN itself and then notes that our client's token wins;
    # that is exactly the intent, so the notice is noise in every start-up log
    def filter(self, record: logging.LogRecord) -> bool:
        return "`token` will be unused" not in record.getMessage()


def _bolt_logger() -> logging.Logger:
    logger = logging.getLogger("approvald.slack.bolt")
    if not any(isinstance(f, _DropTokenNotice) for f in logger.filters):
        logger.addFilter(_DropTokenNotice())
    return logger


class SlackService:
    def __init__(self, settings: Settings, engine: Engine) -> None:
        check_slack_settings(settings)
        if engine.signer is None:
            raise ConfigError("APPROVALD_SECRET is not set or shorter than 16 characters "
                              "(the key approval-button tokens are derived from)")
        assert settings.slack_bot_token is not None and settings.channel is not None
        self.settings = settings
        self.engine = engine
        # one pooled HTTP session: without it slack_sdk opens a new connection per call
        self.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
        self.client = AsyncWebClient(token=settings.slack_bot_token.get_secret_value(),
                                     base_url=settings.slack_api_url, session=self.http)
        engine.directory = SlackDirectory(self.client)
        socket = settings.slack_app_token is not None
        self.mode = "Socket Mode" if socket else f"HTTP on port {settings.port}"
        secret = settings.slack_signing_secret
        self.app = AsyncApp(
            client=self.client,
            logger=_bolt_logger(),
            signing_secret=None if secret is None else secret.get_secret_value(),
            request_verification_enabled=not socket or secret is not None,
            # listeners ack, then hand their work to tasks (see bot/handlers.py): the
            # response goes out as soon as the listener returns, with no polling for it
            process_before_response=True,
        )
        self.handlers = Handlers(self)
        self.handlers.register(self.app)
        ops = settings.ops_channel or settings.channel
        self.deliverer = SlackDeliverer(engine, self.client, channel=settings.channel,
                                        ops_channel=ops)
        self.threads = ThreadFollower(engine, self.client, channel=ops,
                                      permalink=self.deliverer._permalink)
        self._runner: web.AppRunner | None = None
        self._socket: Any = None
        self.port: int | None = None

    def web_app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_REQUEST_BYTES)

        async def events(request: web.Request) -> web.StreamResponse:
            try:
                bolt_request = await to_bolt_request(request)
            except ValueError:  # a body bolt cannot even parse: nothing to verify or act on
                return web.json_response({"ok": False, "error": "malformed request"},
                                         status=400)
            resp = await self.app.async_dispatch(bolt_request)
            return await to_aiohttp_response(resp)

        async def health(_request: web.Request) -> web.StreamResponse:
            return web.json_response({"ok": True, "mode": self.mode})

        app.router.add_post("/slack/events", events)
        app.router.add_get("/healthz", health)
        return app

    async def start(self) -> None:
        if self.settings.slack_app_token is not None:
            from slack_bolt.adapter.socket_mode.aiohttp import AsyncSocketModeHandler

            self._socket = AsyncSocketModeHandler(
                self.app, self.settings.slack_app_token.get_secret_value(),
                web_client=self.client)
            await self._socket.connect_async()
            return
        self._runner = web.AppRunner(self.web_app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.settings.host, self.settings.port)
        await site.start()
        sockets = site._server.sockets if site._server is not None else []  # type: ignore[union-attr]
        self.port = sockets[0].getsockname()[1] if sockets else self.settings.port
        self.mode = f"HTTP on port {self.port}"

    async def stop(self) -> None:
        await self.handlers.drain()
        if self._socket is not None:
            await self._socket.close_async()
        if self._runner is not None:
            await self._runner.cleanup()
        await self.http.close()
