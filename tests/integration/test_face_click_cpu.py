"""Issue 50: a click through the served Slack face builds no Web API client (bolt's
``_init_context`` did, for every request: ``bot/slack/app.py``'s ``FaceApp`` copies the
app's) and answers through ``transport.response``, not bolt's aiohttp adapter."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any

from approvald.bot.slack import cards

from tests.integration.slack_harness import CHANNEL, harness

WATCHED = {("async_base_client.py", "__init__"), ("aiohttp/__init__.py", "to_aiohttp_response"),
           ("transport.py", "response"), ("async_app.py", "_init_context"),
           ("/bot/slack/app.py", "_init_context")}


async def test_an_approve_click_builds_no_client_and_skips_bolt_s_adapter(
        sqlite_url: str, tmp_path: Path) -> None:
    async with harness(sqlite_url, tmp_path) as h:
        # bolt's path, the one a click takes when the direct buttons' front stands aside
        # (bot/slack/direct.py; its own path: tests/integration/test_direct_front.py)
        h.service.slack.front.enabled = False
        paused = await h.pause_refund()
        await h.card(paused.approval_ids[0])
        a = await h.approval(paused.approval_ids[0])
        seen: Counter[str] = Counter()

        def profile(frame: Any, event: str, arg: Any) -> None:
            code = frame.f_code
            if event == "call":
                for file, name in WATCHED:
                    if code.co_name == name and code.co_filename.endswith(file):
                        seen[f"{file}:{name}"] += 1

        sys.setprofile(profile)
        try:
            resp = await h.slack.click(cards.APPROVE, h.value(a), user_id="U_ALICE",
                                       channel_id=CHANNEL, message_ts=a.message_ts)
        finally:
            sys.setprofile(None)
        assert resp.status == 200
        assert (await h.approval(a.id)).status == "approved"
        assert seen["async_base_client.py:__init__"] == 0, seen
        assert seen["aiohttp/__init__.py:to_aiohttp_response"] == 0, seen
        assert seen["transport.py:response"] == 1, seen
        assert seen["/bot/slack/app.py:_init_context"] == 1, seen  # FaceApp's
        assert seen["async_app.py:_init_context"] == 0, seen
