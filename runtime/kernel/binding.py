"""What binds a decision to arguments, as shown outside the database (invariant 20).

Inside the database a request binds its arguments by their digest: SHA-256 of the canonical JSON
of ``{"tool": ..., "arguments": ...}`` (:func:`runtime.kernel.canonical.call_digest`). That
digest is never shown. A plain hash of arguments gives a masked value back to whoever tries the
candidates: a masked 4-digit PIN whose other arguments a card shows is found among 10,000 hashes
in a few milliseconds. So everything that leaves the database and ties a decision to arguments
(a button's value, a mail, a web form or page, an audit export, a trace, a ``--json`` document
of the CLI or of the HTTP API, an error message) shows the digest's **binding** instead:
HMAC-SHA-256 of the digest under the deployment's binding key, 64 hex characters, computed here
and nowhere else (:func:`shown`).

The binding key is the deployment's: derived (HMAC, label ``approvald-binding-v1``)
from a 256-bit secret its database generates once, by the first process that opens it
(table ``deployment_keys``), so every process on that database shows the same binding for
the same arguments, whatever secrets its environment holds, and a binding (a card's
button, an export kept by compliance) stays the same across restarts and rotations of the
other keys. It is kept beside the requests' plain digests, which whoever reads the
database holds anyway (invariant 20 is about what leaves it). A process that was never
configured (a library user's own assembly) keys bindings with a random key of its own:
never with a plain hash.

What comes back (a web form's field, the CLI's ``--digest``, an API caller's reported
``args_digest``) is checked by :func:`matches`: a binding (or a prefix of one) of the
arguments' digest, or, where the caller holds the arguments anyway, the plain digest
that earlier versions showed.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from approvald.store.db import Database

LABEL = b"approvald-binding-v1"
KEY_NAME = "binding"  # its row in deployment_keys, where the deployment made it itself
SHORT = 12  # characters of a binding shown where space is short (a card, a mail, a line)
_HEX = frozenset("0123456789abcdef")


@dataclass(frozen=True)
class BindingKey:
    """The key bindings are computed with (derived from a secret, never the secret)."""

    key: bytes
    source: str  # where it came from, for a line saying so

    @classmethod
    def derive(cls, secret: str | bytes, *, source: str) -> BindingKey:
        raw = secret.encode() if isinstance(secret, str) else secret
        if not raw:
            raise ValueError("a binding key needs a secret")
        return cls(hmac.new(raw, LABEL, hashlib.sha256).digest(), source)

    def binding(self, digest: str) -> str:
        """HMAC-SHA-256 of ``digest`` (a plain SHA-256 hex digest) under this key (in one
        call to OpenSSL: an ``hmac.new`` object costs a handful of Python calls, and a
        decision shows a few bindings)."""
        return hmac.digest(self.key, digest.encode("ascii", "replace"), "sha256").hex()


def generated_secret() -> str:
    """A new random secret for a deployment that has none (256 bits, hex)."""
    return secrets.token_hex(32)


_key = BindingKey.derive(secrets.token_bytes(32), source="this process only")


def configure(key: BindingKey) -> None:
    """Key every binding this process shows with ``key`` (the deployment's: see
    ``bot/wiring.py``)."""
    global _key
    _key = key


def current() -> BindingKey:
    """The key bindings are shown with now."""
    return _key


def shown(digest: str) -> str:
    """The binding shown for the arguments with ``digest``: the one function every face
    shows a digest through."""
    return _key.binding(digest)


def shown_opt(digest: str | None) -> str | None:
    """:func:`shown`, and None for no digest."""
    return None if digest is None else _key.binding(digest)


def short(digest: str) -> str:
    """The first :data:`SHORT` characters of the binding (for a card, a mail, a line);
    empty for no digest."""
    return shown(digest)[:SHORT] if digest else ""


def matches(given: str, digest: str, *, plain: bool = False) -> bool:
    """Whether ``given`` names the arguments with ``digest``: their binding, or a prefix
    of it; with ``plain`` (only where the one giving it holds the arguments: the
    operator's CLI, the caller that asked), also their plain digest or a prefix of it, as
    versions before bindings showed them."""
    text = given.strip().lower()
    if not text or len(text) > 64 or not _HEX.issuperset(text):
        return False
    if hmac.compare_digest(shown(digest)[:len(text)], text):
        return True
    return plain and hmac.compare_digest(digest[:len(text)], text)


async def deployment_key(db: Database, *, now: datetime) -> BindingKey:
    """The deployment's binding key: derived from the secret its database keeps for it
    (made once, by the first process that needs it; every other process reads the same),
    so that every process on the database, whatever secrets its environment holds, shows
    the same binding for the same arguments, and a card keeps its value across restarts
    and rotations of the other keys."""
    async with db.read() as tx:  # (every process reads it; only the first one writes)
        secret = await tx.keys.get(KEY_NAME)
    if secret is None:
        async with db.write() as tx:
            secret = await tx.keys.get_or_add(KEY_NAME, secret=generated_secret(), now=now)
    return BindingKey.derive(bytes.fromhex(secret), source="the database's binding key")


# the keys under which recorded details (an audit entry's, an outbox row's) hold a digest
# of arguments; a policy's digest (``policy_digest``, and ``digest`` of ``policy_loaded``)
# is no caller's data, and ``digest`` is arguments' only beside ``asked_digest`` (an
# edit's impact in a packet: runtime/requests/packet.py) or in an exact scope (``kind: exact``, a
# standing approval's: runtime/policies/scope.py)
DIGEST_KEYS = frozenset({"args_digest", "asked_digest", "edited_digest", "effective_digest",
                         "original_digest", "previous_digest",
                         # and the identities of a tool that changed since its call was
                         # approved (runtime/runs/external.py: a caller's tool_changed)
                         "approved_identity", "current_identity"})
_EDIT_KEY = "asked_digest"
# an audit entry's {detail: digest of its real value} (runtime/record/audit.py)
MASKED_KEY = "masked"


def shown_details(value: Any) -> Any:
    """``value`` (recorded details, at any depth) with every digest of arguments or of a
    masked value shown as its binding."""
    if isinstance(value, list):
        return [shown_details(v) for v in value]
    if not isinstance(value, dict):
        return value
    out: dict[str, Any] = {}
    edit = _EDIT_KEY in value or value.get("kind") == "exact"
    for k, v in value.items():
        if (k in DIGEST_KEYS or (edit and k == "digest")) and isinstance(v, str) and v:
            out[k] = shown(v)
        elif k == MASKED_KEY and isinstance(v, dict):
            out[k] = {name: shown(d) if isinstance(d, str) and d else d
                      for name, d in v.items()}
        else:
            out[k] = shown_details(v)
    return out
