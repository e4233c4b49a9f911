"""Issue 50: the buttons decided on the click (Approve, Retry, Mark done, Re-plan) reach
their listener through one global bolt middleware (``bot/slack/handlers.py``,
``DirectClicks``), without bolt building every argument a listener could ask for, once for
the matcher and once for the listener. What it takes and what it answers are bolt's own:
these pin both, and that it runs (an Approve click builds no listener arguments)."""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from approvald.bot.slack import cards
from approvald.bot.slack.handlers import DirectClicks
from approvald.bot.slack.transport import parse

from tests.integration.slack_harness import CHANNEL, harness, wait_for

BOLT_PER_LISTENER = ("build_async_required_kwargs", "async_matches")


async def _bolt_calls(work: Callable[[], Awaitable[Any]]) -> tuple[Any, Counter[str]]:
    """What ``work`` returned and how often bolt built a listener's arguments or asked a
    listener whether it matches, on this thread (the service runs in this process)."""
    seen: Counter[str] = Counter()

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_name in BOLT_PER_LISTENER and \
                "slack_bolt" in frame.f_code.co_filename:
            seen[frame.f_code.co_name] += 1

    sys.setprofile(profile)
    try:
        result = await work()
    finally:
        sys.setprofile(None)
    return result, seen


async def test_an_approve_click_reaches_its_listener_without_bolt_s_argument_building(
        sqlite_url: str, tmp_path: Path) -> None:
    async with harness(sqlite_url, tmp_path) as h:
        paused = await h.pause_refund()
        await h.card(paused.approval_ids[0])
        a = await h.approval(paused.approval_ids[0])
        resp, seen = await _bolt_calls(lambda: h.slack.click(
            cards.APPROVE, h.value(a), user_id="U_ALICE", channel_id=CHANNEL,
            message_ts=a.message_ts))
        assert resp.status == 200
        assert seen == Counter(), seen
        assert (await h.approval(a.id)).status == "approved"
        # the other buttons still go through bolt's listeners (Deny opens its modal)
        other = await h.pause_refund()
        await h.card(other.approval_ids[0])
        b = await h.approval(other.approval_ids[0])
        resp, seen = await _bolt_calls(lambda: h.slack.click(
            cards.DENY, h.value(b), user_id="U_ALICE", channel_id=CHANNEL,
            message_ts=b.message_ts))
        assert resp.status == 200 and seen["build_async_required_kwargs"] >= 2, seen
        await h.service.slack.handlers.drain()
        assert await wait_for(lambda: [c for c in h.emulator.calls("views.open")],
                              what="the deny modal")


async def test_the_middleware_answers_what_bolt_s_listeners_answered(
        sqlite_url: str, tmp_path: Path) -> None:
    """The same bodies dispatched with the middleware and without it (bolt's listeners
    alone) get the same answer: a malformed value (an ephemeral reply), malformed actions
    (bolt's matcher raised: 500, or its error handler raised again: aiohttp's 500), an
    action id that is not a string, a legacy attachment
    action, a click on another button."""
    async with harness(sqlite_url, tmp_path) as h:
        app = h.service.slack.app
        mine = [m for m in app._async_middleware_list if isinstance(m, DirectClicks)]
        assert len(mine) == 1 and app._async_middleware_list[-1] is mine[0]
        user = {"id": "U_NOBODY", "name": "nobody"}
        bodies: list[dict[str, Any]] = [
            {"type": "block_actions", "user": user, "channel": {"id": CHANNEL},
             "actions": [{"action_id": cards.APPROVE, "value": "not a token"}]},
            {"type": "block_actions", "user": user, "actions": [{"action_id": cards.RETRY}]},
            {"type": "block_actions", "user": user, "actions": []},
            {"type": "block_actions", "user": user, "actions": [{"value": "x"}]},
            {"type": "block_actions", "user": user, "actions": [{"action_id": ["x"]}]},
            {"type": "block_actions", "user": user, "actions": ["approve"]},
            {"type": "interactive_message", "user": user, "callback_id": cards.APPROVE,
             "actions": [{"name": "x", "value": "y"}]},
            {"type": "block_actions", "user": user,
             "actions": [{"action_id": "no_such_button", "value": "x"}]},
        ]

        async def answers() -> list[tuple[int | str, str]]:
            out: list[tuple[int | str, str]] = []
            for body in bodies:
                raw = ("payload=" + json.dumps(body)).encode()
                req = parse(raw, "application/x-www-form-urlencoded", "",
                            {"Content-Type": "application/x-www-form-urlencoded"})
                try:  # bolt's error handler raises again on what its matcher raised on
                    resp = await app.async_dispatch(req)
                except Exception as exc:
                    out.append(("raised", type(exc).__name__))
                else:
                    out.append((resp.status, resp.body))
            await h.service.slack.handlers.drain()
            return out

        with_it = await answers()
        app._async_middleware_list.remove(mine[0])
        try:
            without = await answers()
        finally:
            app._async_middleware_list.append(mine[0])
        assert with_it == without
        assert [status for status, _ in with_it] == [200, 200, "raised", 500, 404, 500, 200, 404]
