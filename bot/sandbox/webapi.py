"""The Web API methods the emulator answers, with Slack's response shapes and error names.

Each method takes the merged request arguments and returns the JSON body of a success, or
raises :class:`SlackError`, which the server turns into HTTP 200 ``{"ok": false, ...}`` as
Slack does. Transport concerns (auth, faults, recording) stay in :mod:`bot.sandbox.server`.
"""

from __future__ import annotations

import base64
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from approvald.bot.sandbox.blocks import MAX_VIEW_BLOCKS, block_problems
from approvald.bot.sandbox.request import Params, SlackError
from approvald.bot.sandbox.state import JSON, Channel, SandboxState, clone
from approvald.runtime import Clock

MAX_TEXT = 40_000


TokenKind = Literal["bot", "app"]


@dataclass(frozen=True)
class MethodSpec:
    """How a method is reached: which token it needs and whether GET is accepted."""

    handler: str
    token: TokenKind = "bot"
    get: bool = False


METHODS: dict[str, MethodSpec] = {
    "auth.test": MethodSpec("auth_test", get=True),
    "chat.postMessage": MethodSpec("chat_post_message"),
    "chat.update": MethodSpec("chat_update"),
    "chat.delete": MethodSpec("chat_delete"),
    "chat.postEphemeral": MethodSpec("chat_post_ephemeral"),
    "chat.getPermalink": MethodSpec("chat_get_permalink", get=True),
    "views.open": MethodSpec("views_open"),
    "views.update": MethodSpec("views_update"),
    "views.publish": MethodSpec("views_publish"),
    "users.info": MethodSpec("users_info", get=True),
    "usergroups.users.list": MethodSpec("usergroups_users_list", get=True),
    "conversations.history": MethodSpec("conversations_history", get=True),
    "conversations.replies": MethodSpec("conversations_replies", get=True),
    "apps.connections.open": MethodSpec("apps_connections_open", token="app"),
}


class WebApi:
    """Slack Web API semantics over a :class:`SandboxState`."""

    def __init__(self, state: SandboxState, clock: Clock,
                 issue_socket_ticket: Callable[[], str]) -> None:
        self.state = state
        self.clock = clock
        self._issue_socket_ticket = issue_socket_ticket

    def call(self, method: str, params: Params) -> JSON:
        spec = METHODS.get(method)
        if spec is None:
            raise SlackError("unknown_method")
        result: JSON = getattr(self, spec.handler)(params)
        return result

    # -- auth and socket mode ---------------------------------------------------------------

    def auth_test(self, p: Params) -> JSON:
        ws = self.state.workspace
        return {"ok": True, "url": ws.url, "team": ws.team_name, "user": ws.bot_name,
                "team_id": ws.team_id, "user_id": ws.bot_user_id, "bot_id": ws.bot_id,
                "is_enterprise_install": False}

    def apps_connections_open(self, p: Params) -> JSON:
        host = p.host or "127.0.0.1"
        return {"ok": True, "url": f"ws://{host}/socket-mode/{self._issue_socket_ticket()}"}

    # -- chat --------------------------------------------------------------------------------

    def chat_post_message(self, p: Params) -> JSON:
        channel = self._channel(p.arg("channel"))
        message = self._bot_message(p, require_content=True)
        metadata = self._metadata(p)
        if metadata is not None:
            message["metadata"] = metadata
        thread_ts = p.arg("thread_ts")
        message["ts"] = self.state.ts.next(self.clock.now())
        if thread_ts:
            self.attach_reply(channel, message, thread_ts, broadcast=p.flag("reply_broadcast"))
        channel.messages.append(message)
        return {"ok": True, "channel": channel.id, "ts": message["ts"], "message": clone(message)}

    def chat_update(self, p: Params) -> JSON:
        channel = self._channel(p.arg("channel"))
        ts = p.arg("ts")
        message = channel.find(ts) if ts else None
        if message is None:
            raise SlackError("message_not_found")
        if message.get("bot_id") != self.state.workspace.bot_id:
            raise SlackError("cant_update_message")  # a bot token edits only its own messages
        changes = self._bot_message(p, require_content=False)
        metadata = self._metadata(p)
        given = [k for k in ("blocks", "attachments") if k in changes]
        if p.arg("text") is None and not given and metadata is None:
            raise SlackError("no_text")  # nothing to change: no text, blocks or attachments
        channel.keep_version(message)  # a page may still show it, and click on it
        # Arguments left out keep their old value; an explicit [] removes blocks, as in Slack.
        if p.arg("text") is not None:
            message["text"] = changes["text"]
        for key in given:
            message[key] = changes[key]
            if not changes[key]:
                del message[key]
        if metadata is not None:
            message["metadata"] = metadata
        message["edited"] = {"user": self.state.workspace.bot_user_id,
                             "ts": self.state.ts.next(self.clock.now())}
        return {"ok": True, "channel": channel.id, "ts": message["ts"],
                "text": message.get("text", ""), "message": clone(message)}

    def chat_delete(self, p: Params) -> JSON:
        channel = self._channel(p.arg("channel"))
        ts = p.arg("ts")
        message = channel.find(ts) if ts else None
        if message is None:
            raise SlackError("message_not_found")
        if message.get("bot_id") != self.state.workspace.bot_id:
            raise SlackError("cant_delete_message")  # a bot token deletes only its own
        channel.remove(message["ts"])
        return {"ok": True, "channel": channel.id, "ts": message["ts"]}

    def chat_post_ephemeral(self, p: Params) -> JSON:
        channel = self._channel(p.arg("channel"))
        user = p.arg("user")
        if user is None or user not in self.state.users:
            raise SlackError("user_not_in_channel")
        message = self._bot_message(p, require_content=True)
        message["ts"] = self.state.ts.next(self.clock.now())
        if p.arg("thread_ts"):
            message["thread_ts"] = p.arg("thread_ts")
        self.state.ephemerals.setdefault((channel.id, user), []).append(message)
        return {"ok": True, "message_ts": message["ts"]}

    def chat_get_permalink(self, p: Params) -> JSON:
        channel = self._channel(p.arg("channel"))
        ts = p.arg("message_ts")
        message = channel.find(ts) if ts else None
        if message is None:
            raise SlackError("message_not_found")
        link = f"{self.state.workspace.url}archives/{channel.id}/p{message['ts'].replace('.', '')}"
        thread_ts = message.get("thread_ts")
        if thread_ts and thread_ts != message["ts"]:
            link += f"?thread_ts={thread_ts}&cid={channel.id}"
        return {"ok": True, "channel": channel.id, "permalink": link}

    # -- conversations -----------------------------------------------------------------------

    def conversations_history(self, p: Params) -> JSON:
        channel = self._channel(p.arg("channel"))
        top_level = [m for m in channel.messages if m.get("thread_ts") in (None, m["ts"])
                     or m.get("subtype") == "thread_broadcast"]
        oldest, latest = p.arg("oldest"), p.arg("latest")
        inclusive = p.flag("inclusive")
        top_level = [m for m in top_level if _in_range(m["ts"], oldest, latest, inclusive)]
        newest_first = list(reversed(top_level))
        page, cursor = _paginate(newest_first, p)
        include_metadata = p.flag("include_all_metadata")
        return {"ok": True, "messages": [_present(m, include_metadata) for m in page],
                "has_more": bool(cursor), "pin_count": 0,
                "response_metadata": {"next_cursor": cursor}}

    def conversations_replies(self, p: Params) -> JSON:
        channel = self._channel(p.arg("channel"))
        thread = self.state.thread(channel, p.required("ts"))
        if not thread:
            raise SlackError("thread_not_found")
        page, cursor = _paginate(thread, p)
        include_metadata = p.flag("include_all_metadata")
        return {"ok": True, "messages": [_present(m, include_metadata) for m in page],
                "has_more": bool(cursor), "response_metadata": {"next_cursor": cursor}}

    # -- people ------------------------------------------------------------------------------

    def users_info(self, p: Params) -> JSON:
        user = self.state.users.get(p.arg("user") or "")
        if user is None:
            raise SlackError("user_not_found")
        return {"ok": True, "user": user.to_slack(self.state.workspace.team_id)}

    def usergroups_users_list(self, p: Params) -> JSON:
        group = self.state.usergroups.get(p.arg("usergroup") or "")
        if group is None:
            raise SlackError("no_such_subteam")
        return {"ok": True, "users": list(group.users)}

    # -- views -------------------------------------------------------------------------------

    def views_open(self, p: Params) -> JSON:
        trigger_id = p.arg("trigger_id") or p.arg("interactivity_pointer")
        if trigger_id is None:
            raise SlackError("invalid_arguments", "[ERROR] missing required field: trigger_id")
        trigger = self.state.triggers.get(trigger_id)
        if trigger is None:
            raise SlackError("invalid_trigger_id")
        if trigger.exchanged:
            raise SlackError("exchanged_trigger_id")
        if self.clock.now() - trigger.issued_at >= self.state.trigger_ttl:
            raise SlackError("expired_trigger_id")
        view = self._view_arg(p, "modal")
        external_id = view.get("external_id") or ""
        if external_id and any(v.get("external_id") == external_id
                               for v in self.state.views.values()):
            raise SlackError("duplicate_external_id")
        trigger.exchanged = True
        stored = self._store_view(self.state.new_view_id(), view)
        self.state.view_users[stored["id"]] = trigger.user_id
        return {"ok": True, "view": clone(stored)}

    def views_update(self, p: Params) -> JSON:
        view_id, external_id = p.arg("view_id"), p.arg("external_id")
        if view_id is None and external_id is None:
            raise SlackError("invalid_arguments", "[ERROR] view_id or external_id is required")
        current = (self.state.views.get(view_id) if view_id else
                   next((v for v in self.state.views.values()
                         if v.get("external_id") == external_id), None))
        if current is None:
            raise SlackError("not_found")
        self._check_hash(p, current)
        view = self._view_arg(p, current["type"])
        stored = self._store_view(current["id"], view, replaces=current)
        return {"ok": True, "view": clone(stored)}

    def views_publish(self, p: Params) -> JSON:
        user_id = p.required("user_id")
        if user_id not in self.state.users:
            raise SlackError("user_not_found")
        view = self._view_arg(p, "home")
        current_id = self.state.home_views.get(user_id)
        current = self.state.views.get(current_id) if current_id else None
        if current is not None:
            self._check_hash(p, current)
        stored = self._store_view(current_id or self.state.new_view_id(), view, replaces=current)
        self.state.home_views[user_id] = stored["id"]
        self.state.view_users[stored["id"]] = user_id
        return {"ok": True, "view": clone(stored)}

    # -- helpers -----------------------------------------------------------------------------

    def _channel(self, ref: str | None) -> Channel:
        channel = self.state.channel(ref)
        if channel is None:
            raise SlackError("channel_not_found")
        return channel

    def _bot_message(self, p: Params, *, require_content: bool) -> JSON:
        ws = self.state.workspace
        text = p.arg("text")
        if text is not None and len(text) > MAX_TEXT:
            raise SlackError("msg_too_long")
        blocks = p.decoded("blocks", "invalid_blocks_format")
        if blocks is not None:
            problems = block_problems(blocks)
            if problems:
                raise SlackError("invalid_blocks", *problems)
        attachments = p.decoded("attachments", "invalid_attachments")
        if require_content and not (text or blocks or attachments):
            raise SlackError("no_text")
        message: JSON = {"type": "message", "user": ws.bot_user_id, "bot_id": ws.bot_id,
                         "app_id": ws.app_id, "team": ws.team_id, "text": text or ""}
        if blocks is not None:
            message["blocks"] = blocks
        if attachments is not None:
            message["attachments"] = attachments
        return message

    def _metadata(self, p: Params) -> JSON | None:
        metadata = p.decoded("metadata", "invalid_metadata_format")
        if metadata is None:
            return None
        if (not isinstance(metadata, dict) or not isinstance(metadata.get("event_type"), str)
                or not isinstance(metadata.get("event_payload", {}), dict)):
            raise SlackError("invalid_metadata_schema")
        return {"event_type": metadata["event_type"],
                "event_payload": metadata.get("event_payload", {})}

    def attach_reply(self, channel: Channel, message: JSON, thread_ts: str,
                     *, broadcast: bool) -> None:
        """Make ``message`` a reply in the thread of ``thread_ts`` and update the parent."""
        parent = channel.find(thread_ts)
        # Replying to a reply lands in the parent's thread; an unknown ts is kept as given.
        root = parent.get("thread_ts", thread_ts) if parent else thread_ts
        root_message = channel.find(root) if parent else None
        message["thread_ts"] = root
        if broadcast:
            message["subtype"] = "thread_broadcast"
        if root_message is None:
            return
        message["parent_user_id"] = root_message.get("user")
        root_message["thread_ts"] = root
        root_message["reply_count"] = root_message.get("reply_count", 0) + 1
        users = root_message.setdefault("reply_users", [])
        if message["user"] not in users:
            users.append(message["user"])
        root_message["reply_users_count"] = len(users)
        root_message["latest_reply"] = message["ts"]

    def _view_arg(self, p: Params, kind: str) -> JSON:
        view = p.decoded("view", "invalid_arguments")
        if not isinstance(view, dict):
            raise SlackError("invalid_arguments", "[ERROR] missing required field: view")
        if view.get("type") != kind:
            raise SlackError("invalid_arguments",
                             f"[ERROR] must be '{kind}' [json-pointer:/view/type]")
        problems = block_problems(view.get("blocks", []), max_blocks=MAX_VIEW_BLOCKS)
        if problems:
            raise SlackError("invalid_arguments", *problems)
        return view

    def _check_hash(self, p: Params, current: JSON) -> None:
        given = p.arg("hash")
        if given is not None and given != current["hash"]:
            raise SlackError("hash_conflict")

    def _store_view(self, view_id: str, view: JSON, *, replaces: JSON | None = None) -> JSON:
        ws = self.state.workspace
        now = self.clock.now()
        stored: JSON = {
            "id": view_id, "team_id": ws.team_id, "type": view["type"],
            "title": view.get("title"), "submit": view.get("submit"), "close": view.get("close"),
            "blocks": view.get("blocks", []),
            "private_metadata": view.get("private_metadata", ""),
            "callback_id": view.get("callback_id", ""),
            "external_id": view.get("external_id", ""),
            "state": {"values": {}},
            "hash": f"{int(now.timestamp())}.{secrets.token_hex(4)}",
            "clear_on_close": bool(view.get("clear_on_close", False)),
            "notify_on_close": bool(view.get("notify_on_close", False)),
            "root_view_id": replaces["root_view_id"] if replaces else view_id,
            "previous_view_id": None, "app_id": ws.app_id, "app_installed_team_id": ws.team_id,
            "bot_id": ws.bot_id,
        }
        self.state.views[view_id] = stored
        return stored


def _present(message: JSON, include_metadata: bool) -> JSON:
    out = clone(message)
    if not include_metadata:
        out.pop("metadata", None)  # Slack returns metadata only when include_all_metadata is set
    return out


def _in_range(ts: str, oldest: str | None, latest: str | None, inclusive: bool) -> bool:
    value = float(ts)
    if oldest is not None and (value < float(oldest) or (value == float(oldest) and not inclusive)):
        return False
    return not (latest is not None
                and (value > float(latest) or (value == float(latest) and not inclusive)))


def _paginate(items: list[JSON], p: Params) -> tuple[list[JSON], str]:
    """Slice ``items`` by ``limit`` and an opaque ``cursor``; return the page and next cursor."""
    limit = max(1, min(p.integer("limit", 100), 999))
    start = 0
    cursor = p.arg("cursor")
    if cursor:
        try:
            start = int(base64.b64decode(cursor).decode().removeprefix("next:"))
        except ValueError:
            raise SlackError("invalid_cursor") from None
    end = start + limit
    next_cursor = base64.b64encode(f"next:{end}".encode()).decode() if end < len(items) else ""
    return items[start:end], next_cursor
