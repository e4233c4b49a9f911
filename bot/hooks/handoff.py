"""The command hook's fast path: hand the event to a running ``serve`` over HTTP, with the
standard library only, so the hook's process imports next to nothing.

``approvald hook claude-code --serve URL`` posts the event's bytes to
``URL/v1/hooks/claude-code?wait=S`` with the bearer token in ``$APPROVALD_HOOK_TOKEN`` (a
token made with ``--face hook:claude-code``, which names the person the calls are for),
and prints serve's answer. Whatever else happens (serve not running, not answering in
time, a refused token, an answer that is not a decision) is a :class:`HandoffFailed`,
which the hook turns into a deny naming it: never an allow.

Over ``http://`` (serve on this machine, or on a trusted network) the exchange is one
HTTP/1.1 request on a socket (``Connection: close``): ``http.client`` would import ``ssl``
and ``email``, a third of the hook's 50 ms. Over ``https://``, ``http.client``.
"""

from __future__ import annotations

import json
import os
import socket
import time
from typing import Any, NamedTuple
from urllib.parse import quote, urlsplit

from approvald.bot.claude_code_contract import PRE

TOKEN_VARIABLE = "APPROVALD_HOOK_TOKEN"
# read here, not through approvald's settings: the fast path does not load them
ENVIRONMENT = {
    TOKEN_VARIABLE: "the bearer token (made with `--face hook:claude-code`) the Claude Code "
                    "hook calls serve with: the command hook's `--serve URL`, and the HTTP "
                    "hook's `Authorization` header (Claude Code fills it in from "
                    "`allowedEnvVars`); it names the person the calls are for",
}
PATH = "/v1/hooks/claude-code"
MAX_ANSWER = 1_000_000  # bytes of serve's answer read


class HandoffFailed(Exception):
    """serve did not decide the event (the message says what happened instead)."""


class Serve(NamedTuple):
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

    def post(self, event: bytes, *, kind: str, wait: float, deadline: float
             ) -> dict[str, Any] | None:
        """serve's answer to ``event`` (of kind ``kind``): the decision for a PreToolUse,
        None for an event after the call (recorded). Past ``deadline`` (a
        ``time.monotonic`` value), a :class:`HandoffFailed`."""
        target = f"{self.base}{PATH}?wait={quote(f'{max(0.0, wait):.3f}')}"
        headers = {"Authorization": f"Bearer {self.token}",
                   "Content-Type": "application/json"}
        try:
            if self.scheme == "https":
                status, body = _https(self, target, event, headers, deadline)
            else:
                status, body = _http(self, target, event, headers, deadline)
        except Exception as exc:  # whatever it was, serve did not decide
            raise HandoffFailed(f"serve at {self.where} did not answer: {_why(exc)}") from None
        if kind != PRE and status in (200, 204):
            return None
        if status != 200:
            raise HandoffFailed(f"serve at {self.where} answered {status}: "
                                f"{_error_message(body)}")
        return _decision(body, self.where)


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("no answer in time")
    return left


def _http(serve: Serve, target: str, body: bytes, headers: dict[str, str], deadline: float
          ) -> tuple[int, bytes]:
    """One HTTP/1.1 exchange on a socket: (status, body)."""
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    request = (f"POST {target} HTTP/1.1\r\nHost: {serve.host}:{serve.port}\r\n{head}"
               f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode("latin-1")
    with socket.create_connection((serve.host, serve.port), timeout=_left(deadline)) as sock:
        sock.sendall(request + body)
        data = bytearray()
        while len(data) <= MAX_ANSWER + 65536:
            sock.settimeout(_left(deadline))
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    return _response(bytes(data))


def _response(data: bytes) -> tuple[int, bytes]:
    """(status, body) of a whole HTTP/1.1 response (a ``ValueError`` if it is not one)."""
    head, sep, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    version, _, status = lines[0].partition(" ")
    if not sep or not version.startswith("HTTP/1.") or not status[:3].isdigit():
        raise ValueError("not an HTTP answer")
    fields = {k.strip().lower(): v.strip()
              for k, _, v in (line.partition(":") for line in lines[1:])}
    if fields.get("transfer-encoding", "").lower() == "chunked":
        body = bytearray()
        while True:
            size_line, _, rest = rest.partition(b"\r\n")
            size = int(size_line.split(b";")[0], 16)
            if size == 0:
                break
            body += rest[:size]
            rest = rest[size + 2:]
        return int(status[:3]), bytes(body)
    if "content-length" in fields:
        length = int(fields["content-length"])
        if len(rest) < length:
            raise ValueError("the answer was cut short")
        rest = rest[:length]
    return int(status[:3]), rest


def _https(serve: Serve, target: str, body: bytes, headers: dict[str, str],
           deadline: float) -> tuple[int, bytes]:
    import http.client  # (and ssl): only over https

    conn = http.client.HTTPSConnection(serve.host, serve.port, timeout=_left(deadline))
    try:
        conn.request("POST", target, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read(MAX_ANSWER)
    finally:
        conn.close()


def _why(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "no answer in time"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused (is `approvald serve` running?)"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _error_message(body: bytes) -> str:
    try:
        return str(json.loads(body)["error"]["message"])[:300]
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
