"""The emulated Sign in with Slack, by its own rules: the authorize step checks the client
and the request and sends back a code and the state; a code is exchanged once, by the
client that holds the secret, for the redirect URI it was issued to; userInfo answers only
to the access token an exchange gave."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qs, urlencode, urlsplit

import pytest
from aiohttp.test_utils import make_mocked_request
from approvald.bot.sandbox.openid import OpenIdProvider
from approvald.bot.sandbox.request import Params, SlackError
from approvald.bot.sandbox.state import SandboxState, User, Workspace
from approvald.runtime.kernel.clock import ManualClock

BACK = "https://approvals.example.com/review/sign-in/slack/callback"


def provider() -> tuple[OpenIdProvider, ManualClock]:
    state = SandboxState(Workspace())
    state.users["U_ALICE"] = User("U_ALICE", "alice", "Alice", "alice@example.com")
    clock = ManualClock(datetime(2026, 12, 5, tzinfo=UTC))
    return OpenIdProvider(state, clock, client_id="1.2", client_secret="s3cret"), clock


def authorize(p: OpenIdProvider, **query: str) -> tuple[int, dict[str, str]]:
    q = {"client_id": "1.2", "response_type": "code", "scope": "openid profile email",
         "redirect_uri": BACK, "state": "S", "nonce": "N", **query}
    resp = p.authorize(make_mocked_request("GET", "/openid/connect/authorize?" + urlencode(q)))
    location = resp.headers.get("Location", "")
    return resp.status, {k: v[0] for k, v in parse_qs(urlsplit(location).query).items()}


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def exchange(p: OpenIdProvider, code: str, *, secret: str = "s3cret",
             redirect: str = BACK) -> dict[str, object]:
    return p.token(Params({"code": code, "redirect_uri": redirect}), basic("1.2", secret))


def test_the_authorize_step_checks_the_request_and_sends_back_code_and_state() -> None:
    p, _ = provider()
    assert authorize(p)[0] == 403  # nobody signed in to this Slack
    p.sign_in_as("U_ALICE")
    status, back = authorize(p)
    assert status == 302 and back["state"] == "S" and back["code"]
    assert authorize(p, client_id="9.9")[0] == 400
    assert authorize(p, scope="profile")[0] == 400
    assert authorize(p, response_type="token")[0] == 400
    assert authorize(p, redirect_uri="javascript:alert(1)")[0] == 400
    p.deny()
    assert authorize(p)[1] == {"error": "access_denied", "state": "S"}
    with pytest.raises(KeyError):
        p.sign_in_as("U_NOBODY")


def test_a_code_is_exchanged_once_by_its_client_for_its_redirect() -> None:
    p, clock = provider()
    p.sign_in_as("U_ALICE")
    code = authorize(p)[1]["code"]
    for kwargs, error in (({"secret": "wrong"}, "bad_client_secret"),
                          ({"redirect": BACK + "x"}, "bad_redirect_uri")):
        with pytest.raises(SlackError) as caught:
            exchange(p, code, **kwargs)  # type: ignore[arg-type]
        assert caught.value.error == error
    answer = exchange(p, code)
    token, id_token = str(answer["access_token"]), str(answer["id_token"])
    claims = json.loads(base64.urlsafe_b64decode(id_token.split(".")[1] + "=="))
    assert claims["nonce"] == "N" and claims["aud"] == "1.2" and claims["sub"] == "U_ALICE"
    assert claims["https://slack.com/team_id"] == "T_TEST"
    with pytest.raises(SlackError, match="invalid_code"):
        exchange(p, code)  # once
    late = authorize(p)[1]["code"]
    clock.advance(timedelta(minutes=10))
    with pytest.raises(SlackError, match="invalid_code"):
        exchange(p, late)
    info = p.user_info(token)
    assert info["https://slack.com/user_id"] == "U_ALICE" and info["email"] == "alice@example.com"
    with pytest.raises(SlackError, match="invalid_auth"):
        p.user_info("xoxp-forged")
    p.sign_in_as("U_EVE", team="T_OTHER")
    other = exchange(p, authorize(p)[1]["code"])
    assert p.user_info(str(other["access_token"]))["https://slack.com/team_id"] == "T_OTHER"
