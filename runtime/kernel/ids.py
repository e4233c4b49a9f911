"""Identifiers and secrets."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
import socket
import uuid
from typing import Literal

from approvald.runtime.kernel import binding

DIGEST_PREFIX = 12  # digest characters a v2 token showed in clear (tokens now show a binding)


def new_id() -> str:
    """A random 128-bit id as 32 hex characters (runs, approvals)."""
    return uuid.uuid4().hex


def new_nonce() -> str:
    """128 random bits from the OS CSPRNG, hex-encoded."""
    return secrets.token_hex(16)


def worker_id() -> str:
    """``host:pid:random``: unique per process, and lets a peer on the same host see us die."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


def lease_id(owner: str) -> str:
    """A lease id of the process ``owner`` (its :func:`worker_id`): one per attempt to
    advance a run, so two tasks of one process never both believe they hold it. It starts
    with the worker id, so a peer on the same host can still see its process die."""
    return f"{owner}/{secrets.token_hex(3)}"


def parse_worker_id(owner: str) -> tuple[str, int] | None:
    host, _, rest = owner.partition(":")
    pid, _, _ = rest.partition(":")
    return (host, int(pid)) if host and pid.isdigit() else None


def owner_is_dead(owner: str) -> bool:
    """True only when the owner ran on this host and its process no longer exists."""
    parsed = parse_worker_id(owner)
    if parsed is None or parsed[0] != socket.gethostname():
        return False
    try:
        os.kill(parsed[1], 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


TokenCheck = Literal["ok", "stale", "bad"]


class TokenSigner:
    """Approval-button tokens: ``"<binding prefix>.<HMAC>"``, url-safe.

    The HMAC (SHA-256, 192 bits kept) covers the approval id, its random nonce and the
    digest of the exact arguments the card showed. The database stores only the nonce, so
    read access to it does not let anyone click; and a card drawn before an edit carries
    the old digest, so it can never approve the edited arguments. Escalation makes a new
    approval with a new nonce, so an old card stops matching anything pending.

    What the token shows in clear (for people and logs) is the first characters of the
    arguments' binding (:func:`runtime.kernel.binding.short`), never of their plain digest
    (invariant 20). Tokens of earlier versions still verify, against the digest stored
    with the request: ``<digest prefix>.<HMAC>`` (``v2``) and ``HMAC(id|nonce)`` (``v1``).
    """

    def __init__(self, secret: str | bytes) -> None:
        raw = secret.encode() if isinstance(secret, str) else secret
        if len(raw) < 16:
            raise ValueError("the token secret must be at least 16 bytes")
        self._key = hashlib.sha256(b"approvald-token-v1\x00" + raw).digest()

    def _mac(self, text: str) -> str:
        mac = hmac.new(self._key, text.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(mac[:24]).decode().rstrip("=")

    def token(self, approval_id: str, nonce: str, digest: str) -> str:
        """The token for a card showing the arguments with ``digest``."""
        return f"{binding.short(digest)}.{self._mac(f'v3|{approval_id}|{nonce}|{digest}')}"

    def _genuine(self, approval_id: str, nonce: str, token: str, digest: str) -> bool:
        """Whether ``token`` is one this signer made for the arguments with ``digest``:
        its HMAC (what is shown before it is not bound: a binding changes with the key it
        is shown under, the HMAC does not), or a ``v2`` token's whole text."""
        shown, _, mac = token.rpartition(".")
        if hmac.compare_digest(self._mac(f"v3|{approval_id}|{nonce}|{digest}"), mac):
            return True
        legacy = f"{digest[:DIGEST_PREFIX]}.{self._mac(f'v2|{approval_id}|{nonce}|{digest}')}"
        return hmac.compare_digest(legacy, token) and bool(shown)

    def check(self, approval_id: str, nonce: str, token: str, *, digest: str,
              original: str) -> TokenCheck:
        """``ok``: a card showing the arguments with ``digest`` (the current ones);
        ``stale``: a genuine card drawn before an edit (it showed ``original``);
        ``bad``: anything else (forged, another request's, or from an intermediate edit).

        Tokens minted before digests were bound in (``HMAC(id|nonce)``, no ``.``) stay
        valid until the first edit: such a card showed the original arguments.
        """
        if "." not in token:
            legacy = hmac.compare_digest(self._mac(f"{approval_id}|{nonce}"), token)
            if not legacy:
                return "bad"
            return "ok" if digest == original else "stale"
        if self._genuine(approval_id, nonce, token, digest):
            return "ok"
        if original != digest and self._genuine(approval_id, nonce, token, original):
            return "stale"
        return "bad"


EXTERNAL_PREFIX = "x"  # the first character of an external request's run id (others are hex)


def new_request_id() -> str:
    """A new external request's id: its run's, starting with ``x``."""
    return EXTERNAL_PREFIX + new_id()[1:]


def is_external(run_id: str) -> bool:
    """Whether ``run_id`` is an external request's (no query: ids tell)."""
    return run_id.startswith(EXTERNAL_PREFIX)
