"""OpenAIChatModel against a real local HTTP server that plays scripted answers."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from approvald.runtime.engine import assemble
from approvald.runtime.kernel.errors import (
    ApprovaldError,
    ConfigError,
    ModelError,
    ModelUnavailable,
)
from approvald.runtime.kernel.outcomes import Completed
from approvald.runtime.models import OpenAIChatModel, ToolSpec
from approvald.runtime.models.openai import INVALID_JSON_KEY
from approvald.runtime.policies.tools import tool
from approvald.runtime.record.state import AssistantMessage, ToolCall, ToolMessage, UserMessage
from approvald.runtime.runs.agent import Agent, Registry
from approvald.store import migrate
from approvald.store.db import Database

KEY = "sk-test-0123456789-secret"


# -- the fake provider -------------------------------------------------------------------
@dataclass
class Answer:
    """One scripted HTTP answer."""

    status: int = 200
    json: Any = None
    text: str | None = None  # sent verbatim instead of ``json`` when set
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0


@dataclass
class Seen:
    """One request the fake provider received."""

    path: str
    headers: dict[str, str]
    body: Any


Script = Answer | Callable[[Any], Answer]


class FakeProvider:
    """Answers ``POST /v1/chat/completions`` from ``script`` (then ``default``), records all."""

    def __init__(self) -> None:
        self.script: list[Script] = []
        self.default: Script | None = None
        self.seen: list[Seen] = []
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        raw = await request.read()
        try:
            body = json.loads(raw)
        except ValueError:
            body = raw.decode(errors="replace")
        self.seen.append(Seen(request.path, dict(request.headers), body))
        item = self.script.pop(0) if self.script else self.default
        if item is None:
            return web.json_response({"error": {"message": "script exhausted"}}, status=599)
        answer = item if isinstance(item, Answer) else item(body)
        if answer.delay:
            await asyncio.sleep(answer.delay)
        if answer.text is not None:
            return web.Response(status=answer.status, text=answer.text, headers=answer.headers)
        return web.json_response(answer.json, status=answer.status, headers=answer.headers)


@pytest.fixture
async def provider() -> AsyncIterator[FakeProvider]:
    fake = FakeProvider()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", fake.handle)
    # handler_cancellation: a handler stalled past the client's timeout stops when the
    # client hangs up, so shutting the server down never waits for it.
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    fake.url = f"http://{host}:{port}/v1"
    try:
        yield fake
    finally:
        await runner.cleanup()


@dataclass
class Made:
    model: OpenAIChatModel
    sleeps: list[float]


@pytest.fixture
async def make(provider: FakeProvider) -> AsyncIterator[Callable[..., Made]]:
    """Build models pointed at the fake provider, recording sleeps; closes them after."""
    made: list[OpenAIChatModel] = []

    def factory(**kw: Any) -> Made:
        sleeps: list[float] = []

        async def sleep(seconds: float) -> None:
            sleeps.append(seconds)

        kw.setdefault("api_key", KEY)
        kw.setdefault("base_url", provider.url)
        model = OpenAIChatModel(kw.pop("model", "gpt-test"), sleep=sleep, **kw)
        made.append(model)
        return Made(model, sleeps)

    try:
        yield factory
    finally:
        for m in made:
            await m.aclose()


def completion(content: str | None = None, *calls: dict[str, Any]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = list(calls)
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "gpt-test",
        "choices": [{"index": 0, "message": message,
                     "finish_reason": "tool_calls" if calls else "stop"}],
    }


def fn_call(call_id: str | None, name: str, arguments: str) -> dict[str, Any]:
    call: dict[str, Any] = {"type": "function", "function": {"name": name,
                                                             "arguments": arguments}}
    if call_id is not None:
        call["id"] = call_id
    return call


async def ask(model: OpenAIChatModel, text: str = "hi",
              tools: tuple[ToolSpec, ...] = ()) -> Any:
    return await model.complete(instructions="Be brief.",
                                messages=[UserMessage(content=text)], tools=tools)


WEATHER = ToolSpec(
    "get_weather", "Current weather for a city.",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)


# -- request mapping ---------------------------------------------------------------------
async def test_request_body_maps_transcript_and_tools(provider: FakeProvider,
                                                      make: Callable[..., Made]) -> None:
    provider.script = [Answer(json=completion("done"))]
    m = make(temperature=0.2)
    transcript: list[UserMessage | AssistantMessage | ToolMessage] = [
        UserMessage(content="Weather in Oslo and Bergen?"),
        AssistantMessage(content=None, tool_calls=[
            ToolCall(id="call_1", name="get_weather", arguments={"city": "Oslo"}),
            ToolCall(id="call_2", name="get_weather", arguments={"city": "Bergen"}),
        ]),
        ToolMessage(call_id="call_1", name="get_weather", content={"temp_c": 4, "sky": "sun"}),
        ToolMessage(call_id="call_2", name="get_weather", content="rain, 9°C"),
        AssistantMessage(content="Oslo sunny, Bergen rainy."),
        UserMessage(content="Thanks"),
    ]
    reply = await m.model.complete(instructions="You are a weather bot.",
                                   messages=transcript, tools=[WEATHER])
    assert reply.content == "done"

    assert len(provider.seen) == 1
    seen = provider.seen[0]
    assert seen.path == "/v1/chat/completions"
    assert seen.headers["Authorization"] == f"Bearer {KEY}"
    assert seen.headers["Content-Type"].startswith("application/json")
    assert seen.body == {
        "model": "gpt-test",
        "messages": [
            {"role": "system", "content": "You are a weather bot."},
            {"role": "user", "content": "Weather in Oslo and Bergen?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'}},
                {"id": "call_2", "type": "function",
                 "function": {"name": "get_weather", "arguments": '{"city":"Bergen"}'}},
            ]},
            {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c":4,"sky":"sun"}'},
            {"role": "tool", "tool_call_id": "call_2", "content": "rain, 9°C"},
            {"role": "assistant", "content": "Oslo sunny, Bergen rainy."},
            {"role": "user", "content": "Thanks"},
        ],
        "tools": [{"type": "function", "function": {
            "name": "get_weather", "description": "Current weather for a city.",
            "parameters": WEATHER.parameters}}],
        "tool_choice": "auto",
        "temperature": 0.2,
    }


async def test_no_tools_means_no_tools_key_and_no_temperature(
        provider: FakeProvider, make: Callable[..., Made]) -> None:
    provider.script = [Answer(json=completion("hello"))]
    reply = await ask(make().model)
    assert reply.content == "hello"
    body = provider.seen[0].body
    assert set(body) == {"model", "messages"}
    assert body["messages"] == [{"role": "system", "content": "Be brief."},
                                {"role": "user", "content": "hi"}]


# -- response parsing --------------------------------------------------------------------
async def test_reply_with_two_tool_calls(provider: FakeProvider,
                                         make: Callable[..., Made]) -> None:
    provider.script = [Answer(json=completion(
        "Checking both.",
        fn_call("call_a", "get_weather", '{"city": "Oslo"}'),
        fn_call("call_b", "get_weather", '{"city": "Bergen", "units": "metric"}'),
    ))]
    reply = await ask(make().model, tools=(WEATHER,))
    assert reply.content == "Checking both."
    assert reply.tool_calls == (
        ToolCall(id="call_a", name="get_weather", arguments={"city": "Oslo"}),
        ToolCall(id="call_b", name="get_weather",
                 arguments={"city": "Bergen", "units": "metric"}),
    )


async def test_reply_with_plain_content(provider: FakeProvider,
                                        make: Callable[..., Made]) -> None:
    provider.script = [Answer(json=completion("The answer is 42."))]
    reply = await ask(make().model)
    assert reply.content == "The answer is 42."
    assert reply.tool_calls == ()


DEEP = '{"a":' * 1000 + "1" + "}" * 1000


async def test_bad_arguments_are_kept_and_flagged(provider: FakeProvider,
                                                  make: Callable[..., Made]) -> None:
    provider.script = [Answer(json=completion(
        None,
        fn_call("call_a", "get_weather", '{"city": "Oslo"'),  # truncated JSON
        fn_call("call_b", "get_weather", '["Oslo"]'),  # JSON, but not an object
        fn_call(None, "get_weather", '{"city": "Bergen"}'),  # no id: the runtime assigns
        fn_call("", "get_weather", ""),  # blank arguments: a call without arguments
        fn_call("call_d", "get_weather", DEEP),  # issue 45: was a RecursionError
    ))]
    reply = await ask(make().model, tools=(WEATHER,))
    assert reply.content is None
    assert reply.tool_calls == (
        ToolCall(id="call_a", name="get_weather",
                 arguments={INVALID_JSON_KEY: '{"city": "Oslo"'}),
        ToolCall(id="call_b", name="get_weather", arguments={INVALID_JSON_KEY: '["Oslo"]'}),
        ToolCall(id="", name="get_weather", arguments={"city": "Bergen"}),
        ToolCall(id="", name="get_weather", arguments={}),
        ToolCall(id="call_d", name="get_weather", arguments={INVALID_JSON_KEY: DEEP}),
    )
    assert INVALID_JSON_KEY == "__invalid_json__"


@pytest.mark.parametrize("answer, snippet", [
    (Answer(text="<html>Bad Gateway page</html>", headers={"Content-Type": "text/html"}),
     "<html>Bad Gateway page</html>"),
    (Answer(json={"object": "list", "data": []}), '"object":"list"'),
    (Answer(json={"choices": []}), '"choices":[]'),
    (Answer(json={"choices": [{"index": 0}]}), '"index":0'),
    (Answer(json=completion(None, {"id": "c1", "type": "function",
                                   "function": {"arguments": "{}"}})), '"id":"c1"'),
    # half a surrogate pair: JSON can escape it, no database can store it as text
    (Answer(json=completion("half \ud800 a pair")), "half \\ud800 a pair"),
])
async def test_not_a_chat_completion(provider: FakeProvider, make: Callable[..., Made],
                                     answer: Answer, snippet: str) -> None:
    provider.script = [answer]
    m = make()
    with pytest.raises(ModelError, match="not a chat completion") as err:
        await ask(m.model)
    assert snippet in str(err.value)
    assert len(provider.seen) == 1
    assert m.sleeps == []


# -- retries -----------------------------------------------------------------------------
async def test_429_honours_retry_after(provider: FakeProvider,
                                       make: Callable[..., Made]) -> None:
    provider.script = [
        Answer(status=429, json={"error": {"message": "Rate limit reached"}},
               headers={"Retry-After": "3"}),
        Answer(json=completion("ok")),
    ]
    m = make()
    reply = await ask(m.model)
    assert reply.content == "ok"
    assert m.sleeps == [3.0]
    assert len(provider.seen) == 2
    assert provider.seen[0].body == provider.seen[1].body


async def test_a_long_retry_after_is_a_durable_wait_not_an_in_call_sleep(
        provider: FakeProvider, make: Callable[..., Made]) -> None:
    provider.script = [Answer(status=429, json={"error": {"message": "Rate limit reached"}},
                              headers={"Retry-After": "30"})]
    m = make()
    with pytest.raises(ModelUnavailable) as err:
        await ask(m.model)
    assert err.value.retry_after == 30.0 and m.sleeps == [] and len(provider.seen) == 1
    assert "429" in str(err.value)


async def test_an_outage_that_outlasts_the_retries_is_unavailable_not_an_error(
        provider: FakeProvider, make: Callable[..., Made]) -> None:
    provider.default = Answer(status=503, text="overloaded")
    m = make(max_retries=2)
    with pytest.raises(ModelUnavailable) as err:
        await ask(m.model)
    assert err.value.retry_after is None and len(provider.seen) == 3


async def test_5xx_retried_with_exponential_backoff(provider: FakeProvider,
                                                    make: Callable[..., Made]) -> None:
    provider.script = [
        Answer(status=500, json={"error": {"message": "internal"}}),
        Answer(status=503, text="overloaded"),
        Answer(json=completion("finally")),
    ]
    m = make(backoff=0.5)
    reply = await ask(m.model)
    assert reply.content == "finally"
    assert len(provider.seen) == 3
    assert len(m.sleeps) == 2
    first, second = m.sleeps
    assert 0.5 <= first <= 0.55  # backoff * 2**0 plus at most 10% jitter
    assert 1.0 <= second <= 1.1  # backoff * 2**1 plus at most 10% jitter


async def test_backoff_is_capped(provider: FakeProvider, make: Callable[..., Made]) -> None:
    provider.script = [
        *[Answer(status=502, text="x")] * 3,
        Answer(status=429, text="slow down", headers={"Retry-After": "4.5"}),
        Answer(json=completion("ok")),
    ]
    m = make(backoff=2.0, max_backoff=4.0)
    assert (await ask(m.model)).content == "ok"
    assert len(m.sleeps) == 4
    assert 2.0 <= m.sleeps[0] <= 2.2
    assert 4.0 <= m.sleeps[1] <= 4.4
    assert 4.0 <= m.sleeps[2] <= 4.4
    assert m.sleeps[3] == 4.0  # Retry-After is capped at max_backoff too


async def test_5xx_forever_gives_up(provider: FakeProvider, make: Callable[..., Made]) -> None:
    provider.default = Answer(status=500, text=f"upstream exploded (key was {KEY})")
    m = make(max_retries=2)
    with pytest.raises(ModelError) as err:
        await ask(m.model)
    assert len(provider.seen) == 3  # max_retries + 1
    assert len(m.sleeps) == 2
    msg = str(err.value)
    assert "HTTP 500" in msg and "after 3 attempts" in msg
    assert "upstream exploded" in msg
    assert KEY not in msg
    assert isinstance(err.value, ApprovaldError)


async def test_401_fails_at_once_with_provider_message(provider: FakeProvider,
                                                       make: Callable[..., Made]) -> None:
    provider.default = Answer(status=401, json={"error": {
        "message": f"Incorrect API key provided: {KEY}.", "type": "invalid_request_error",
        "code": "invalid_api_key"}})
    m = make()
    with pytest.raises(ModelError) as err:
        await ask(m.model)
    assert len(provider.seen) == 1
    assert m.sleeps == []
    msg = str(err.value)
    assert "HTTP 401" in msg and "Incorrect API key provided" in msg
    assert KEY not in msg
    assert "invalid_request_error" not in msg  # the message, not the whole body


@pytest.mark.parametrize("status", [400, 403, 404])
async def test_other_4xx_fail_at_once(provider: FakeProvider, make: Callable[..., Made],
                                      status: int) -> None:
    provider.default = Answer(status=status, text="nope")
    m = make()
    with pytest.raises(ModelError, match=f"HTTP {status}: nope"):
        await ask(m.model)
    assert len(provider.seen) == 1


async def test_stalled_server_times_out_then_fails(provider: FakeProvider,
                                                   make: Callable[..., Made]) -> None:
    provider.default = Answer(json=completion("too late"), delay=2.0)
    m = make(timeout=0.3, max_retries=1)
    started = time.monotonic()
    with pytest.raises(ModelError, match=r"after 2 attempt\(s\): no answer within 0.3s"):
        await ask(m.model)
    assert time.monotonic() - started < 1.5
    assert len(provider.seen) == 2
    assert len(m.sleeps) == 1


async def test_connection_refused_is_retried(make: Callable[..., Made]) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    m = make(base_url=f"http://127.0.0.1:{port}/v1", max_retries=2)
    with pytest.raises(ModelError, match="after 3 attempt") as err:
        await ask(m.model)
    assert len(m.sleeps) == 2
    assert KEY not in str(err.value)


# -- configuration -----------------------------------------------------------------------
def test_missing_api_key_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("APPROVALD_MODEL_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(ConfigError, match="APPROVALD_MODEL_API_KEY") as err:
        OpenAIChatModel("gpt-test")
    assert "\n" not in str(err.value)


async def test_key_and_base_url_from_environment(provider: FakeProvider,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("APPROVALD_MODEL_API_KEY", raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-openai-var")
    monkeypatch.setenv("APPROVALD_MODEL_BASE_URL", provider.url + "/")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/unused")
    provider.script = [Answer(json=completion("env ok"))]
    async with OpenAIChatModel("gpt-test") as model:
        assert (await ask(model)).content == "env ok"
        assert "sk-from-openai-var" not in repr(model)
    assert provider.seen[0].headers["Authorization"] == "Bearer sk-from-openai-var"


def test_default_base_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("APPROVALD_MODEL_BASE_URL", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    assert OpenAIChatModel("m", api_key="k").base_url == "https://api.openai.com/v1"


def test_bad_base_url_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="APPROVALD_MODEL_BASE_URL"):
        OpenAIChatModel("m", api_key="k", base_url="ftp://example.com")


# -- end to end through the engine -------------------------------------------------------
async def test_agent_runs_through_engine(provider: FakeProvider, make: Callable[..., Made],
                                         tmp_path: Path) -> None:
    @tool(permission="read")
    async def lookup_weather(city: str) -> dict[str, Any]:
        """Current weather for a city."""
        return {"city": city, "temp_c": 4}

    def play(body: Any) -> Answer:
        if any(m["role"] == "tool" for m in body["messages"]):
            return Answer(json=completion("It is 4°C in Oslo."))
        return Answer(json=completion(
            None, fn_call("call_abc", "lookup_weather", '{"city":"Oslo"}')))

    provider.default = play
    model = make().model
    agent = Agent(name="weather", instructions="Answer weather questions.", model=model,
                  tools=[lookup_weather])
    db = Database(f"sqlite+aiosqlite:///{tmp_path / 't.db'}")
    try:
        await migrate.upgrade(db)
        engine = assemble(db, Registry([agent]))
        outcome = await engine.run("weather", "How warm is Oslo?", requested_by="U1")
        assert outcome.status == "completed"
        assert isinstance(outcome, Completed)
        assert outcome.result == "It is 4°C in Oslo."
        state = await engine.state(outcome.run_id)
    finally:
        await db.close()

    assert len(provider.seen) == 2
    first, second = (s.body for s in provider.seen)
    assert first["tools"][0]["function"]["name"] == "lookup_weather"
    assert first["tools"][0]["function"]["parameters"]["required"] == ["city"]
    assert [m["role"] for m in first["messages"]] == ["system", "user"]
    assert first["messages"][0]["content"] == "Answer weather questions."

    msgs = second["messages"]
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool"]
    assert msgs[2]["tool_calls"] == [{"id": "call_abc", "type": "function", "function": {
        "name": "lookup_weather", "arguments": '{"city":"Oslo"}'}}]
    assert msgs[3]["tool_call_id"] == "call_abc"
    assert json.loads(msgs[3]["content"]) == {"city": "Oslo", "temp_c": 4}

    assert [type(m) for m in state.messages] == [
        UserMessage, AssistantMessage, ToolMessage, AssistantMessage]
    tool_msg = state.messages[2]
    assert isinstance(tool_msg, ToolMessage)
    assert tool_msg.call_id == "call_abc"
    assert tool_msg.content == {"city": "Oslo", "temp_c": 4}
    last = state.messages[-1]
    assert isinstance(last, AssistantMessage) and last.meta is not None
    assert last.model_copy(update={"meta": None}) == AssistantMessage(content="It is 4°C in Oslo.")
    assert last.meta.model == model.model  # the model step's record names the model
    assert state.result == "It is 4°C in Oslo."
