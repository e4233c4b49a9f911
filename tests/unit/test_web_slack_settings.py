"""Sign in with Slack's settings: offered only with both the client ID and secret, one
workspace known, the authorize page beside SLACK_API_URL unless set; and the id_token's
claims read as they are."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from approvald.bot.config import Settings
from approvald.bot.web.service import slack_open_id
from approvald.bot.web.slack_sign_in import id_token_claims
from approvald.runtime.kernel.errors import ConfigError

URL = "https://approvals.example.com"


def settings(**values: Any) -> Settings:
    return Settings(APPROVALD_PUBLIC_URL=URL, **values)


def test_off_unless_configured_and_both_halves_needed() -> None:
    assert slack_open_id(settings()) is None
    with pytest.raises(ConfigError, match=r"^APPROVALD_SLACK_CLIENT_SECRET: "):
        slack_open_id(settings(APPROVALD_SLACK_CLIENT_ID="1.2", APPROVALD_SLACK_TEAM_ID="T1"))
    with pytest.raises(ConfigError, match=r"^APPROVALD_SLACK_CLIENT_ID: "):
        slack_open_id(settings(APPROVALD_SLACK_CLIENT_SECRET="s", APPROVALD_SLACK_TEAM_ID="T1"))
    # which workspace: the configured one, or the bot token's
    with pytest.raises(ConfigError, match=r"^APPROVALD_SLACK_TEAM_ID: "):
        slack_open_id(settings(APPROVALD_SLACK_CLIENT_ID="1.2",
                               APPROVALD_SLACK_CLIENT_SECRET="s"))
    assert slack_open_id(settings(APPROVALD_SLACK_CLIENT_ID="1.2",
                                  APPROVALD_SLACK_CLIENT_SECRET="s",
                                  SLACK_BOT_TOKEN="xoxb-1")) is not None


def test_the_authorize_url() -> None:
    s = settings(APPROVALD_SLACK_CLIENT_ID="1.2", APPROVALD_SLACK_CLIENT_SECRET="s",
                 APPROVALD_SLACK_TEAM_ID="T024BE7LD")
    oid = slack_open_id(s)
    assert oid is not None
    url = oid.authorize_url("STATE", "NONCE", "T024BE7LD")
    assert url == ("https://slack.com/openid/connect/authorize?response_type=code&scope="
                   "openid+profile+email&client_id=1.2&state=STATE&nonce=NONCE&redirect_uri="
                   "https%3A%2F%2Fapprovals.example.com%2Freview%2Fsign-in%2Fslack%2Fcallback"
                   "&team=T024BE7LD")
    # an emulator's Web API: its authorize page beside it; or named outright
    assert settings(SLACK_API_URL="http://127.0.0.1:9/api/").slack_authorize_endpoint() \
        == "http://127.0.0.1:9/openid/connect/authorize"
    assert settings(SLACK_AUTHORIZE_URL="https://sso.example.com/a").slack_authorize_endpoint() \
        == "https://sso.example.com/a"
    with pytest.raises(ValueError, match="APPROVALD_SLACK_TEAM_ID"):
        settings(APPROVALD_SLACK_TEAM_ID="not a team")


def _jwt(claims: Any) -> str:
    def b64(raw: bytes) -> str:
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")
    return f"{b64(b'{}')}.{b64(json.dumps(claims).encode())}.sig"


def test_id_token_claims() -> None:
    assert id_token_claims(_jwt({"sub": "U1", "nonce": "n"})) == {"sub": "U1", "nonce": "n"}
    for bad in ("", "a.b", "a.!!!.c", _jwt([1, 2])):
        with pytest.raises(ValueError):
            id_token_claims(bad)
