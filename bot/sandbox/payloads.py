"""Builders for the payloads Slack sends to apps, in Slack's own shapes.

Pure functions over plain data, shared by the signed HTTP client and by Socket Mode
envelopes, so a test drives an app the same way over either transport. Field sets follow
Slack's documented examples for ``block_actions``, ``view_submission``, slash commands and
Events API ``event_callback`` envelopes.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any

JSON = dict[str, Any]

#: Slack still sends the legacy verification token; Bolt ignores it when signatures are on.
VERIFICATION_TOKEN = "sandbox-verification-token"


@dataclass(frozen=True)
class Actor:
    """Who an interaction comes from, and in which team and app."""

    user_id: str
    username: str
    team_id: str
    team_domain: str
    app_id: str

    def user(self) -> JSON:
        return {"id": self.user_id, "username": self.username, "name": self.username,
                "team_id": self.team_id}

    def team(self) -> JSON:
        return {"id": self.team_id, "domain": self.team_domain}


def slack_ts(now: datetime) -> str:
    return f"{now.timestamp():.6f}"


def block_actions(actor: Actor, *, action_id: str, value: str | None, now: datetime,
                  trigger_id: str, response_url: str, container: JSON,
                  channel: JSON | None = None, message: JSON | None = None,
                  view: JSON | None = None, block_id: str | None = None,
                  element: JSON | None = None, action_type: str = "button") -> JSON:
    """A ``block_actions`` payload for one interactive element (a button by default)."""
    action: JSON = {"action_id": action_id, "block_id": block_id or secrets.token_hex(3),
                    "type": (element or {}).get("type", action_type),
                    "action_ts": slack_ts(now)}
    if value is not None:
        action["value"] = value
    for key in ("text", "style"):  # Slack echoes the element's label and style back
        if element and key in element:
            action[key] = element[key]
    payload: JSON = {"type": "block_actions", "user": actor.user(), "api_app_id": actor.app_id,
                     "token": VERIFICATION_TOKEN, "container": container,
                     "trigger_id": trigger_id, "team": actor.team(), "enterprise": None,
                     "is_enterprise_install": False, "actions": [action]}
    if channel is not None:
        payload["channel"] = channel
    if message is not None:
        payload["message"] = message
        payload["state"] = {"values": {}}
        payload["response_url"] = response_url
    if view is not None:
        payload["view"] = view
    return payload


def state_values(values: dict[str, dict[str, Any]]) -> JSON:
    """Turn ``{block_id: {action_id: value}}`` into Slack's ``view.state.values``.

    A plain string becomes a ``plain_text_input`` value; a dict is taken as the full
    element state (e.g. ``{"type": "static_select", "selected_option": {...}}``).
    """
    out: JSON = {}
    for block_id, actions in values.items():
        out[block_id] = {
            action_id: (state if isinstance(state, dict)
                        else {"type": "plain_text_input", "value": state})
            for action_id, state in actions.items()}
    return out


def view_submission(actor: Actor, *, view: JSON, values: dict[str, dict[str, Any]],
                    trigger_id: str) -> JSON:
    """A ``view_submission`` payload for ``view`` with the given input values."""
    submitted = {**view, "state": {"values": state_values(values)}}
    return {"type": "view_submission", "team": actor.team(), "user": actor.user(),
            "api_app_id": actor.app_id, "token": VERIFICATION_TOKEN, "trigger_id": trigger_id,
            "view": submitted, "response_urls": [], "enterprise": None,
            "is_enterprise_install": False}


def slash_command(actor: Actor, *, command: str, text: str, channel_id: str,
                  channel_name: str, trigger_id: str, response_url: str) -> dict[str, str]:
    """The form fields of a slash command request (all strings, as Slack posts them)."""
    return {"token": VERIFICATION_TOKEN, "team_id": actor.team_id,
            "team_domain": actor.team_domain, "channel_id": channel_id,
            "channel_name": channel_name, "user_id": actor.user_id,
            "user_name": actor.username, "command": command, "text": text,
            "api_app_id": actor.app_id, "is_enterprise_install": "false",
            "response_url": response_url, "trigger_id": trigger_id}


def event_callback(event: JSON, *, team_id: str, app_id: str, bot_user_id: str,
                   now: datetime) -> JSON:
    """An Events API ``event_callback`` envelope around ``event``."""
    stamped = {"event_ts": slack_ts(now), **event}
    return {"token": VERIFICATION_TOKEN, "team_id": team_id, "api_app_id": app_id,
            "event": stamped, "type": "event_callback",
            "event_id": f"Ev{secrets.token_hex(5).upper()}",
            "event_time": int(now.timestamp()),
            "authorizations": [{"enterprise_id": None, "team_id": team_id,
                                "user_id": bot_user_id, "is_bot": True,
                                "is_enterprise_install": False}],
            "is_ext_shared_channel": False,
            "event_context": f"4-{secrets.token_hex(12)}"}
