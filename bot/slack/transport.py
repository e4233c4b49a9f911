"""Slack's HTTP requests in, bolt's answers out: conversion, and the one signature check.

``POST /slack/events`` reads the raw bytes and checks Slack's signature and timestamp on
them before anything parses the body (:func:`authentic`): an unauthenticated request gets
401 and is never parsed; an authenticated one that does not parse gets 400; neither
reaches bolt. What is authentic becomes an HTTP-mode bolt request (:class:`SignedRequest`)
and is dispatched; bolt's response becomes aiohttp's.

The check is made here, once, and bolt is told so the way its documentation says: an
``AsyncApp`` built with ``request_verification_enabled=False`` ("if you have a proxy that
verifies request signature in front of the Bolt app, it's totally fine to disable
RequestVerification to avoid duplication of work"). This transport is that check in front
of the app; nothing else hands bolt an HTTP request. Socket Mode requests come over the
websocket bolt's own handler opened with the app token, and bolt never checks those.
"""

from __future__ import annotations

import hmac
import logging
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from aiohttp import web
from approvald.bot.slack.body import parse_body
from slack_bolt.adapter.aiohttp import to_aiohttp_response
from slack_bolt.async_app import AsyncApp
from slack_bolt.context.async_context import AsyncBoltContext
from slack_bolt.request.async_internals import build_async_context
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_bolt.request.internals import extract_content_type, parse_query
from slack_bolt.response import BoltResponse
from slack_sdk.signature import SignatureVerifier

if TYPE_CHECKING:
    from approvald.bot.slack.direct import DirectFront

log = logging.getLogger("approvald.slack")

# Slack's timestamp is Unix seconds in ASCII digits; anything else (a sign, spaces, other
# scripts' digits, thousands of digits that int() refuses) is simply not a valid request
_TIMESTAMP = re.compile(r"[0-9]{1,16}")
# slack_sdk's compare_digest raises on non-ASCII text, so the shape is checked first
_SIGNATURE = re.compile(r"v0=[0-9a-f]{64}")
# What parsing a signed but malformed body can raise, in bolt's parse_body (json, form) or in
# the context it extracts from the parsed body (a list or a string where a dict belongs)
_UNPARSEABLE = (ValueError, TypeError, AttributeError, LookupError, RecursionError)


class RawBodyVerifier(SignatureVerifier):
    """slack_sdk's verifier (timestamp window, constant-time compare) over the raw bytes.

    slack_sdk decodes a bytes body as UTF-8 before hashing and raises on one that is not;
    Slack signs the bytes, so those are hashed as they are (for a UTF-8 body, the bytes
    slack_sdk encodes back), and an authentic body that is not UTF-8 is told apart from a
    forged one (400, not 401). The digest is one call into ``hmac.digest`` (C), not an
    ``hmac.HMAC`` object's five Python calls, each request.
    """

    def generate_signature(self, *, timestamp: str, body: str | bytes) -> str | None:
        if timestamp is None:
            return None
        if not isinstance(body, bytes):
            body = (body or "").encode()
        base = f"v0:{timestamp}:".encode() + body
        return "v0=" + hmac.digest(self.signing_secret.encode(), base, "sha256").hex()


def authentic(verifier: SignatureVerifier | None, body: bytes,
              headers: Mapping[str, str]) -> bool:
    """Whether ``body`` is signed by Slack under a timestamp within five minutes.

    The window is slack_sdk's, on the system clock (Slack's timestamps are real time).
    Reads only the two headers and hashes the bytes: nothing here parses the body, so an
    unauthenticated request costs one HMAC whatever it holds.
    """
    timestamp = headers.get("X-Slack-Request-Timestamp")
    signature = headers.get("X-Slack-Signature")
    if verifier is None or timestamp is None or signature is None:
        return False
    if not _TIMESTAMP.fullmatch(timestamp) or not _SIGNATURE.fullmatch(signature):
        return False
    return verifier.is_valid(body=body, timestamp=timestamp, signature=signature)


class SignedRequest(AsyncBoltRequest):
    """An HTTP-mode bolt request for an authenticated body: what bolt itself builds from
    ``raw`` (the same attributes: ``raw_body``, ``body``, ``context``, ``headers``...), made
    once. Bolt's constructor would parse ``raw`` again with its urllib loop (or, handed an
    empty body to skip that, build a context of nothing first and another after); here the
    body is parsed once, by :func:`approvald.bot.slack.body.parse_body` (bolt's parse with
    the percent-decoding done in C), the headers arrive normalized (names lowercased, each
    value a list, as bolt's ``build_normalized_headers`` makes them) and the context is
    built once, by bolt's own ``build_async_context``.

    ``tests/unit/test_slack_transport.py`` checks every attribute against bolt's own
    construction.
    """

    def __init__(self, *, raw: str, body: dict[str, Any], query: str,
                 headers: dict[str, Sequence[str]]) -> None:
        # bolt's __init__ is not called: it would parse or build what is set here
        self.raw_body = raw
        self.query = parse_query(query) if query else {}
        self.headers = headers
        self.content_type = extract_content_type(headers)
        self.body = body
        self.context = build_async_context(AsyncBoltContext({}), body)
        self.lazy_only = bool(headers.get("x-slack-bolt-lazy-only", [False])[0])
        self.lazy_function_name = headers.get("x-slack-bolt-lazy-function-name", [None])[0]
        self.mode = "http"


def signed_body(raw: bytes, content_type: str | None) -> tuple[str, dict[str, Any]]:
    """The text and the parsed body of an authenticated ``raw`` body; raises one of
    ``_UNPARSEABLE`` when it is not a JSON object or a form."""
    text = raw.decode("utf-8")
    body = parse_body(text, content_type)
    if not isinstance(body, dict):
        raise TypeError("not a JSON object or a form")
    return text, body


def signed_request(text: str, body: dict[str, Any], query: str,
                   headers: Mapping[str, str]) -> SignedRequest:
    """The bolt request of a body :func:`signed_body` parsed; raises one of
    ``_UNPARSEABLE`` when bolt cannot read its context out of it."""
    # names lowercased, each value a list, a repeated header's last value: what bolt makes
    # of a multidict itself
    plain: dict[str, Sequence[str]] = {name.lower(): [value] for name, value in headers.items()}
    return SignedRequest(raw=text, body=body, query=query, headers=plain)


def parse(raw: bytes, content_type: str | None, query: str,
          headers: Mapping[str, str]) -> SignedRequest:
    """The bolt request for an authenticated ``raw`` body; raises one of ``_UNPARSEABLE``
    when it is not a JSON object or a form."""
    text, body = signed_body(raw, content_type)
    return signed_request(text, body, query, headers)


def _malformed(exc: BaseException) -> web.Response:
    # no traceback: the body is the sender's fault
    log.warning("a signed Slack request did not parse: %s", type(exc).__name__)
    return web.json_response({"ok": False, "error": "malformed request"}, status=400)


def events_handler(app: AsyncApp, verifier: SignatureVerifier | None,
                   front: DirectFront | None = None
                   ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """The aiohttp handler of ``POST /slack/events`` for ``app`` (built with
    ``request_verification_enabled=False``). Without a verifier (no signing secret: Socket
    Mode alone) nothing sent here can be authenticated: every request gets the 401 a forged
    one gets. ``front``: the direct buttons answered before bolt's dispatch, with bolt's
    answer (:class:`~approvald.bot.slack.direct.DirectFront`)."""

    async def events(request: web.Request) -> web.StreamResponse:
        raw = await request.read()  # past client_max_size aiohttp answers 413 itself
        if not authentic(verifier, raw, request.headers):
            log.debug("refused a Slack request without a valid signature")
            return web.json_response({"ok": False, "error": "invalid signature"},
                                     status=401)
        try:  # authentic from here on: only now is the body decoded and parsed
            text, body = signed_body(raw, request.content_type)
        except _UNPARSEABLE as exc:
            return _malformed(exc)
        query = request.query_string
        if front is not None:
            answer = await front.answer(
                body, lambda: signed_request(text, body, query, request.headers))
            if answer is not None:
                return await response(answer)
        try:
            bolt_request = signed_request(text, body, query, request.headers)
        except _UNPARSEABLE as exc:
            return _malformed(exc)
        return await response(await app.async_dispatch(bolt_request))

    return events


_CHARSET = re.compile(r";\s*charset=utf-8")  # what to_aiohttp_response takes off


async def response(bolt_resp: BoltResponse) -> web.Response:
    """``to_aiohttp_response(bolt_resp)``: the same response; one with no cookie (every
    ack) made here without its two walks of the headers, its cookie parse and its
    ``re.sub`` compiled again (``tests/unit/test_slack_face_cpu.py`` compares them)."""
    headers = bolt_resp.headers
    if "set-cookie" in headers:
        return await to_aiohttp_response(bolt_resp)
    content_type = headers.pop(
        "content-type", ["application/json" if bolt_resp.body.startswith("{") else "text/plain"]
    )[0]
    # the text as the bytes aiohttp's StringPayload would make of it (UTF-8), given as
    # bytes: the same response without a payload object's six Python calls
    return web.Response(status=bolt_resp.status, body=bolt_resp.body.encode(),
                        headers={k: list(v)[0] for k, v in headers.items()},  # noqa: RUF015
                        content_type=_CHARSET.sub("", content_type))
