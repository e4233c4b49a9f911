"""The Slack face of ``approvald serve``: a slack-bolt ``AsyncApp`` over HTTP or Socket Mode.

HTTP mode (``SLACK_SIGNING_SECRET``): events, interactivity and the slash command arrive
at ``POST /slack/events``. The signature and timestamp are checked on the raw bytes before
anything parses the body: an unauthenticated request gets 401 and is never parsed, an
authenticated one that does not parse gets 400, neither reaches a listener (bolt checks
the signature again when it dispatches). Socket Mode (``SLACK_APP_TOKEN``): the app
dials out over a websocket, no public URL needed. Web API calls go to ``SLACK_API_URL``.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
from collections.abc import Mapping
from typing import Any

import aiohttp
from aiohttp import web
from slack_bolt.adapter.aiohttp import to_aiohttp_response
from slack_bolt.async_app import AsyncApp
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_sdk.signature import SignatureVerifier
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
# Slack's timestamp is Unix seconds in ASCII digits; anything else (a sign, spaces, other
# scripts' digits, thousands of digits that int() refuses) is simply not a valid request
_TIMESTAMP = re.compile(r"[0-9]{1,16}")
# slack_sdk's compare_digest raises on non-ASCII text, so the shape is checked first
_SIGNATURE = re.compile(r"v0=[0-9a-f]{64}")
# What parsing a signed but malformed body can raise, in bolt's parse_body (json, form) or in
# the context it extracts from the parsed body (a list or a string where a dict belongs)
_UNPARSEABLE = (ValueError, TypeError, AttributeError, LookupError, RecursionError)


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


class _RawBodyVerifier(SignatureVerifier):
    """slack_sdk's verifier (timestamp window, constant-time compare) over the raw bytes.

    slack_sdk decodes a bytes body as UTF-8 before hashing and raises on one that is not;
    Slack signs the bytes, so those are hashed as they are, and an authentic body that is
    not UTF-8 is told apart from a forged one (400, not 401).
    """

    def generate_signature(self, *, timestamp: str, body: str | bytes) -> str | None:
        if isinstance(body, bytes):
            try:
                body.decode("utf-8")
            except UnicodeDecodeError:
                base = b"v0:" + timestamp.encode("ascii") + b":" + body
                digest = hmac.new(self.signing_secret.encode(), base, hashlib.sha256)
                return f"v0={digest.hexdigest()}"
        return super().generate_signature(timestamp=timestamp, body=body)


def authentic(verifier: SignatureVerifier | None, body: bytes,
              headers: Mapping[str, str]) -> bool:
    """Whether ``body`` is signed by Slack under a timestamp within five minutes.

    The window is slack_sdk's, either way, on the system clock that bolt's own check uses.
    Reads only the two headers and hashes the bytes: nothing here parses the body, so an
    unauthenticated request costs one HMAC whatever it holds.
    """
    timestamp = headers.get("X-Slack-Request-Timestamp")
    signature = headers.get("X-Slack-Signature")
    if verifier is None or timestamp is None or signature is None:
        return False
    if not _TIMESTAMP.fullmatch(timestamp) or not _SIGNATURE.fullmatch(signature):
        return False
    return verifier.is_valid(body=body, timestamp=timestamp, signature=signature)


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
                                        ops_channel=ops, audit_channel=settings.audit_channel)
        self.threads = ThreadFollower(engine, self.client, channel=ops,
                                      permalink=self.deliverer._permalink)
        self._runner: web.AppRunner | None = None
        self._socket: Any = None
        self.port: int | None = None

    def web_app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_REQUEST_BYTES)

        # Without a signing secret (Socket Mode alone) nothing sent here can be authenticated,
        # so every request gets the same 401 as a forged one, not a 404: one rule for the
        # route, and the fix it points at (set SLACK_SIGNING_SECRET) is the one that makes
        # HTTP events work. Socket Mode does not serve this route in the first place.
        secret = self.settings.slack_signing_secret
        verifier = None if secret is None else _RawBodyVerifier(secret.get_secret_value())

        async def events(request: web.Request) -> web.StreamResponse:
            raw = await request.read()  # past client_max_size aiohttp answers 413 itself
            if not authentic(verifier, raw, request.headers):
                log.debug("refused a Slack request without a valid signature")
                return web.json_response({"ok": False, "error": "invalid signature"},
                                         status=401)
            # Authentic from here on: only now is the body decoded and parsed
            try:
                text = raw.decode("utf-8")  # what Slack sends and what bolt re-verifies
                bolt_request = AsyncBoltRequest(body=text, query=request.query_string,
                                                headers=request.headers)  # type: ignore[arg-type]
                if not isinstance(bolt_request.body, dict):
                    raise TypeError("not a JSON object or a form")
            except _UNPARSEABLE as exc:  # no traceback: the body is the sender's fault
                log.warning("a signed Slack request did not parse: %s", type(exc).__name__)
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
