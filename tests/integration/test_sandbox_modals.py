"""A modal on the sandbox page belongs to the page that opened it (issue 33 item 5).

In Slack a modal lives in the client where the button was pressed: another client of the
same person, or the same browser after a reload, does not show it. The sandbox kept open
modals per user, so a modal left open in one browser session came back, blocking the page,
in every new one.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from urllib.parse import parse_qs

import pytest
from aiohttp.test_utils import TestClient, TestServer
from approvald.bot.sandbox import SlackEmulator
from approvald.bot.sandbox.guard import TOKEN_HEADER
from approvald.bot.sandbox.people import Person
from approvald.bot.sandbox.web import SandboxWeb
from approvald.runtime.engine import Engine
from slack_sdk.web.async_client import AsyncWebClient

from tests.integration.test_sandbox import APP, BOT, CARD, CH, MODAL, SECRET, TinyApp

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


async def test_a_modal_shows_only_on_the_page_that_opened_it(
        make_engine: Callable[..., Engine]) -> None:
    emulator = SlackEmulator(BOT, APP, SECRET)
    emulator.add_channel(CH, "approvals")
    emulator.add_user("U_DANA", "dana", "Dana Requester")
    await emulator.start()
    slack = AsyncWebClient(token=BOT, base_url=emulator.base_url)

    async def open_modal(_content_type: str, body: str) -> None:
        payload = json.loads(parse_qs(body)["payload"][0])
        if payload["type"] == "block_actions":
            await slack.views_open(trigger_id=payload["trigger_id"], view=MODAL)

    sandbox = SandboxWeb(emulator, people=[Person("U_DANA", "dana", "Dana Requester", "asks")],
                         channel=CH)
    emulator.on_change(sandbox.changed)
    client = TestClient(TestServer(sandbox.app()))
    try:
        async with TinyApp(open_modal) as app:
            sandbox.attach(make_engine(), app.url)
            await client.start_server()
            headers = {TOKEN_HEADER: sandbox.token}
            ts = (await slack.chat_postMessage(channel=CH, text="card", blocks=CARD))["ts"]

            async def modal(page: str | None) -> str:
                query = "/ui/state?user=U_DANA" + (f"&client={page}" if page else "")
                state = await (await client.get(query, headers=headers)).json()
                assert state["ok"], state
                return str(state["modal"])

            pressed = await client.post("/ui/action", headers=headers, json={
                "user": "U_DANA", "action_id": "deny", "channel": CH, "ts": ts,
                "client": "page-one"})
            assert (await pressed.json())["ok"]
            assert "Why?" in await modal("page-one")  # the page that pressed the button
            assert await modal("page-two") == ""  # a new page (a reload, another browser)
            # only its own page can close or submit it
            view_id = emulator.views(user_id="U_DANA", callback_id="deny_reason")[0]["id"]
            closed = await client.post("/ui/close", headers=headers, json={
                "user": "U_DANA", "view_id": view_id, "client": "page-two"})
            assert closed.status == 400
            assert "Why?" in await modal("page-one")
            closed = await client.post("/ui/close", headers=headers, json={
                "user": "U_DANA", "view_id": view_id, "client": "page-one"})
            assert (await closed.json())["ok"]
            assert await modal("page-one") == ""
    finally:
        await sandbox.close()
        await client.close()
        await slack.session.close() if slack.session else None
        await emulator.stop()
