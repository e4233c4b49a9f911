"""Bearer tokens of the HTTP API, and the secrets that sign their decision webhooks.

A token is ``apd_`` and 256 random bits, and carries the tools it may ask about (names or
globs, ``--tools 'deploy,db_*'``): a request for any other tool is refused. A token may
instead be scoped to one face (``--face hook:claude-code``, :data:`FACES`): it calls that
face and nothing else, every call it makes is made for the person fixed when it was made
(``--requested-by``), and an API token does not call a face. Making and
revoking a token are grants and withdrawals of authority, so both are audited. Names that
start with ``mcp.`` or ``adapter.`` belong to approvald's own MCP gateways and adapters
(:mod:`runtime.policies.intake`): no operator token takes one, and no bearer value exists for them.

Only a token's SHA-256 is stored, so the token is shown once, when it is made, and reading
the database does not let anyone call the API; a token this high in entropy needs no slow
hash. A revoked token stops working at once: every request looks its hash up, except
those that make a request (:class:`LiveTokens`), whose own statements check the token is
still live.

Each token has a webhook secret, derived from the deployment's secret (``APPROVALD_SECRET``,
the key approval-button tokens come from) and the token's random id: the database alone
cannot sign a webhook either. A receiver checks ``X-Approvald-Signature: t=<unix>,v1=<hex>``,
the HMAC-SHA256 under that secret of ``<t>.`` followed by the exact body bytes.
"""

from __future__ import annotations

import base64
import fnmatch
import functools
import hashlib
import hmac
import json
import re
import secrets
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from approvald.runtime.kernel.clock import Clock
from approvald.runtime.kernel.errors import ApprovaldError, ConfigError, NotFound
from approvald.runtime.kernel.identity import InvalidIdentity, normalize_user_id
from approvald.runtime.kernel.ids import new_id
from approvald.runtime.kernel.webhook_hosts import WebhookHosts
from approvald.runtime.policies.intake import HOOK_CREDENTIAL, RESERVED_CREDENTIALS, Source
from approvald.runtime.record.audit import AuditTrail
from approvald.store.db import Database
from approvald.store.repos import Tx
from approvald.store.repos.external import TokenRecord

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


def webhook_keys(secret: str | None) -> WebhookKeys | None:
    """The key webhook secrets are derived from ``secret`` (``APPROVALD_SECRET``); None
    without one of at least 16 bytes."""
    return WebhookKeys(secret) if secret and len(secret.encode()) >= 16 else None


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


@functools.lru_cache(maxsize=1024)  # (a face's credential's, checked for each event it gets)
def check_name(name: str) -> str:
    if not NAME.fullmatch(name):
        raise ApprovaldError(f"a token name is 1-60 characters of a-z, 0-9, '.', '_' and '-', "
                             f"starting with a letter or digit: {name!r}")
    return name


def check_operator_name(name: str) -> str:
    """A name an operator's token may take: not one of approvald's own credentials'."""
    check_name(name)
    if name.startswith(RESERVED_CREDENTIALS):
        raise ApprovaldError(f"token names starting with {' or '.join(RESERVED_CREDENTIALS)} "
                             f"belong to approvald's MCP gateways, adapters and hooks: "
                             f"{name!r}")
    return name


TOOL_PATTERN = re.compile(r"[A-Za-z0-9_.:/*?\[\]-]{1,100}")


def parse_tools(text: str | Sequence[str]) -> list[str]:
    """``"deploy, db_*"`` -> ``["deploy", "db_*"]``: the tool names or globs a token may
    ask about (``*``: any)."""
    items = text.split(",") if isinstance(text, str) else list(text)
    tools = list(dict.fromkeys(t.strip() for t in items if t.strip()))
    if not tools:
        raise ApprovaldError("--tools names at least one tool (or '*' for any): the tools "
                             "this token may ask about")
    for t in tools:
        if not TOOL_PATTERN.fullmatch(t):
            raise ApprovaldError(f"not a tool name or glob: {t!r}")
    return tools


def token_tools(token: TokenRecord) -> list[str] | None:
    """The tools ``token`` may ask about; None: any (a token made before scopes, or one of
    approvald's own credentials, whose tools are its source's)."""
    if token.tools is None:
        return None
    return [str(t) for t in json.loads(token.tools)]


def allows(token: TokenRecord, tool: str) -> bool:
    """May ``token`` ask about ``tool``?"""
    return token.tools is None or _allows(token.tools, tool)


@functools.lru_cache(maxsize=4096)
def _allows(tools: str, tool: str) -> bool:
    """:func:`allows` for a token's recorded tools (their JSON text): worked out once for
    each, not the text parsed and each pattern matched again for every request (issue 50:
    a token's tools never change once it is made)."""
    return any(fnmatch.fnmatchcase(tool, str(t)) for t in json.loads(tools))


def audit_token(audit: AuditTrail, tx: Tx, record: TokenRecord, *, action: str, actor: str,
                via: str) -> None:
    """The audit entry of a token made or revoked (never the token or its hash)."""
    at = record.revoked_at if action == "token_revoked" and record.revoked_at \
        else record.created_at
    audit.record(tx, at=at, action=action, actor=actor, via=via,
                  details={"token": record.name, "token_id": record.id,
                           "tools": token_tools(record), "webhook_url": record.webhook_url,
                           "created_by": record.created_by,
                           **({"face": record.face, "requested_by": record.requested_by}
                              if record.face else {})})


def check_webhook_url(url: str) -> str:
    """An absolute http(s) URL with a host (anything else could never be delivered)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or len(url) > MAX_URL:
        raise ApprovaldError(f"a webhook URL is an absolute http:// or https:// URL of at "
                             f"most {MAX_URL} characters: {url[:100]!r}")
    return url


# the faces a token may be scoped to instead of the /v1 API, and what each is called; and
# mcp:NAME, the MCP gateway NAME that serve mounts at /mcp/NAME
FACES = {"hook:claude-code": "the Claude Code hook (POST /v1/hooks/claude-code)"}
MCP_FACE = re.compile(r"mcp:(?P<name>[a-z0-9][a-z0-9._-]{0,59})")


def face_name(face: str | None) -> str:
    if face is None:
        return "the /v1 API"
    gateway = MCP_FACE.fullmatch(face)
    if gateway:
        return f"the MCP gateway {gateway['name']} (/mcp/{gateway['name']})"
    return FACES.get(face, face)


def check_face(face: str) -> str:
    if face not in FACES and not MCP_FACE.fullmatch(face):
        raise ApprovaldError(f"not a face a token can be scoped to: {face!r} (one of "
                             f"{', '.join(sorted(FACES))}, or mcp:NAME for a gateway)")
    return face


def face_refusal(token: TokenRecord, face: str | None) -> str | None:
    """Why ``token`` may not call ``face`` (None: the /v1 API), or None when it may: a
    token scoped to a face calls that face only, and an API token no face."""
    if token.face == face:
        return None
    if token.face is None:
        return (f"token {token.name} is a token of the /v1 API; {face_name(face)} takes a "
                f"token made for it (`approvald tokens create NAME --face {face} "
                "--requested-by U…`)")
    return f"token {token.name} is scoped to {face_name(token.face)} and calls nothing else"


async def create(db: Database, clock: Clock, keys: WebhookKeys, audit: AuditTrail, name: str, *,
                 created_by: str, via: str, tools: str | Sequence[str] | None = None,
                 face: str | None = None, requested_by: str | None = None,
                 webhook_url: str | None = None,
                 webhook_hosts: WebhookHosts | None = None) -> NewToken:
    """Make a token named ``name`` that may ask about ``tools`` over the /v1 API, or one
    scoped to ``face`` whose calls are all made for ``requested_by`` (names are never
    reused, so the audit log's ``external:<name>`` always means one token); audited. Its
    ``webhook_url`` must be one ``webhook_hosts`` (``APPROVALD_WEBHOOK_HOSTS``) allows;
    without them, none is."""
    check_operator_name(name)
    if face is None:
        if requested_by is not None:
            raise ApprovaldError("--requested-by is for a token scoped to a face (--face): "
                                 "an API token's requests name their requester")
        scope = parse_tools(tools if tools is not None else "")
    else:
        check_face(face)
        if tools is not None or webhook_url is not None:
            raise ApprovaldError(f"a token scoped to {face} takes no --tools or --webhook-url "
                                 "(the face decides what it asks about, and answers itself)")
        try:
            requested_by = normalize_user_id(requested_by or "")
        except InvalidIdentity:
            raise ApprovaldError(f"a token scoped to {face} needs --requested-by, the Slack "
                                 f"user its calls are made for (U…): got {requested_by!r}"
                                 ) from None
        scope = []  # it asks the /v1 API about no tool
    if webhook_url is not None:
        check_webhook_url(webhook_url)
        (webhook_hosts or WebhookHosts(())).check_url(webhook_url)
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token_id = new_id()
    async with db.write() as tx:
        if not await tx.external.add_token(
                id=token_id, name=name, token_hash=token_hash(token), webhook_url=webhook_url,
                created_at=clock.now(), created_by=created_by, tools=json.dumps(scope),
                face=face, requested_by=requested_by):
            raise ApprovaldError(f"there is already a token named {name!r} (names are never "
                                 "reused, even once revoked: pick another)")
        record = await tx.external.token(token_id)
        assert record is not None
        audit_token(audit, tx, record, action="token_created", actor=created_by, via=via)
    return NewToken(record, token, keys.secret(token_id))


OWN = "system:"  # created_by of approvald's own credentials


async def own_credential(db: Database, clock: Clock, audit: AuditTrail,
                         source: Source) -> TokenRecord:
    """The credential an MCP gateway's or an adapter's requests are made under, made on
    first use (audited). No bearer value exists for it (the hash of one never shown), and
    an operator's token is never taken for it, whatever its name: authority is not shared
    between a bearer and approvald's own faces."""
    name = source.credential
    async with db.read() as tx:
        found = await tx.external.token_named(name)
    if found is None:
        async with db.write() as tx:
            made = await tx.external.add_token(
                id=new_id(), name=name, token_hash=token_hash(secrets.token_urlsafe(32)),
                webhook_url=None, created_at=clock.now(), created_by=f"{OWN}{source.kind}")
            found = await tx.external.token_named(name)
            assert found is not None
            if made:
                audit_token(audit, tx, found, action="token_created", actor=found.created_by,
                            via=source.via)
    if not found.created_by.startswith(OWN):
        raise ApprovaldError(
            f"the credential name {name} belongs to a token {found.created_by} made: "
            f"approvald never shares a bearer token's authority with its {source.kind} "
            f"{source.name!r}; give the {source.kind} another name")
    return found


async def revoke(db: Database, clock: Clock, audit: AuditTrail, name: str, *, by: str,
                 via: str) -> TokenRecord:
    """Stop ``name`` working at once (an MCP gateway's ``mcp.NAME`` switches it off);
    audited. A hook's own credential is not revoked: the hook has a switch, which can be
    turned on again (:mod:`runtime.record.switches`)."""
    if name.startswith(HOOK_CREDENTIAL):
        face = Source.of_credential(name)
        raise ApprovaldError(
            f"{name} is approvald's own credential for {face.label}'s hook, not a token: "
            f"switch the hook off with `approvald hook disable {face.name}` (--command for "
            f"the command hook, --http for every person's HTTP hook, both by default), and "
            f"on again with `approvald hook enable {face.name}`; one person's HTTP hook "
            "token is revoked by its own name (`approvald tokens revoke NAME`)")
    async with db.write() as tx:
        record = await tx.external.revoke_token(name, by=by, now=clock.now())
        if record is None:
            found = await tx.external.token_named(name)
        else:
            audit_token(audit, tx, record, action="token_revoked", actor=by, via=via)
    if record is not None:
        return record
    if found is not None:
        raise ApprovaldError(f"token {name!r} was already revoked at "
                             f"{found.revoked_at.isoformat() if found.revoked_at else '?'}")
    raise NotFound(f"no token named {name!r}")


async def tokens(db: Database) -> list[TokenRecord]:
    async with db.read() as tx:
        return await tx.external.tokens()


async def from_header(db: Database, authorization: str) -> TokenRecord | None:
    """The live token an ``Authorization: Bearer …`` header carries, or None."""
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return await authenticate(db, value.strip())


async def authenticate(db: Database, token: str) -> TokenRecord | None:
    """The live token ``token`` is, or None (unknown, malformed or revoked)."""
    if not token.startswith(TOKEN_PREFIX) or len(token) > 200:
        return None
    async with db.read() as tx:
        record = await tx.external.token_by_hash(token_hash(token))
    if record is None or record.revoked_at is not None \
            or record.name.startswith(RESERVED_CREDENTIALS):
        return None  # approvald's own credentials are never a bearer's
    return record


class LiveTokens:
    """Tokens found live by their hash, kept in memory for the one route that makes a
    request (``POST /v1/requests``): what a token is (its name, tools, face, requester)
    never changes once made, and whether it is still live is checked by each statement
    that writes or finds a request with it (the request's ``INSERT ... SELECT ... WHERE``
    its token is not revoked, the idempotency key's lookup the same), so a token revoked
    after it was kept here makes nothing and finds nothing (a 401). A token found
    revoked that way is forgotten (:meth:`forget`)."""

    KEPT = 4096

    def __init__(self, db: Database) -> None:
        self.db = db
        self._by_hash: OrderedDict[str, TokenRecord] = OrderedDict()

    async def from_header(self, authorization: str) -> TokenRecord | None:
        scheme, _, value = authorization.partition(" ")
        value = value.strip()
        if scheme.lower() != "bearer" or not value.startswith(TOKEN_PREFIX) \
                or len(value) > 200:
            return await from_header(self.db, authorization)  # None, as it says
        key = token_hash(value)
        found = self._by_hash.get(key)
        if found is not None:
            self._by_hash.move_to_end(key)
            return found
        found = await authenticate(self.db, value)
        if found is not None:
            self._by_hash[key] = found
            while len(self._by_hash) > self.KEPT:
                self._by_hash.popitem(last=False)
        return found

    def forget(self, token: TokenRecord) -> None:
        self._by_hash.pop(token.token_hash, None)
