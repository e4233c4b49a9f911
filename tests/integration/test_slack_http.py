"""POST /slack/events over real HTTP with raw bodies: the signature is checked on the raw
bytes before anything parses them. Unauthenticated -> 401, authenticated but malformed ->
400, too large -> 413; never a 500, never a traceback, never a change in the database."""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import aiohttp
import pytest
from aiohttp import web
from approvald.bot.slack import cards
from approvald.bot.slack.app import MAX_REQUEST_BYTES

from tests.helpers import Rows
from tests.integration.slack_harness import CHANNEL, SECRET, Harness, harness, wait_for

FORM = "application/x-www-form-urlencoded"
NESTED = b"payload=" + b"[" * 100_000


def sign(body: bytes, timestamp: str, secret: str = SECRET) -> str:
    """Slack's signature: v0= + hex HMAC-SHA256(secret, "v0:{timestamp}:{raw body}").

    The same as bot/sandbox/client.py, but over the bytes, so bodies that are not UTF-8
    can be signed too.
    """
    base = b"v0:" + timestamp.encode() + b":" + body
    return "v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()


def now() -> str:
    return str(int(time.time()))


def signed(body: bytes, *, timestamp: str | None = None, secret: str = SECRET,
           content_type: str = FORM) -> dict[str, str]:
    ts = timestamp if timestamp is not None else now()
    return {"Content-Type": content_type, "X-Slack-Request-Timestamp": ts,
            "X-Slack-Signature": sign(body, ts, secret)}


def approve_click(h: Harness, approval: Any) -> bytes:
    """A genuine Approve click on the pending card: accepted, it would decide the approval."""
    payload = h.slack.envelope_for_click(cards.APPROVE, h.value(approval), user_id="U_ALICE",
                                         channel_id=CHANNEL, message_ts=approval.message_ts)
    return urlencode({"payload": json.dumps(payload)}).encode()


def _unsigned(body: bytes) -> dict[str, str]:
    return {"Content-Type": FORM}


def _stale(body: bytes) -> dict[str, str]:
    return signed(body, timestamp=str(int(time.time()) - 600))


def _future(body: bytes) -> dict[str, str]:
    return signed(body, timestamp=str(int(time.time()) + 600))


def _forged(body: bytes) -> dict[str, str]:
    return signed(body, secret=f"forged-{SECRET}")


def _timestamp(ts: str) -> Callable[[bytes], dict[str, str]]:
    return lambda body: signed(body, timestamp=ts)


def _signature_only(body: bytes) -> dict[str, str]:
    headers = signed(body)
    del headers["X-Slack-Request-Timestamp"]
    return headers


def _timestamp_only(body: bytes) -> dict[str, str]:
    headers = signed(body)
    del headers["X-Slack-Signature"]
    return headers


def _uppercase_signature(body: bytes) -> dict[str, str]:
    headers = signed(body)
    headers["X-Slack-Signature"] = headers["X-Slack-Signature"].upper()
    return headers


# name -> (body, or None for a genuine Approve click; headers for that body)
UNAUTHENTICATED: dict[str, tuple[bytes | None, Callable[[bytes], dict[str, str]]]] = {
    "nested-unsigned": (NESTED, _unsigned),
    "not-utf8-unsigned": (b"payload=\xff\xfe\xfd", _unsigned),
    "missing-headers": (None, _unsigned),
    "timestamp-abc": (None, _timestamp("abc")),
    "timestamp-5000-digits": (None, _timestamp("1" * 5000)),
    "timestamp-empty": (None, _timestamp("")),
    "stale-10-minutes": (None, _stale),
    "future-10-minutes": (None, _future),
    "wrong-signature": (None, _forged),
    "signature-without-timestamp": (None, _signature_only),
    "timestamp-without-signature": (None, _timestamp_only),
    "signature-not-hex": (None, _uppercase_signature),
    "nested-forged": (NESTED, _forged),
}

MALFORMED: dict[str, tuple[bytes, str]] = {
    "nested-form": (NESTED, FORM),
    "nested-json": (b"[" * 100_000, "application/json"),
    "malformed-json-payload": (b"payload=%7Bnot+json", FORM),
    "payload-not-an-object": (b"payload=123", FORM),
    "json-list": (b"[1, 2, 3]", "application/json"),
    "not-utf8": (b"payload=\xff\xfe\xfd", FORM),
}


async def post(h: Harness, body: bytes, headers: dict[str, str]) -> tuple[int, str]:
    url = f"http://127.0.0.1:{h.service.slack.port}/slack/events"
    # a BytesIO, not bytes: aiohttp warns (an error here) about large raw bodies
    async with aiohttp.ClientSession() as session, \
            session.post(url, data=io.BytesIO(body), headers=headers) as resp:
        return resp.status, await resp.text()


async def snapshot(h: Harness, approval_id: str) -> tuple[str, list[Any], tuple[int, str]]:
    await h.service.slack.handlers.drain()  # any work a listener handed off is done
    return await Rows.of(h.engine).request_state(approval_id)


def assert_no_traceback(caplog: pytest.LogCaptureFixture) -> None:
    bad = [r for r in caplog.records if r.levelno >= logging.ERROR and r.exc_info]
    assert not bad, [r.getMessage() for r in bad]


async def _pending(h: Harness) -> Any:
    paused = await h.pause_refund()
    [aid] = paused.approval_ids
    await h.card(aid)  # delivery done: nothing else moves the database from here
    return await h.approval(aid)


@pytest.mark.parametrize("case", list(UNAUTHENTICATED))
async def test_unauthenticated_gets_401_and_changes_nothing(sqlite_url: str, tmp_path: Path,
                                                           caplog: pytest.LogCaptureFixture,
                                                           case: str) -> None:
    async with harness(sqlite_url, tmp_path) as h:
        a = await _pending(h)
        before = await snapshot(h, a.id)
        assert before[:2] == ("pending", [])
        body, headers = UNAUTHENTICATED[case]
        body = approve_click(h, a) if body is None else body
        status, text = await post(h, body, headers(body))
        assert status == 401, text
        assert await snapshot(h, a.id) == before
        assert h.refunds() == []
    assert_no_traceback(caplog)


@pytest.mark.parametrize("case", list(MALFORMED))
async def test_signed_but_malformed_gets_400_and_changes_nothing(
        sqlite_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture, case: str) -> None:
    async with harness(sqlite_url, tmp_path) as h:
        a = await _pending(h)
        before = await snapshot(h, a.id)
        body, content_type = MALFORMED[case]
        status, text = await post(h, body, signed(body, content_type=content_type))
        assert status == 400, text
        assert json.loads(text) == {"ok": False, "error": "malformed request"}
        assert await snapshot(h, a.id) == before
    assert_no_traceback(caplog)


@pytest.mark.parametrize("sign_it", [True, False])
async def test_too_large_gets_413_and_changes_nothing(sqlite_url: str, tmp_path: Path,
                                                      caplog: pytest.LogCaptureFixture,
                                                      sign_it: bool) -> None:
    async with harness(sqlite_url, tmp_path) as h:
        a = await _pending(h)
        before = await snapshot(h, a.id)
        body = b"payload=" + b"[" * MAX_REQUEST_BYTES
        status, _ = await post(h, body, signed(body) if sign_it else _unsigned(body))
        assert status == 413
        assert await snapshot(h, a.id) == before
    assert_no_traceback(caplog)


async def test_a_signed_real_click_still_works(sqlite_url: str, tmp_path: Path,
                                               caplog: pytest.LogCaptureFixture) -> None:
    async with harness(sqlite_url, tmp_path) as h:
        a = await _pending(h)
        # first refused and malformed requests, then the genuine click on the same server
        assert (await post(h, NESTED, _unsigned(NESTED)))[0] == 401
        assert (await post(h, NESTED, signed(NESTED)))[0] == 400
        body = approve_click(h, a)
        status, _ = await post(h, body, signed(body))
        assert status == 200
        run = await wait_for(lambda: _completed(h, a.run_id), what="the run to complete")
        assert "was issued" in run.result
        assert (await h.approval(a.id)).status == "approved"
        assert len(h.refunds()) == 1
        challenge = await h.slack.url_verification("ch-1")  # signed by the emulator client
        assert challenge.status == 200 and "ch-1" in challenge.body
    assert_no_traceback(caplog)


async def _completed(h: Harness, run_id: str) -> Any:
    run = await h.run(run_id)
    return run if run.status == "completed" else None


async def test_without_a_signing_secret_the_route_refuses_everything(
        sqlite_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # Socket Mode only: bolt verifies nothing, so the HTTP route must not dispatch anything
    async with harness(sqlite_url, tmp_path, SLACK_APP_TOKEN="xapp-approvald-test",
                       SLACK_SIGNING_SECRET=None) as h:
        await h.emulator.wait_connected(5)
        a = await _pending(h)
        before = await snapshot(h, a.id)
        runner = web.AppRunner(h.service.slack.web_app(), access_log=None)
        await runner.setup()
        try:
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            url = f"http://127.0.0.1:{port}/slack/events"
            body = approve_click(h, a)
            async with aiohttp.ClientSession() as session:
                for headers in (signed(body), _unsigned(body)):
                    async with session.post(url, data=body, headers=headers) as resp:
                        assert resp.status == 401
                async with session.get(f"http://127.0.0.1:{port}/healthz") as resp:
                    assert resp.status == 200
        finally:
            await runner.cleanup()
        assert await snapshot(h, a.id) == before
    assert_no_traceback(caplog)


async def test_bolt_gets_http_requests_only_after_the_one_signature_check(
        sqlite_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 47: the transport checks the signature (bolt's own check is switched off the way
    bolt documents it, not skipped by labelling the request Socket Mode). An unsigned, a
    forged and a stale-signed click are refused with 401 before bolt sees them and change
    nothing; the genuine one reaches bolt as an HTTP-mode request holding the raw body."""
    from slack_bolt.request.async_request import AsyncBoltRequest

    async with harness(sqlite_url, tmp_path) as h:
        a = await _pending(h)
        before = await snapshot(h, a.id)
        app = h.service.slack.app
        dispatched: list[AsyncBoltRequest] = []
        dispatch = app.async_dispatch

        async def spy(req: AsyncBoltRequest) -> Any:
            dispatched.append(req)
            return await dispatch(req)

        app.async_dispatch = spy  # type: ignore[method-assign]
        body = approve_click(h, a)
        for refused in (_unsigned, _forged, _stale):
            status, text = await post(h, body, refused(body))
            assert (status, json.loads(text)) == (401, {"ok": False,
                                                        "error": "invalid signature"})
        assert dispatched == []
        assert await snapshot(h, a.id) == before
        assert h.refunds() == []
        # the genuine click as bolt's dispatch gets it: with serve's auth.test answer in
        # bolt's authorization an Approve is answered in front of the dispatch
        # (bot/slack/direct.py, tests/integration/test_direct_front.py), so that is off here
        h.service.slack.front.enabled = False
        status, _ = await post(h, body, signed(body))
        assert status == 200
        [req] = dispatched
        assert (req.mode, req.raw_body) == ("http", body.decode())
        assert (await wait_for(lambda: _completed(h, a.run_id), what="the run")).status \
            == "completed"
    assert_no_traceback(caplog)
