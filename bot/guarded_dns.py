"""An aiohttp resolver that answers only with addresses a webhook may connect to.

aiohttp connects to exactly the addresses its resolver returns, so filtering them here,
in the same lookup the connection uses, leaves no gap between a check and the connect
for a name to resolve elsewhere (DNS rebinding). URLs whose host is an IP address never
reach a resolver: :meth:`WebhookHosts.check_url` classifies those before the request.
"""

from __future__ import annotations

import logging
import socket

from aiohttp.abc import AbstractResolver, ResolveResult
from approvald.runtime import WebhookHosts

log = logging.getLogger("approvald.webhooks")


class AddressRefused(OSError):
    """Every address the name resolved to was refused (aiohttp wraps it as a DNS error)."""


class GuardedResolver(AbstractResolver):
    """``inner``'s answers, less the addresses ``hosts`` refuses; why, in :attr:`refused`."""

    def __init__(self, hosts: WebhookHosts, inner: AbstractResolver) -> None:
        self.hosts = hosts
        self.inner = inner
        self.refused: str | None = None  # set when a lookup left nothing to connect to

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        answers = await self.inner.resolve(host, port, family)
        kept, why = self.hosts.addresses(host, port, [a["host"] for a in answers])
        if not kept:
            self.refused = f"{host} resolved to nothing a webhook may reach: " + \
                ("; ".join(why) or "no address")
            raise AddressRefused(self.refused)
        if why:
            log.warning("webhook host %s: not connecting to %s", host, "; ".join(why))
        allowed = set(kept)
        return [a for a in answers if a["host"] in allowed]

    async def close(self) -> None:
        await self.inner.close()
