"""A card's Web API call with its request built once (``bot/slack/private_slack_sdk.py``,
issue 50): the same bytes on the wire as ``api_call(method, json=card)``, the same
retries and the same errors, and none of api_call's per-call building.

The private names it relies on are listed in its ``RELIES_ON``; pyproject.toml bounds
slack_sdk to releases this test has passed on."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

import pytest
from aiohttp import web
from approvald.bot.config import Settings
from approvald.bot.slack import cards, private_slack_sdk
from approvald.bot.slack.app import SlackWeb
from approvald.bot.slack.delivery import CARD_EVENT, SlackDeliverer, classify
from approvald.bot.slack.private_slack_sdk import JsonCalls
from approvald.runtime import CardView, RetryLater
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.async_handler import AsyncRetryHandler
from slack_sdk.http_retry.builtin_interval_calculators import FixedValueRetryIntervalCalculator

from tests.helpers import served
from tests.unit.test_cards import NOW, TOKEN, approval, decided
from tests.unit.test_click_cpu import counting_calls

Seen = tuple[str, str, list[tuple[str, str]], bytes]
Answer = tuple[int, dict[str, str], str]


@asynccontextmanager
async def slack(answers: list[Answer]) -> AsyncIterator[tuple[SlackWeb, list[Seen]]]:
    """A Web API that records each request as it came (method, path, headers, body) and
    gives ``answers`` in turn (then ok), and the face's client and session pointed at it."""
    seen: list[Seen] = []

    async def answer(request: web.Request) -> web.Response:
        seen.append((request.method, request.path_qs, list(request.headers.items()),
                     await request.read()))
        status, headers, body = answers.pop(0) if answers else (
            200, {}, json.dumps({"ok": True, "channel": "C1", "ts": "9.9"}))
        kind = "application/json" if body.startswith("{") else "text/plain"
        return web.Response(status=status, headers=headers, text=body, content_type=kind)

    app = web.Application()
    app.router.add_post("/api/{method}", answer)
    async with served(app) as port:
        settings = Settings(SLACK_BOT_TOKEN="xoxb-test", SLACK_SIGNING_SECRET="s" * 32,
                            APPROVALD_CHANNEL="C1", APPROVALD_SECRET="k" * 32,
                            SLACK_API_URL=f"http://127.0.0.1:{port}/api/")
        face = SlackWeb(settings)
        face.open()
        try:
            yield face, seen
        finally:
            await face.close()


def card_args() -> list[tuple[str, dict[str, Any]]]:
    """Each card call's arguments, as delivery gives them."""
    update = cards.approval_card(replace(decided("approved"), channel="C1", message_ts="1.2"),
                                 token=None, now=NOW)
    live = approval(args={"note": "a <b> & `c` \u202e 😀 é\u0301"})
    post = cards.approval_card(live, token=TOKEN, now=NOW)
    return [("chat.update", {"channel": "C1", "ts": "1.2", "text": update["text"],
                             "blocks": update["blocks"]}),
            ("chat.postMessage", {"channel": "C1", "text": post["text"],
                                  "blocks": post["blocks"], "unfurl_links": False,
                                  "unfurl_media": False,
                                  "metadata": {"event_type": CARD_EVENT, "event_payload": {
                                      "approval_id": live.id, "outbox_id": 7}}})]


def test_every_private_name_relied_on_is_there() -> None:
    assert private_slack_sdk.RELIES_ON
    gone = private_slack_sdk.missing()
    assert not gone, (
        f"{private_slack_sdk.dependency()} lacks {', '.join(gone)}, which "
        "bot/slack/private_slack_sdk.py relies on: adapt it to this release (or bound "
        "slack-sdk below it in pyproject.toml); APPROVALD_SLACK_FAST_PATH=0 meanwhile")


async def test_a_card_call_sends_the_bytes_api_call_sends() -> None:
    async with slack([]) as (face, seen):
        fast = JsonCalls(face.client)
        for method, args in card_args():
            for _ in range(2):  # its request built the first time, reused the second
                ours = await fast.call(method, json.loads(json.dumps(args)))
                theirs = await face.client.api_call(method, json=json.loads(json.dumps(args)))
                assert seen[-2] == seen[-1]  # method, path, headers (in order), body bytes
                assert seen[-1][1] == f"/api/{method}"
                assert (ours.api_url, ours.http_verb, ours.req_args, ours.status_code,
                        ours.data) == (theirs.api_url, theirs.http_verb, theirs.req_args,
                                       theirs.status_code, theirs.data)
        assert len(seen) == 8
        # the token read as it stands: a changed token changes the request as api_call's
        face.client.token = "xoxb-other"
        await fast.call("chat.update", card_args()[0][1])
        await face.client.api_call("chat.update", json=card_args()[0][1])
        assert seen[-2] == seen[-1] and ("Authorization", "Bearer xoxb-other") in seen[-1][2]


ANSWERS: list[list[Answer]] = [
    [(429, {"Retry-After": "7"}, json.dumps({"ok": False, "error": "ratelimited"}))],
    [(200, {}, json.dumps({"ok": False, "error": "channel_not_found"}))],
    [(500, {}, "upstream connect error")],
]


@pytest.mark.parametrize("answers", ANSWERS, ids=["ratelimited", "error", "5xx"])
async def test_a_failed_card_call_fails_as_api_call_s(answers: list[Answer]) -> None:
    async with slack(answers * 2) as (face, seen):
        outcomes = []
        for call in (lambda: JsonCalls(face.client).call("chat.update", {"channel": "C1"}),
                     lambda: face.client.api_call("chat.update", json={"channel": "C1"})):
            with pytest.raises(SlackApiError) as failed:
                await call()
            r = failed.value.response
            drained = classify(failed.value)
            outcomes.append((str(failed.value), r.status_code, r.data,
                             r.headers.get("Retry-After"), type(drained),
                             getattr(drained, "after", None)))
        assert outcomes[0] == outcomes[1] and len(seen) == 2 and seen[0] == seen[1]
    if answers[0][0] == 429:
        assert outcomes[0][4] is RetryLater and outcomes[0][5] == 7.0


class RetryOnce(AsyncRetryHandler):
    """Another try after a 429, at once (slack_sdk's own handler sleeps Retry-After)."""

    async def _can_retry_async(self, *, state: Any, request: Any, response: Any = None,
                               error: Any = None) -> bool:
        return response is not None and response.status_code == 429


async def test_a_card_call_is_retried_by_the_client_s_handlers_as_api_call_s() -> None:
    """A retry handler the client carries runs as it does for api_call: the second
    try's answer is the call's."""
    answers: list[Answer] = [(429, {"Retry-After": "0"},
                              json.dumps({"ok": False, "error": "ratelimited"}))]
    for send in ("fast", "api_call"):
        async with slack(list(answers)) as (face, seen):
            face.client.retry_handlers.append(RetryOnce(
                max_retry_count=1, interval_calculator=FixedValueRetryIntervalCalculator(0)))
            resp = await (JsonCalls(face.client).call("chat.update", {"channel": "C1"})
                          if send == "fast" else
                          face.client.api_call("chat.update", json={"channel": "C1"}))
            assert resp["ts"] == "9.9" and len(seen) == 2


async def test_a_card_update_builds_no_request_of_its_own() -> None:
    """Exact: a card's chat.update after the first does none of api_call's building (the
    URL joined, the headers merged, the deprecated methods looked up) and goes out
    through the function api_call ends in, once."""
    async with slack([]) as (face, seen):
        delivery = SlackDeliverer(None, face.client, channel="C1",  # type: ignore[arg-type]
                                  ops_channel="C2")
        a = replace(decided("approved"), channel="C1", message_ts="1.2")
        view = CardView(a, None, NOW, (), None, None, None, ())
        await delivery._update(None, view)  # type: ignore[arg-type]
        with counting_calls() as calls:
            await delivery._update(None, view)  # type: ignore[arg-type]
        # one request, through the function api_call ends in (a coroutine's resumptions
        # count as calls here: its retry state, made once a request, is counted instead)
        assert calls["slack_sdk.web.async_internal_utils:_request_with_session"] >= 1
        assert calls["slack_sdk.http_retry.state:__init__"] == 1
        for name in ("slack_sdk.web.async_base_client:api_call",
                     "slack_sdk.web.internal_utils:_get_url", "urllib.parse:urljoin",
                     "slack_sdk.web.internal_utils:_build_req_args",
                     "slack_sdk.web.internal_utils:_get_headers",
                     "slack_sdk.web.deprecation:show_deprecation_warning_if_any",
                     "slack_sdk.web.async_base_client:_send"):
            assert calls[name] == 0, name
        assert len(seen) == 2 and seen[0] == seen[1]
        # switched off, api_call builds it
        plain = SlackDeliverer(None, face.client, channel="C1",  # type: ignore[arg-type]
                               ops_channel="C2", fast_path=False)
        with counting_calls() as calls:
            await plain._update(None, view)  # type: ignore[arg-type]
        assert calls["slack_sdk.web.internal_utils:_build_req_args"] == 1
        assert seen[2] == seen[1]


def test_the_switch_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    base = {"SLACK_BOT_TOKEN": "xoxb-test", "SLACK_SIGNING_SECRET": "s" * 32,
            "APPROVALD_CHANNEL": "C1", "APPROVALD_SECRET": "k" * 32}
    assert Settings(**base).slack_fast_path is True
    monkeypatch.setenv("APPROVALD_SLACK_FAST_PATH", "0")
    assert Settings(**base).slack_fast_path is False


async def test_a_card_call_s_response_is_slack_sdk_s_without_its_logger_looked_up() -> None:
    """Exact: the response of a card's call is the AsyncSlackResponse its constructor makes
    (every attribute, the logger its module's), made without the constructor, whose
    ``logging.getLogger`` took the logging lock for every card (issue 50)."""
    from slack_sdk.web.async_slack_response import AsyncSlackResponse

    async with slack([]) as (face, _seen):
        calls = JsonCalls(face.client)
        await calls.call("chat.update", {"channel": "C1"})
        with counting_calls() as counted:
            ours = await calls.call("chat.update", {"channel": "C1"})
        assert counted["logging:getLogger"] == 0, counted
        assert counted["slack_sdk.web.async_slack_response:__init__"] == 0, counted
        made = AsyncSlackResponse(client=face.client, http_verb="POST", api_url=ours.api_url,
                                  req_args=ours.req_args, data=ours.data,
                                  headers=ours.headers, status_code=ours.status_code)
        assert type(ours) is AsyncSlackResponse and vars(ours) == vars(made)
        theirs = await face.client.api_call("chat.update", json={"channel": "C1"})
        assert set(vars(theirs)) == set(vars(ours)) and theirs._logger is ours._logger
        assert (ours.data, ours.status_code) == (theirs.data, theirs.status_code)
