"""The sandbox page hears when the sandbox becomes ready.

The page draws ``data-ready="1"`` from ``/ui/state`` and fetches that again only when the
event stream says something changed. Loaded while the sandbox was still starting (the page
reloads itself as soon as a restarted sandbox answers), it stayed "not ready" for good:
attaching the engine woke nobody (the browser test's flake after a restart).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from approvald.bot.sandbox import SlackEmulator
from approvald.bot.sandbox.guard import TOKEN_HEADER
from approvald.bot.sandbox.people import Person
from approvald.bot.sandbox.web import SandboxWeb
from approvald.runtime.engine import Engine

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


@pytest.fixture
async def page() -> AsyncIterator[tuple[SandboxWeb, Any]]:
    emulator = SlackEmulator(bot_token="xoxb-sandbox", signing_secret="s" * 32)
    emulator.add_channel("C_APPROVALS", "approvals")
    emulator.add_user("U_DANA", "dana", "Dana Requester")
    sandbox = SandboxWeb(emulator, people=[Person("U_DANA", "dana", "Dana Requester",
                                                  "asks for refunds")],
                         channel="C_APPROVALS")
    client = TestClient(TestServer(sandbox.app()))
    await client.start_server()
    try:
        yield sandbox, client
    finally:
        await sandbox.close()
        await client.close()


async def next_event(lines: asyncio.StreamReader) -> str:
    while True:
        line = (await asyncio.wait_for(lines.readline(), 5)).decode().strip()
        if line.startswith("data:"):
            return line


async def test_attaching_the_engine_wakes_the_page(
        page: tuple[SandboxWeb, Any], make_engine: Callable[..., Engine]) -> None:
    sandbox, client = page
    headers = {TOKEN_HEADER: sandbox.token}
    state = await (await client.get("/ui/state?user=U_DANA", headers=headers)).json()
    assert state["ready"] is False
    events = await client.get("/ui/events", headers=headers)
    first = await next_event(events.content)
    sandbox.attach(make_engine(), "http://127.0.0.1:9/slack/events")
    assert await next_event(events.content) != first  # the page is told to look again
    state = await (await client.get("/ui/state?user=U_DANA", headers=headers)).json()
    assert state["ready"] is True
    events.close()
