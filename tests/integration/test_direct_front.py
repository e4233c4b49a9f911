"""Issue 50: the direct buttons (Approve, ...) answered in front of bolt's dispatch
(``bot/slack/direct.py``, ``DirectFront``), over the served HTTP face: what bolt's dispatch
did for such a click and no longer does (its context read out of the body, its three
global middleware), and that every answer is bolt's own: the same bodies, the front on and
off, get the same status, body, reply and state."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from approvald.bot.slack import cards

from tests.integration.slack_harness import CHANNEL, Harness, harness, wait_for
from tests.integration.test_slack import _policy
from tests.unit.test_slack_face_cpu import _calls_awaiting

FORM = "application/x-www-form-urlencoded"


async def test_an_approve_click_skips_bolt_s_context_and_middleware_from_the_first(
        sqlite_url: str, tmp_path: Path) -> None:
    async with harness(sqlite_url, tmp_path) as h:
        await wait_for(lambda: h.service.slack.connected, what="the face to connect")
        asked = len(h.emulator.calls("auth.test"))  # serve's own check of its token
        first, second = [await h.pause_refund() for _ in range(2)]
        clicks = []
        for paused in (first, second):
            await h.card(paused.approval_ids[0])
            a = await h.approval(paused.approval_ids[0])
            resp = None

            async def click(a: Any = a) -> None:
                nonlocal resp
                resp = await h.slack.click(cards.APPROVE, h.value(a), user_id="U_ALICE",
                                           channel_id=CHANNEL, message_ts=a.message_ts)

            clicks.append(await _calls_awaiting(click))
            assert resp is not None and resp.status == 200 and resp.body == ""
            assert (await h.approval(a.id)).status == "approved"
        # bolt's authorization holds the answer serve's own auth.test got as it connected:
        # no click asks it again, and the first goes in front of bolt's dispatch already
        assert len(h.emulator.calls("auth.test")) == asked == 1
        for after in clicks:
            _direct(after)
        # the clicks middleware taken off the app: the front stands aside, bolt's own
        # listeners answer (their arguments built by bolt)
        app = h.service.slack.app
        app._async_middleware_list.remove(h.service.slack.front.clicks)
        third = await h.pause_refund()
        await h.card(third.approval_ids[0])
        a = await h.approval(third.approval_ids[0])
        seen = await _calls_awaiting(lambda: h.slack.click(
            cards.APPROVE, h.value(a), user_id="U_ALICE", channel_id=CHANNEL,
            message_ts=a.message_ts))
        assert seen["slack_bolt.kwargs_injection.async_utils:build_async_required_kwargs"] > 0
        assert seen["slack_bolt.app.async_app:async_dispatch"] > 0, seen
        assert seen["slack_bolt.request.async_internals:build_async_context"] == 1, seen
        await wait_for(lambda: _status(h, a.id, "approved"), what="the approval")
        assert len(h.emulator.calls("auth.test")) == 1


def _direct(after: dict[str, int]) -> None:
    """A click answered in front of bolt's dispatch: no context built out of the body, no
    middleware, one request client (counted on entry and on each resumption)."""
    for name in ("slack_bolt.app.async_app:async_dispatch",
                 "slack_bolt.request.async_internals:build_async_context",
                 "slack_bolt.middleware.authorization.async_single_team_authorization:"
                 "async_process",
                 "slack_bolt.middleware.ssl_check.async_ssl_check:async_process",
                 "slack_bolt.middleware.url_verification.async_url_verification:"
                 "async_process",
                 "approvald.bot.slack.direct:async_process",
                 "approvald.bot.slack.transport:signed_request"):
        assert after[name] == 0, (name, after)
    assert after["approvald.bot.slack.direct:answer"] > 0, after
    assert after["approvald.bot.slack.direct:plain_context"] == 1, after
    assert after["approvald.bot.slack.app:request_client"] == 1, after
    # the client, without the context bolt's _init_context also fills (a logger looked
    # up, the token, the runner) for a listener that reads none of it
    assert after["approvald.bot.slack.app:_init_context"] == 0, after
    assert after["slack_bolt.logger:get_bolt_app_logger"] == 0, after


async def _status(h: Harness, approval_id: str, status: str) -> bool:
    return bool((await h.approval(approval_id)).status == status)


def _body(h: Harness, a: Any, *, clicker: str = "U_ALICE", value: str | None = None,
          **change: Any) -> str:
    body = h.slack.envelope_for_click(cards.APPROVE, h.value(a) if value is None else value,
                                      user_id=clicker, channel_id=CHANNEL,
                                      message_ts=a.message_ts)
    for key, v in change.items():
        if v is None:
            body.pop(key, None)
        else:
            body[key] = v
    return urlencode({"payload": json.dumps(body)})


async def _answers(h: Harness, front: bool) -> list[Any]:
    """Each case's (status, body), what the clicker was told and the request's status
    after, on requests of their own, with the front on or off."""
    h.service.slack.front.enabled = front
    out: list[Any] = []

    async def case(make: Any, *, twice: bool = False) -> None:
        paused = await h.pause_refund()
        await h.card(paused.approval_ids[0])
        a = await h.approval(paused.approval_ids[0])
        told = len(h.emulator.calls("chat.postEphemeral"))
        answers = []
        for _ in range(2 if twice else 1):
            r = await h.slack.post(make(a), FORM)
            answers.append((r.status, r.body))
        await h.service.slack.handlers.drain()
        said = [c.params.get("text") for c in h.emulator.calls("chat.postEphemeral")[told:]]
        out.append((answers, said, (await h.approval(a.id)).status))

    await case(lambda a: _body(h, a), twice=True)  # approved, then the second click
    await case(lambda a: _body(h, a, clicker="U_DANA"))  # who asked may not approve
    await case(lambda a: _body(h, a, clicker="U_MALLORY"))  # a stranger
    await case(lambda a: _body(h, a, value=f"{a.id}:{'x' * 40}"))  # a forged token
    await case(lambda a: _body(h, a, value="not a token"))  # malformed
    await case(lambda a: _body(h, a, channel="C_APPROVALS"))  # the listener raises: 500
    await case(lambda a: _body(h, a, user={"name": "alice"}))  # no user id: 500
    await case(lambda a: _body(h, a, team=7))  # bolt cannot read its context: 400
    await case(lambda a: _body(h, a, message={"message": {"thread_ts": "1.2"}}))
    await case(lambda a: _body(h, a, event={"type": "x"}))
    await case(lambda a: _body(h, a, channel=None))  # no channel (as from the App Home)
    return out


async def test_the_front_answers_what_bolt_s_dispatch_answers(
        sqlite_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    async with harness(sqlite_url, tmp_path,
                       APPROVALD_POLICY_FILE=str(_policy(tmp_path))) as h:  # named approvers
        await wait_for(lambda: h.service.slack.connected, what="the face to connect")
        warm = await h.pause_refund()  # one click made before those compared
        await h.card(warm.approval_ids[0])
        a = await h.approval(warm.approval_ids[0])
        await h.slack.click(cards.APPROVE, h.value(a), user_id="U_ALICE", channel_id=CHANNEL,
                            message_ts=a.message_ts)
        taken = h.service.slack.front.answer
        seen: list[bool] = []

        async def answer(*args: Any) -> Any:
            result = await taken(*args)
            seen.append(result is not None)
            return result

        h.service.slack.front.answer = answer  # type: ignore[method-assign]

        def failures() -> list[str]:  # bolt's error handler, the listener's on_error, logs
            return [r.getMessage().split(":")[1] for r in caplog.records
                    if r.getMessage().startswith("Slack listener failed")]

        with_front = await _answers(h, True)
        taken_with, failed_with = list(seen), failures()
        seen.clear()
        caplog.clear()
        without = await _answers(h, False)
        assert with_front == without, (with_front, without)
        assert failed_with == failures() == [" AttributeError", " KeyError"]
        # the second click and each refusal told the clicker, ephemerally
        assert [len(said) for _, said, _ in with_front] == [1] * 5 + [0] * 6
        # the front took the real clicks (a second click too) and the listener's raise, not
        # the shapes bolt reads differently
        assert taken_with == [True, True, True, True, True, True, True, False, False, False,
                              False, False]
        assert not any(seen)
        assert [statuses for statuses, _, _ in with_front] == [
            [(200, ""), (200, "")], [(200, "")], [(200, "")], [(200, "")], [(200, "")],
            [(500, "")], [(500, "")],
            [(400, '{"ok": false, "error": "malformed request"}')], [(200, "")], [(200, "")],
            [(200, "")]]
        assert [state for _, _, state in with_front] == [
            "approved", "pending", "pending", "pending", "pending", "pending", "pending",
            "pending", "approved", "approved", "approved"]


async def test_the_front_s_listener_gets_the_ack_and_client_bolt_s_context_gives(
        sqlite_url: str, tmp_path: Path) -> None:
    from approvald.bot.slack.transport import signed_request

    async with harness(sqlite_url, tmp_path) as h:
        warm = await h.pause_refund()
        await h.card(warm.approval_ids[0])
        a = await h.approval(warm.approval_ids[0])
        await h.slack.click(cards.APPROVE, h.value(a), user_id="U_ALICE", channel_id=CHANNEL,
                            message_ts=a.message_ts)
        got: list[Any] = []

        async def listener(ack: Any, body: Any, client: Any) -> None:
            got.append((body, client))
            await ack()

        front = h.service.slack.front
        front.clicks.listeners[cards.APPROVE] = listener
        for team in ({"id": "T_OTHER", "domain": "x"}, None):
            body = h.slack.envelope_for_click(cards.APPROVE, "x", user_id="U_ALICE",
                                              channel_id=CHANNEL, message_ts=a.message_ts)
            body["team"] = team
            r = await h.slack.post(urlencode({"payload": json.dumps(body)}), FORM)
            assert (r.status, r.body) == (200, "")
            sent, client = got.pop()
            assert sent == body
            req = signed_request("", body, "", {})  # bolt's context of the same body
            h.service.slack.app._init_context(req)
            assert vars(client) == vars(req.context.client), team
            assert client.default_params == (
                {"team_id": "T_OTHER"} if team else {"team_id": body["user"]["team_id"]})
