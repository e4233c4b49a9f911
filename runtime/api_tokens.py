"""Bearer tokens of the HTTP API, and the secrets that sign their decision webhooks.

A token is ``apd_`` and 256 random bits. Only its SHA-256 is stored, so the token is shown
once, when it is made, and reading the database does not let anyone call the API; a
token this high in entropy needs no slow hash. A revoked token stops working at once
(every request looks its hash up).

Each token has a webhook secret, derived from the deployment's secret (``APPROVALD_SECRET``,
the key approval-button tokens come from) and the token's random id: the database alone
cannot sign a webhook either. A receiver checks ``X-Approvald-Signature: t=<unix>,v1=<hex>``,
the HMAC-SHA256 under that secret of ``<t>.`` followed by the exact body bytes.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from urllib.parse import urlsplit

from runtime.clock import Clock
from runtime.errors import ApprovaldError, ConfigError, NotFound
from runtime.ids import new_id
from runtime.webhook_hosts import WebhookHosts
from store.db import Database
from store.repos.external import TokenRecord

TOKEN_PREFIX = "apd_"
SECRET_PREFIX = "whsec_"
NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,59}")
MAX_URL = 2000
SIGNATURE_HEADER = "X-Approvald-Signature"


@dataclass(frozen=True)
class NewToken:
    """A token just made: the only time ``token`` exists outside its holder's hands."""

    record: TokenRecord
    token: str
    webhook_secret: str


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


class WebhookKeys:
    """Derives each token's webhook secret from the deployment's secret."""

    def __init__(self, master: str | bytes) -> None:
        raw = master.encode() if isinstance(master, str) else master
        if len(raw) < 16:
            raise ConfigError("APPROVALD_SECRET is not set or shorter than 16 characters "
                              "(the key webhook secrets are derived from)")
        self._key = hashlib.sha256(b"approvald-webhook-v1\x00" + raw).digest()

    def secret(self, token_id: str) -> str:
        mac = hmac.new(self._key, token_id.encode(), hashlib.sha256).digest()
        return SECRET_PREFIX + base64.urlsafe_b64encode(mac).decode().rstrip("=")


def signature(secret: str, body: bytes, t: int) -> str:
    """The value of :data:`SIGNATURE_HEADER` for ``body`` sent at Unix time ``t``."""
    mac = hmac.new(secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={t},v1={mac}"


def check_name(name: str) -> str:
    if not NAME.fullmatch(name):
        raise ApprovaldError(f"a token name is 1-60 characters of a-z, 0-9, '.', '_' and '-', "
                             f"starting with a letter or digit: {name!r}")
    return name


def check_webhook_url(url: str) -> str:
    """An absolute http(s) URL with a host (anything else could never be delivered)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or len(url) > MAX_URL:
        raise ApprovaldError(f"a webhook URL is an absolute http:// or https:// URL of at "
                             f"most {MAX_URL} characters: {url[:100]!r}")
    return url


async def create(db: Database, clock: Clock, keys: WebhookKeys, name: str, *,
                 created_by: str, webhook_url: str | None = None,
                 webhook_hosts: WebhookHosts | None = None) -> NewToken:
    """Make a token named ``name`` (names are never reused, so the audit log's
    ``external:<name>`` always means one token). Its ``webhook_url`` must be one
    ``webhook_hosts`` (``APPROVALD_WEBHOOK_HOSTS``) allows; without them, none is."""
    check_name(name)
    if webhook_url is not None:
        check_webhook_url(webhook_url)
        (webhook_hosts or WebhookHosts(())).check_url(webhook_url)
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token_id = new_id()
    async with db.write() as tx:
        if not await tx.external.add_token(
                id=token_id, name=name, token_hash=token_hash(token), webhook_url=webhook_url,
                created_at=clock.now(), created_by=created_by):
            raise ApprovaldError(f"there is already a token named {name!r} (names are never "
                                 "reused, even once revoked: pick another)")
        record = await tx.external.token(token_id)
    assert record is not None
    return NewToken(record, token, keys.secret(token_id))


async def revoke(db: Database, clock: Clock, name: str, *, by: str) -> TokenRecord:
    async with db.write() as tx:
        record = await tx.external.revoke_token(name, by=by, now=clock.now())
        if record is None:
            found = await tx.external.token_named(name)
    if record is not None:
        return record
    if found is not None:
        raise ApprovaldError(f"token {name!r} was already revoked at "
                             f"{found.revoked_at.isoformat() if found.revoked_at else '?'}")
    raise NotFound(f"no token named {name!r}")


async def tokens(db: Database) -> list[TokenRecord]:
    async with db.read() as tx:
        return await tx.external.tokens()


async def authenticate(db: Database, token: str) -> TokenRecord | None:
    """The live token ``token`` is, or None (unknown, malformed or revoked)."""
    if not token.startswith(TOKEN_PREFIX) or len(token) > 200:
        return None
    async with db.read() as tx:
        record = await tx.external.token_by_hash(token_hash(token))
    if record is None or record.revoked_at is not None:
        return None
    return record
