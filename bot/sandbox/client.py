"""Act as Slack towards an app: signed interactivity, slash command and Events API requests.

Requests are signed exactly as Slack signs them: ``X-Slack-Request-Timestamp`` plus
``X-Slack-Signature = "v0=" + hex(HMAC-SHA256(secret, f"v0:{timestamp}:{raw_body}"))``.
Options forge the signature, age the timestamp or drop both headers, so tests can check
that the app refuses them. With an ``emulator``, trigger ids and response URLs are issued
by it, so ``views.open`` and ``respond()`` from the app work end to end.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

import aiohttp
from approvald.bot.sandbox import payloads
from approvald.bot.sandbox.blocks import find_element
from approvald.bot.sandbox.payloads import JSON, Actor
from approvald.runtime import Clock, SystemClock
from slack_sdk.signature import SignatureVerifier

if TYPE_CHECKING:
    from approvald.bot.sandbox.server import SlackEmulator


@dataclass(frozen=True)
class AppResponse:
    """What the app answered: HTTP status, headers, body text, and the trigger id sent."""

    status: int
    headers: dict[str, str]
    body: str
    trigger_id: str | None = None

    def json(self) -> Any:
        return json.loads(self.body)


class SlackClientSim:
    """Sends Slack-shaped, Slack-signed requests to the app at ``app_url``.

    ``clock`` (``now() -> datetime``) stamps the signature; keep it on real time unless
    the app's verifier uses the same fake clock, or every request looks stale to it.
    Use ``async with`` (or :meth:`close`) so the HTTP session is closed.
    """

    def __init__(self, app_url: str, signing_secret: str, clock: Clock | None = None, *,
                 emulator: SlackEmulator | None = None, team_id: str | None = None,
                 team_domain: str | None = None, app_id: str | None = None) -> None:
        self.app_url = app_url
        self.signing_secret = signing_secret
        self.clock: Clock = clock or SystemClock()
        self.emulator = emulator
        workspace = emulator.workspace if emulator else None
        self.team_id = team_id or (workspace.team_id if workspace else "T_TEST")
        self.team_domain = team_domain or (workspace.domain if workspace else "sandbox")
        self.app_id = app_id or (workspace.app_id if workspace else "A_SANDBOX")
        self.trigger_ids: list[str] = []  # every trigger id handed to the app, oldest first
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> SlackClientSim:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -- requests to the app -----------------------------------------------------------------

    async def click(self, action_id: str, value: str | None, *, user_id: str,
                    channel_id: str | None = None, message_ts: str | None = None,
                    message: JSON | None = None, view_id: str | None = None,
                    trigger_id: str | None = None, team_id: str | None = None,
                    container: JSON | None = None, state: dict[str, dict[str, Any]] | None = None,
                    forge: bool = False, timestamp_offset: int = 0,
                    signed: bool = True) -> AppResponse:
        """Press a button: POST a ``block_actions`` payload as ``payload=<json>``.

        ``state``: what the surface's inputs hold when the button is pressed, as
        ``{block_id: {action_id: value}}`` (see :meth:`ticked` for checkboxes); it goes
        into ``view.state.values`` for a view and ``state.values`` for a message.
        """
        payload = self.envelope_for_click(
            action_id, value, user_id=user_id, channel_id=channel_id, message_ts=message_ts,
            message=message, view_id=view_id, trigger_id=trigger_id, team_id=team_id,
            container=container, state=state)
        return await self.post(urlencode({"payload": json.dumps(payload)}),
                               "application/x-www-form-urlencoded", payload["trigger_id"],
                               forge=forge, timestamp_offset=timestamp_offset, signed=signed)

    async def submit_view(self, callback_id: str, values: dict[str, dict[str, Any]], *,
                          user_id: str, private_metadata: str | None = None,
                          view_id: str | None = None, forge: bool = False,
                          timestamp_offset: int = 0, signed: bool = True) -> AppResponse:
        """Submit a modal: POST a ``view_submission`` payload with ``values``."""
        payload = self.envelope_for_view_submission(
            callback_id, values, user_id=user_id, private_metadata=private_metadata,
            view_id=view_id)
        return await self.post(urlencode({"payload": json.dumps(payload)}),
                               "application/x-www-form-urlencoded", payload["trigger_id"],
                               forge=forge, timestamp_offset=timestamp_offset, signed=signed)

    async def slash(self, command: str, text: str, *, user_id: str, channel_id: str,
                    forge: bool = False, timestamp_offset: int = 0,
                    signed: bool = True) -> AppResponse:
        """Run a slash command: POST its form fields."""
        fields = self.envelope_for_slash(command, text, user_id=user_id, channel_id=channel_id)
        return await self.post(urlencode(fields), "application/x-www-form-urlencoded",
                               fields["trigger_id"], forge=forge,
                               timestamp_offset=timestamp_offset, signed=signed)

    async def event(self, event: JSON, *, forge: bool = False, timestamp_offset: int = 0,
                    signed: bool = True) -> AppResponse:
        """Deliver an Events API event (e.g. ``app_home_opened``) as a JSON envelope."""
        return await self.post(json.dumps(self.envelope_for_event(event)), "application/json",
                               forge=forge, timestamp_offset=timestamp_offset, signed=signed)

    async def url_verification(self, challenge: str = "sandbox-challenge") -> AppResponse:
        """The handshake Slack sends when an Events request URL is saved."""
        body = {"token": payloads.VERIFICATION_TOKEN, "challenge": challenge,
                "type": "url_verification"}
        return await self.post(json.dumps(body), "application/json")

    # -- payloads (also for Socket Mode: emulator.send_envelope("interactive", payload)) -------

    def envelope_for_click(self, action_id: str, value: str | None, *, user_id: str,
                           channel_id: str | None = None, message_ts: str | None = None,
                           message: JSON | None = None, view_id: str | None = None,
                           trigger_id: str | None = None, team_id: str | None = None,
                           container: JSON | None = None,
                           state: dict[str, dict[str, Any]] | None = None) -> JSON:
        """The ``block_actions`` payload :meth:`click` sends (type ``interactive``).

        With an emulator, the clicked message (or view) is looked up so the payload carries
        its blocks, and the action gets the real block_id and button label.
        """
        if message is None and self.emulator and channel_id and message_ts:
            message = self.emulator.message(channel_id, message_ts)
        view = self.emulator.view(view_id) if self.emulator and view_id else None
        if view_id and view is None:
            view = {"id": view_id, "type": "home", "blocks": []}
        blocks = (message or view or {}).get("blocks")
        block_id, element = find_element(blocks, action_id)
        if container is None:
            container = ({"type": "view", "view_id": view_id} if view_id else
                         {"type": "message", "message_ts": message_ts, "channel_id": channel_id,
                          "is_ephemeral": False})
        channel = self._channel(channel_id) if channel_id else None
        payload = payloads.block_actions(
            self._actor(user_id, team_id), action_id=action_id, value=value,
            now=self.clock.now(), trigger_id=trigger_id or self._trigger(user_id),
            response_url=self._response_url(channel_id, user_id, message_ts),
            container=container, channel=channel,
            message=message if not view_id else None, view=view, block_id=block_id,
            element=element)
        if state is not None:
            values = {"values": payloads.state_values(state)}
            if view is not None:
                payload["view"] = {**payload["view"], "state": values}
            else:  # a message's inputs (an ephemeral one has no "message" in its payload)
                payload["state"] = values
                payload.setdefault("response_url",
                                   self._response_url(channel_id, user_id, message_ts))
        return payload

    @staticmethod
    def ticked(blocks: Any, values: Any) -> dict[str, dict[str, Any]]:
        """The ``state`` of ``blocks``' checkboxes with the options whose value is in
        ``values`` ticked (and nothing else), for :meth:`click` or :meth:`submit_view`:
        each element's state lists the ticked option objects, as Slack sends them."""
        wanted = set(values)
        state: dict[str, dict[str, Any]] = {}
        for block in blocks if isinstance(blocks, list) else []:
            elements = [block.get("accessory"), block.get("element"),
                        *(block.get("elements") or [] if block.get("type") == "actions"
                          else [])]
            for el in elements:
                if not isinstance(el, dict) or el.get("type") != "checkboxes":
                    continue
                chosen = [o for o in el.get("options") or [] if o.get("value") in wanted]
                state.setdefault(block["block_id"], {})[el["action_id"]] = {
                    "type": "checkboxes", "selected_options": chosen}
        return state

    @staticmethod
    def filled(blocks: Any, changes: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
        """The ``state`` of a modal's input blocks as Slack sends it on submit: what each
        input was drawn with (``initial_value``/``initial_option(s)``), except the blocks
        named in ``changes`` (``{block_id: value}``): text for a ``plain_text_input``, an
        option's value for a ``static_select`` or ``radio_buttons``, a list of option values
        for ``checkboxes`` (a value the element does not offer is sent as given, as a forged
        payload would). For :meth:`submit_view` or :meth:`click`."""
        changes = dict(changes or {})
        state: dict[str, dict[str, Any]] = {}
        for block in blocks if isinstance(blocks, list) else []:
            el = block.get("element") if isinstance(block, dict) else None
            if block.get("type") != "input" or not isinstance(el, dict):
                continue
            kind, options = el.get("type"), el.get("options") or []
            by_value = {o.get("value"): o for o in options}
            given = changes.pop(block["block_id"], None)
            if kind == "plain_text_input":
                value = given if given is not None else el.get("initial_value")
                entry: dict[str, Any] = {"type": kind, "value": value}
            elif kind in ("static_select", "radio_buttons"):
                chosen = (by_value.get(given, {"text": {"type": "plain_text", "text": given},
                                               "value": given})
                          if given is not None else el.get("initial_option"))
                entry = {"type": kind, "selected_option": chosen}
            elif kind == "checkboxes":
                chosen_all = ([by_value.get(v, {"text": {"type": "plain_text", "text": v},
                                                "value": v}) for v in given]
                              if given is not None else el.get("initial_options") or [])
                entry = {"type": kind, "selected_options": chosen_all}
            else:
                continue
            state[block["block_id"]] = {el["action_id"]: entry}
        if changes:
            raise KeyError(f"no input block {', '.join(sorted(changes))} in these blocks")
        return state

    def envelope_for_view_submission(self, callback_id: str, values: dict[str, dict[str, Any]],
                                     *, user_id: str, private_metadata: str | None = None,
                                     view_id: str | None = None) -> JSON:
        """The ``view_submission`` payload :meth:`submit_view` sends (type ``interactive``).

        Without ``view_id`` the emulator's newest view with ``callback_id`` (for this user
        if any) is submitted; ``private_metadata=None`` keeps that view's own metadata.
        """
        view = self._find_view(callback_id, user_id, view_id)
        view["callback_id"] = callback_id
        if private_metadata is not None:
            view["private_metadata"] = private_metadata
        return payloads.view_submission(self._actor(user_id), view=view, values=values,
                                        trigger_id=self._trigger(user_id))

    def envelope_for_slash(self, command: str, text: str, *, user_id: str,
                           channel_id: str) -> dict[str, str]:
        """The slash command fields :meth:`slash` posts (type ``slash_commands``)."""
        return payloads.slash_command(
            self._actor(user_id), command=command, text=text, channel_id=channel_id,
            channel_name=self._channel(channel_id)["name"], trigger_id=self._trigger(user_id),
            response_url=self._response_url(channel_id, user_id, None))

    def envelope_for_event(self, event: JSON) -> JSON:
        """The ``event_callback`` body :meth:`event` posts (type ``events_api``)."""
        bot_user = self.emulator.workspace.bot_user_id if self.emulator else "U_BOT"
        return payloads.event_callback(event, team_id=self.team_id, app_id=self.app_id,
                                       bot_user_id=bot_user, now=self.clock.now())

    # -- signing and transport ---------------------------------------------------------------

    def signature_headers(self, body: str, *, forge: bool = False,
                          timestamp_offset: int = 0) -> dict[str, str]:
        """Slack's signature headers for ``body``; ``forge`` signs with a wrong secret."""
        timestamp = str(int(self.clock.now().timestamp()) + timestamp_offset)
        secret = f"forged-{self.signing_secret}" if forge else self.signing_secret
        signature = SignatureVerifier(secret).generate_signature(timestamp=timestamp, body=body)
        # generate_signature returns None only for a missing timestamp, never the case here.
        return {"X-Slack-Request-Timestamp": timestamp, "X-Slack-Signature": signature or ""}

    async def post(self, body: str, content_type: str, trigger_id: str | None = None, *,
                   forge: bool = False, timestamp_offset: int = 0,
                   signed: bool = True) -> AppResponse:
        """POST a raw ``body`` to the app, signed unless ``signed=False``."""
        headers = {"Content-Type": content_type,
                   "User-Agent": "Slackbot 1.0 (+https://api.slack.com/robots)"}
        if signed:
            headers.update(self.signature_headers(body, forge=forge,
                                                  timestamp_offset=timestamp_offset))
        if self._session is None:
            self._session = aiohttp.ClientSession()
        # Send the exact bytes that were signed: the app verifies the raw body.
        async with self._session.post(self.app_url, data=body.encode(), headers=headers) as res:
            text = await res.text()
            return AppResponse(res.status, dict(res.headers), text, trigger_id)

    # -- helpers -----------------------------------------------------------------------------

    def _actor(self, user_id: str, team_id: str | None = None) -> Actor:
        user = self.emulator.state.users.get(user_id) if self.emulator else None
        return Actor(user_id, user.name if user else user_id.lower(), team_id or self.team_id,
                     self.team_domain, self.app_id)

    def _channel(self, channel_id: str) -> JSON:
        found = self.emulator.state.channel(channel_id) if self.emulator else None
        return {"id": channel_id, "name": found.name if found else channel_id.lower()}

    def _trigger(self, user_id: str) -> str:
        trigger_id = (self.emulator.issue_trigger_id(user_id) if self.emulator else
                      f"{secrets.randbelow(10**8)}.{secrets.randbelow(10**8)}."
                      f"{secrets.token_hex(16)}")
        self.trigger_ids.append(trigger_id)
        return trigger_id

    def _response_url(self, channel_id: str | None, user_id: str,
                      message_ts: str | None) -> str:
        if self.emulator is not None and self.emulator.is_running:
            return self.emulator.response_url(channel=channel_id, user=user_id,
                                              message_ts=message_ts)
        return f"https://hooks.slack.com/actions/{self.team_id}/0/{secrets.token_hex(12)}"

    def _find_view(self, callback_id: str, user_id: str, view_id: str | None) -> JSON:
        if self.emulator is not None:
            if view_id is not None:
                found = self.emulator.view(view_id)
                if found is not None:
                    return found
            else:
                candidates = (self.emulator.views(user_id=user_id, callback_id=callback_id)
                              or self.emulator.views(callback_id=callback_id))
                if candidates:
                    return candidates[-1]
        return {"id": view_id or f"V{secrets.token_hex(4).upper()}", "type": "modal",
                "callback_id": callback_id, "private_metadata": "", "blocks": [],
                "title": {"type": "plain_text", "text": "Sandbox"}, "state": {"values": {}}}
