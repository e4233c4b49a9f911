"""Sign in with Slack on the review queue: Slack's OpenID Connect (authorization code flow).

The browser is sent to Slack's authorize page (``SLACK_AUTHORIZE_URL``) with the scopes
``openid profile email``, a ``state`` (single-use, stored hashed, bound to a cookie of the
browser that began the sign-in: see :mod:`bot.web.auth`) and a ``nonce`` derived from
the state under the deployment's secret. Slack sends the browser back to
``APPROVALD_PUBLIC_URL/review/sign-in/slack/callback`` with a code, which is exchanged
with ``openid.connect.token`` (the client ID and secret), and the user is read with
``openid.connect.userInfo`` (the access token the exchange gave), both through
slack_sdk's client at ``SLACK_API_URL``.

The ``id_token`` comes straight from Slack's token endpoint over TLS, in answer to the
client secret: OpenID Connect Core (3.1.3.7) lets a client that gets it that way rely on
TLS rather than on its signature, so its claims are read, not verified against Slack's
keys. Its issuer, audience (this client) and ``nonce`` are checked; its subject must be
the user ``openid.connect.userInfo`` names.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import aiohttp
from approvald.bot.web.auth import Refused
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

SCOPES = "openid profile email"
ISSUER = "https://slack.com"
TEAM_CLAIM = "https://slack.com/team_id"
USER_CLAIM = "https://slack.com/user_id"
CALLBACK = "/review/sign-in/slack/callback"


@dataclass(frozen=True)
class SlackIdentity:
    """Who Slack says signed in: the Slack user id (the approver's identity) and team."""

    user: str
    team: str
    email: str | None = None


def id_token_claims(token: str) -> dict[str, Any]:
    """The claims of a JWT, read (not verified: see the module doc); ValueError if it is
    not one."""
    parts = token.split(".")
    if len(parts) != 3:
        raise ValueError("not a JWT")
    body = parts[1] + "=" * (-len(parts[1]) % 4)
    try:
        claims = json.loads(base64.urlsafe_b64decode(body.encode("ascii")))
    except (binascii.Error, UnicodeError, ValueError):
        raise ValueError("a JWT whose claims cannot be read") from None
    if not isinstance(claims, dict):
        raise ValueError("a JWT whose claims are not an object")
    return claims


class SlackOpenId:
    """Slack's side of Sign in with Slack: the authorize URL, the code exchange, the team."""

    def __init__(self, *, client_id: str, client_secret: str, authorize_url: str,
                 api_url: str, public_url: str, team_id: str | None,
                 bot_token: str | None) -> None:
        self.client_id = client_id
        self._secret = client_secret
        self.authorize_endpoint = authorize_url
        self.redirect_uri = public_url + CALLBACK
        self._team = team_id
        self._bot_token = bot_token
        # no token of its own: the exchange authenticates with the client's ID and secret,
        # userInfo with the access token the exchange gives
        self.client = AsyncWebClient(base_url=api_url, timeout=15)

    def authorize_url(self, state: str, nonce: str, team: str | None) -> str:
        query = {"response_type": "code", "scope": SCOPES, "client_id": self.client_id,
                 "state": state, "nonce": nonce, "redirect_uri": self.redirect_uri}
        if team:
            query["team"] = team  # Slack goes straight to this workspace
        return f"{self.authorize_endpoint}?{urlencode(query)}"

    async def team(self) -> str:
        """This deployment's workspace: APPROVALD_SLACK_TEAM_ID, else the bot token's."""
        if self._team is None:
            if self._bot_token is None:
                raise Refused("slack_unreachable", "Sign in with Slack does not know this "
                              "deployment's workspace.", 503)
            try:
                resp = await self.client.auth_test(token=self._bot_token)
            except (SlackApiError, aiohttp.ClientError, TimeoutError) as exc:
                raise Refused("slack_unreachable", f"Slack could not be asked which "
                              f"workspace this is ({_why(exc)}); try again.", 503) from None
            team = resp.get("team_id")
            if not isinstance(team, str) or not team:
                raise Refused("slack_unreachable", "Slack did not say which workspace this "
                              "is; try again.", 503)
            self._team = team
        return self._team

    async def identify(self, code: str, nonce: str) -> SlackIdentity:
        """Exchange ``code`` and read who signed in; :class:`Refused` (not yet audited) when
        Slack refuses the exchange or its answer does not hold together."""
        try:
            token = await self.client.openid_connect_token(
                client_id=self.client_id, client_secret=self._secret, code=code,
                redirect_uri=self.redirect_uri, grant_type="authorization_code")
            access = token.get("access_token")
            if not isinstance(access, str) or not access:
                raise Refused("token_exchange", "Slack gave no access token.")
            info = await self.client.openid_connect_userInfo(token=access)
        except SlackApiError as exc:
            raise Refused("token_exchange", f"Slack refused the sign-in ({_why(exc)}). "
                          "Try again.") from None
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise Refused("slack_unreachable", f"Slack could not be reached ({_why(exc)}). "
                          "Try again.", 503) from None
        raw = token.get("id_token")
        try:
            claims = id_token_claims(raw if isinstance(raw, str) else "")
        except ValueError as exc:
            raise Refused("token_exchange",
                          f"Slack's answer has no usable id_token ({exc}).") from None
        aud = claims.get("aud")
        if claims.get("iss") != ISSUER or self.client_id not in (
                aud if isinstance(aud, list) else [aud]):
            raise Refused("token_exchange", "Slack's id_token is not for this app.")
        if claims.get("nonce") != nonce or ("nonce" in info.data
                                            and info.get("nonce") != nonce):
            raise Refused("nonce", "This sign-in with Slack does not match the one begun "
                          "here. Try again.")
        user, team = info.get(USER_CLAIM), info.get(TEAM_CLAIM)
        if not isinstance(user, str) or not isinstance(team, str) \
                or claims.get("sub") != info.get("sub"):
            raise Refused("token_exchange", "Slack's answer does not name one user.")
        email = info.get("email")
        return SlackIdentity(user=user, team=team,
                             email=email if isinstance(email, str) else None)


def _why(exc: BaseException) -> str:
    if isinstance(exc, SlackApiError):
        return str(exc.response.get("error") or "an error")
    return type(exc).__name__ if not str(exc) else str(exc)[:200]
