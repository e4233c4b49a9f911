"""A fake of Anthropic's Messages API for the real Claude Code CLI, on loopback.

Claude Code reaches it through ``ANTHROPIC_BASE_URL`` (with any ``ANTHROPIC_API_KEY``). It
plays the model from a script: a queue of turns, each either a tool call
(:func:`tool_use`) or a final answer (:func:`say`), handed out one per request of the main
conversation (the requests made with :attr:`FakeAnthropic.model`). It answers the way the
API does (https://docs.anthropic.com/en/api/messages-streaming): with ``"stream": true`` a
``text/event-stream`` of ``message_start``, per content block ``content_block_start`` /
``content_block_delta`` (``text_delta``, or ``input_json_delta`` carrying the tool input as
``partial_json`` pieces) / ``content_block_stop``, then ``message_delta`` (``stop_reason``
and cumulative ``usage``) and ``message_stop``; without it one ``message`` object.

Every request is recorded (:attr:`FakeAnthropic.requests`), so a test can read what Claude
Code sent back: the ``tool_result`` of a call, with the reason a hook gave for a denial.
The side requests Claude Code makes are answered too: ``count_tokens``, the model list, its
reachability check (``/api/hello``), and requests for another model (a title, a summary:
a short text). A path the fake does not
know is answered 404 as the API does, logged at WARNING and kept in
:attr:`FakeAnthropic.unknown`, which a test checks is empty: a new Claude Code that asks
for something new is seen, not silently ignored.
"""

from __future__ import annotations

import inspect
import json
import logging
import sys
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from aiohttp import web

log = logging.getLogger("tests.fake_anthropic")
T = TypeVar("T")

MODEL = "claude-sonnet-4-5-20250929"  # what the tests pass as --model


@dataclass(frozen=True)
class Turn:
    """One reply of the model: text blocks and tool calls, and why it stopped."""

    content: tuple[dict[str, Any], ...]

    @property
    def stop_reason(self) -> str:
        return "tool_use" if any(b["type"] == "tool_use" for b in self.content) else "end_turn"


def tool_use(name: str, tool_input: dict[str, Any], *, text: str | None = None,
             id: str | None = None) -> Turn:
    """The model calls tool ``name`` with ``tool_input`` (after saying ``text``, if any)."""
    block = {"type": "tool_use", "id": id or f"toolu_{uuid.uuid4().hex[:24]}", "name": name,
             "input": tool_input}
    return Turn((({"type": "text", "text": text},) if text else ()) + (block,))


def say(text: str) -> Turn:
    """The model answers ``text`` and ends its turn."""
    return Turn(({"type": "text", "text": text},))


# a turn, or one made from the request (a coroutine function may hold the reply back until
# the test has done something: Claude Code waits for it as for a slow model)
Script = Turn | Callable[[dict[str, Any]], Turn | Awaitable[Turn]]


@dataclass
class Recorded:
    """One request as the fake received it."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any

    @property
    def model(self) -> str | None:
        return self.body.get("model") if isinstance(self.body, dict) else None


@dataclass
class FakeAnthropic:
    """The fake API: :meth:`start` it, :meth:`script` the turns, read :attr:`requests`."""

    model: str = MODEL
    requests: list[Recorded] = field(default_factory=list)
    unknown: list[Recorded] = field(default_factory=list)
    turns: list[Script] = field(default_factory=list)
    # main-conversation requests that found no turn left (the test scripted too few)
    unscripted: list[Recorded] = field(default_factory=list)
    url: str = ""
    _runner: web.AppRunner | None = None

    # -- the test's side ---------------------------------------------------------------

    def script(self, *turns: Script) -> None:
        """Queue the replies of the main conversation, in order (replacing any left)."""
        self.turns[:] = turns

    def reset(self) -> None:
        """Forget every request and turn (a new test)."""
        self.requests.clear()
        self.unknown.clear()
        self.turns.clear()
        self.unscripted.clear()

    def conversation(self) -> list[dict[str, Any]]:
        """The bodies of the main conversation's requests, in order."""
        return [r.body for r in self.requests
                if r.path == "/v1/messages" and r.model == self.model]

    def tool_results(self) -> list[dict[str, Any]]:
        """Every ``tool_result`` block Claude Code sent back, in order, each once (a later
        request repeats the history: only the newest user message's results are new)."""
        found: list[dict[str, Any]] = []
        seen: set[str] = set()
        for body in self.conversation():
            for message in body.get("messages", []):
                content = message.get("content")
                if message.get("role") != "user" or not isinstance(content, list):
                    continue
                for block in content:
                    if block.get("type") == "tool_result" and \
                            block.get("tool_use_id") not in seen:
                        seen.add(block["tool_use_id"])
                        found.append(block)
        return found

    def tool_result_text(self, tool_use_id: str | None = None) -> str:
        """The text of the tool result for ``tool_use_id`` (default: the last one)."""
        results = self.tool_results()
        if tool_use_id is not None:
            results = [r for r in results if r["tool_use_id"] == tool_use_id]
        assert results, f"Claude Code sent no tool_result (for {tool_use_id or 'any call'})"
        content = results[-1].get("content")
        if isinstance(content, list):
            return "\n".join(str(c.get("text", "")) for c in content)
        return str(content)

    # -- the server ---------------------------------------------------------------------

    async def start(self) -> str:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/messages", self._messages)
        app.router.add_post("/v1/messages/count_tokens", self._count_tokens)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/v1/models/{model}", self._model)
        # Claude Code's check that the API host is reachable (HEAD, unless its
        # non-essential traffic is off)
        app.router.add_get("/api/hello", self._hello)
        app.router.add_route("*", "/{tail:.*}", self._unknown)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _record(self, request: web.Request) -> Recorded:
        raw = await request.read()
        body = loads(raw)
        rec = Recorded(request.method, request.path, dict(request.headers), body)
        self.requests.append(rec)
        return rec

    async def _unknown(self, request: web.Request) -> web.Response:
        rec = await self._record(request)
        self.unknown.append(rec)
        log.warning("fake Anthropic API: unknown request %s %s", rec.method, rec.path)
        return error(404, "not_found_error", f"{rec.method} {rec.path}: not found")

    async def _hello(self, request: web.Request) -> web.Response:
        await self._record(request)
        return web.Response(status=200)

    async def _count_tokens(self, request: web.Request) -> web.Response:
        rec = await self._record(request)
        return web.json_response({"input_tokens": approx_tokens(rec.body)})

    async def _models(self, request: web.Request) -> web.Response:
        await self._record(request)
        return web.json_response({"data": [model_info(self.model)], "has_more": False,
                                  "first_id": self.model, "last_id": self.model})

    async def _model(self, request: web.Request) -> web.Response:
        await self._record(request)
        return web.json_response(model_info(request.match_info["model"]))

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        rec = await self._record(request)
        body = rec.body if isinstance(rec.body, dict) else {}
        if not body.get("messages") or not body.get("model"):
            return error(400, "invalid_request_error", "model and messages are required")
        if rec.model == self.model:
            turn = await self._next_turn(rec)
        else:  # a side request on another model (a title, a summary): a short answer
            turn = say("Gate a shell command")
        message_id = f"msg_{uuid.uuid4().hex[:24]}"
        usage_in = approx_tokens(body)
        if not body.get("stream"):
            return web.json_response({
                "id": message_id, "type": "message", "role": "assistant",
                "model": body["model"], "content": list(turn.content),
                "stop_reason": turn.stop_reason, "stop_sequence": None,
                "usage": {"input_tokens": usage_in, "output_tokens": out_tokens(turn)}},
                dumps=dumps)
        return await self._stream(request, body["model"], message_id, turn, usage_in)

    async def _next_turn(self, rec: Recorded) -> Turn:
        if not self.turns:
            self.unscripted.append(rec)
            log.warning("fake Anthropic API: a model request with no scripted turn left")
            return say("(the fake model has no scripted turn left)")
        script = self.turns.pop(0)
        if isinstance(script, Turn):
            return script
        made = script(rec.body)
        return await made if inspect.isawaitable(made) else made

    async def _stream(self, request: web.Request, model: str, message_id: str, turn: Turn,
                      usage_in: int) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache",
                                           "request-id": f"req_{uuid.uuid4().hex[:24]}"})
        await resp.prepare(request)

        async def send(event: str, data: dict[str, Any]) -> None:
            await resp.write(f"event: {event}\ndata: {json.dumps(data)}\n\n".encode())

        await send("message_start", {"type": "message_start", "message": {
            "id": message_id, "type": "message", "role": "assistant", "model": model,
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": usage_in, "output_tokens": 1,
                      "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}}})
        for index, block in enumerate(turn.content):
            if block["type"] == "text":
                await send("content_block_start", {"type": "content_block_start",
                                                   "index": index,
                                                   "content_block": {"type": "text",
                                                                     "text": ""}})
                await send("ping", {"type": "ping"})
                for piece in pieces(block["text"]):
                    await send("content_block_delta", {
                        "type": "content_block_delta", "index": index,
                        "delta": {"type": "text_delta", "text": piece}})
            else:
                await send("content_block_start", {
                    "type": "content_block_start", "index": index,
                    "content_block": {"type": "tool_use", "id": block["id"],
                                      "name": block["name"], "input": {}}})
                # the API streams the input as JSON text in pieces, the first often empty
                for piece in ["", *pieces(dumps(block["input"]))]:
                    await send("content_block_delta", {
                        "type": "content_block_delta", "index": index,
                        "delta": {"type": "input_json_delta", "partial_json": piece}})
            await send("content_block_stop", {"type": "content_block_stop", "index": index})
        await send("message_delta", {
            "type": "message_delta",
            "delta": {"stop_reason": turn.stop_reason, "stop_sequence": None},
            "usage": {"input_tokens": usage_in, "output_tokens": out_tokens(turn)}})
        await send("message_stop", {"type": "message_stop"})
        await resp.write_eof()
        return resp


def deep_enough(fn: Callable[[Any], T], value: Any) -> T:
    """``fn(value)`` (``json.loads`` or ``json.dumps``), however deep the JSON: a test sends
    a tool input 1,000 levels deep, past Python's default recursion limit."""
    try:
        return fn(value)
    except RecursionError:
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(max(limit, 20_000))
        try:
            return fn(value)
        finally:
            sys.setrecursionlimit(limit)


def loads(raw: bytes) -> Any:
    """A request body (or a line Claude Code printed): its JSON, else its text."""
    if not raw:
        return None
    try:
        return deep_enough(json.loads, raw)
    except ValueError:
        return raw.decode(errors="replace")


def dumps(value: Any) -> str:
    """``json.dumps``, however deep ``value`` is."""
    return deep_enough(json.dumps, value)


def pieces(text: str, size: int = 24) -> list[str]:
    """``text`` cut into the small pieces a stream carries (at least one)."""
    return [text[i:i + size] for i in range(0, len(text), size)] or [""]


def approx_tokens(body: Any) -> int:
    return max(1, len(dumps(body)) // 4)


def out_tokens(turn: Turn) -> int:
    return max(1, len(dumps(turn.content)) // 4)


def model_info(model: str) -> dict[str, Any]:
    return {"type": "model", "id": model, "display_name": model,
            "created_at": "2025-09-29T00:00:00Z"}


def error(status: int, kind: str, message: str) -> web.Response:
    """An error as the API words it."""
    return web.json_response({"type": "error", "error": {"type": kind, "message": message}},
                             status=status)
