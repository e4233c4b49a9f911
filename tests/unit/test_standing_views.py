"""Standing approvals in Slack, the pure builders: the card's button and what the card says
of a standing approval granted on it, the modal (windows within max_standing, scopes, the
call's argument names within Slack's limits, a condition drawn from the arguments), reading
its submission, and the App Home's list within 100 blocks."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from approvald.bot.sandbox.blocks import block_problems
from approvald.bot.slack import cards, views
from approvald.bot.slack import texts as T
from approvald.bot.slack.mrkdwn import units
from approvald.runtime.policies.rules import holds
from approvald.store.repos.standing import StandingRecord

from tests.unit.test_batch_views import pending
from tests.unit.test_cards import (
    HOSTILE,
    NOW,
    TOKEN,
    approval,
    assert_inert,
    check_message,
    check_view,
    decided,
    dump,
)

REFUND = {"order_id": "A-1001", "amount_cents": 4200, "reason": "duplicate charge"}
UP_TO_50 = 'args.order_id == "A-1001" && args.amount_cents <= 5000'


def policy(**kw: Any) -> dict[str, Any]:
    return {"approvers": ["U0BOB"], "quorum": 1, "ttl": "30m", "on_expire": "cancel",
            "escalate": [], "risk": "medium", **kw}


def standing(*, id: str = "5" * 32, scope: dict[str, Any] | None = None, quorum: int = 1,
             grants: tuple[str, ...] = ("U0BOB",), status: str = "active", uses: int = 0,
             window: timedelta = timedelta(minutes=30), **kw: Any) -> StandingRecord:
    fields: dict[str, Any] = dict(
        id=id, tool="issue_refund", scope=json.dumps(scope or {"kind": "condition",
                                                               "when": UP_TO_50}),
        rule=None, approvers='["U0BOB", "U0CAROL"]', quorum=quorum, allow_self_approval=False,
        grants=json.dumps(list(grants)), status=status, granted_on="3" * 32,
        uses=uses, created_at=NOW - timedelta(minutes=1),
        expires_at=NOW - timedelta(minutes=1) + window, revoked_at=None, revoked_by=None)
    fields.update(kw)
    return StandingRecord(**fields)


def action_ids(blocks: list[dict[str, Any]]) -> list[str]:
    return [e["action_id"] for b in blocks if b["type"] == "actions" for e in b["elements"]]


def input_element(view: dict[str, Any], block_id: str) -> dict[str, Any]:
    [block] = [b for b in view["blocks"] if b.get("block_id") == block_id]
    return dict(block["element"])


def check_modal(view: dict[str, Any]) -> None:
    check_view(view)
    assert block_problems(view["blocks"], max_blocks=100) == []  # the emulator's checks too
    assert units(view["title"]["text"]) <= 24 and units(view["submit"]["text"]) <= 24


# -- the card ---------------------------------------------------------------------------------

def test_the_button_sits_beside_approve_unless_max_standing_turns_it_off() -> None:
    card = cards.approval_card(approval(args=REFUND, policy=policy()), token=TOKEN, now=NOW)
    check_message(card)
    assert action_ids(card["blocks"])[:3] == [cards.APPROVE, cards.STANDING, cards.DENY]
    [button] = [e for b in card["blocks"] if b["type"] == "actions" for e in b["elements"]
                if e["action_id"] == cards.STANDING]
    assert button["text"]["text"] == T.BUTTON_STANDING
    assert button["value"] == f"v2:3f2a9c0d4b5e6f708192a3b4c5d6e7f8:{TOKEN}"
    for off in ("0", "10m"):  # off, or shorter than the shortest window
        card = cards.approval_card(approval(policy=policy(max_standing=off)), token=TOKEN,
                                   now=NOW)
        assert cards.STANDING not in action_ids(card["blocks"])
        assert cards.APPROVE in action_ids(card["blocks"])
    question = cards.approval_card(approval(kind="outcome_unknown"), token=TOKEN, now=NOW)
    assert cards.STANDING not in action_ids(question["blocks"])
    # in the App Home's compact cards too
    compact = cards.compact_blocks(approval(policy=policy()), TOKEN, now=NOW, selectable=True)
    assert cards.STANDING in action_ids(compact)


def test_the_card_tells_a_standing_approval_granted_on_it() -> None:
    a = decided("approved", args=json.dumps(REFUND), decided_by="U0BOB")
    card = cards.approval_card(a, token=None, now=NOW, standing=[standing()])
    check_message(card)
    text = dump(card)
    assert f":repeat: *Standing approval* `{'5' * 32}` granted by <@U0BOB> for 30m" in text
    assert "calls where `args.order_id == \\\"A-1001\\\" &amp;&amp; args.amount_cents " \
           "&lt;= 5000`" in text
    assert "Matching calls run without a card until <!date^" in text and "0 use(s)" in text
    assert "grants" not in text  # a quorum of one has nothing to count
    # a quorum tool's, proposed while the request still waits for its other approvals
    live = approval(quorum=2, approve_count=1)
    card = cards.approval_card(live, token=TOKEN, now=NOW, standing=[standing(
        quorum=2, status="proposed", scope={"kind": "exact", "digest": "d1",
                                            "values": {"order": "1234"}})])
    check_message(card)
    text = dump(card)
    assert "for 30m: only this exact call." in text and "*1 of 2 grants*" in text
    assert cards.APPROVE in action_ids(card["blocks"])
    active = dump(cards.approval_card(live, token=TOKEN, now=NOW, standing=[standing(
        quorum=2, grants=("U0BOB", "U0CAROL"), uses=3)]))
    assert "granted by <@U0BOB>, <@U0CAROL>" in active and "*2 of 2 grants*. Matching" in active
    assert "3 use(s)" in active
    revoked = dump(cards.approval_card(a, token=None, now=NOW, standing=[standing(
        status="revoked", revoked_by="U0CAROL", revoked_at=NOW, uses=2)]))
    assert "Revoked by <@U0CAROL> <!date^" in revoked and "after 2 use(s)" in revoked
    over = dump(cards.approval_card(a, token=None, now=NOW + timedelta(hours=1),
                                    standing=[standing()]))
    assert "Its window ended <!date^" in over


def test_agent_written_scope_values_are_inert_on_the_card_and_the_home() -> None:
    hostile = standing(scope={"kind": "fields", "values": {"memo<!here>": HOSTILE,
                                                           "note": HOSTILE * 20}})
    a = decided("approved", args=json.dumps({"memo<!here>": HOSTILE}))
    card = cards.approval_card(a, token=None, now=NOW, standing=[hostile])
    check_message(card)
    assert_inert(card)
    home = views.home_view([], [], now=NOW, standing=[views.HomeStanding(hostile, True)])
    check_view(home)
    assert_inert(home)


# -- the modal --------------------------------------------------------------------------------

@pytest.mark.parametrize(("cap", "offered"), [
    (None, ["15m", "30m", "1h"]),  # the default max_standing, 1 h
    ("2h", ["15m", "30m", "1h", "2h"]),
    ("45m", ["15m", "30m"]),
    ("12h", ["15m", "30m", "1h", "2h", "4h", "8h"]),  # never past 8 h
])
def test_the_modal_offers_windows_within_max_standing(cap: str | None,
                                                      offered: list[str]) -> None:
    a = approval(args=REFUND, policy=policy(**({"max_standing": cap} if cap else {})))
    view = views.standing_modal(a, TOKEN, "C0OPS", "1.2")
    check_modal(view)
    window = input_element(view, cards.WINDOW_BLOCK)
    assert window["type"] == "static_select"
    assert [o["value"] for o in window["options"]] == offered
    assert [o["text"]["text"] for o in window["options"]] == [T.WINDOW_LABELS[k]
                                                              for k in offered]
    assert window["initial_option"]["value"] == "15m"  # the shortest, unless chosen
    assert view["callback_id"] == cards.STANDING_MODAL
    assert views.parse_metadata(view["private_metadata"]) == views.ModalTarget(
        a.id, TOKEN, "C0OPS", "1.2")


def test_the_modal_offers_the_three_scopes_and_explains_them() -> None:
    view = views.standing_modal(approval(args=REFUND, policy=policy()), TOKEN, None, None)
    check_modal(view)
    scope = input_element(view, cards.SCOPE_BLOCK)
    assert scope["type"] == "radio_buttons"
    assert [(o["value"], o["text"]["text"]) for o in scope["options"]] == [
        ("exact", T.SCOPE_EXACT), ("fields", T.SCOPE_FIELDS), ("condition", T.SCOPE_CONDITION)]
    assert scope["initial_option"]["value"] == "exact"
    fields = input_element(view, cards.FIELDS_BLOCK)
    assert [o["value"] for o in fields["options"]] == list(REFUND)
    assert fields["options"][1]["description"]["text"] == "now `4200`"
    when = input_element(view, cards.WHEN_BLOCK)
    assert when["initial_value"] == 'args.order_id == "A-1001" && args.amount_cents <= 4200'
    text = dump(view)
    assert "same approvers and quorum as this request (one approval)" in text
    assert "revoke it at once" in text and "audit log" in text
    quorum = views.standing_modal(approval(args=REFUND, quorum=2), TOKEN, None, None)
    assert "(2 approvals: it covers nothing until 1 more approver(s) grant it)" in dump(quorum)
    # a call without arguments: no argument to choose
    bare = views.standing_modal(approval(args={}), TOKEN, None, None)
    check_modal(bare)
    assert [o["value"] for o in input_element(bare, cards.SCOPE_BLOCK)["options"]] == [
        "exact", "condition"]
    assert cards.FIELDS_BLOCK not in dump(bare) and "initial_value" not in dump(bare)


def test_the_modal_lists_ten_argument_names_cut_to_slacks_limits() -> None:
    args = {f"argument_{i}_{'x' * 100}<!channel>": HOSTILE * 5 for i in range(12)}
    args["n" * 200] = 1  # too long for an option's value: not offered
    view = views.standing_modal(approval(args=args), TOKEN, None, None)
    check_modal(view)
    fields = input_element(view, cards.FIELDS_BLOCK)
    assert len(fields["options"]) == 10
    for o in fields["options"]:
        assert o.pop("value") in args  # data sent back, never drawn
        assert units(o["text"]["text"]) <= 75 and units(o["description"]["text"]) <= 75
    assert_inert([b for b in view["blocks"] if b.get("block_id") != cards.FIELDS_BLOCK])
    assert_inert(fields)


def test_the_example_condition_holds_for_the_call_and_skips_what_cel_cannot_spell() -> None:
    assert views.example_condition("t", REFUND) == (
        'args.order_id == "A-1001" && args.amount_cents <= 4200')
    odd = {"in": "x", "with space": 1, "ok": True, "nested": {"a": 1}, "f": 1.5,
           "big": 2 ** 70, "quote": 'a"b\\c', "é": "x", "a": -3, "b": "two words",
           "c": "y", "d": "z"}
    text = views.example_condition("t", odd)
    assert text == 'args.ok == true && args.quote == "a\\"b\\\\c" && args.a <= -3 && args.c == "y"'
    assert holds(text, "t", odd)
    assert views.example_condition("t", {"note": "free text only"}) == ""


def test_reading_the_modal() -> None:
    def state(window: str | None = "30m", scope: str | None = "condition",
              fields: list[str] | None = None, when: str | None = UP_TO_50) -> dict[str, Any]:
        def chosen(v: str | None) -> dict[str, Any]:
            return {"selected_option": {"value": v} if v else None}
        return {cards.WINDOW_BLOCK: {cards.WINDOW_INPUT: chosen(window)},
                cards.SCOPE_BLOCK: {cards.SCOPE_INPUT: chosen(scope)},
                cards.FIELDS_BLOCK: {cards.FIELDS_INPUT: {"selected_options": [
                    {"value": f} for f in fields or []]}},
                cards.WHEN_BLOCK: {cards.WHEN_INPUT: {"value": when}}}

    assert views.parse_standing(state()) == (
        views.StandingChoice(timedelta(minutes=30), "condition", [], UP_TO_50), {})
    assert views.parse_standing(state(scope="fields", fields=["order_id"])) == (
        views.StandingChoice(timedelta(minutes=30), "fields", ["order_id"], ""), {})
    assert views.parse_standing(state(scope="exact")) == (
        views.StandingChoice(timedelta(minutes=30), "exact", [], ""), {})
    assert views.parse_standing(state(window=None)) == (
        None, {cards.WINDOW_BLOCK: T.MODAL_STANDING_NO_WINDOW})
    assert views.parse_standing(state(window="9h", scope="other")) == (
        None, {cards.WINDOW_BLOCK: T.MODAL_STANDING_NO_WINDOW,
               cards.SCOPE_BLOCK: T.MODAL_STANDING_NO_SCOPE})
    assert views.parse_standing(state(scope="fields")) == (
        None, {cards.FIELDS_BLOCK: T.MODAL_STANDING_NO_FIELDS})
    assert views.parse_standing(state(when="  ")) == (
        None, {cards.WHEN_BLOCK: T.MODAL_STANDING_NO_WHEN})
    assert views.parse_standing(None)[0] is None


# -- the App Home -----------------------------------------------------------------------------

def test_the_home_lists_standing_approvals_with_revoke_and_grant_too() -> None:
    proposed = standing(id="6" * 32, quorum=2, status="proposed")
    items = [views.HomeStanding(proposed, True), views.HomeStanding(standing(uses=3), False)]
    home = views.home_view([], [], now=NOW, standing=items, notice="*done*")
    check_view(home)
    blocks = home["blocks"]
    assert blocks[1]["text"]["text"] == "*done*"
    text = dump(blocks)
    assert T.HOME_STANDING_TITLE in text and "grants 1/2 (<@U0BOB>)" in text
    assert "3 use(s)" in text and "calls where `args.order_id" in text
    assert action_ids(blocks) == [cards.STANDING_GRANT, cards.STANDING_REVOKE]
    grant, revoke = [e for b in blocks if b["type"] == "actions" for e in b["elements"]]
    assert (grant["value"], revoke["value"]) == ("6" * 32, "6" * 32)
    assert grant["confirm"]["confirm"]["text"] == T.CONFIRM_GRANT_YES
    assert revoke["confirm"]["confirm"]["text"] == T.CONFIRM_REVOKE_YES
    [accessory] = [b["accessory"] for b in blocks if (b.get("accessory") or {}).get("type")
                   == "button"]
    assert (accessory["action_id"], accessory["value"]) == (cards.STANDING_REVOKE, "5" * 32)
    # none to show: the Home is as it was
    assert T.HOME_STANDING_TITLE not in dump(views.home_view([], [], now=NOW))


@pytest.mark.parametrize("hostile", [False, True])
def test_150_pending_and_12_standing_approvals_stay_within_100_blocks(hostile: bool) -> None:
    many = pending(150)
    if hostile:
        many = [(replace(a, args=json.dumps({"memo": HOSTILE * 40})), t) for a, t in many]
    items = [views.HomeStanding(standing(id=f"{i:032d}", quorum=2, status="proposed"),
                                i % 2 == 0) for i in range(12)]
    recent = [decided("approved", id=f"r{i}") for i in range(15)]
    home = views.home_view(many, recent, now=NOW, standing=items)
    check_view(home)
    assert len(home["blocks"]) <= 100
    text = dump(home)
    assert text.count(cards.STANDING_REVOKE) == 10
    assert T.HOME_STANDING_MORE.format(n=2) in text
    assert "`approvald standing list`" in text
    assert T.HOME_MORE.split("{")[0] in text and T.HOME_RECENT_TITLE in text
