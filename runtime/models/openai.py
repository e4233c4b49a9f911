"""A model adapter for OpenAI-compatible chat-completions endpoints.

:class:`OpenAIChatModel` speaks the ``POST {base_url}/chat/completions`` protocol that
OpenAI and many compatible servers (vLLM, llama.cpp, Ollama, gateways) implement. It maps
the runtime's transcript to chat messages, hands the agent's tools over as ``function``
tools, and turns the first choice back into a :class:`~runtime.models.base.ModelReply`.

Transient failures (HTTP 429/500/502/503/504, connection errors, timeouts) are retried
with exponential backoff, honouring ``Retry-After``; when they persist, or the provider
asks for a longer pause than ``max_in_call_wait``, the call raises
:class:`~runtime.kernel.errors.ModelUnavailable` and the run waits durably (its lease released)
until then. Everything else becomes a :class:`~runtime.kernel.errors.ModelError` at once, which
fails the run with a one-line reason.
The API key never appears in an error message.

Configuration comes from the constructor or, failing that, the environment:

``APPROVALD_MODEL_API_KEY`` / ``OPENAI_API_KEY``
    the bearer token (required);
``APPROVALD_MODEL_BASE_URL`` / ``OPENAI_BASE_URL``
    the API root, default ``https://api.openai.com/v1``.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from types import TracebackType
from typing import Any

import aiohttp
from approvald.runtime.kernel.canonical import compact_json
from approvald.runtime.kernel.errors import ConfigError, ModelError, ModelUnavailable
from approvald.runtime.kernel.json_input import MAX_DEPTH, loads
from approvald.runtime.models.base import ModelReply, ToolSpec, Transcript, Usage
from approvald.runtime.record.state import AssistantMessage, ToolCall, ToolMessage, UserMessage
from yarl import URL

__all__ = ["DEFAULT_BASE_URL", "INVALID_JSON_KEY", "OpenAIChatModel"]

DEFAULT_BASE_URL = "https://api.openai.com/v1"
KEY_VARS = ("APPROVALD_MODEL_API_KEY", "OPENAI_API_KEY")
BASE_URL_VARS = ("APPROVALD_MODEL_BASE_URL", "OPENAI_BASE_URL")
# read when an agent's OpenAIChatModel is made without them (docs/reference/settings.md)
ENVIRONMENT = {
    "APPROVALD_MODEL_API_KEY": "the bearer token of an OpenAI-compatible chat-completions API, "
                               "for an agent's `OpenAIChatModel` made without `api_key`; "
                               "else `OPENAI_API_KEY`. Never shown in an error message",
    "OPENAI_API_KEY": "read when `APPROVALD_MODEL_API_KEY` is not set",
    "APPROVALD_MODEL_BASE_URL": "the API's root for an `OpenAIChatModel` made without "
                                f"`base_url`; else `OPENAI_BASE_URL`; default `{DEFAULT_BASE_URL}`",
    "OPENAI_BASE_URL": "read when `APPROVALD_MODEL_BASE_URL` is not set",
}

#: Arguments that are not a JSON object are passed on as ``{INVALID_JSON_KEY: raw_text}``;
#: no tool accepts that key, so the runtime's schema validation reports the call back to
#: the model as ``invalid_arguments`` instead of failing the run.
INVALID_JSON_KEY = "__invalid_json__"

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
_SNIPPET = 200
_JITTER = 0.1  # up to 10% added to computed backoff delays

Sleep = Callable[[float], Awaitable[None]]


class OpenAIChatModel:
    """A :class:`~runtime.models.base.Model` backed by a chat-completions HTTP API.

    ``max_retries`` counts retries, so a call makes at most ``max_retries + 1`` requests.
    Between attempts it waits ``backoff * 2**attempt`` seconds (capped at ``max_backoff``,
    plus up to 10% jitter), or the server's ``Retry-After`` (also capped at
    ``max_backoff``). ``timeout`` bounds each request as a whole. ``sleep`` is injectable
    so tests never really wait.

    The HTTP session is created lazily, inside the running event loop, on the first call;
    call :meth:`aclose` (or use ``async with``) when done with the model.
    """

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        timeout: float = 60.0,
        max_retries: int = 4,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        max_in_call_wait: float = 5.0,
        temperature: float | None = None,
        price_per_million: tuple[float, float] | None = None,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        if not model:
            raise ConfigError("OpenAIChatModel: a model name is required")
        key = api_key or _first_env(KEY_VARS)
        if not key:
            raise ConfigError(
                f"{KEY_VARS[0]} is not set (nor {KEY_VARS[1]}): "
                "the OpenAI-compatible model needs an API key"
            )
        root = (base_url or _first_env(BASE_URL_VARS) or DEFAULT_BASE_URL).rstrip("/")
        try:
            url = URL(root + "/chat/completions")
        except ValueError as exc:
            raise ConfigError(f"{BASE_URL_VARS[0]}: not a URL: {root!r} ({exc})") from None
        if url.scheme not in ("http", "https") or not url.host:
            raise ConfigError(
                f"{BASE_URL_VARS[0]}: not an http(s) URL: {_display(url)!r} "
                f"(expected e.g. {DEFAULT_BASE_URL})"
            )
        if timeout <= 0 or max_retries < 0 or backoff < 0 or max_backoff < 0:
            raise ConfigError(
                "OpenAIChatModel: timeout must be positive and max_retries, backoff and "
                "max_backoff must not be negative"
            )
        self.model = model
        self.base_url = root
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.max_in_call_wait = max_in_call_wait
        # USD per million (input, output) tokens: a step's cost is recorded only if the API
        # reports one or this is set; a price is never guessed
        self.price_per_million = price_per_million
        self.temperature = temperature
        self._api_key = key
        self._url = url
        self._where = _display(url)
        self._sleep = sleep
        self._random = random.Random()
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def __repr__(self) -> str:  # never shows the key
        return f"OpenAIChatModel(model={self.model!r}, base_url={self._where!r})"

    # -- lifecycle ---------------------------------------------------------------------
    async def __aenter__(self) -> OpenAIChatModel:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the HTTP session, if one was opened. The model may be used again after."""
        session, self._session, self._loop = self._session, None, None
        if session is not None and not session.closed:
            await session.close()

    def _get_session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed or self._loop is not loop:
            # A session is bound to the loop it was made in; a new loop needs a new one.
            self._session = aiohttp.ClientSession()
            self._loop = loop
        return self._session

    # -- the protocol ------------------------------------------------------------------
    async def complete(
        self, *, instructions: str, messages: Transcript, tools: Sequence[ToolSpec]
    ) -> ModelReply:
        """Ask the endpoint for the next assistant turn; raises :class:`ModelError`."""
        body = self.request_body(instructions=instructions, messages=messages, tools=tools)
        data = await self._post(body)
        return self._parse(data)

    def request_body(
        self, *, instructions: str, messages: Transcript, tools: Sequence[ToolSpec]
    ) -> dict[str, Any]:
        """The JSON body sent for one completion (public so it can be inspected)."""
        chat: list[dict[str, Any]] = [{"role": "system", "content": instructions}]
        chat.extend(_to_chat(m) for m in messages)
        body: dict[str, Any] = {"model": self.model, "messages": chat}
        if tools:
            body["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": t.name,
                        "description": t.description,
                        "parameters": t.parameters,
                    },
                }
                for t in tools
            ]
            body["tool_choice"] = "auto"
        if self.temperature is not None:
            body["temperature"] = self.temperature
        return body

    # -- HTTP --------------------------------------------------------------------------
    async def _post(self, body: dict[str, Any]) -> Any:
        """POST with retries; returns the decoded JSON of a 2xx answer."""
        payload = json.dumps(body, ensure_ascii=False).encode()
        headers = {
            "Authorization": f"Bearer {self._api_key}",
            "Content-Type": "application/json",
            "Accept": "application/json",
        }
        timeout = aiohttp.ClientTimeout(total=self.timeout)
        attempts = self.max_retries + 1
        for attempt in range(attempts):
            last = attempt == attempts - 1
            try:
                session = self._get_session()
                async with session.post(
                    self._url, data=payload, headers=headers, timeout=timeout
                ) as resp:
                    status = resp.status
                    raw = await resp.read()
                    retry_after = resp.headers.get("Retry-After")
            except (aiohttp.ClientError, TimeoutError) as exc:
                if last:
                    raise ModelUnavailable(
                        f"model provider at {self._where} failed after {attempts} "
                        f"attempt(s): {self._describe(exc)}",
                        model=self.model,
                    ) from None
                await self._sleep(self._delay(attempt, None))
                continue
            if 200 <= status < 300:
                try:  # as callers' JSON is read: a lone surrogate is no text to store
                    return loads(raw)
                except ValueError:
                    raise self._not_a_completion(raw) from None
            if status in RETRY_STATUSES:
                hinted = _parse_retry_after(retry_after)
                if last or (hinted is not None and hinted > self.max_in_call_wait):
                    # not worth holding the run for: it waits durably instead
                    err = self._http_error(status, raw, attempts=attempt + 1)
                    raise ModelUnavailable(str(err), retry_after=hinted, model=self.model,
                                           status=status)
                await self._sleep(self._delay(attempt, retry_after))
                continue
            raise self._http_error(status, raw, attempts=attempt + 1)
        raise AssertionError("unreachable")  # pragma: no cover

    def _delay(self, attempt: int, retry_after: str | None) -> float:
        """Seconds to wait before retry number ``attempt + 1``."""
        hinted = _parse_retry_after(retry_after)
        if hinted is not None:
            return min(hinted, self.max_backoff)
        delay = min(self.backoff * 2.0**attempt, self.max_backoff)
        return delay + self._random.uniform(0, delay * _JITTER)

    # -- errors ------------------------------------------------------------------------
    def _redact(self, text: str) -> str:
        return text.replace(self._api_key, "***") if self._api_key else text

    def _snippet(self, raw: bytes) -> str:
        text = " ".join(raw.decode("utf-8", errors="replace").split())
        text = self._redact(text)
        if len(text) > _SNIPPET:
            text = text[:_SNIPPET] + "..."
        return text or "(empty body)"

    def _describe(self, exc: BaseException) -> str:
        if isinstance(exc, TimeoutError):
            return f"no answer within {self.timeout:g}s"
        detail = self._redact(" ".join(str(exc).split()))
        return f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__

    def _http_error(self, status: int, raw: bytes, *, attempts: int) -> ModelError:
        detail = self._snippet(raw)
        try:
            doc = json.loads(raw)
        except ValueError:
            doc = None
        if isinstance(doc, dict):
            err = doc.get("error")
            msg = err.get("message") if isinstance(err, dict) else err
            if isinstance(msg, str) and msg.strip():
                detail = self._snippet(msg.encode())
        tries = f" after {attempts} attempts" if attempts > 1 else ""
        return ModelError(
            f"model provider at {self._where} answered HTTP {status}{tries}: {detail}",
            model=self.model, status=status,
        )

    def _not_a_completion(self, raw: bytes) -> ModelError:
        return ModelError(
            f"model provider at {self._where} answered something that is not a chat "
            f"completion: {self._snippet(raw)}",
            model=self.model,
        )

    # -- response ----------------------------------------------------------------------
    def _parse(self, data: Any) -> ModelReply:
        def bad() -> ModelError:
            return self._not_a_completion(_dump(data).encode())

        choices = data.get("choices") if isinstance(data, dict) else None
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise bad()
        message = choices[0].get("message")
        if not isinstance(message, dict):
            raise bad()
        content = message.get("content")
        if content is not None and not isinstance(content, str):
            raise bad()
        raw_calls = message.get("tool_calls") or []
        if not isinstance(raw_calls, list):
            raise bad()
        calls: list[ToolCall] = []
        for rc in raw_calls:
            fn = rc.get("function") if isinstance(rc, dict) else None
            name = fn.get("name") if isinstance(fn, dict) else None
            if not isinstance(rc, dict) or not isinstance(fn, dict) or not name \
                    or not isinstance(name, str):
                raise bad()
            call_id = rc.get("id")
            calls.append(ToolCall(
                id=call_id if isinstance(call_id, str) else "",
                name=name,
                arguments=_parse_arguments(fn.get("arguments")),
            ))
        return ModelReply(content=content, tool_calls=tuple(calls),
                          usage=self._usage(data.get("usage")))

    def _usage(self, raw: Any) -> Usage | None:
        """Token counts from the response's ``usage`` (absent or malformed: None); its cost
        if the API reports one (``usage.cost``), else from ``price_per_million``."""
        if not isinstance(raw, dict):
            return None

        def count(key: str) -> int | None:
            value = raw.get(key)
            ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
            return value if ok else None

        tokens_in, tokens_out = count("prompt_tokens"), count("completion_tokens")
        cost = raw.get("cost")
        cost_usd = (float(cost) if isinstance(cost, int | float) and not isinstance(cost, bool)
                    and cost >= 0 else None)
        if cost_usd is None and self.price_per_million is not None \
                and tokens_in is not None and tokens_out is not None:
            per_in, per_out = self.price_per_million
            cost_usd = (tokens_in * per_in + tokens_out * per_out) / 1_000_000
        if tokens_in is None and tokens_out is None and cost_usd is None:
            return None
        return Usage(input_tokens=tokens_in, output_tokens=tokens_out, cost_usd=cost_usd)


# -- helpers ---------------------------------------------------------------------------
def _first_env(names: Sequence[str]) -> str | None:
    for name in names:
        value = os.environ.get(name, "").strip()
        if value:
            return value
    return None


def _display(url: URL) -> str:
    """The URL without credentials, query or fragment, safe to put in messages."""
    return str(url.with_user(None).with_query(None).with_fragment(None))


def _to_chat(m: UserMessage | AssistantMessage | ToolMessage) -> dict[str, Any]:
    if isinstance(m, UserMessage):
        return {"role": "user", "content": m.content}
    if isinstance(m, AssistantMessage):
        out: dict[str, Any] = {"role": "assistant", "content": m.content}
        if m.tool_calls:
            out["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": compact_json(c.arguments)},
                }
                for c in m.tool_calls
            ]
        return out
    content = m.content if isinstance(m.content, str) else compact_json(m.content)
    return {"role": "tool", "tool_call_id": m.call_id, "content": content}


def _parse_arguments(raw: Any) -> dict[str, Any]:
    """Tool-call arguments as a dict; anything but a JSON object is flagged, not dropped.

    Missing or blank arguments mean "no arguments" (some servers send ``""`` for tools
    without parameters). A server that already sent an object is taken at its word.
    """
    if raw is None:
        return {}
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, str):
        if not raw.strip():
            return {}
        try:  # (arguments nested past MAX_DEPTH are as unusable as broken JSON)
            parsed = loads(raw, max_depth=MAX_DEPTH)
        except ValueError:
            return {INVALID_JSON_KEY: raw}
        if isinstance(parsed, dict):
            return parsed
        return {INVALID_JSON_KEY: raw}
    return {INVALID_JSON_KEY: _dump(raw)}


def _dump(value: Any) -> str:
    """Compact JSON of whatever a server sent (lenient: only used for reporting)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)


def _parse_retry_after(value: str | None) -> float | None:
    """``Retry-After`` as seconds (delta-seconds or an HTTP date); ``None`` if unusable."""
    if value is None or not value.strip():
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - datetime.now(UTC)).total_seconds()
    if seconds != seconds:  # NaN
        return None
    return max(0.0, seconds)
