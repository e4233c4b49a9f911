"""Identifiers and secrets."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
import socket
import uuid


def new_id() -> str:
    """A random 128-bit id as 32 hex characters (runs, approvals)."""
    return uuid.uuid4().hex


def new_nonce() -> str:
    """128 random bits from the OS CSPRNG, hex-encoded."""
    return secrets.token_hex(16)


def worker_id() -> str:
    """``host:pid:random``: unique per process, and lets a peer on the same host see us die."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


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


class TokenSigner:
    """Approval tokens: HMAC-SHA256(secret, approval id | nonce), 192 bits, url-safe.

    The database stores only the random nonce. A token can be recomputed (to render the
    same buttons on a card, an App Home view or a quorum update) only with the secret,
    so read access to the database does not let anyone click. Escalation makes a new
    approval with a new nonce, so the old card's token stops matching anything pending.
    """

    def __init__(self, secret: str | bytes) -> None:
        raw = secret.encode() if isinstance(secret, str) else secret
        if len(raw) < 16:
            raise ValueError("the token secret must be at least 16 bytes")
        self._key = hashlib.sha256(b"approvald-token-v1\x00" + raw).digest()

    def token(self, approval_id: str, nonce: str) -> str:
        mac = hmac.new(self._key, f"{approval_id}|{nonce}".encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(mac[:24]).decode().rstrip("=")

    def verify(self, approval_id: str, nonce: str, token: str) -> bool:
        return hmac.compare_digest(self.token(approval_id, nonce), token)
