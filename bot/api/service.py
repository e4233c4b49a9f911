"""What ``serve`` mounts of the HTTP API: its routes and its webhook deliveries."""

from __future__ import annotations

import asyncio

from aiohttp import web
from approvald.bot.api.routes import Routes
from approvald.bot.api.webhooks import WebhookDeliverer
from approvald.bot.config import Settings
from approvald.runtime.api_tokens import WebhookKeys
from approvald.runtime.engine import Engine
from approvald.runtime.outbox import Deliverer


def webhook_keys(settings: Settings) -> WebhookKeys | None:
    """The key webhook secrets are derived from (None without a long enough secret)."""
    secret = settings.token_secret()
    return WebhookKeys(secret) if secret and len(secret.encode()) >= 16 else None


class HttpApi:
    """What ``serve`` mounts: the routes on its listener, the webhooks on its drain."""

    def __init__(self, engine: Engine, settings: Settings, *,
                 stop: asyncio.Event | None = None) -> None:
        self.engine = engine
        self.keys = webhook_keys(settings)
        # where webhooks may go; serve adds the ports it binds (see WebhookHosts.add_own_port)
        self.webhook_hosts = settings.webhook_allowlist()
        self.routes = Routes(engine, stop=stop, webhook_hosts=self.webhook_hosts)

    def add_routes(self, app: web.Application) -> None:
        self.routes.add_to(app)

    def deliverer(self, inner: Deliverer) -> Deliverer:
        """``inner`` with webhook rows delivered here."""
        return WebhookDeliverer(self.engine, inner, self.keys, hosts=self.webhook_hosts)
