"""Reading Web API requests: arguments, tokens, and Slack's error envelope.

Slack takes arguments from the query string, a form body or a JSON body (slack_sdk uses
JSON for chat.postMessage, chat.update and views.*, query parameters for the rest) and the
token from ``Authorization: Bearer`` or a ``token`` argument.
"""

from __future__ import annotations

import hmac
import json
from typing import Any

from aiohttp import web

JSON = dict[str, Any]


class SlackError(Exception):
    """A Web API failure: ``error`` is Slack's error code, ``messages`` its detail lines."""

    def __init__(self, error: str, *messages: str) -> None:
        super().__init__(error)
        self.error = error
        self.messages = list(messages)

    def body(self) -> JSON:
        out: JSON = {"ok": False, "error": self.error}
        if self.messages:
            out["response_metadata"] = {"messages": self.messages}
        return out


class Params:
    """Request arguments merged from query string, form body and JSON body (JSON wins)."""

    def __init__(self, values: dict[str, Any], *, host: str | None = None) -> None:
        self.values = values
        self.host = host  # the request's Host header: Socket Mode URLs point back at it

    def arg(self, name: str) -> str | None:
        value = self.values.get(name)
        return None if value is None or value == "" else str(value)

    def required(self, name: str) -> str:
        value = self.arg(name)
        if value is None:
            raise SlackError("invalid_arguments", f"[ERROR] missing required field: {name}")
        return value

    def flag(self, name: str) -> bool:
        # slack_sdk sends booleans as "1"/"0" in query strings and as true/false in JSON.
        return self.values.get(name) in (True, 1, "1", "true", "True")

    def integer(self, name: str, default: int) -> int:
        try:
            return int(self.values.get(name) or default)
        except (TypeError, ValueError):
            raise SlackError("invalid_arguments", f"[ERROR] {name} must be an integer") from None

    def decoded(self, name: str, error: str) -> Any:
        """A structured argument: form bodies carry it as a JSON string, JSON bodies inline."""
        value = self.values.get(name)
        if isinstance(value, str):
            if not value:
                return None
            try:
                return json.loads(value)
            except json.JSONDecodeError:
                raise SlackError(error) from None
        return value


async def read_params(request: web.Request) -> dict[str, Any]:
    """Merge query string, form body and JSON body the way Slack accepts arguments."""
    values: dict[str, Any] = dict(request.query)
    if request.method != "POST" or not request.can_read_body:
        return values
    if request.content_type == "application/json":
        try:
            body = json.loads(await request.text())
        except json.JSONDecodeError:
            raise SlackError("invalid_json") from None
        if not isinstance(body, dict):
            raise SlackError("json_not_object")
        values.update(body)
    elif request.content_type in ("application/x-www-form-urlencoded", "multipart/form-data"):
        form = await request.post()
        values.update({k: v for k, v in form.items() if isinstance(v, str)})
    return values


def pop_token(request: web.Request, values: dict[str, Any]) -> str | None:
    """Take the token from ``Authorization: Bearer`` (preferred) or a ``token`` argument."""
    token = values.pop("token", None)  # never keep tokens in recorded params
    header = request.headers.get("Authorization", "")
    if header.startswith("Bearer "):
        return header.removeprefix("Bearer ").strip()
    return str(token) if token else None


def authorize(token: str | None, expected: str, other: str) -> None:
    """Raise Slack's auth error unless ``token`` is ``expected`` (``other``: the wrong kind)."""
    if not token:
        raise SlackError("not_authed")
    given = token.encode("utf-8", "surrogateescape")
    if hmac.compare_digest(given, other.encode()):
        raise SlackError("not_allowed_token_type")  # e.g. an xapp- token on chat.postMessage
    if not hmac.compare_digest(given, expected.encode()):
        raise SlackError("invalid_auth")
