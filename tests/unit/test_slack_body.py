"""bot.slack_body parses a Slack request body exactly as bolt's own parser does."""

from __future__ import annotations

import json
from urllib.parse import quote_plus, unquote_plus, urlencode

import pytest
from approvald.bot.slack.body import parse_body, unquote_form
from hypothesis import given, settings
from hypothesis import strategies as st
from slack_bolt.request.internals import parse_body as bolt_parse_body

# what form bodies are made of, '%' escapes (well-formed or not) and backslashes included
PIECES = st.one_of(st.text(max_size=6), st.sampled_from(
    ["%", "%4", "%41", "%zz", "%e2%82%ac", "%E2%82", "%ff", "%5C", "\\", "\\x41", "+", "&",
     "=", "&&", "payload", "%2B", ";"]))
RAW = st.lists(PIECES, max_size=12).map("".join)


@settings(max_examples=400, deadline=None)
@given(RAW)
def test_unquote_matches_urllib(value: str) -> None:
    assert unquote_form(value) == unquote_plus(value)


@settings(max_examples=400, deadline=None)
@given(RAW)
def test_any_form_body_parses_as_bolt_parses_it(body: str) -> None:
    try:
        expected = bolt_parse_body(body, None)
    except ValueError:  # a 'payload' field that is not JSON: both refuse it
        with pytest.raises(ValueError):
            parse_body(body, None)
        return
    assert parse_body(body, None) == expected


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(max_size=8), st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                max_size=3), max_leaves=10),
    max_size=5))
def test_an_interaction_payload_round_trips(payload: dict[str, object]) -> None:
    body = urlencode({"payload": json.dumps(payload, ensure_ascii=False)})
    assert parse_body(body, "application/x-www-form-urlencoded") == payload == \
        bolt_parse_body(body, "application/x-www-form-urlencoded")


def test_json_and_empty_bodies() -> None:
    assert parse_body("", None) == {}
    assert parse_body('{"type": "url_verification"}', None) == {"type": "url_verification"}
    assert parse_body('["x"]', "application/json") == ["x"]  # the caller refuses a non-object
    body = "command=%2Fapprovald&text=" + quote_plus("list & more")
    assert parse_body(body, None) == {"command": "/approvald", "text": "list & more"}
