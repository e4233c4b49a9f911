"""A modal's inputs in the Slack emulator: the state Slack sends on submit (what each input
was drawn with, or what the user chose), and Slack's limits on radio buttons and selects."""

from __future__ import annotations

from typing import Any

import pytest
from approvald.bot.sandbox.blocks import block_problems
from approvald.bot.sandbox.client import SlackClientSim
from approvald.bot.sandbox.inputs import BadInput, surface_state


def option(value: str, text: str | None = None) -> dict[str, Any]:
    return {"text": {"type": "plain_text", "text": text or value}, "value": value}


def input_block(block_id: str, element: dict[str, Any]) -> dict[str, Any]:
    return {"type": "input", "block_id": block_id, "element": {"action_id": "a", **element},
            "label": {"type": "plain_text", "text": block_id}}


BLOCKS = [
    {"type": "section", "text": {"type": "mrkdwn", "text": "intro"}},
    input_block("window", {"type": "static_select", "options": [option("15m"), option("1h")],
                           "initial_option": option("15m")}),
    input_block("scope", {"type": "radio_buttons", "options": [option("exact"), option("when")],
                          "initial_option": option("exact")}),
    input_block("fields", {"type": "checkboxes", "options": [option("a"), option("b")]}),
    input_block("when", {"type": "plain_text_input", "initial_value": "args.a == 1"}),
    input_block("note", {"type": "plain_text_input"}),
]


def test_inputs_as_drawn() -> None:
    assert SlackClientSim.filled(BLOCKS) == {
        "window": {"a": {"type": "static_select", "selected_option": option("15m")}},
        "scope": {"a": {"type": "radio_buttons", "selected_option": option("exact")}},
        "fields": {"a": {"type": "checkboxes", "selected_options": []}},
        "when": {"a": {"type": "plain_text_input", "value": "args.a == 1"}},
        "note": {"a": {"type": "plain_text_input", "value": None}},
    }


def test_inputs_as_chosen_and_forged() -> None:
    state = SlackClientSim.filled(BLOCKS, {"window": "1h", "scope": "when", "fields": ["b"],
                                           "when": "args.b", "note": "hi"})
    assert state["window"]["a"]["selected_option"] == option("1h")
    assert state["scope"]["a"]["selected_option"] == option("when")
    assert state["fields"]["a"]["selected_options"] == [option("b")]
    assert state["when"]["a"]["value"] == "args.b" and state["note"]["a"]["value"] == "hi"
    # a value the element does not offer is sent as given (a forged payload)
    forged = SlackClientSim.filled(BLOCKS, {"window": "9h", "fields": ["zz"]})
    assert forged["window"]["a"]["selected_option"]["value"] == "9h"
    assert forged["fields"]["a"]["selected_options"][0]["value"] == "zz"
    with pytest.raises(KeyError, match="nope"):
        SlackClientSim.filled(BLOCKS, {"nope": "x"})
    # it goes into a view submission as Slack's view.state.values
    sim = SlackClientSim("http://127.0.0.1:9/", "secret")
    payload = sim.envelope_for_view_submission("cb", state, user_id="U1")
    assert payload["view"]["state"]["values"] == state


def test_slacks_limits_on_radio_buttons_and_selects() -> None:
    assert block_problems(BLOCKS) == []
    eleven = input_block("r", {"type": "radio_buttons",
                               "options": [option(f"v{i}") for i in range(11)]})
    [problem] = block_problems([eleven])
    assert "between 1 and 10 items" in problem and "/blocks/0/element/options" in problem
    many = input_block("s", {"type": "static_select",
                             "options": [option(f"v{i}") for i in range(101)]})
    assert "between 1 and 100 items" in block_problems([many])[0]
    assert block_problems([input_block("s", {"type": "static_select", "options": [
        option(f"v{i}") for i in range(100)]})]) == []
    long = input_block("s", {"type": "static_select", "options": [option("v", "t" * 76)]})
    assert "must be less than 76" in block_problems([long])[0]


# -- what the page sends: checked against the surface, turned into Slack's state ----------

def test_the_pages_values_become_the_state_slack_sends() -> None:
    """Issue 52 item 7: the page drew ``[static_select element]`` and sent nothing of its
    choices; now each input's value is checked against the drawn element and sent as the
    option objects Slack sends."""
    state = surface_state(BLOCKS, {"window": {"a": "1h"}, "scope": {"a": "when"},
                                   "fields": {"a": ["b", "a"]}, "when": {"a": "args.a > 0"}})
    assert state == {
        "window": {"a": {"type": "static_select", "selected_option": option("1h")}},
        "scope": {"a": {"type": "radio_buttons", "selected_option": option("when")}},
        "fields": {"a": {"type": "checkboxes", "selected_options": [option("a"), option("b")]}},
        "when": {"a": "args.a > 0"}}  # text: payloads.state_values makes it plain_text_input
    ticked = [{"type": "section", "block_id": "pick.1", "text": option("x")["text"],
               "accessory": {"type": "checkboxes", "action_id": "select",
                             "options": [option("tok-1")]}}]
    assert surface_state(ticked, {"pick.1": {"select": ["tok-1"]}}) == {
        "pick.1": {"select": {"type": "checkboxes", "selected_options": [option("tok-1")]}}}


@pytest.mark.parametrize("given, error", [
    ({"window": {"a": "8h"}}, "window/a: not one of its options"),
    ({"scope": {"a": ["exact"]}}, "scope/a: not one of its options"),
    ({"fields": {"a": ["a", "a"]}}, "fields/a: not a list of its options"),
    ({"fields": {"a": ["c"]}}, "fields/a: not a list of its options"),
    ({"fields": {"a": "a"}}, "fields/a: not a list of its options"),
    ({"when": {"a": 7}}, "when/a must be text"),
    ({"nowhere": {"a": "x"}}, "there is no input nowhere/a here"),
    ({"window": "1h"}, "values must map block ids"),
    (["window"], "values must be an object"),
])
def test_what_the_surface_does_not_offer_is_refused(given: Any, error: str) -> None:
    with pytest.raises(BadInput, match=error):
        surface_state(BLOCKS, given)
