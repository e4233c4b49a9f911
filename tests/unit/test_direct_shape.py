"""Issue 50: the direct front (``bot/slack/direct.py``) takes a click only where bolt's
dispatch would have done nothing it skips: bolt reads the body's context without raising
(``plain_context``: else bolt answers, a 400 where it raises) and its clicks middleware
would run the same listener without raising on the way (``listener_for``). Checked on
bodies of every shape the fields bolt reads can take, nested as bolt descends into them."""

from __future__ import annotations

from typing import Any

import pytest
from approvald.bot.slack.direct import DirectClicks, plain_context
from hypothesis import given, settings
from hypothesis import strategies as st
from slack_bolt.context.async_context import AsyncBoltContext
from slack_bolt.request.async_internals import build_async_context
from slack_bolt.request.internals import extract_team_id

# every field bolt's context reads, at any depth
KEYS = ["type", "user", "channel", "team", "enterprise", "authorizations", "event", "message",
        "previous_message", "assistant_thread", "response_url", "response_urls", "thread_ts",
        "view", "is_enterprise_install", "enterprise_id", "team_id", "user_id", "channel_id",
        "item", "function_execution_id", "function_data", "bot_access_token", "inputs",
        "is_ext_shared_channel", "app_installed_team_id", "user_team", "id", "actions",
        "action_id", "block_actions"]
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2, 2), st.sampled_from(
    ["", "id", "T1", "E1", "U1", "C1", "event_callback", "block_actions", "approve", "true"]))
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(KEYS), inner, max_size=5)),
    max_leaves=12)
CLICK: dict[str, Any] = {
    "type": "block_actions", "user": {"id": "U1", "name": "u", "team_id": "T1"},
    "team": {"id": "T1"}, "enterprise": None, "channel": {"id": "C1"},
    "message": {"ts": "1.2", "text": "a card"}, "response_url": "https://hooks.example/r",
    "actions": [{"action_id": "approve", "value": "v"}], "container": {"type": "message"}}
# the fields the front looks at, and those bolt descends into
TOP = ["user", "channel", "team", "enterprise", "authorizations", "event", "message",
       "previous_message", "assistant_thread", "response_urls", "item", "view",
       "function_data", "user_id", "channel_id", "team_id"]
# a click with a field or two of those replaced by anything, some of its own dropped
BODIES = st.builds(lambda changes, drop: {
    **{k: v for k, v in CLICK.items() if k not in drop}, **changes},
    st.dictionaries(st.sampled_from(TOP), VALUES, max_size=2),
    st.sets(st.sampled_from(list(CLICK)), max_size=2))


def _listener(*args: Any) -> Any:
    raise AssertionError("not called")


@settings(max_examples=1000, deadline=None)
@given(BODIES)
def test_a_body_the_front_takes_is_one_bolt_reads_without_raising(body: dict[str, Any]) -> None:
    try:
        bolt = build_async_context(AsyncBoltContext({}), body)
    except Exception:
        raised = True
    else:
        raised = False
    if plain_context(body):
        assert not raised, body
        # the request's client gets the team id bolt's context holds
        assert bolt.team_id == (extract_team_id(body) or None)
    clicks = DirectClicks({"approve": _listener})
    taken = clicks.listener_for(body)
    if taken is not None:  # the middleware's own lookup finds it, without raising
        assert body["type"] == "block_actions"
        assert clicks.listeners.get(body["actions"][0]["action_id"]) is taken


@pytest.mark.parametrize("change", [
    {"user": {"name": "no id"}}, {"user": "U1"}, {"user": None}, {"channel": None},
    {"channel": {"name": "no id"}}, {"channel": ["id"]}, {"team": 7}, {"team": ["id"]},
    {"enterprise": True}, {"authorizations": []}, {"event": {"type": "x"}},
    {"response_urls": []}, {"message": {"message": {}}}, {"previous_message": {}},
    {"assistant_thread": {}}])
def test_the_shapes_the_front_leaves_to_bolt(change: dict[str, Any]) -> None:
    assert plain_context(CLICK)
    assert not plain_context({**CLICK, **change})


def test_a_message_nested_past_the_stack_is_left_to_bolt_which_refuses_it() -> None:
    """bolt descends into a message's message for a thread's ts: one nested deeper than
    the stack allows raises there (the transport's 400), so the front never takes one."""
    import sys

    deep: dict[str, Any] = {"ts": "1.2"}
    for _ in range(sys.getrecursionlimit()):
        deep = {"message": deep}
    body = {**CLICK, "message": deep}
    with pytest.raises(RecursionError):
        build_async_context(AsyncBoltContext({}), body)
    assert not plain_context(body)


@pytest.mark.parametrize("actions", [None, [], "approve", ["approve"], [{}],
                                     [{"action_id": ["approve"]}], [{"action_id": "deny"}]])
def test_the_actions_the_front_leaves_to_bolt(actions: Any) -> None:
    clicks = DirectClicks({"approve": _listener})
    assert clicks.listener_for(CLICK) is _listener
    assert clicks.listener_for({**CLICK, "actions": actions}) is None
    assert clicks.listener_for({**CLICK, "type": "interactive_message"}) is None


def test_the_front_stands_aside_on_a_bolt_without_a_name_it_relies_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The private names of bolt's app the front reads are there (slack-bolt is bounded
    below 2 in pyproject.toml); on a release without one, the front stays off and bolt's
    dispatch answers every click."""
    from approvald.bot.slack import direct
    from slack_bolt.async_app import AsyncApp

    clicks = DirectClicks({"approve": _listener})
    ours = AsyncApp(name="t", token="xoxb-t", signing_secret="s" * 32,
                    request_verification_enabled=False, ignoring_self_events_enabled=False,
                    attaching_function_token_enabled=False)
    ours.use(clicks)
    assert direct.missing(ours) == []
    assert direct.DirectFront(ours, clicks).enabled
    monkeypatch.setattr(direct, "RELIES_ON", (*direct.RELIES_ON, "_gone"))
    assert direct.missing(ours) == ["_gone"]
    assert not direct.DirectFront(ours, clicks).enabled
