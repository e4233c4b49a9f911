"""Keeping the sandbox workspace in a file, so a restart finds the cards it posted.

Real Slack keeps its messages whatever happens to the app; the sandbox has to do the same
for "stop it, start it again, click the card" to work. The whole workspace (channels,
messages, people, views, ephemeral replies) is written as one JSON document after every
change, to a temporary file renamed over the old one: a process killed at any moment
leaves either the previous workspace or the new one, never half of each. The write
happens before the app gets the Web API answer, so the workspace on disk always holds at
least what the app (and so the database) knows about.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from approvald.bot.sandbox.state import JSON, Channel, SandboxState, User, UserGroup

FORMAT = 1


class WorkspaceFileError(Exception):
    """The workspace file exists but cannot be read back."""


def dump(state: SandboxState, extra: JSON) -> JSON:
    """The workspace as plain JSON (trigger ids are not kept: they live 3 s anyway)."""
    return {
        "format": FORMAT,
        "extra": extra,
        "channels": [{"id": c.id, "name": c.name, "is_private": c.is_private,
                      "messages": c.messages} for c in state.channels.values()],
        "users": [vars(u) for u in state.users.values()],
        "usergroups": [vars(g) for g in state.usergroups.values()],
        "views": state.views,
        "view_users": state.view_users,
        "home_views": state.home_views,
        "ephemerals": [{"channel": c, "user": u, "messages": m}
                       for (c, u), m in state.ephemerals.items()],
        "last_ts": state.ts.last,
    }


def load(state: SandboxState, data: JSON) -> JSON:
    """Fill ``state`` from :func:`dump`'s document; returns its ``extra``."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise WorkspaceFileError(f"not a sandbox workspace of format {FORMAT}")
    try:
        state.channels = {c["id"]: Channel(c["id"], c["name"], bool(c["is_private"]),
                                           list(c["messages"])) for c in data["channels"]}
        state.users = {u["id"]: User(**u) for u in data["users"]}
        state.usergroups = {g["id"]: UserGroup(**g) for g in data["usergroups"]}
        state.views = dict(data["views"])
        state.view_users = dict(data["view_users"])
        state.home_views = dict(data["home_views"])
        state.ephemerals = {(e["channel"], e["user"]): list(e["messages"])
                            for e in data["ephemerals"]}
        state.ts.last = int(data["last_ts"])
    except (KeyError, TypeError, ValueError) as exc:
        raise WorkspaceFileError(f"damaged ({type(exc).__name__}: {exc})") from None
    numbers = [int(v[1:]) for v in state.views if v[1:].isdigit()]
    state.restart_view_ids(max(numbers, default=0) + 1)
    extra: JSON = data.get("extra") or {}
    return extra


class WorkspaceFile:
    """One JSON file holding the workspace (see the module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> JSON | None:
        """The stored document, or None when there is no file yet."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise WorkspaceFileError(f"cannot read it: {exc.strerror or exc}") from None
        try:
            data: Any = json.loads(text)
        except json.JSONDecodeError as exc:
            raise WorkspaceFileError(f"not JSON ({exc})") from None
        if not isinstance(data, dict):
            raise WorkspaceFileError("not a JSON object")
        return data

    def write(self, document: JSON) -> None:
        """Replace the file with ``document``, atomically (temporary file, then rename)."""
        text = json.dumps(document, ensure_ascii=False, separators=(",", ":"))
        fd, tmp = tempfile.mkstemp(prefix=self.path.name + ".", suffix=".tmp",
                                   dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
