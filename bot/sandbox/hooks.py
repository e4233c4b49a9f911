"""``response_url`` endpoints: where an app answers an interaction without the Web API.

Bolt's ``respond()`` posts JSON to the URL Slack put in the payload. The emulator issues
such URLs, records each post and applies it to the workspace the way Slack does.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from datetime import datetime

from aiohttp import web
from approvald.bot.sandbox.request import Params, SlackError
from approvald.bot.sandbox.state import JSON
from approvald.bot.sandbox.webapi import WebApi


@dataclass(frozen=True)
class ResponseUrlPost:
    """A message the app sent to an interaction's ``response_url``."""

    url: str
    body: JSON
    at: datetime


@dataclass
class _Target:
    url: str
    channel: str | None
    user: str | None
    message_ts: str | None
    posts: list[ResponseUrlPost] = field(default_factory=list)


class ResponseUrls:
    """Issues response URLs and serves ``POST /response/{hook}``."""

    def __init__(self, api: WebApi) -> None:
        self.api = api
        self._targets: dict[str, _Target] = {}

    def issue(self, root_url: str, *, channel: str | None, user: str | None,
              message_ts: str | None) -> str:
        hook = secrets.token_hex(8)
        url = f"{root_url}response/{hook}"
        self._targets[hook] = _Target(url, channel, user, message_ts)
        return url

    def posts(self, url: str | None = None) -> list[ResponseUrlPost]:
        found = [p for t in self._targets.values() if url in (None, t.url) for p in t.posts]
        return sorted(found, key=lambda p: p.at)

    async def handle(self, request: web.Request) -> web.Response:
        target = self._targets.get(request.match_info["hook"])
        if target is None:
            return web.Response(status=404, text="no_service")
        try:
            body = await request.json()
        except json.JSONDecodeError:
            return web.Response(status=400, text="invalid_payload")
        if not isinstance(body, dict):
            return web.Response(status=400, text="invalid_payload")
        target.posts.append(ResponseUrlPost(target.url, body, self.api.clock.now()))
        try:
            self._apply(target, body)
        except SlackError as exc:  # e.g. invalid blocks: Slack refuses the response too
            return web.json_response(exc.body())
        return web.json_response({"ok": True})

    def _apply(self, target: _Target, body: JSON) -> None:
        state = self.api.state
        channel = state.channel(target.channel)
        if channel is None:
            return
        original = channel.find(target.message_ts) if target.message_ts else None
        if body.get("delete_original") and original is not None:
            channel.messages.remove(original)
        elif body.get("replace_original") and original is not None:
            for key in ("text", "blocks", "attachments"):
                if key in body:
                    original[key] = body[key]
        elif body.get("response_type") == "in_channel":
            self.api.chat_post_message(Params({**body, "channel": channel.id}))
        elif target.user is not None:
            # Ephemeral (the default response_type): only the clicking user sees it.
            message: JSON = {"type": "message", "text": body.get("text", ""),
                             "ts": state.ts.next(self.api.clock.now())}
            if "blocks" in body:
                message["blocks"] = body["blocks"]
            state.ephemerals.setdefault((channel.id, target.user), []).append(message)
