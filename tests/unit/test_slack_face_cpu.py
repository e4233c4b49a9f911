"""Issue 50: the Slack face's Python per approval, cut with no change in what it sends.

Each cut is pinned twice: what it produces is what the slower way produced (for every
value a property test can think of), and the calls it saves stay saved (exact counts,
taken with ``sys.setprofile``, never timings).
"""

from __future__ import annotations

import json
import math
import sys
from collections import Counter
from functools import partial
from typing import Any

import pytest
from approvald.bot.slack import cards
from approvald.bot.slack.mrkdwn import pretty_dumps
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import served
from tests.unit.test_cards import NOW, TOKEN, approval, decided
from tests.unit.test_click_cpu import _calls_during, counting_calls


async def _calls_awaiting(work: Any) -> Counter[str]:
    """The Python functions awaiting ``work()`` called (``_calls_during``'s, awaited)."""
    with counting_calls() as seen:
        await work()
    return seen


def _dumps(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


# keys and strings that need escapes: quotes, backslashes, controls, bidi controls, lone
# surrogates, astral characters, line separators
TEXT = st.text(st.one_of(st.characters(), st.sampled_from(
    ['"', "\\", "\n", "\x00", "\x1f", "\x7f", "\u2028", "\u202e", "\ud800", "\udfff", "😀",
     "é", ",", ":", "{", "[", " "])), max_size=12)
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.integers(-2**80, 2**80),
                    st.floats(allow_nan=True, allow_infinity=True), TEXT)
JSON = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=5), st.dictionaries(TEXT, inner, max_size=5)), max_leaves=40)


@settings(max_examples=300, deadline=None)
@given(JSON)
def test_pretty_dumps_is_json_dumps_indented_for_every_json_value(value: Any) -> None:
    assert pretty_dumps(value) == _dumps(value)


@settings(max_examples=300, deadline=None)
@given(st.recursive(
    st.one_of(SCALARS, st.just(NOW), st.just(b"x"), st.just(math.pi)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.lists(inner, max_size=4).map(tuple),
        st.dictionaries(st.one_of(TEXT, st.integers(), st.floats(), st.booleans(),
                                  st.none()), inner, max_size=4)), max_leaves=20))
def test_pretty_dumps_is_json_dumps_indented_beyond_json_too(value: Any) -> None:
    """Tuples, keys that are numbers, true or null, values that ``default=str`` turns into
    text: what json.dumps writes of them too."""
    assert pretty_dumps(value) == _dumps(value)


def test_pretty_dumps_leaves_the_rest_to_json_dumps_and_raises_what_it_raises() -> None:
    class Sub(dict[str, Any]):
        pass

    class Items(list[Any]):  # json's Python encoder iterates it; its C one would not
        def __iter__(self) -> Any:
            return iter([9])

    for value in (Sub(a=[1]), [Sub(a=1)], {"a": Items([1, 2])}, {1: [2]}, [{None: [2]}]):
        assert pretty_dumps(value) == _dumps(value)
    cycle: list[Any] = [1]
    cycle.append(cycle)
    for bad in (cycle, {"a": cycle}, {(1, 2): 1}, {"a": [{(1, 2): [1]}]}):
        raised: list[tuple[type, str]] = []
        for dumps in (_dumps, pretty_dumps):
            try:
                dumps(bad)
            except (TypeError, ValueError) as exc:
                raised.append((type(exc), str(exc)))
        assert len(raised) == 2 and raised[0] == raised[1], (bad, raised)


PURE_PYTHON_ENCODER = {f"json.encoder:{name}" for name in (
    "_make_iterencode", "_iterencode", "_iterencode_dict", "_iterencode_list")}


def test_a_card_s_arguments_are_written_by_json_s_c_encoder() -> None:
    """The card's pretty arguments do not run json's pure-Python encoder (json.dumps with
    ``indent`` does: a generator resumed for every piece), and read as they did."""
    args = {"order": "1234", "amount": 40.5, "note": "é \u202e <b>", "items": [
        {"sku": "a", "qty": 2}, {"sku": "b", "tags": []}], "ok": True, "none": None}
    raw = json.dumps(args)
    assert cards.args_text(raw) == cards.json_escapes(_dumps(args))
    for a in (approval(args=args), decided("approved")):
        seen = _calls_during(partial(cards.approval_card, a, token=None, now=NOW))
        assert not set(seen) & PURE_PYTHON_ENCODER, seen
    live = approval(args=args)
    seen = _calls_during(partial(cards.approval_card, live, token=TOKEN, now=NOW))
    assert not set(seen) & PURE_PYTHON_ENCODER, seen


SLACK_TEXT = st.text(st.one_of(st.characters(), st.sampled_from(
    ["&", "<", ">", "`", "*", "😀", "\u202e", "\ud800", "\u0301", "\n"])), max_size=40)


@settings(max_examples=200, deadline=None)
@given(SLACK_TEXT, st.integers(0, 3), st.lists(SLACK_TEXT, max_size=12))
def test_the_card_s_block_dicts_are_the_models_to_dict(text: str, times: int,
                                                        parts: list[str]) -> None:
    """``section_dict`` and the others make the dict that the model's ``to_dict`` made (or
    raise where it raised), short, empty or past Slack's limits."""
    from approvald.bot.slack.mrkdwn import (
        context,
        context_dict,
        header,
        header_dict,
        section,
        section_dict,
    )
    from slack_sdk.errors import SlackObjectFormationError

    long = text * (times * 800)  # past a section's 3,000 units, and a header's 150
    for fast, slow, arg in ((section_dict, section, text), (section_dict, section, long),
                            (header_dict, header, text), (header_dict, header, long),
                            (context_dict, context, parts), (context_dict, context,
                                                             [long, *parts])):
        try:
            want: Any = json.dumps(slow(arg).to_dict())  # type: ignore[operator]
        except SlackObjectFormationError as exc:
            want = type(exc)
        try:
            got: Any = json.dumps(fast(arg))  # type: ignore[operator]
        except SlackObjectFormationError as exc:
            got = type(exc)
        assert got == want, (fast.__name__, arg)


def test_cards_are_the_cards_the_models_made(monkeypatch: Any) -> None:
    """Every example card of test_approval_cards_are_the_dicts_to_dict_made, drawn with its
    blocks made as models and turned into dicts by ``to_dict``: the same JSON, key for
    key; and drawing a card makes no model at all (a live card's buttons are made once
    per shape)."""
    from approvald.bot.slack import mrkdwn

    from tests.unit.test_cards import cannot_run, packet, question, vote
    high = packet(risk="high")
    examples = [
        (approval(), TOKEN, []),
        (approval(args={"note": "a <b> & `c` ``d`` \u202e 😀 é\u0301"}), TOKEN, []),
        (approval(edited_args={"order": "1234", "amount": 40}), TOKEN, []),
        (decided("approved", reason="fine"), None, [vote("U0BOB")]),
        (decided("denied", reason="x" * 3000), None, [vote("U0BOB", verdict="deny")]),
        (approval(packet_=high), TOKEN, []),
        (approval(args={"blob": "y" * 6000}), TOKEN, []),
        (approval(packet_=packet(evidence=[{"tool": "t", "result": "r" * 400}] * 5,
                                 impact="i" * 600)), None, []),
        (question(), TOKEN, []), (cannot_run(), TOKEN, []),
        (question(status="approved"), None, []), (cannot_run(status="denied"), None, []),
    ]
    fast = [cards.approval_card(a, token=t, now=NOW, votes=v) for a, t, v in examples]
    made: Counter[str] = Counter()
    for a, t, v in examples:
        made += _calls_during(partial(cards.approval_card, a, token=t, now=NOW, votes=v))
    models = {name: n for name, n in made.items()
              if name.startswith("slack_sdk.models.") and name.endswith(":__init__")}
    assert models == {}, models
    monkeypatch.setattr(cards, "section_dict", lambda t: mrkdwn.section(t).to_dict())
    monkeypatch.setattr(cards, "header_dict", lambda t: mrkdwn.header(t).to_dict())
    monkeypatch.setattr(cards, "context_dict", lambda p: mrkdwn.context(p).to_dict())
    slow = [cards.approval_card(a, token=t, now=NOW, votes=v) for a, t, v in examples]
    assert json.dumps(fast) == json.dumps(slow)


@settings(max_examples=300, deadline=None)
@given(SLACK_TEXT, st.integers(-1, 60), st.integers(0, 3))
def test_clip_and_safe_cut_are_the_walk_s_answer(text: str, limit: int, times: int) -> None:
    """``clip`` and ``safe_cut`` answer short text without the walk: what it gave."""
    from approvald.bot.slack import texts
    from approvald.bot.slack.mrkdwn import _fit, clip, mask_text, safe_cut, units

    def reference_clip(text: str, limit: int) -> str:
        text = mask_text(text)
        shown, end = _fit(text, 0, limit, code=False)
        if end == len(text):
            return shown
        return _fit(text, 0, limit - 1, code=False)[0] + texts.ELLIPSIS

    text = text * times
    assert clip(text, limit) == reference_clip(text, limit)
    # safe_cut's shortcut (2 * len within the limit) answers what its units check answers
    for n in (limit, 2 * len(text), 2 * len(text) - 1, units(text), units(text) - 1):
        if n > 0:
            cut = safe_cut(text, n)
            assert (cut == text) is (units(text) <= n) or cut == text[:-1] + "…", n
            assert units(cut) <= n or cut == "…", n
            if 2 * len(text) <= n:
                assert units(text) <= n and cut == text, n


@settings(max_examples=300, deadline=None)
@given(st.lists(st.dictionaries(TEXT, st.one_of(TEXT, st.booleans(), st.integers(),
                                                st.lists(st.dictionaries(TEXT, TEXT,
                                                                         max_size=4),
                                                         max_size=4)),
                                max_size=6), max_size=6))
def test_json_dumps_is_json_dumps(blocks: list[dict[str, Any]]) -> None:
    from approvald.bot.slack.mrkdwn import json_dumps
    assert json_dumps(blocks) == json.dumps(blocks)


def test_a_card_s_short_texts_are_shown_without_the_walk() -> None:
    """A decided card (its texts short and plain) is drawn without ``_fit`` for each text
    ``clip`` shows, a ``units`` count per text or json.dumps: the card, counted."""
    a = decided("approved")
    cards.approval_card(a, token=None, now=NOW)
    seen = _calls_during(partial(cards.approval_card, a, token=None, now=NOW))
    assert seen["approvald.bot.slack.mrkdwn:_fit"] == 1  # the arguments' code block
    assert seen["approvald.bot.slack.mrkdwn:units"] == 2  # the arguments' title, the header
    assert seen["approvald.bot.slack.mrkdwn:safe_cut"] == 10
    assert seen["json:dumps"] == 0, seen
    assert seen["approvald.bot.slack.mrkdwn:within_text_budget"] == 1


async def test_the_slack_session_sends_json_dumps_text_in_one_c_call() -> None:
    """The face's Web API session serializes a ``json=`` body (every card) as json.dumps
    does, without json.dumps' three Python calls."""
    from approvald.bot.config import Settings
    from approvald.bot.slack.app import SlackWeb

    web = SlackWeb(Settings(SLACK_BOT_TOKEN="xoxb-test", SLACK_SIGNING_SECRET="s" * 32,
                            APPROVALD_CHANNEL="C1", APPROVALD_SECRET="k" * 32))
    web.open()
    try:
        assert web.http is not None
        serialize = web.http._json_serialize
        card = cards.approval_card(approval(), token=TOKEN, now=NOW)
        assert serialize(card) == json.dumps(card)
        seen = _calls_during(serialize, card)
        assert not [name for name in seen if name.startswith("json")], seen
    finally:
        await web.close()


def test_a_decision_is_counted_without_looking_its_label_up_again() -> None:
    """The meter's decision counter finds each outcome's child once; the exposition shows
    every decision counted, by outcome, as before."""
    from approvald.bot.metrics import PrometheusMeter
    from prometheus_client.exposition import generate_latest

    meter = PrometheusMeter()
    for outcome in ("approved", "denied", "approved", "refused:stale", "approved"):
        meter.decision(outcome, 0.01)
    seen = _calls_during(meter.decision, "approved", 0.02)
    assert seen["prometheus_client.metrics:labels"] == 0
    text = generate_latest(meter.registry).decode()
    assert 'approvald_decisions_total{outcome="approved"} 4.0' in text
    assert 'approvald_decisions_total{outcome="denied"} 1.0' in text
    assert 'approvald_decisions_total{outcome="refused:stale"} 1.0' in text
    assert "approvald_decision_seconds_count 6.0" in text


async def test_bolt_s_response_becomes_the_aiohttp_response_bolt_s_adapter_makes() -> None:
    """``transport.response`` is slack_bolt's ``to_aiohttp_response``: the same status,
    body, headers and cookies, for an ack and every other shape; an ack's without the
    adapter's cookie walk."""
    from approvald.bot.slack.transport import response
    from slack_bolt.adapter.aiohttp import to_aiohttp_response
    from slack_bolt.response import BoltResponse

    def shapes() -> list[BoltResponse]:
        return [
            BoltResponse(status=200, body=""),
            BoltResponse(status=200, body={"response_action": "errors", "errors": {"a": "b"}}),
            BoltResponse(status=404, body={"error": "unhandled request"}),
            BoltResponse(status=401, body="nope", headers={"X-A": "1", "x-b": ["2", "3"]}),
            BoltResponse(status=200, body="{}",
                         headers={"Content-Type": "text/html; charset=utf-8"}),
            BoltResponse(status=200, body="x", headers={
                "content-type": "a/b;charset=utf-8", "set-cookie": ["k=v; Max-Age=60; Path=/"]}),
        ]

    for ours, theirs in zip([await response(b) for b in shapes()],
                            [await to_aiohttp_response(b) for b in shapes()], strict=True):
        assert (ours.status, ours.text, ours.content_type, ours.charset) == (
            theirs.status, theirs.text, theirs.content_type, theirs.charset)
        assert list(ours.headers.items()) == list(theirs.headers.items())
        assert str(ours.cookies) == str(theirs.cookies)
    ack = BoltResponse(status=200, body="")
    seen = await _calls_awaiting(lambda: response(ack))
    assert seen["slack_bolt.response.response:cookies"] == 0
    assert seen["slack_bolt.adapter.aiohttp:to_aiohttp_response"] == 0
    assert seen["re:sub"] == 0


async def test_a_signed_click_s_ack_goes_out_without_bolt_s_adapter() -> None:
    import time

    from approvald.bot.slack.transport import RawBodyVerifier, events_handler
    from multidict import CIMultiDict, CIMultiDictProxy
    from slack_bolt.response import BoltResponse

    from tests.unit.test_slack_transport import BODIES

    secret = "s" * 32
    raw, content_type = BODIES["click"]
    body = raw.encode()
    stamp = str(int(time.time()))
    verifier = RawBodyVerifier(secret)
    signature = verifier.generate_signature(timestamp=stamp, body=body)

    class App:
        async def async_dispatch(self, req: Any) -> BoltResponse:
            return BoltResponse(status=200, body="")

    class Request:
        headers = CIMultiDictProxy(CIMultiDict({
            "Content-Type": content_type, "X-Slack-Request-Timestamp": stamp,
            "X-Slack-Signature": signature or ""}))
        query_string = ""

        def __init__(self) -> None:
            self.content_type = content_type.split(";")[0]

        async def read(self) -> bytes:
            return body

    events = events_handler(App(), verifier)  # type: ignore[arg-type]
    answers: list[Any] = []

    async def click() -> None:
        answers.append(await events(Request()))  # type: ignore[arg-type]

    seen = await _calls_awaiting(click)
    answer = answers[0]
    assert answer.status == 200
    assert seen["approvald.bot.slack.transport:response"] == 1
    assert seen["slack_bolt.adapter.aiohttp:to_aiohttp_response"] == 0


def _reference_slack_date(when: Any, tokens: str) -> str:
    """``mrkdwn.slack_date`` as it was: ``strftime`` for each token, by ``re.sub``."""
    import re
    from datetime import UTC

    from approvald.bot.slack import texts

    pattern = re.compile(r"\{(date_num|date|date_short|date_long|date_pretty|"
                         r"date_short_pretty|date_long_pretty|time|time_secs)\}")
    formats = {"time": "%H:%M UTC", "time_secs": "%H:%M:%S UTC"}
    when = (when if when.tzinfo else when.replace(tzinfo=UTC)).astimezone(UTC)
    if pattern.search(tokens):
        fallback = pattern.sub(
            lambda m: when.strftime(formats.get(m.group(1), "%Y-%m-%d")), tokens)
    else:
        fallback = when.strftime(texts.DATE_FALLBACK)
    fallback = fallback.replace("|", "/").replace(">", "")
    return f"<!date^{int(when.timestamp())}^{tokens}|{fallback}>"


DATE_TOKENS = ["{date_num}", "{date}", "{date_short}", "{date_long}", "{date_pretty}",
               "{date_short_pretty}", "{date_long_pretty}", "{time}", "{time_secs}"]


@settings(max_examples=300, deadline=None)
@given(st.datetimes(min_value=__import__("datetime").datetime(2, 1, 2),
                    timezones=st.one_of(st.none(), st.timezones())),
       st.lists(st.one_of(st.sampled_from(DATE_TOKENS), st.sampled_from(
           ["expires ", " at ", "{", "}", "{x}", "|", ">", "{time", "%Y", "{{date}}"]),
           st.text(max_size=4)), max_size=6))
def test_slack_date_is_strftime_s_answer(when: Any, parts: list[str]) -> None:
    from approvald.bot.slack import texts
    from approvald.bot.slack.mrkdwn import slack_date

    for tokens in ("".join(parts), texts.DATE_AT, texts.DATE_EXPIRES, texts.DATE_EXPIRED,
                   "{date}{x}", "{x} {time} }", "a { {date_num} }}|>", "{time_secs}{",
                   "no token {}", "%Y-%m-%d {date_long_pretty}"):
        assert slack_date(when, tokens) == _reference_slack_date(when, tokens), tokens


def test_a_card_s_dates_are_written_without_strftime() -> None:
    """A date's fallback words are written in slack_date itself: no Python call per token
    and no ``strftime`` (which parses its format again on every call)."""
    from approvald.bot.slack import texts
    from approvald.bot.slack.mrkdwn import slack_date

    slack_date(NOW, texts.DATE_AT)
    seen: Counter[str] = Counter()

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            seen[frame.f_code.co_name] += 1
        elif event == "c_call":
            seen[f"C:{getattr(arg, '__name__', arg)}"] += 1

    sys.setprofile(profile)
    try:
        slack_date(NOW, texts.DATE_AT)
        slack_date(NOW, texts.DATE_EXPIRES)
    finally:
        sys.setprofile(None)
    assert seen["slack_date"] == 2 and seen["C:strftime"] == 0, seen
    assert [name for name in seen if not name.startswith("C:")] == ["slack_date"], seen


def test_a_request_s_context_is_the_one_bolt_makes(monkeypatch: Any) -> None:
    """``FaceApp._init_context`` makes the context bolt's ``AsyncApp._init_context`` makes:
    the same keys and values, and a Web API client of the request's own with the same
    attributes (shared where bolt's shares them: the app's headers, session and logger;
    its own default parameters and retry handlers), without building a client."""
    from approvald.bot.slack.app import FaceApp
    from approvald.bot.slack.transport import parse
    from slack_bolt.async_app import AsyncApp
    from slack_sdk.web.async_client import AsyncWebClient

    from tests.unit.test_slack_transport import BODIES

    monkeypatch.delenv("HTTPS_PROXY", raising=False)  # the app's client read it at start
    monkeypatch.delenv("https_proxy", raising=False)
    monkeypatch.delenv("HTTP_PROXY", raising=False)
    monkeypatch.delenv("http_proxy", raising=False)
    app_client = AsyncWebClient(token=" xoxb-test ", base_url="http://127.0.0.1:9/api")
    app = FaceApp(name="app.py", client=app_client, signing_secret="s" * 32,
                  request_verification_enabled=False, process_before_response=True)
    raw, content_type = BODIES["click"]

    def request() -> Any:
        return parse(raw.encode(), content_type, "", {"Content-Type": content_type})

    for team in (None, "T0TEAM"):
        theirs, ours = request(), request()
        for r in (theirs, ours):
            if team is None:
                r.context.pop("team_id", None)
            else:
                r.context["team_id"] = team
        AsyncApp._init_context(app, theirs)
        seen = _calls_during(app._init_context, ours)
        assert seen["slack_sdk.web.async_base_client:__init__"] == 0
        assert seen["slack_sdk.web.internal_utils:get_user_agent"] == 0
        assert seen["slack_sdk.proxy_env_variable_loader:load_http_proxy_from_env"] == 0
        a, b = theirs.context, ours.context
        assert a.keys() == b.keys()
        assert {k: v for k, v in a.items() if k != "client"} == {
            k: v for k, v in b.items() if k != "client"}
        c, d = a["client"], b["client"]
        assert type(c) is type(d) and c is not d and d is not app_client
        assert vars(c).keys() == vars(d).keys()
        for name, value in vars(c).items():
            mine = vars(d)[name]
            assert mine == value, name
            if name in ("headers", "session", "_logger", "ssl"):
                assert mine is value, name
            if name in ("default_params", "retry_handlers"):
                assert mine is not value and mine is not getattr(app_client, name), name
        assert d.default_params == ({} if team is None else {"team_id": team})
        assert d.token == "xoxb-test"


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=48), st.text(max_size=24)),
       st.text("0123456789", min_size=1, max_size=12))
def test_a_request_s_signature_is_slack_sdk_s_over_its_raw_bytes(body: Any, stamp: str) -> None:
    """``RawBodyVerifier`` signs what slack_sdk's verifier signs (a UTF-8 body, bytes or
    text), and a body that is not UTF-8 as its bytes, with one call into C."""
    import hashlib
    import hmac

    from approvald.bot.slack.transport import RawBodyVerifier
    from slack_sdk.signature import SignatureVerifier

    secret = "8f742231b10e8888abcd99yyyzzz85a5"
    ours = RawBodyVerifier(secret).generate_signature(timestamp=stamp, body=body)
    try:
        theirs = SignatureVerifier(secret).generate_signature(timestamp=stamp, body=body)
    except UnicodeDecodeError:  # slack_sdk refuses the bytes; Slack signed them as they are
        theirs = "v0=" + hmac.new(secret.encode(), b"v0:" + stamp.encode() + b":" + body,
                                  hashlib.sha256).hexdigest()
    assert ours == theirs


def test_a_request_s_signature_is_checked_with_no_hmac_object() -> None:
    import time

    from approvald.bot.slack.transport import RawBodyVerifier, authentic

    verifier = RawBodyVerifier("s" * 32)
    body, stamp = b"payload=%7B%7D", str(int(time.time()))
    headers = {"X-Slack-Request-Timestamp": stamp,
               "X-Slack-Signature": verifier.generate_signature(timestamp=stamp, body=body)
               or ""}
    assert authentic(verifier, body, headers)
    assert not authentic(verifier, body + b" ", headers)
    seen = _calls_during(authentic, verifier, body, headers)
    assert seen["hmac:new"] == seen["hmac:__init__"] == 0, seen
    assert seen["hmac:digest"] == 1, seen


async def test_an_ack_goes_out_as_bolt_s_adapter_sends_it_with_no_payload_object() -> None:
    """The bytes on the wire are the adapter's (but for the date), for an ack and every
    other shape; an ack's body is given as bytes, not as text for a payload object."""
    import asyncio

    from aiohttp import web
    from approvald.bot.slack.transport import response
    from slack_bolt.adapter.aiohttp import to_aiohttp_response
    from slack_bolt.response import BoltResponse

    shapes = [lambda: BoltResponse(status=200, body=""),
              lambda: BoltResponse(status=200, body={"response_action": "errors",
                                                     "errors": {"a": "b é ✓"}}),
              lambda: BoltResponse(status=404, body={"error": "unhandled request"}),
              lambda: BoltResponse(status=401, body="nope é", headers={"X-A": "1"}),
              lambda: BoltResponse(status=200, body="{}",
                                   headers={"Content-Type": "text/html; charset=utf-8"}),
              lambda: BoltResponse(status=200, body="x", headers={
                  "set-cookie": ["k=v; Max-Age=60; Path=/"]})]

    async def handle(request: web.Request) -> web.StreamResponse:
        made = shapes[int(request.match_info["i"])]()
        return await (response if request.match_info["who"] == "ours"
                      else to_aiohttp_response)(made)

    app = web.Application()
    app.router.add_get("/{who}/{i}", handle)

    async def wire(port: int, path: str) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        got = await reader.read()
        writer.close()
        return b"\r\n".join(line for line in got.split(b"\r\n")
                            if not line.startswith(b"Date: "))

    async with served(app) as port:
        for i in range(len(shapes)):
            assert await wire(port, f"/ours/{i}") == await wire(port, f"/theirs/{i}"), i
    seen = await _calls_awaiting(lambda: response(BoltResponse(status=200, body="")))
    assert seen["aiohttp.payload:get"] == seen["aiohttp.payload:__init__"] == 0, seen


# the stored arguments a card shows, as every edge reads them: none, empty, not JSON, not
# an object, plain, a declared path, what the detectors find, nested
STORED_ARGS = [None, "", "{}", "[1, 2]", "not json", '"text"', '{"order": "1234", "n": 42}',
               '{"card": "4242 4242 4242 4242", "service": "web"}',
               '{"note": "key sk_live_4eC39HqLyjWDarjtT1zdp7dc9f2a here"}',
               '{"a": {"card": "4242 4242 4242 4242", "b": [1, "x"]}}',
               '"sk_live_4eC39HqLyjWDarjtT1zdp7dc9f2a"', '["sk_live_4eC39HqLyjWDarjtT1zdp7dc9f2a"]']


@pytest.mark.parametrize("raw", STORED_ARGS)
@pytest.mark.parametrize("sensitive", [(), ("card",), ("a.card",)])
def test_a_card_s_arguments_are_read_once_for_their_text_and_their_mask(
        raw: str | None, sensitive: tuple[str, ...]) -> None:
    """Issue 50: ``_args_shown`` is ``args_text`` and ``shows_masked`` of the same stored
    JSON, which it reads and masks once."""
    assert cards._args_shown(raw, sensitive) == (
        cards.args_text(raw, sensitive=sensitive),
        raw is not None and cards.shows_masked(raw, sensitive))


def test_a_decided_card_reads_its_arguments_and_its_outcome_once() -> None:
    """Exact, for the card an approval's update draws (and one approved with edits): each
    stored JSON of arguments is masked once (for its text and for the "masked" note, twice
    before), the outcome's words are read once (four times before), and the agent's name
    only where the card says it (the fallback of a decided card does not)."""
    from dataclasses import replace

    a = decided("approved", args={"service": "web"})
    edited = decided("approved", args={"card": "4242 4242 4242 4242"},
                     edited_args={"card": "5555 5555 5555 4444"},
                     policy={"approvers": ["U0BOB"], "sensitive": ["card"]})
    for record, stored in ((a, 1), (edited, 2), (replace(a, status="denied"), 1)):
        seen = _calls_during(lambda r=record: cards.approval_card(r, token=None, now=NOW))
        assert seen["approvald.runtime.policies.sensitive:masked_json"] == stored, seen
        assert seen["approvald.runtime.kernel.vocabulary:word"] == 1, seen
        assert seen["approvald.runtime.requests.packet:asker"] == 1, seen
        # the note that arguments are shown masked stands where masked() says
        card = cards.approval_card(record, token=None, now=NOW)
        shown = [b["text"]["text"] for b in card["blocks"] if b["type"] == "section"
                 and b["text"]["text"].startswith((cards.T.SECTION_ARGS,
                                                   cards.T.SECTION_ARGS_ORIGINAL))]
        noted = cards.T.ARGS_MASKED in shown[0]
        assert noted == cards.masked(record) == (record is edited), card["blocks"]
