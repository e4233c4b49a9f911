"""Decision webhooks: ``api.webhook`` outbox rows -> a signed POST to the caller's URL.

The row was committed with the decision it tells (see ``runtime.runs.external``), so a crash
loses nothing, and the drain retries a failure with exponential backoff until the row's
deadline (24 hours), as for Slack: a 429 waits for its ``Retry-After``; other 4xx answers
that no retry can change (400, 404, 410, ...) park the row as dead at once, reported to
ops like any dead delivery. Each try is signed afresh (a new ``t``); the body and
``X-Approvald-Delivery`` (the row's id) stay the same, so a receiver can deduplicate the
rare second delivery of a try whose answer was lost.

Every try checks the URL against ``APPROVALD_WEBHOOK_HOSTS`` again and connects only to
the addresses its host resolves to that pass (:mod:`bot.guarded_dns`): a URL or an
address refused there is a dead delivery at once, with the reason (the setting may have
changed since the URL was given, and DNS may answer differently now).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import aiohttp
from aiohttp.abc import AbstractResolver
from aiohttp.resolver import DefaultResolver
from approvald.bot.guarded_dns import GuardedResolver
from approvald.runtime import (
    SIGNATURE_HEADER,
    WEBHOOK,
    Engine,
    RetryLater,
    Undeliverable,
    WebhookHosts,
    WebhookKeys,
    WebhookRefused,
    compact_json,
    signature,
)
from approvald.store.records import OutboxRecord

TIMEOUT = 10.0  # s for one try
PERMANENT = frozenset({400, 401, 403, 404, 405, 410, 413, 422})


def _retry_after(value: str | None) -> float:
    try:
        seconds = float(value or 1.0)
    except ValueError:
        return 1.0
    return seconds if seconds > 0 else 1.0


class WebhookDeliverer:
    """Delivers the HTTP API's outbox rows: decision webhooks."""

    kinds = frozenset({WEBHOOK})

    def __init__(self, engine: Engine, keys: WebhookKeys | None, *,
                 hosts: WebhookHosts, timeout: float = TIMEOUT) -> None:
        self.e = engine
        self.keys = keys
        self.hosts = hosts
        self.timeout = timeout
        # where names are looked up (tests give a resolver they control)
        self.resolver: Callable[[], AbstractResolver] = DefaultResolver

    async def deliver(self, row: OutboxRecord) -> dict[str, Any] | None:
        if self.keys is None:  # a setting someone can still fix: keep trying till then
            raise RetryLater("APPROVALD_SECRET is not set: webhooks cannot be signed")
        payload = row.payload_value()
        url = str(payload["url"])
        try:
            self.hosts.check_url(url)
        except WebhookRefused as exc:  # the setting changed since, or it predates it
            raise Undeliverable(f"webhook {url} refused: {exc}") from None
        body = compact_json(payload["document"]).encode("utf-8")
        t = int(self.e.now().timestamp())
        headers = {"Content-Type": "application/json", "User-Agent": "approvald",
                   SIGNATURE_HEADER: signature(self.keys.secret(payload["token_id"]), body, t),
                   "X-Approvald-Event": str(payload.get("event", "decision")),
                   "X-Approvald-Delivery": str(row.id)}
        resolver = GuardedResolver(self.hosts, self.resolver())
        try:
            async with aiohttp.ClientSession(
                    connector=aiohttp.TCPConnector(resolver=resolver, use_dns_cache=False),
                    timeout=aiohttp.ClientTimeout(total=self.timeout)) as session, \
                    session.post(url, data=body, headers=headers,
                                 allow_redirects=False) as resp:
                status, retry_after = resp.status, resp.headers.get("Retry-After")
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            if resolver.refused is not None:
                raise Undeliverable(f"webhook {url} refused: {resolver.refused}") from None
            raise RetryLater(f"webhook {url} unreachable: {type(exc).__name__}: {exc}") from None
        finally:
            await resolver.close()
        if 200 <= status < 300:
            return {"status": status}
        if status == 429:
            raise RetryLater(f"webhook {url} is rate limiting", after=_retry_after(retry_after))
        if status in PERMANENT:
            raise Undeliverable(f"webhook {url} answered HTTP {status}")
        raise RetryLater(f"webhook {url} answered HTTP {status}")
