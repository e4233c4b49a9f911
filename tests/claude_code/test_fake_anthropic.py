"""The fake Messages API held to the protocol Anthropic publishes
(https://docs.anthropic.com/en/api/messages-streaming), in this process: the order of the
stream's events, a tool call's input rebuilt from its ``input_json_delta`` pieces, the
non-streaming message, the side routes, and what it records. (Claude Code's own client is
the other judge: the tier's tests run it against the fake.)"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from tests.claude_code.fake_anthropic import MODEL, FakeAnthropic, say, tool_use


@pytest.fixture
async def fake() -> AsyncIterator[FakeAnthropic]:
    api = FakeAnthropic()
    await api.start()
    yield api
    await api.stop()


def body(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 1024,
            "messages": [{"role": "user", "content": "go"}], **extra}


async def sse(resp: aiohttp.ClientResponse) -> list[tuple[str, dict[str, Any]]]:
    """The (event name, data) pairs of a server-sent event stream."""
    events: list[tuple[str, dict[str, Any]]] = []
    name = ""
    async for raw in resp.content:
        line = raw.decode().rstrip("\n")
        if line.startswith("event: "):
            name = line.removeprefix("event: ")
        elif line.startswith("data: "):
            data = json.loads(line.removeprefix("data: "))
            assert data["type"] == name  # each event's data names its event
            events.append((name, data))
    return events


async def test_a_tool_call_streams_as_the_api_streams_it(fake: FakeAnthropic) -> None:
    command = {"command": "touch a-file-with-a-long-name-so-the-input-comes-in-pieces",
               "description": "ünïcode too"}
    fake.script(tool_use("Bash", command, text="I will run it.", id="toolu_1"))
    async with aiohttp.ClientSession() as s, \
            s.post(f"{fake.url}/v1/messages", json=body(stream=True)) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        events = await sse(resp)
    names = [n for n, _ in events if n != "ping"]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    start = events[0][1]["message"]
    assert (start["role"], start["content"], start["stop_reason"]) == ("assistant", [], None)
    # block 0: text; block 1: the tool call, its input in input_json_delta pieces
    blocks: dict[int, dict[str, Any]] = {}
    for name, data in events:
        if name == "content_block_start":
            blocks[data["index"]] = {**data["content_block"], "json": "", "stopped": False}
        elif name == "content_block_delta":
            block, delta = blocks[data["index"]], data["delta"]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            else:
                assert delta["type"] == "input_json_delta"
                block["json"] += delta["partial_json"]
        elif name == "content_block_stop":
            blocks[data["index"]]["stopped"] = True
    assert blocks[0]["type"] == "text" and blocks[0]["text"] == "I will run it."
    call = blocks[1]
    assert (call["type"], call["id"], call["name"], call["input"]) == (
        "tool_use", "toolu_1", "Bash", {})
    assert json.loads(call["json"]) == command and all(b["stopped"] for b in blocks.values())
    assert len([n for n, d in events if n == "content_block_delta"
                and d["index"] == 1]) > 2  # really in pieces
    delta = events[-2][1]
    assert delta["delta"]["stop_reason"] == "tool_use" and delta["usage"]["output_tokens"] > 0


async def test_without_stream_one_message_and_the_side_routes(fake: FakeAnthropic) -> None:
    fake.script(say("done"))
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{fake.url}/v1/messages", json=body()) as resp:
            message = await resp.json()
        assert message["content"] == [{"type": "text", "text": "done"}]
        assert (message["type"], message["stop_reason"]) == ("message", "end_turn")
        # a request on another model (a title) is a side request: no scripted turn used
        async with s.post(f"{fake.url}/v1/messages",
                           json={**body(), "model": "claude-haiku-4-5"}) as resp:
            assert (await resp.json())["content"][0]["type"] == "text"
        async with s.post(f"{fake.url}/v1/messages/count_tokens", json=body()) as resp:
            assert (await resp.json())["input_tokens"] > 0
        async with s.get(f"{fake.url}/v1/models") as resp:
            assert (await resp.json())["data"][0]["id"] == MODEL
        async with s.head(f"{fake.url}/api/hello") as resp:
            assert resp.status == 200
        async with s.post(f"{fake.url}/v1/messages", json={"model": MODEL}) as resp:
            assert resp.status == 400
            assert (await resp.json())["error"]["type"] == "invalid_request_error"
        # a path it does not know: 404 as the API words it, and kept for the test to see
        async with s.get(f"{fake.url}/v1/files") as resp:
            assert resp.status == 404 and (await resp.json())["type"] == "error"
    assert [(r.method, r.path) for r in fake.unknown] == [("GET", "/v1/files")]
    assert fake.unscripted == []
    # the main conversation's next request finds no turn: answered, and recorded
    async with aiohttp.ClientSession() as s, \
            s.post(f"{fake.url}/v1/messages", json=body()) as resp:
        assert resp.status == 200
    assert len(fake.unscripted) == 1 and len(fake.conversation()) == 3


async def test_tool_results_are_read_from_what_the_client_sent(fake: FakeAnthropic) -> None:
    fake.script(say("ok"), say("ok"))
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": True,
              "content": "denied: not on a Friday"}
    history = [{"role": "user", "content": "go"},
               {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1",
                                                  "name": "Bash", "input": {}}]},
               {"role": "user", "content": [result]}]
    async with aiohttp.ClientSession() as s:
        for _ in range(2):  # the second request repeats the history: the result counts once
            async with s.post(f"{fake.url}/v1/messages",
                               json={**body(), "messages": history}) as resp:
                assert resp.status == 200
    assert fake.tool_results() == [result]
    assert fake.tool_result_text("toolu_1") == "denied: not on a Friday"
