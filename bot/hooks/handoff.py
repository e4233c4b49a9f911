"""The command hook's fast path: hand the event to a running ``serve`` over HTTP (standard
library only, so the hook's process imports next to nothing).

``approvald hook claude-code --serve URL`` posts the event's bytes to
``URL/v1/hooks/claude-code?wait=S`` with the bearer token in ``$APPROVALD_HOOK_TOKEN`` (a
token made with ``--face hook:claude-code``, which names the person the calls are for),
and prints serve's answer. Whatever else happens (serve not running, not answering in
time, a refused token, an answer that is not a decision) is a :class:`HandoffFailed`,
which the hook turns into a deny naming it: never an allow.
"""

from __future__ import annotations

import http.client
import json
import os
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

from approvald.bot.hooks.contract import PRE

TOKEN_VARIABLE = "APPROVALD_HOOK_TOKEN"
# read here, not through approvald's settings: the fast path does not load them
ENVIRONMENT = {
    TOKEN_VARIABLE: "the bearer token (made with `--face hook:claude-code`) the Claude Code "
                    "hook calls serve with: the command hook's `--serve URL`, and the HTTP "
                    "hook's `Authorization` header (Claude Code fills it in from "
                    "`allowedEnvVars`); it names the person the calls are for",
}
PATH = "/v1/hooks/claude-code"


class HandoffFailed(Exception):
    """serve did not decide the event (the message says what happened instead)."""


@dataclass(frozen=True)
class Serve:
    """Where serve listens, and the token the hook calls it with."""

    scheme: str
    host: str
    port: int
    base: str  # the URL's path, before /v1/...
    token: str

    @classmethod
    def parse(cls, url: str, token: str | None = None) -> Serve:
        """``url`` (``http(s)://host[:port][/prefix]``) with ``token`` (default: the
        ``APPROVALD_HOOK_TOKEN`` variable); a bad one is a :class:`HandoffFailed`."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise HandoffFailed(f"--serve {url!r} is not an http:// or https:// URL")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise HandoffFailed(f"--serve {url!r} has no valid port") from None
        token = token if token is not None else os.environ.get(TOKEN_VARIABLE, "")
        if not token.strip():
            raise HandoffFailed(f"{TOKEN_VARIABLE} is not set: with --serve, the hook calls "
                                "serve with a token made by `approvald tokens create NAME "
                                "--face hook:claude-code --requested-by U…`")
        return cls(parts.scheme, parts.hostname, port, parts.path.rstrip("/"), token.strip())

    @property
    def where(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}{self.base}"

    def post(self, event: bytes, *, kind: str, wait: float, timeout: float
             ) -> dict[str, Any] | None:
        """serve's answer to ``event`` (of kind ``kind``): the decision for a PreToolUse,
        None for an event after the call (recorded). ``timeout``: seconds for the whole
        exchange's each step (the watchdog bounds the sum)."""
        cls = http.client.HTTPSConnection if self.scheme == "https" else \
            http.client.HTTPConnection
        conn = cls(self.host, self.port, timeout=max(0.001, timeout))
        path = f"{self.base}{PATH}?wait={quote(f'{max(0.0, wait):.3f}')}"
        try:
            conn.request("POST", path, body=event, headers={
                "Authorization": f"Bearer {self.token}", "Content-Type": "application/json"})
            resp = conn.getresponse()
            body = resp.read(1_000_000)
        except (OSError, http.client.HTTPException) as exc:
            raise HandoffFailed(f"serve at {self.where} did not answer: "
                                f"{_why(exc)}") from None
        finally:
            conn.close()
        if kind != PRE and resp.status in (200, 204):
            return None
        if resp.status != 200:
            raise HandoffFailed(f"serve at {self.where} answered {resp.status}: "
                                f"{_error_message(body)}")
        return _decision(body, self.where)


def _why(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "no answer in time"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused (is `approvald serve` running?)"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _error_message(body: bytes) -> str:
    try:
        doc = json.loads(body)
        return str(doc["error"]["message"])[:300]
    except (ValueError, LookupError, TypeError):
        return body[:200].decode("utf-8", "replace") or "(no body)"


def _decision(body: bytes, where: str) -> dict[str, Any]:
    """serve's PreToolUse answer, if it is one: allow or deny, and nothing else."""
    try:
        doc = json.loads(body)
        said = doc["hookSpecificOutput"]
        ok = said["hookEventName"] == PRE and said["permissionDecision"] in ("allow", "deny") \
            and isinstance(said.get("permissionDecisionReason"), str)
    except (ValueError, LookupError, TypeError):
        ok = False
    if not ok:
        raise HandoffFailed(f"serve at {where} answered something that is not a decision")
    return dict(doc)
