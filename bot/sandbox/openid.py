"""Sign in with Slack, emulated: Slack's OpenID Connect authorize step, and the Web API
methods ``openid.connect.token`` and ``openid.connect.userInfo``.

Whoever the test (or the sandbox) says is signed in to this Slack (:meth:`sign_in_as`)
is who the authorize step signs in: it checks the app's client ID, ``response_type=code``
and the ``openid`` scope, then sends the browser back to ``redirect_uri`` with a code (or
with ``error=access_denied`` after :meth:`deny`), and the ``state`` as given. A code works
once, for ten minutes, for the client and redirect URI it was issued to; the exchange
takes the client's ID and secret as HTTP Basic credentials (as slack_sdk sends them) or as
arguments. Slack's ``id_token`` is signed RS256 with Slack's keys; this one is signed
HS256 with the client secret (the app reads its claims, it does not verify them: it gets
the token from the token endpoint itself).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from urllib.parse import urlencode, urlsplit

from aiohttp import web
from approvald.bot.sandbox.request import Params, SlackError
from approvald.bot.sandbox.state import JSON, SandboxState
from approvald.runtime import Clock

CODE_TTL = timedelta(minutes=10)
METHODS = frozenset({"openid.connect.token", "openid.connect.userInfo"})


@dataclass
class _Grant:
    """A code (then an access token) issued to someone who signed in."""

    user: str
    team: str
    client_id: str
    redirect_uri: str
    nonce: str | None
    issued_at: datetime
    used: bool = False


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


class OpenIdProvider:
    """Sign in with Slack over a :class:`SandboxState`."""

    def __init__(self, state: SandboxState, clock: Clock, *, client_id: str,
                 client_secret: str) -> None:
        self.state = state
        self.clock = clock
        self.client_id = client_id
        self.client_secret = client_secret
        self.who: tuple[str, str] | None = None  # (user, team) signed in to this Slack
        self.denied = False
        self._codes: dict[str, _Grant] = {}
        self._tokens: dict[str, _Grant] = {}

    def sign_in_as(self, user: str, *, team: str | None = None) -> None:
        """Who the authorize step signs in from now on (``team``: another workspace's
        member, for a refusal; unset: a member of this one)."""
        if team is None and user not in self.state.users:
            raise KeyError(f"unknown user {user}")
        self.who = (user, team or self.state.workspace.team_id)
        self.denied = False

    def deny(self) -> None:
        """The person at the authorize step presses Cancel from now on."""
        self.denied = True

    # -- the authorize step (a browser's GET) -----------------------------------------------
    def authorize(self, request: web.Request) -> web.Response:
        q = request.query
        redirect = q.get("redirect_uri", "")
        if q.get("client_id") != self.client_id:
            return _page(400, "Sign in with Slack: unknown client_id")
        if urlsplit(redirect).scheme not in ("http", "https"):
            return _page(400, "Sign in with Slack: redirect_uri must be an http(s) URL")
        if q.get("response_type") != "code" or "openid" not in q.get("scope", "").split():
            return _page(400, "Sign in with Slack: response_type=code and the openid scope "
                              "are required")
        back = {"state": q["state"]} if "state" in q else {}
        if self.denied:
            return _redirect(redirect, {"error": "access_denied", **back})
        if self.who is None:
            return _page(403, "Nobody is signed in to this emulated Slack (sign_in_as)")
        code = secrets.token_urlsafe(24)
        user, team = self.who
        self._codes[code] = _Grant(user, team, self.client_id, redirect, q.get("nonce"),
                                   self.clock.now())
        return _redirect(redirect, {"code": code, **back})

    # -- the Web API methods ----------------------------------------------------------------
    def call(self, method: str, p: Params, *, authorization: str, token: str | None) -> JSON:
        if method == "openid.connect.token":
            return self.token(p, authorization)
        return self.user_info(token)

    def token(self, p: Params, authorization: str) -> JSON:
        client_id, secret = p.arg("client_id"), p.arg("client_secret")
        if authorization.startswith("Basic "):
            try:
                raw = base64.b64decode(authorization.removeprefix("Basic ").strip()).decode()
            except ValueError:
                raise SlackError("invalid_auth") from None
            client_id, _, secret = raw.partition(":")
        if client_id != self.client_id:
            raise SlackError("invalid_client_id")
        if not hmac.compare_digest((secret or "").encode(), self.client_secret.encode()):
            raise SlackError("bad_client_secret")
        if p.arg("grant_type") not in (None, "authorization_code"):
            raise SlackError("invalid_grant_type")
        grant = self._codes.get(p.arg("code") or "")
        if grant is None or grant.used or self.clock.now() - grant.issued_at >= CODE_TTL:
            raise SlackError("invalid_code")
        if p.arg("redirect_uri") != grant.redirect_uri:
            raise SlackError("bad_redirect_uri")
        grant.used = True
        access = f"xoxp-openid-{secrets.token_hex(12)}"
        self._tokens[access] = grant
        return {"ok": True, "access_token": access, "token_type": "Bearer",
                "id_token": self._id_token(grant)}

    def user_info(self, token: str | None) -> JSON:
        if not token:
            raise SlackError("not_authed")
        grant = self._tokens.get(token)
        if grant is None:
            raise SlackError("invalid_auth")
        return {"ok": True, **self._claims(grant)}

    def _claims(self, grant: _Grant) -> JSON:
        ws = self.state.workspace
        person = self.state.users.get(grant.user) if grant.team == ws.team_id else None
        claims: JSON = {"sub": grant.user, "https://slack.com/user_id": grant.user,
                        "https://slack.com/team_id": grant.team,
                        "name": person.real_name if person else grant.user,
                        "locale": "en-US"}
        if grant.team == ws.team_id:
            claims |= {"https://slack.com/team_name": ws.team_name,
                       "https://slack.com/team_domain": ws.domain}
        if person is not None and person.email:
            claims |= {"email": person.email, "email_verified": True}
        return claims

    def _id_token(self, grant: _Grant) -> str:
        now = int(self.clock.now().timestamp())
        claims: JSON = {"iss": "https://slack.com", "aud": grant.client_id, "iat": now,
                        "exp": now + 3600, "auth_time": now, **self._claims(grant)}
        if grant.nonce is not None:
            claims["nonce"] = grant.nonce
        head = _b64(json.dumps({"typ": "JWT", "alg": "HS256"}).encode())
        body = _b64(json.dumps(claims, separators=(",", ":")).encode())
        mac = hmac.new(self.client_secret.encode(), f"{head}.{body}".encode(), hashlib.sha256)
        return f"{head}.{body}.{_b64(mac.digest())}"


def _redirect(uri: str, query: dict[str, str]) -> web.Response:
    sep = "&" if urlsplit(uri).query else "?"
    return web.Response(status=302, headers={"Location": f"{uri}{sep}{urlencode(query)}",
                                             "Cache-Control": "no-store"})


def _page(status: int, text: str) -> web.Response:
    return web.Response(status=status, text=text, headers={"Cache-Control": "no-store"})
