"""What ``serve`` mounts of the HTTP API: its routes and its webhook deliveries."""

from __future__ import annotations

import asyncio

from aiohttp import web
from approvald.bot.api.routes import Routes
from approvald.bot.api.webhooks import WebhookDeliverer
from approvald.bot.config import Settings
from approvald.runtime import Engine, WebhookKeys, api_tokens


def webhook_keys(settings: Settings) -> WebhookKeys | None:
    """The key webhook secrets are derived from (None without a long enough secret)."""
    return api_tokens.webhook_keys(settings.token_secret())


class HttpApi:
    """What ``serve`` mounts: the routes on its listener, the webhooks on its drain."""

    def __init__(self, engine: Engine, settings: Settings, *,
                 stop: asyncio.Event | None = None) -> None:
        self.engine = engine
        self.keys = webhook_keys(settings)
        # where webhooks may go; serve adds the ports it binds (see WebhookHosts.add_own_port)
        self.webhook_hosts = settings.webhook_allowlist()
        self.routes = Routes(engine, stop=stop, webhook_hosts=self.webhook_hosts)
        # its outbox rows (webhooks), on serve's drain
        self.webhooks = WebhookDeliverer(engine, self.keys, hosts=self.webhook_hosts)

    def add_routes(self, app: web.Application) -> None:
        self.routes.add_to(app)

