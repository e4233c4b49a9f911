"""Checkboxes in the Slack emulator: Slack's limits on them, their state in a signed
``block_actions`` payload (a view's and a message's), and how the sandbox page draws them."""

from __future__ import annotations

from typing import Any

from approvald.bot.sandbox import render
from approvald.bot.sandbox.blocks import block_problems
from approvald.bot.sandbox.client import SlackClientSim

from tests.unit.test_sandbox_render import NAMES, assert_safe


def option(value: str, text: str = "Select") -> dict[str, Any]:
    return {"text": {"type": "plain_text", "text": text}, "value": value}


def boxes(*options: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return {"type": "checkboxes", "action_id": "pick", "options": list(options), **kw}


def section(block_id: str, element: dict[str, Any]) -> dict[str, Any]:
    return {"type": "section", "block_id": block_id,
            "text": {"type": "mrkdwn", "text": "a request"}, "accessory": element}


def test_slacks_limits_on_checkboxes_are_enforced() -> None:
    assert block_problems([section("b1", boxes(option("a:1")))]) == []
    eleven = boxes(*(option(f"a:{i}") for i in range(11)))
    [problem] = block_problems([section("b1", eleven)])
    assert "between 1 and 10 items" in problem and "/blocks/0/accessory/options" in problem
    long = boxes(option("v" * 151, "t" * 76))
    problems = block_problems([section("b1", long)])
    assert len(problems) == 2 and all("must be less than" in p for p in problems)
    modal_input = {"type": "input", "block_id": "i", "label": {"type": "plain_text", "text": "L"},
                   "element": boxes()}
    assert "between 1 and 10" in block_problems([modal_input])[0]


def test_ticked_state_goes_into_the_view_or_the_message() -> None:
    blocks = [section("b1", boxes(option("a:1"))), section("b2", boxes(option("b:2"))),
              {"type": "actions", "block_id": "x", "elements": [
                  {"type": "button", "action_id": "go", "text": {"type": "plain_text",
                                                                 "text": "Go"}}]}]
    state = SlackClientSim.ticked(blocks, ["b:2"])
    assert state == {"b1": {"pick": {"type": "checkboxes", "selected_options": []}},
                     "b2": {"pick": {"type": "checkboxes",
                                     "selected_options": [option("b:2")]}}}
    sim = SlackClientSim("http://127.0.0.1:9/", "secret")
    on_view = sim.envelope_for_click("go", None, user_id="U1", view_id="V1", state=state)
    assert on_view["view"]["state"]["values"] == state and "state" not in on_view
    on_message = sim.envelope_for_click(
        "go", None, user_id="U1", channel_id="C1", state=state,
        message={"ts": "1.000001", "blocks": blocks},
        container={"type": "message", "message_ts": "1.000001", "channel_id": "C1",
                   "is_ephemeral": True})
    assert on_message["state"]["values"] == state and on_message["response_url"]
    plain = sim.envelope_for_click("go", None, user_id="U1", view_id="V1")
    assert "state" not in plain["view"] or plain["view"]["state"] == {"values": {}}


def test_the_page_draws_checkboxes_ticked_as_their_initial_options() -> None:
    element = boxes(option("a:1", "<b>one</b>"), option("b:2", "two"),
                    initial_options=[option("b:2", "two")])
    out = render.blocks([section("b1", element)], NAMES)
    assert_safe(out)
    assert "b-unknown" not in out and out.count('type="checkbox"') == 2
    assert out.count(" checked") == 1 and "&lt;b&gt;one&lt;/b&gt;" in out
