"""The Slack sandbox: a real local server that slack_sdk talks to, and a Slack-signed client.

Every request here goes to 127.0.0.1; nothing reaches slack.com.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs

import aiohttp
import pytest
from aiohttp import web
from approvald.bot.sandbox import SlackClientSim, SlackEmulator, run_forever
from approvald.runtime.kernel.clock import ManualClock
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.builtin_async_handlers import AsyncServerErrorRetryHandler
from slack_sdk.http_retry.builtin_interval_calculators import FixedValueRetryIntervalCalculator
from slack_sdk.signature import SignatureVerifier
from slack_sdk.socket_mode.aiohttp import SocketModeClient
from slack_sdk.socket_mode.async_client import AsyncBaseSocketModeClient
from slack_sdk.socket_mode.request import SocketModeRequest
from slack_sdk.socket_mode.response import SocketModeResponse
from slack_sdk.web.async_client import AsyncWebClient
from yarl import URL

BOT, APP, SECRET = "xoxb-test", "xapp-test", "sandbox-signing-secret"
CH = "C_APPROVALS"
CARD: list[dict[str, Any]] = [{"type": "section", "block_id": "summary",
         "text": {"type": "mrkdwn", "text": "*refund* $40 to order 1234"}},
        {"type": "actions", "block_id": "decide", "elements": [
            {"type": "button", "action_id": "approve", "value": "ap_1", "style": "primary",
             "text": {"type": "plain_text", "text": "Approve"}},
            {"type": "button", "action_id": "deny", "value": "ap_1",
             "text": {"type": "plain_text", "text": "Deny"}}]}]
MODAL: dict[str, Any] = {"type": "modal", "callback_id": "deny_reason", "private_metadata": "ap_1",
         "title": {"type": "plain_text", "text": "Deny"},
         "blocks": [{"type": "input", "block_id": "reason", "label":
                     {"type": "plain_text", "text": "Why?"},
                     "element": {"type": "plain_text_input", "action_id": "text"}}]}


@pytest.fixture
async def emulator(clock: ManualClock) -> AsyncIterator[SlackEmulator]:
    emu = SlackEmulator(BOT, APP, SECRET, clock=clock)
    emu.add_channel(CH, "approvals")
    emu.add_user("U_ALICE", "alice", "Alice Approver")
    emu.add_user("U_BOB", "bob", "Bob Reviewer")
    emu.add_usergroup("S_APPROVERS", ["U_ALICE", "U_BOB"])
    await emu.start()
    yield emu
    await emu.stop()


@pytest.fixture
def slack(emulator: SlackEmulator) -> AsyncWebClient:
    # No retry handlers: each test sees exactly the answer the emulator gave.
    return AsyncWebClient(token=BOT, base_url=emulator.base_url, retry_handlers=[])


async def slack_error(call: Awaitable[Any]) -> SlackApiError:
    with pytest.raises(SlackApiError) as caught:
        await call
    return caught.value


class TinyApp:
    """An app under test: verifies Slack signatures and hands valid bodies to ``on_body``."""

    def __init__(self, on_body: Callable[[str, str], Awaitable[None]] | None = None) -> None:
        self.verifier = SignatureVerifier(SECRET)
        self.bodies: list[tuple[str, str]] = []  # (content type, raw body) of valid requests
        self.on_body = on_body
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.text()
        if not self.verifier.is_valid_request(body, dict(request.headers)):
            return web.Response(status=401, text="invalid signature")
        self.bodies.append((request.content_type, body))
        if self.on_body is not None:
            await self.on_body(request.content_type, body)
        return web.Response(text="")

    def payload(self, i: int = -1) -> dict[str, Any]:
        content_type, body = self.bodies[i]
        if content_type == "application/json":
            return dict(json.loads(body))
        fields = {k: v[0] for k, v in parse_qs(body).items()}
        return dict(json.loads(fields["payload"])) if "payload" in fields else fields

    async def __aenter__(self) -> TinyApp:
        app = web.Application()
        app.router.add_post("/slack/events", self.handle)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}/slack/events"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.runner is not None
        await self.runner.cleanup()


# -- messages ----------------------------------------------------------------------------------

async def test_post_update_replies_and_history_carry_metadata(
        emulator: SlackEmulator, slack: AsyncWebClient) -> None:
    meta = {"event_type": "approval_requested", "event_payload": {"approval_id": "ap_1"}}
    posted = await slack.chat_postMessage(channel=CH, text="Approve?", blocks=CARD, metadata=meta)
    assert posted["channel"] == CH and posted["message"]["blocks"] == CARD
    assert re.fullmatch(r"\d{10}\.\d{6}", posted["ts"])
    reply = await slack.chat_postMessage(channel=CH, text="queued", thread_ts=posted["ts"])
    updated = await slack.chat_update(channel=CH, ts=posted["ts"], text="Approved by alice",
                                      blocks=[])
    assert updated["ts"] == posted["ts"] and updated["text"] == "Approved by alice"
    assert "blocks" not in updated["message"] and "edited" in updated["message"]

    history = await slack.conversations_history(channel=CH, include_all_metadata=True)
    assert [m["ts"] for m in history["messages"]] == [posted["ts"]]  # replies stay in thread
    assert history["messages"][0]["metadata"] == meta
    assert history["messages"][0]["reply_count"] == 1
    plain = await slack.conversations_history(channel=CH)
    assert "metadata" not in plain["messages"][0]
    replies = await slack.conversations_replies(channel=CH, ts=posted["ts"],
                                                include_all_metadata=True)
    assert [m["ts"] for m in replies["messages"]] == [posted["ts"], reply["ts"]]
    assert replies["messages"][1]["thread_ts"] == posted["ts"]
    assert emulator.last_message(CH)["ts"] == reply["ts"]  # type: ignore[index]
    link = await slack.chat_getPermalink(channel=CH, message_ts=reply["ts"])
    assert link["permalink"].endswith(f"?thread_ts={posted['ts']}&cid={CH}")


async def test_ts_is_unique_and_increasing_on_a_frozen_clock(slack: AsyncWebClient) -> None:
    stamps = [(await slack.chat_postMessage(channel=CH, text=str(i)))["ts"] for i in range(3)]
    assert stamps == sorted(stamps, key=float) and len(set(stamps)) == 3


async def test_ephemeral_is_kept_per_user_and_not_in_history(
        emulator: SlackEmulator, slack: AsyncWebClient) -> None:
    sent = await slack.chat_postEphemeral(channel=CH, user="U_ALICE", text="only you")
    assert [m["ts"] for m in emulator.ephemeral(CH, "U_ALICE")] == [sent["message_ts"]]
    assert emulator.ephemeral(CH, "U_BOB") == [] and emulator.messages(CH) == []
    error = await slack_error(slack.chat_postEphemeral(channel=CH, user="U_NOBODY", text="x"))
    assert error.response["error"] == "user_not_in_channel"


@pytest.mark.parametrize(("kwargs", "error"), [
    ({"channel": "C_NOPE", "text": "x"}, "channel_not_found"),
    ({"channel": CH, "text": "x" * 40_001}, "msg_too_long"),
    ({"channel": CH, "text": "x", "blocks": [{"type": "divider"}] * 51}, "invalid_blocks"),
    ({"channel": CH, "text": "x", "blocks": [
        {"type": "section", "text": {"type": "mrkdwn", "text": "y" * 3001}}]}, "invalid_blocks"),
])
async def test_post_message_errors(slack: AsyncWebClient, kwargs: dict[str, Any],
                                   error: str) -> None:
    failure = await slack_error(slack.chat_postMessage(**kwargs))
    assert failure.response.status_code == 200  # Slack reports API errors with HTTP 200
    assert failure.response["error"] == error


async def test_update_of_unknown_message(slack: AsyncWebClient) -> None:
    failure = await slack_error(slack.chat_update(channel=CH, ts="1.000100", text="x"))
    assert failure.response["error"] == "message_not_found"


# -- people ------------------------------------------------------------------------------------

async def test_users_and_usergroups(slack: AsyncWebClient) -> None:
    user = (await slack.users_info(user="U_ALICE"))["user"]
    assert (user["id"], user["name"], user["real_name"]) == ("U_ALICE", "alice", "Alice Approver")
    assert (await slack.usergroups_users_list(usergroup="S_APPROVERS"))["users"] == [
        "U_ALICE", "U_BOB"]
    assert (await slack_error(slack.users_info(user="U_X"))).response["error"] == "user_not_found"
    failure = await slack_error(slack.usergroups_users_list(usergroup="S_X"))
    assert failure.response["error"] == "no_such_subteam"


# -- views -------------------------------------------------------------------------------------

async def test_views_open_exchanges_a_fresh_trigger_once(
        emulator: SlackEmulator, slack: AsyncWebClient, clock: ManualClock) -> None:
    trigger = emulator.issue_trigger_id("U_ALICE")
    clock.advance(2.9)
    view = (await slack.views_open(trigger_id=trigger, view=MODAL))["view"]
    assert view["id"].startswith("V") and view["callback_id"] == "deny_reason"
    assert [v["id"] for v in emulator.views(user_id="U_ALICE")] == [view["id"]]
    again = await slack_error(slack.views_open(trigger_id=trigger, view=MODAL))
    assert again.response["error"] == "exchanged_trigger_id"


async def test_views_open_refuses_unknown_and_expired_triggers(
        emulator: SlackEmulator, slack: AsyncWebClient, clock: ManualClock) -> None:
    unknown = await slack_error(slack.views_open(trigger_id="1.2.abc", view=MODAL))
    assert unknown.response["error"] == "invalid_trigger_id"
    trigger = emulator.issue_trigger_id("U_ALICE")
    clock.advance(3.1)
    expired = await slack_error(slack.views_open(trigger_id=trigger, view=MODAL))
    assert expired.response["error"] == "expired_trigger_id"


async def test_views_publish_and_update(emulator: SlackEmulator, slack: AsyncWebClient) -> None:
    home = {"type": "home", "blocks": [{"type": "section",
                                        "text": {"type": "mrkdwn", "text": "2 pending"}}]}
    first = (await slack.views_publish(user_id="U_ALICE", view=home))["view"]
    second = (await slack.views_publish(user_id="U_ALICE", view=home, hash=first["hash"]))["view"]
    assert second["id"] == first["id"] == emulator.home_view("U_ALICE")["id"]  # type: ignore[index]
    stale = await slack_error(slack.views_update(view_id=first["id"], view=home,
                                                 hash=first["hash"]))
    assert stale.response["error"] == "hash_conflict"


# -- auth --------------------------------------------------------------------------------------

@pytest.mark.parametrize(("token", "error"), [
    ("xoxb-wrong", "invalid_auth"), (None, "not_authed"), (APP, "not_allowed_token_type")])
async def test_bot_methods_check_the_token(emulator: SlackEmulator, token: str | None,
                                           error: str) -> None:
    client = AsyncWebClient(token=token, base_url=emulator.base_url)
    failure = await slack_error(client.chat_postMessage(channel=CH, text="x"))
    assert failure.response["error"] == error
    assert emulator.messages(CH) == []


async def test_apps_connections_open_needs_the_app_token(emulator: SlackEmulator) -> None:
    client = AsyncWebClient(base_url=emulator.base_url)
    opened = await client.apps_connections_open(app_token=APP)
    assert re.fullmatch(r"ws://127\.0\.0\.1:\d+/socket-mode/\w+", opened["url"])
    failure = await slack_error(client.apps_connections_open(app_token=BOT))
    assert failure.response["error"] == "not_allowed_token_type"


# -- faults ------------------------------------------------------------------------------------

async def test_fail_next_two_then_success(emulator: SlackEmulator, slack: AsyncWebClient) -> None:
    emulator.fail_next(2)
    for _ in range(2):
        failure = await slack_error(slack.chat_postMessage(channel=CH, text="x"))
        assert failure.response.status_code == 500
    assert (await slack.chat_postMessage(channel=CH, text="x"))["ok"]
    assert [c.status for c in emulator.calls("chat.postMessage")] == [500, 500, 200]
    assert len(emulator.messages(CH)) == 1  # failed calls changed nothing


async def test_faults_can_target_one_method_and_sdk_retries_recover(
        emulator: SlackEmulator) -> None:
    emulator.fail_next(1, status=503, method="chat.postMessage")
    retry = AsyncServerErrorRetryHandler(
        max_retry_count=1, interval_calculator=FixedValueRetryIntervalCalculator(0))
    client = AsyncWebClient(token=BOT, base_url=emulator.base_url, retry_handlers=[retry])
    assert (await client.auth_test())["user_id"] == "U_BOT"  # not the targeted method
    assert (await client.chat_postMessage(channel=CH, text="x"))["ok"]
    assert [c.status for c in emulator.calls("chat.postMessage")] == [503, 200]


async def test_rate_limit_answers_429_with_retry_after(
        emulator: SlackEmulator, slack: AsyncWebClient) -> None:
    emulator.rate_limit_next(1, retry_after=7)
    failure = await slack_error(slack.chat_postMessage(channel=CH, text="x"))
    assert failure.response.status_code == 429
    assert failure.response.headers["Retry-After"] == "7"
    assert failure.response["error"] == "ratelimited"
    assert (await slack.chat_postMessage(channel=CH, text="x"))["ok"]


async def test_down_refuses_connections_until_up(emulator: SlackEmulator) -> None:
    async with aiohttp.ClientSession() as session:  # a pooled keep-alive connection too
        client = AsyncWebClient(token=BOT, base_url=emulator.base_url, session=session,
                                retry_handlers=[])
        await client.auth_test()
        await emulator.down()
        with pytest.raises(aiohttp.ClientConnectionError):
            await client.auth_test()
        await emulator.up()
        assert (await client.auth_test())["ok"]


async def test_down_503_answers_every_call(emulator: SlackEmulator,
                                           slack: AsyncWebClient) -> None:
    await emulator.down("503")
    assert (await slack_error(slack.auth_test())).response.status_code == 503
    await emulator.up()
    assert (await slack.auth_test())["ok"]


# -- recording and raw requests ----------------------------------------------------------------

async def test_recording_merges_query_form_and_json(emulator: SlackEmulator,
                                                    slack: AsyncWebClient) -> None:
    async with aiohttp.ClientSession() as session:
        form = {"token": BOT, "text": "from a form", "blocks": json.dumps(CARD)}
        async with session.post(f"{emulator.base_url}chat.postMessage?channel={CH}",
                                data=form) as res:
            assert (await res.json())["ok"]
        async with session.get(f"{emulator.base_url}views.open?token={BOT}") as res:
            assert res.status == 405  # views.open is POST-only
    await slack.users_info(user="U_BOB")
    posted = emulator.calls("chat.postMessage")[0]
    assert posted.params == {"channel": CH, "text": "from a form", "blocks": json.dumps(CARD)}
    assert posted.status == 200 and posted.ok and posted.at == emulator.clock.now()
    assert emulator.last_message(CH)["blocks"] == CARD  # type: ignore[index]
    assert [c.method for c in emulator.calls()] == ["chat.postMessage", "views.open",
                                                    "users.info"]
    emulator.reset_calls()
    assert emulator.calls() == []


# -- the signed client -------------------------------------------------------------------------

async def test_signed_requests_pass_slack_verification_and_forgeries_fail(
        emulator: SlackEmulator) -> None:
    posted = await AsyncWebClient(token=BOT, base_url=emulator.base_url).chat_postMessage(
        channel=CH, text="Approve?", blocks=CARD)
    async with TinyApp() as app, SlackClientSim(app.url, SECRET, emulator=emulator) as sim:
        ok = await sim.click("approve", "ap_1", user_id="U_ALICE", channel_id=CH,
                             message_ts=posted["ts"])
        assert ok.status == 200 and ok.trigger_id == sim.trigger_ids[-1]
        assert (await sim.click("approve", "ap_1", user_id="U_ALICE", forge=True)).status == 401
        stale = await sim.click("approve", "ap_1", user_id="U_ALICE", timestamp_offset=-600)
        assert stale.status == 401
        assert (await sim.click("approve", "ap_1", user_id="U_ALICE", signed=False)).status == 401
        assert len(app.bodies) == 1

    payload = app.payload()
    assert payload["type"] == "block_actions" and payload["api_app_id"] == "A_SANDBOX"
    assert payload["user"] == {"id": "U_ALICE", "username": "alice", "name": "alice",
                               "team_id": "T_TEST"}
    assert payload["team"] == {"id": "T_TEST", "domain": "sandbox"}
    assert payload["channel"] == {"id": CH, "name": "approvals"}
    assert payload["container"]["message_ts"] == posted["ts"]
    assert payload["message"]["blocks"] == CARD
    action = payload["actions"][0]
    assert (action["action_id"], action["block_id"], action["value"], action["type"]) == (
        "approve", "decide", "ap_1", "button")
    assert payload["response_url"].startswith(emulator.root_url)


async def test_click_trigger_opens_a_modal_and_submission_carries_it(
        emulator: SlackEmulator) -> None:
    slack = AsyncWebClient(token=BOT, base_url=emulator.base_url)

    async def open_modal(content_type: str, body: str) -> None:
        payload = json.loads(parse_qs(body)["payload"][0])
        if payload["type"] == "block_actions":
            await slack.views_open(trigger_id=payload["trigger_id"], view=MODAL)

    async with TinyApp(open_modal) as app, emulator.client(app.url) as sim:
        assert (await sim.click("deny", "ap_1", user_id="U_BOB")).status == 200
        (modal,) = emulator.views(user_id="U_BOB", callback_id="deny_reason")
        await sim.submit_view("deny_reason", {"reason": {"text": "too much"}}, user_id="U_BOB")
    submission = app.payload()
    assert submission["type"] == "view_submission" and submission["view"]["id"] == modal["id"]
    assert submission["view"]["private_metadata"] == "ap_1"
    assert submission["view"]["state"]["values"] == {
        "reason": {"text": {"type": "plain_text_input", "value": "too much"}}}


async def test_slash_event_and_response_url(emulator: SlackEmulator) -> None:
    posted = await AsyncWebClient(token=BOT, base_url=emulator.base_url).chat_postMessage(
        channel=CH, text="Approve?", blocks=CARD)
    async with TinyApp() as app, emulator.client(app.url) as sim:
        assert (await sim.slash("/approvals", "list", user_id="U_ALICE",
                                channel_id=CH)).status == 200
        assert (await sim.event({"type": "app_home_opened", "user": "U_ALICE",
                                 "tab": "home"})).status == 200
        await sim.click("approve", "ap_1", user_id="U_ALICE", channel_id=CH,
                        message_ts=posted["ts"])
        slash, event, click = app.payload(0), app.payload(1), app.payload(2)
        async with aiohttp.ClientSession() as session:
            reply = {"replace_original": True, "text": "Approved by <@U_ALICE>"}
            async with session.post(click["response_url"], json=reply) as res:
                assert res.status == 200
    assert (slash["command"], slash["text"], slash["user_id"], slash["channel_id"]) == (
        "/approvals", "list", "U_ALICE", CH)
    assert slash["trigger_id"] in sim.trigger_ids
    assert event["type"] == "event_callback" and event["event"]["type"] == "app_home_opened"
    assert event["event_id"].startswith("Ev") and event["team_id"] == "T_TEST"
    assert emulator.message(CH, posted["ts"])["text"] == "Approved by <@U_ALICE>"  # type: ignore[index]
    assert emulator.responses()[0].body == reply


# -- socket mode -------------------------------------------------------------------------------

async def test_socket_mode_delivers_envelopes_and_returns_acks(emulator: SlackEmulator) -> None:
    seen: list[SocketModeRequest] = []
    messages: list[dict[str, Any]] = []

    async def ack(client: AsyncBaseSocketModeClient, request: SocketModeRequest) -> None:
        seen.append(request)
        await client.send_socket_mode_response(SocketModeResponse(
            envelope_id=request.envelope_id, payload={"text": "got it"}))

    async def on_message(client: AsyncBaseSocketModeClient, message: dict[str, Any],
                         raw: str | None) -> None:
        messages.append(message)

    client = SocketModeClient(app_token=APP, web_client=AsyncWebClient(
        base_url=emulator.base_url))
    client.socket_mode_request_listeners.append(ack)
    client.message_listeners.append(on_message)
    try:
        await client.connect()  # type: ignore[no-untyped-call]
        await emulator.wait_connected(timeout=5)
        payload = SlackClientSim("http://unused", SECRET, emulator=emulator).envelope_for_click(
            "approve", "ap_1", user_id="U_ALICE", channel_id=CH)
        reply = await emulator.send_envelope("interactive", payload,
                                             accepts_response_payload=True)
    finally:
        await client.close()  # type: ignore[no-untyped-call]
    assert reply == {"envelope_id": seen[0].envelope_id, "payload": {"text": "got it"}}
    assert seen[0].type == "interactive" and seen[0].accepts_response_payload
    assert seen[0].payload["actions"][0]["action_id"] == "approve"
    assert messages[0]["type"] == "hello"
    assert messages[0]["connection_info"] == {"app_id": "A_SANDBOX"}


@pytest.mark.parametrize("outage", [False, True])
async def test_socket_mode_client_reconnects(emulator: SlackEmulator, outage: bool) -> None:
    async def ack(client: AsyncBaseSocketModeClient, request: SocketModeRequest) -> None:
        await client.send_socket_mode_response(SocketModeResponse(
            envelope_id=request.envelope_id))

    web_client = AsyncWebClient(base_url=emulator.base_url, retry_handlers=[])
    client = SocketModeClient(app_token=APP, web_client=web_client, ping_interval=0.05)
    client.socket_mode_request_listeners.append(ack)
    try:
        await client.connect()  # type: ignore[no-untyped-call]
        await emulator.wait_connected(timeout=5)
        if outage:
            await emulator.down()
            await asyncio.sleep(0.2)  # let the client fail a few reconnects against the outage
            await emulator.up()
        else:
            await emulator.hub.request_reconnect()
        await emulator.wait_connected(timeout=5, total=2)
        assert len(emulator.calls("apps.connections.open")) == 2  # a fresh URL was fetched
        reply = await emulator.send_envelope("events_api", {"type": "event_callback"})
    finally:
        await client.close()  # type: ignore[no-untyped-call]
    assert set(reply) == {"envelope_id"}


async def test_send_envelope_times_out_without_a_connection(emulator: SlackEmulator) -> None:
    with pytest.raises(TimeoutError, match="no ack"):
        await emulator.send_envelope("events_api", {"type": "event_callback"}, timeout=0.05)


# -- the CLI entry point -----------------------------------------------------------------------

async def _run_forever(capsys: pytest.CaptureFixture[str]) -> tuple[asyncio.Task[None], str]:
    """``approvald sandbox --slack-only`` on a free port, and its Web API base URL."""
    task = asyncio.create_task(run_forever("127.0.0.1", 0))
    printed = ""
    for _ in range(200):
        printed += capsys.readouterr().out
        if "listening" in printed:
            break
        await asyncio.sleep(0.01)
    found = re.search(r"(http://\S+/api/)", printed)
    assert found, printed
    return task, found.group(1)


async def _stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_run_forever_serves_a_seeded_workspace(capsys: pytest.CaptureFixture[str]) -> None:
    task, api = await _run_forever(capsys)
    try:
        slack = AsyncWebClient(token=BOT, base_url=api)
        assert (await slack.users_info(user="U_ALICE"))["user"]["name"] == "alice"
        assert (await slack.chat_postMessage(channel=CH, text="hello"))["ok"]
    finally:
        await _stop(task)


async def test_run_forever_answers_no_other_sites_page_nor_a_rebound_name(
        capsys: pytest.CaptureFixture[str]) -> None:
    # its tokens are the README's (xoxb-test): another site's page could post with them
    # as a form (no preflight), or read the channel through a DNS name rebound to 127.0.0.1
    task, api = await _run_forever(capsys)
    port = URL(api).port
    try:
        async with aiohttp.ClientSession() as http:
            async with http.post(api + "chat.postMessage",
                                 data={"token": BOT, "channel": CH, "text": "from a page"},
                                 headers={"Origin": "http://evil.example"}) as resp:
                assert resp.status == 403
                assert "Origin" in (await resp.json())["error"]
            for path in ("conversations.history?channel=" + CH, "apps.connections.open"):
                async with http.post(api + path, headers={
                        "Host": f"evil.example:{port}",
                        "Authorization": f"Bearer {APP if 'apps' in path else BOT}"}) as resp:
                    body = await resp.json()
                    assert resp.status == 403 and "evil.example" in body["error"], body
            async with http.get(f"http://127.0.0.1:{port}/socket-mode/x", headers={
                    "Host": f"evil.example:{port}"}) as resp:
                assert resp.status == 403
            # the same calls as a Slack client makes them, by any loopback name, still work
            for host in ("127.0.0.1", "localhost"):
                slack = AsyncWebClient(token=BOT, base_url=f"http://{host}:{port}/api/")
                assert (await slack.chat_postMessage(channel=CH, text=f"via {host}"))["ok"]
            history = await AsyncWebClient(token=BOT, base_url=api).conversations_history(
                channel=CH)
            assert [m["text"] for m in history["messages"]] == ["via localhost", "via 127.0.0.1"]
    finally:
        await _stop(task)
