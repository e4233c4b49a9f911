"""``/v1``: the HTTP API's routes, on the listener that serves ``/slack/events`` (or, in
Socket Mode and without Slack, the one that serves ``/healthz``).

Every answer is JSON; an error is ``{"error": {"code", "message"}}`` with its HTTP status.
A request is authenticated before anything else is read: a missing, unknown or revoked
bearer token gets 401 and changes nothing. Bodies are read up to a cap (413 past it),
then parsed (400 if they are not a JSON object) and validated (422).
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar

from aiohttp import web
from approvald.bot import claude_code
from approvald.bot.api import schemas
from approvald.runtime import (
    MAX_DEPTH,
    ApprovaldError,
    Engine,
    ExternalError,
    IntakeError,
    NewRequest,
    NotFound,
    PayloadTooLarge,
    Report,
    Tighten,
    TooDeep,
    WebhookHosts,
    WebhookRefused,
    api_tokens,
    compact_json,
    external,
    parse_caller_json,
)
from approvald.store.repos.external import TokenRecord
from pydantic import BaseModel, ValidationError

log = logging.getLogger("approvald.api")

# ExternalError codes -> HTTP statuses
STATUSES = {"unauthorized": 401, "invalid_request": 422, "looser_than_policy": 403,
            "tool_not_allowed": 403, "unsatisfiable": 409,
            "idempotency_conflict": 409, "not_approved": 409, "cancelled": 409,
            "digest_mismatch": 409, "already_reported": 409, "already_started": 409}
DEFAULT_WAIT = 30.0
HOOK_FACE = "hook:claude-code"
# the routes with a method each: another method on one of these paths is a 405
_KNOWN = ((re.compile(r"/v1/requests"), "POST"),
          (re.compile(r"/v1/requests/[^/]+"), "GET"),
          (re.compile(r"/v1/requests/[^/]+/decision"), "GET"),
          (re.compile(r"/v1/requests/[^/]+/result"), "POST"),
          (re.compile(r"/v1/openapi\.json"), "GET"),
          (re.compile(r"/v1/hooks/claude-code"), "POST"))

Handler = Callable[[web.Request, TokenRecord], Awaitable[web.StreamResponse]]
_Model = TypeVar("_Model", bound=BaseModel)  # what a request's body is validated into
_T = TypeVar("_T")


def _not_json(token: str) -> NoReturn:
    raise ValueError(f"{token} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400: a number no JSON reader gets back as written
        raise ValueError(f"{text[:40]} is out of the range of a JSON number")
    return value


def _tighten(body: schemas.Tighten | None) -> Tighten | None:
    """The body's tighten as the intake reads it (a duration past what approvald accepts,
    say, is refused here with its field named)."""
    if body is None:
        return None
    try:
        return Tighten.model_validate(body.model_dump(exclude_none=True))
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(x) for x in ("tighten", *err["loc"]))
        msg = str(err["msg"]).removeprefix("Value error, ")
        raise ApiError(422, "invalid_request", f"{where}: {msg}") from None


def _failure(request: web.Request, exc: Exception) -> web.Response:
    """The answer to a request ``exc`` stopped: its status, or a 500 (logged) for a bug."""
    if isinstance(exc, ApiError):
        return error(exc.status, exc.code, str(exc), exc.headers)
    if isinstance(exc, NotFound):
        return error(404, "not_found", str(exc))
    if isinstance(exc, ExternalError | IntakeError):
        return error(STATUSES.get(exc.code, 422), exc.code, str(exc))
    if isinstance(exc, PayloadTooLarge):
        return error(413, "payload_too_large", str(exc))
    if isinstance(exc, ApprovaldError):
        return error(400, "refused", str(exc))
    if isinstance(exc, TimeoutError):
        return error(503, "unavailable", str(exc) or "approvald did not answer in time")
    # a bug: said in one line to the caller, logged in full here
    log.error("%s %s failed", request.method, request.path, exc_info=exc)
    return error(500, "internal", "approvald failed to answer; see its log")


@dataclass
class _Seen:
    """What a hook's request has shown so far: its token's name, its event's kind (an
    event not read yet is taken to be a PreToolUse, so that it is denied)."""

    who: str = "?"
    kind: str = claude_code.PRE


def _forget(tasks: set[asyncio.Future[Any]]) -> Callable[[asyncio.Future[Any]], None]:
    def done(task: asyncio.Future[Any]) -> None:
        tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("claude-code hook over HTTP: late failure: %s", task.exception())
    return done


async def within(work: Coroutine[Any, Any, _T], budget: float) -> asyncio.Task[_T]:
    """``work`` run in a task of its own, handed back once it has ended or at ``budget``
    seconds, whichever comes first: at the budget whatever it is doing, even stuck where
    its cancellation does not reach (it is left running: the caller cancels it). Cancelled
    itself (the caller went away), it cancels ``work``. What ``asyncio.wait`` does for one
    future, without its sets, its second coroutine, and the turn of the event loop that
    a done callback takes: the work wakes its waiter as it ends (issue 50)."""
    loop = asyncio.get_running_loop()
    woken = loop.create_future()

    def wake() -> None:
        if not woken.done():
            woken.set_result(None)

    async def run() -> _T:
        try:
            return await work
        finally:  # the task is done once this returns, before its waiter runs
            wake()

    task = loop.create_task(run())
    timer = loop.call_later(budget, wake)
    try:
        await woken
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        timer.cancel()
    return task


class _Undecided(Exception):
    """The hook's event cannot be decided (the message says why): a deny."""


def _said(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.headers = status, code, headers


def error(status: int, code: str, message: str,
          headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message}}, status=status,
                             headers=headers, dumps=compact_json)


def answer(doc: dict[str, Any], status: int = 200) -> web.Response:
    return web.json_response(doc, status=status, dumps=compact_json)


class Routes:
    """The handlers; ``stop`` ends long polls early when the process stops."""

    def __init__(self, engine: Engine, *, stop: asyncio.Event | None = None,
                 webhook_hosts: WebhookHosts | None = None) -> None:
        self.e = engine
        self.stop = stop
        # where a request's own webhook may point (APPROVALD_WEBHOOK_HOSTS, less serve's
        # own listeners); none, without the setting
        self.webhook_hosts = webhook_hosts or WebhookHosts(())
        # arguments and a packet, or a result, each up to the payload cap, and their JSON
        self.body_limit = 2 * engine.max_payload_bytes + 64 * 1024
        # hook requests answered before their work ended (see claude_code)
        self._stragglers: set[asyncio.Future[Any]] = set()

    def add_to(self, app: web.Application) -> None:
        r = app.router
        r.add_get("/v1/openapi.json", self.openapi, allow_head=False)
        r.add_post("/v1/requests", self._guard(self.create, to_open=True))
        r.add_get("/v1/requests/{id}", self._guard(self.read), allow_head=False)
        r.add_get("/v1/requests/{id}/decision", self._guard(self.decision), allow_head=False)
        r.add_post("/v1/requests/{id}/result", self._guard(self.result))
        r.add_post("/v1/hooks/claude-code", self.claude_code)
        r.add_route("*", "/v1{tail:(/.*)?}", self.unknown)

    # -- plumbing -------------------------------------------------------------------------
    def _guard(self, handler: Handler, *, face: str | None = None, to_open: bool = False
               ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        """``handler`` for a bearer token scoped to ``face`` (None: the /v1 API's): any
        other is refused before the body is read (401 unknown, 403 another face's).
        ``to_open``: the handler only opens requests (the token may come from memory:
        :meth:`~runtime.engine.Engine.caller`)."""
        async def guarded(request: web.Request) -> web.StreamResponse:
            try:
                token = await self._token(request, to_open=to_open)
                refused = api_tokens.face_refusal(token, face)
                if refused is not None:
                    raise ApiError(403, "wrong_face", refused)
                return await handler(request, token)
            except Exception as exc:
                return _failure(request, exc)
        return guarded

    async def _token(self, request: web.Request, *, to_open: bool = False) -> TokenRecord:
        token = await self.e.caller(request.headers.get("Authorization", ""),
                                    to_open=to_open)
        if token is None:
            raise ApiError(401, "unauthorized", "a valid bearer token is required "
                           "(Authorization: Bearer <token from `approvald tokens create`>)",
                           {"WWW-Authenticate": 'Bearer realm="approvald"'})
        return token

    async def _raw(self, request: web.Request, limit: int) -> bytes:
        """The body, up to ``limit`` bytes (413 past it, before more is read)."""
        if request.content_length is not None and request.content_length > limit:
            raise ApiError(413, "payload_too_large", f"the body is over the {limit}-byte cap")
        content = request.content
        if request.content_length is not None and content.is_eof():
            return content.read_nowait()  # all of it arrived with the request: no wait
        raw = bytearray()
        async for chunk in request.content.iter_chunked(64 * 1024):
            raw += chunk
            if len(raw) > limit:
                raise ApiError(413, "payload_too_large",
                               f"the body is over the {limit}-byte cap")
        return bytes(raw)

    def _seconds(self, request: web.Request, default: float, most: float) -> float:
        raw = request.query.get("wait")
        try:
            wait = min(default, most) if raw is None else float(raw)
        except ValueError:
            wait = -1.0
        if not 0 <= wait <= most:
            raise ApiError(400, "invalid_request", f"wait is a number of seconds from 0 to "
                                                   f"{most:g}, got {raw!r}")
        return wait

    async def _body(self, request: web.Request, model: type[_Model]) -> _Model:
        raw = await self._raw(request, self.body_limit)
        try:
            value = parse_caller_json(raw.decode("utf-8"), parse_constant=_not_json,
                                      parse_float=_finite)
        except TooDeep as exc:
            raise ApiError(422, "invalid_request", f"the body is {exc} (a value in it may "
                                                   f"nest {MAX_DEPTH})") from None
        except ValueError as exc:  # UnicodeDecodeError is a ValueError
            raise ApiError(400, "malformed_json",
                           f"the body is not JSON: {str(exc)[:200]}") from None
        if not isinstance(value, dict):
            raise ApiError(400, "malformed_json", "the body is not a JSON object")
        try:
            return model.model_validate(value)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(x) for x in err["loc"]) or "body"
            msg = str(err["msg"]).removeprefix("Value error, ")
            raise ApiError(422, "invalid_request", f"{where}: {msg}") from None

    # -- handlers -------------------------------------------------------------------------
    async def openapi(self, request: web.Request) -> web.StreamResponse:
        return answer(schemas.openapi())

    async def create(self, request: web.Request, token: TokenRecord) -> web.StreamResponse:
        body: schemas.CreateRequest = await self._body(request, schemas.CreateRequest)
        if body.webhook_url is not None:
            try:
                self.webhook_hosts.check_url(body.webhook_url)
            except WebhookRefused as exc:  # the operator's list: an authorization matter
                raise ApiError(403, "webhook_not_allowed", f"webhook_url: {exc}") from None
        doc, new = await self.e.open_request(token, NewRequest(
            tool=body.tool, args=body.args,
            requested_by=body.requested_by or f"api:{token.name}",
            packet=body.packet.model_dump(exclude_none=True) if body.packet else {},
            tighten=None if body.tighten is None else _tighten(body.tighten),
            idempotency_key=body.idempotency_key, webhook_url=body.webhook_url))
        if doc["status"] == "forbidden":
            reason = (doc["decision"] or {}).get("reason") or "the policy forbids this call"
            return answer({**doc, "error": {"code": "forbidden", "message": reason}}, 403)
        return answer(doc, 201 if new else 200)

    async def read(self, request: web.Request, token: TokenRecord) -> web.StreamResponse:
        return answer(await self.e.request_document(token, request.match_info["id"]))

    async def decision(self, request: web.Request, token: TokenRecord) -> web.StreamResponse:
        wait = self._seconds(request, DEFAULT_WAIT, external.MAX_WAIT)
        return answer(await self.e.wait_request(token, request.match_info["id"],
                                                seconds=wait, stop=self.stop))

    async def result(self, request: web.Request, token: TokenRecord) -> web.StreamResponse:
        body: schemas.ReportResult = await self._body(request, schemas.ReportResult)
        doc, new = await self.e.report_request(token, request.match_info["id"], Report(
            status=body.status, args_digest=body.args_digest, result=body.result,
            error=body.error))
        return answer(doc, 201 if new else 200)

    async def claude_code(self, request: web.Request) -> web.StreamResponse:
        """Claude Code's HTTP hook: the event as the command hook reads it on stdin, the
        answer as it prints (:mod:`bot.claude_code`), for the token's requester.

        A missing or revoked token is a 401, another face's a 403. Past that, whatever
        stops a ``PreToolUse`` from being decided (an event too large, too deep, not UTF-8
        or not JSON, a ``wait`` out of range, a database that fails or does not answer, a
        bug) is a 200 deny saying why, and the answer comes within ``wait`` plus
        :data:`~bot.claude_code_contract.HTTP_MARGIN` seconds of the request, the token's check
        included: Claude Code reads a non-2xx or late answer as a failed hook, which lets
        the call go ahead unless the hook's settings say ``"onFailure": "block"``. An
        event it cannot read is taken to be a ``PreToolUse`` (denied); a ``PostToolUse``
        that cannot be recorded is an error status, as on the rest of ``/v1``."""
        try:
            wait, bad_wait = self._seconds(request, claude_code.DEFAULT_WAIT,
                                           claude_code.MAX_HTTP_WAIT), None
        except ApiError as exc:
            wait, bad_wait = claude_code.DEFAULT_WAIT, str(exc)
        budget = wait + claude_code.HTTP_MARGIN
        seen = _Seen()
        work = await within(self._claude_code(request, wait, bad_wait, seen), budget)
        if work.done():
            return work.result()
        # stuck where a cancellation does not reach at once (a statement waiting in the
        # database driver's thread, a rollback behind it): answer now; the work is
        # cancelled and ends in the background when the database lets it
        work.cancel()
        self._stragglers.add(work)
        work.add_done_callback(_forget(self._stragglers))
        why = (f"no decision within {budget:g} s (wait {wait:g} s + "
               f"{claude_code.HTTP_MARGIN:g}); the database may not be answering")
        if seen.kind != claude_code.PRE:
            return _failure(request, TimeoutError(why))
        return self._deny(seen.who, why)

    async def _claude_code(self, request: web.Request, wait: float, bad_wait: str | None,
                           seen: _Seen) -> web.StreamResponse:
        try:
            try:  # from memory: a PreToolUse's request checks it is still live
                token = await self._token(request, to_open=True)
            except ApiError:
                raise
            except Exception as exc:  # the database, most likely: deny, never allow
                raise _Undecided(f"its token could not be checked ({_said(exc)})") from exc
            seen.who = token.name
            refused = api_tokens.face_refusal(token, HOOK_FACE)
            if refused is not None:
                raise ApiError(403, "wrong_face", refused)
            try:
                raw = await self._raw(request, claude_code.MAX_EVENT)
            except ApiError:
                raise _Undecided(f"the event is larger than {claude_code.MAX_EVENT} "
                                 "bytes") from None
            event = claude_code.HookEvent.read(raw)
            seen.kind = event.event
            if bad_wait is not None:
                raise _Undecided(bad_wait)
            if seen.kind != claude_code.PRE:  # what it reports needs a token read now
                token = await self._token(request)
            assert token.requested_by is not None  # a face token always has one
            hook = claude_code.ClaudeCodeHook(
                self.e, event, requested_by=token.requested_by, bearer=token.name,
                bearer_id=token.id)
            if seen.kind != claude_code.PRE:
                await hook.post_tool_use()
                return web.Response(status=204)
            try:
                return answer(await hook.pre_tool_use(wait=wait))
            except ExternalError as exc:  # the bearer token, revoked since it was kept
                if exc.code != "unauthorized":
                    raise
                self.e.forget_caller(token)
                await self._token(request)  # the 401 (revoked), as for any request
                raise
        except ApiError as exc:
            if exc.status in (401, 403) or seen.kind != claude_code.PRE:
                return error(exc.status, exc.code, str(exc), exc.headers)
            return self._deny(seen.who, str(exc))
        except Exception as exc:
            if seen.kind != claude_code.PRE:
                return _failure(request, exc)
            return self._deny(seen.who, _said(exc),
                              bug=not isinstance(exc, ApprovaldError | _Undecided))

    def _deny(self, who: str, why: str, *, bug: bool = False) -> web.Response:
        """Fail closed: a deny saying why, never an allow."""
        log.warning("claude-code hook over HTTP (token %s): could not decide: %s", who, why,
                    exc_info=bug)
        return answer(claude_code.fail_closed(why))

    async def unknown(self, request: web.Request) -> web.StreamResponse:
        for pattern, method in _KNOWN:
            if pattern.fullmatch(request.path):
                return error(405, "method_not_allowed",
                             f"{request.method} {request.path}: use {method}",
                             {"Allow": method})
        return error(404, "unknown_request", f"{request.method} {request.path} is not part of "
                                             "the API (see /v1/openapi.json)")
