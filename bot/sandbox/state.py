"""In-memory state of the sandbox workspace: channels, people, messages, views, trigger ids.

Everything here is plain data plus small lookups; the Web API rules (which error when)
live in :mod:`bot.sandbox.webapi`, so this module stays easy to inspect from tests.
"""

from __future__ import annotations

import copy
import itertools
import secrets
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

JSON = dict[str, Any]

#: Slack lets an app exchange a trigger_id for a modal within three seconds of issuing it.
TRIGGER_TTL = timedelta(seconds=3)


@dataclass(frozen=True)
class Workspace:
    """Identity of the emulated team, its bot user and its app."""

    team_id: str = "T_TEST"
    domain: str = "sandbox"
    team_name: str = "Sandbox"
    bot_user_id: str = "U_BOT"
    bot_id: str = "B_BOT"
    app_id: str = "A_SANDBOX"
    bot_name: str = "approvald"

    @property
    def url(self) -> str:
        return f"https://{self.domain}.slack.com/"


@dataclass
class Channel:
    """A conversation and its messages, oldest first (top-level messages and replies)."""

    id: str
    name: str
    is_private: bool = False
    messages: list[JSON] = field(default_factory=list)
    # the last few versions of each edited message, as a page may still show them: ts ->
    # {version: message} (kept in memory only: a page reloads after a restart anyway)
    earlier: dict[str, dict[str, JSON]] = field(default_factory=dict)

    def find(self, ts: str) -> JSON | None:
        for message in self.messages:
            if message["ts"] == ts:
                return message
        return None

    def keep_version(self, message: JSON) -> None:
        """Remember ``message`` as it is now, before an edit (at most :data:`VERSIONS`)."""
        kept = self.earlier.setdefault(message["ts"], {})
        kept[version_of(message)] = clone(message)
        while len(kept) > VERSIONS:
            del kept[next(iter(kept))]

    def version(self, ts: str, version: str) -> JSON | None:
        """Message ``ts`` as it was at ``version`` (:func:`version_of`), if remembered;
        None for the current version or an unknown one."""
        current = self.find(ts)
        if current is None or version_of(current) == version:
            return None
        return self.earlier.get(ts, {}).get(version)

    def remove(self, ts: str) -> bool:
        """Delete the message ``ts``. Its replies stay, as in Slack (which shows a deleted
        parent that has replies as a tombstone; here it is simply gone)."""
        before = len(self.messages)
        self.messages = [m for m in self.messages if m["ts"] != ts]
        return len(self.messages) < before


@dataclass
class User:
    """A workspace member, as users.info describes it."""

    id: str
    name: str
    real_name: str
    email: str | None = None
    is_bot: bool = False
    tz: str = "Etc/UTC"

    def to_slack(self, team_id: str) -> JSON:
        profile: JSON = {"real_name": self.real_name, "display_name": self.name,
                         "real_name_normalized": self.real_name}
        if self.email:
            profile["email"] = self.email
        return {"id": self.id, "team_id": team_id, "name": self.name, "deleted": False,
                "real_name": self.real_name, "tz": self.tz, "is_bot": self.is_bot,
                "is_admin": False, "is_app_user": False, "profile": profile}


@dataclass
class UserGroup:
    """A user group (Slack calls them subteams); only membership matters here."""

    id: str
    handle: str
    users: list[str]


@dataclass
class Trigger:
    """A trigger_id handed to the app inside an interaction payload."""

    id: str
    issued_at: datetime
    user_id: str | None = None
    exchanged: bool = False


class TsSource:
    """Issues message timestamps the way Slack formats them: ``"<seconds>.<micros>"``.

    They follow the emulator clock but are strictly increasing, because apps use ts as a
    message id: two posts in the same microsecond (or a frozen test clock) still differ.
    """

    STEP = 100  # microseconds between colliding stamps; looks like real Slack ts suffixes

    def __init__(self) -> None:
        self.last = 0  # the newest stamp issued, in microseconds (kept across restarts)

    def next(self, now: datetime) -> str:
        micros = int(now.timestamp()) * 1_000_000 + now.microsecond
        if micros <= self.last:
            micros = self.last + self.STEP
        self.last = micros
        return f"{micros // 1_000_000}.{micros % 1_000_000:06d}"


class SandboxState:
    """All mutable workspace data of one emulator instance."""

    def __init__(self, workspace: Workspace) -> None:
        self.workspace = workspace
        self.channels: dict[str, Channel] = {}
        self.users: dict[str, User] = {}
        self.usergroups: dict[str, UserGroup] = {}
        self.views: dict[str, JSON] = {}
        self.view_users: dict[str, str | None] = {}  # view id -> the user it was opened for
        self.home_views: dict[str, str] = {}  # user id -> id of the published home view
        self.ephemerals: dict[tuple[str, str], list[JSON]] = {}
        self.triggers: dict[str, Trigger] = {}
        self.ts = TsSource()
        # chat.postMessage to a user id posts in the bot's DM with them (as Slack does);
        # off unless asked for, so tests of plain channel rules see channel_not_found
        self.direct_messages = False
        self.trigger_ttl = TRIGGER_TTL  # Slack's 3 s; a sandbox for people may allow more
        self._view_seq = itertools.count(1)
        self._trigger_seq = itertools.count(1000)

    def restart_view_ids(self, start: int) -> None:
        """Issue view ids from ``start`` on (after loading a saved workspace)."""
        self._view_seq = itertools.count(start)

    # -- channels and messages ------------------------------------------------------------

    def channel(self, ref: str | None) -> Channel | None:
        """Find a channel by id, or by name with or without "#" as chat.postMessage allows."""
        if not ref:
            return None
        if ref in self.channels:
            return self.channels[ref]
        name = ref.removeprefix("#")
        found = next((c for c in self.channels.values() if c.name == name), None)
        if found is None and self.direct_messages and ref in self.users:
            found = self.dm(ref)
        return found

    def dm(self, user_id: str) -> Channel:
        """The bot's direct-message conversation with ``user_id`` (opened on first use)."""
        channel_id = f"D_{user_id.removeprefix('U_').removeprefix('U')}"
        if channel_id not in self.channels:
            self.channels[channel_id] = Channel(channel_id, f"dm-{user_id.lower()}",
                                                is_private=True)
        return self.channels[channel_id]

    def thread(self, channel: Channel, ts: str) -> list[JSON]:
        """The parent message and its replies, oldest first; empty if ``ts`` is unknown."""
        parent = channel.find(ts)
        if parent is None:
            return []
        root = str(parent.get("thread_ts") or parent["ts"])
        if root != parent["ts"]:  # asked with a reply's ts: Slack answers with the whole thread
            found = channel.find(root)
            if found is None:
                return [parent]
            parent = found
        replies = [m for m in channel.messages
                   if m.get("thread_ts") == root and m["ts"] != root]
        return [parent, *replies]

    # -- views and triggers --------------------------------------------------------------

    def new_view_id(self) -> str:
        # Slack view ids are "V" + uppercase base-36; keep the shape, make them readable.
        return f"V{next(self._view_seq):08d}"

    def issue_trigger(self, now: datetime, user_id: str | None = None) -> str:
        """Mint a trigger id shaped like Slack's ("12345.98765.abcd2358fdea")."""
        trigger_id = f"{next(self._trigger_seq)}.{int(now.timestamp())}.{secrets.token_hex(16)}"
        self.triggers[trigger_id] = Trigger(trigger_id, now, user_id)
        return trigger_id


VERSIONS = 5  # earlier versions of a message kept, for a click on a card drawn before


def version_of(message: JSON) -> str:
    """Which version of a message this is: its last edit's ts ("" if never edited)."""
    edited = message.get("edited")
    return str(edited.get("ts", "")) if isinstance(edited, dict) else ""


def clone(value: JSON) -> JSON:
    """A deep copy, so callers can never mutate stored state through a response."""
    return copy.deepcopy(value)
