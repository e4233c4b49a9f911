"""The Slack transport hands bolt an HTTP-mode request (issue 47): exactly what bolt builds
from the raw body itself (body, context, headers, query), with the body parsed once by
approvald's parser; never a request labelled Socket Mode."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlencode

import pytest
from approvald.bot.slack.transport import parse
from slack_bolt.request.async_request import AsyncBoltRequest

FORM = "application/x-www-form-urlencoded"
CLICK = {"type": "block_actions", "user": {"id": "U_ALICE", "team_id": "T1"},
         "team": {"id": "T1"}, "channel": {"id": "C1"}, "api_app_id": "A1",
         "enterprise": {"id": "E1"}, "is_enterprise_install": False,
         "message": {"ts": "1.2", "text": "a card: 100% <b> & é"},
         "actions": [{"action_id": "approve", "value": "v+1 %41"}],
         "response_url": "https://hooks.example/r", "trigger_id": "t1"}
EVENT = {"type": "event_callback", "team_id": "T1", "api_app_id": "A1",
         "event": {"type": "app_home_opened", "user": "U_BOB", "channel": "D1"}}
COMMAND = {"command": "/approvals", "text": "mine please", "user_id": "U_ALICE",
           "team_id": "T1", "channel_id": "C1", "response_url": "https://hooks.example/c"}

BODIES: dict[str, tuple[str, str]] = {
    "click": (urlencode({"payload": json.dumps(CLICK)}), FORM),
    "event": (json.dumps(EVENT), "application/json"),
    "slash-command": (urlencode(COMMAND), FORM),
}


@pytest.mark.parametrize("lazy", [False, True])
@pytest.mark.parametrize("case", list(BODIES))
def test_the_request_is_the_one_bolt_builds_from_the_raw_body(case: str, lazy: bool) -> None:
    raw, content_type = BODIES[case]
    headers = {"Content-Type": content_type, "X-Slack-Request-Timestamp": "1700000000",
               "X-Slack-Signature": "v0=" + "0" * 64}
    if lazy:  # headers bolt reads itself (its lazy listeners' re-dispatch)
        headers |= {"X-Slack-Bolt-Lazy-Only": "1", "X-Slack-Bolt-Lazy-Function-Name": "f"}
    ours = parse(raw.encode(), content_type, "a=1&b=2", headers)
    theirs = AsyncBoltRequest(body=raw, query="a=1&b=2",
                              headers={k.lower(): v for k, v in headers.items()})
    # Slack sends no query string: bolt's parse of "" is {} too
    assert vars(parse(raw.encode(), content_type, "", headers))["query"] == vars(
        AsyncBoltRequest(body=raw, query=""))["query"] == {}

    def shape(r: AsyncBoltRequest) -> dict[str, Any]:
        # every attribute bolt's constructor sets, whatever it sets (the transport builds
        # its request without calling that constructor)
        return {**vars(r), "context": dict(r.context)}

    assert shape(ours) == shape(theirs)
    assert set(vars(theirs)) == {"raw_body", "query", "headers", "content_type", "body",
                                 "context", "lazy_only", "lazy_function_name", "mode"}
    assert ours.mode == "http" and ours.raw_body == raw
    copy = ours.to_copyable()  # what bolt hands a lazy listener: parsed again from raw
    assert (copy.mode, copy.body, dict(copy.context)) == ("http", ours.body, dict(ours.context))
