"""Batch decisions' Block Kit: the App Home and /approvals grouped by tool with a checkbox
per request, what a batch did, and the one-reason deny modal, all within Slack's limits."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from approvald.bot.slack import cards, views
from approvald.bot.slack import texts as T
from approvald.bot.slack.mrkdwn import text_length
from approvald.runtime.approvals.batch import Outcome
from approvald.runtime.approvals.decide import Decision
from approvald.store.records import ApprovalRecord

from tests.unit.test_cards import (
    NOW,
    TOKEN,
    approval,
    assert_inert,
    check_message,
    check_view,
    decided,
    dump,
    hostile_approval,
)


def pending(n: int, *, tool: str = "issue_refund", start: int = 0,
            **kw: Any) -> list[tuple[ApprovalRecord, str]]:
    """``n`` requests, oldest first, each for its own order."""
    return [(approval(id=f"{tool[:4]}{i:028d}", tool=tool,
                      args={"order_id": f"A-{1000 + i}", "amount_cents": 4200},
                      requested_at=NOW - timedelta(minutes=500 - i), **kw), TOKEN)
            for i in range(start, start + n)]


def checkboxes(blocks: list[dict[str, Any]]) -> list[str]:
    return [o["value"] for b in blocks if (b.get("accessory") or {}).get("type") == "checkboxes"
            for o in b["accessory"]["options"]]


def headers(blocks: list[dict[str, Any]]) -> list[str]:
    return [b["text"]["text"] for b in blocks if b["type"] == "header"]


def test_home_groups_requests_by_tool_oldest_first_with_a_checkbox_each() -> None:
    refunds, emails = pending(3), pending(2, tool="send_email", start=10)
    question = (approval(id="q" * 32, kind="outcome_unknown", tool="issue_refund"), TOKEN)
    order = [refunds[0], emails[0], refunds[1], question, emails[1], refunds[2]]
    home = views.home_view(order, [], now=NOW)
    check_view(home)
    assert headers(home["blocks"]) == [T.HOME_TITLE, "issue_refund · 4 waiting",
                                       "send_email · 2 waiting", T.HOME_RECENT_TITLE]
    # a group holds its requests in the order given; an outcome question gets no checkbox
    assert checkboxes(home["blocks"]) == [f"v2:{a.id}:{TOKEN}" for a, _ in
                                          (refunds[0], refunds[1], refunds[2], *emails)]
    buttons = [b for b in home["blocks"] if b.get("block_id") == cards.BATCH_BLOCK]
    [batch] = buttons
    approve, deny = batch["elements"]
    assert (approve["action_id"], deny["action_id"]) == (cards.APPROVE_SELECTED,
                                                        cards.DENY_SELECTED)
    assert "confirm" in approve and "value" not in approve and "value" not in deny
    # each request keeps its summary and its own buttons
    text = dump(home)
    for a, _ in order:
        assert f"v2:{a.id}:{TOKEN}" in text
    assert "A-1000" in text and "Refunding the duplicate charge." in text
    assert T.HOME_MORE[:12] not in text


def test_no_batch_buttons_without_anything_to_tick() -> None:
    empty = views.home_view([], [], now=NOW)
    assert not [b for b in empty["blocks"] if b.get("block_id") == cards.BATCH_BLOCK]
    questions = views.home_view([(approval(kind="outcome_unknown"), TOKEN)], [], now=NOW)
    assert not [b for b in questions["blocks"] if b.get("block_id") == cards.BATCH_BLOCK]


@pytest.mark.parametrize("hostile", [False, True])
def test_the_home_with_150_pending_stays_within_100_blocks(hostile: bool) -> None:
    many = pending(100) + pending(50, tool="send_email", start=100)
    if hostile:
        many = [(replace(hostile_approval(3000), id=a.id, tool=a.tool,
                         requested_at=a.requested_at), t) for a, t in many]
    recent = [decided("approved", id=f"r{i}") for i in range(15)]
    home = views.home_view(many, recent, now=NOW)
    check_view(home)
    assert_inert(home)
    assert len(home["blocks"]) <= 100
    shown = checkboxes(home["blocks"])
    assert len(shown) >= (20 if hostile else 40)
    assert shown == [f"v2:{a.id}:{TOKEN}" for a, _ in many[:len(shown)]]  # the oldest that fit
    assert T.HOME_MORE.format(shown=len(shown), total=150) in dump(home)
    assert "`approvald approvals list --limit 150`" in dump(home)
    # and with the results of a large batch on top, still within the limits
    outcomes = [(Outcome(a.id, refused="approval is already approved by U_BOB <!channel>" * 5,
                         code="not_pending"), decided("approved", id=a.id)) for a, _ in many[:45]]
    after = views.home_view(many[45:], recent, now=NOW,
                            result=views.BatchResult("approve", outcomes))
    check_view(after)
    assert_inert(after)
    assert len(after["blocks"]) <= 100 and checkboxes(after["blocks"])
    assert text_length(after["blocks"]) <= views.HOME_TEXT_BUDGET + 20_000


def _decision(a: ApprovalRecord, outcome: str, approvals: int = 1, quorum: int = 1) -> Decision:
    return Decision(approval=a, outcome=outcome, approvals=approvals, quorum=quorum,
                    run_ready=outcome != "voted")


def test_batch_results_say_what_became_of_each_request() -> None:
    ok, vote, late, stale = (approval(id=f"{c * 8}{'0' * 24}", args={"order_id": f"A-{c}"})
                             for c in "abcd")
    outcomes = [
        (Outcome(ok.id, decision=_decision(ok, "approved")), ok),
        (Outcome(vote.id, decision=_decision(vote, "voted", 1, 2)), vote),
        (Outcome(late.id, refused="approval x is already approved by U_BOB <!channel>",
                 code="not_pending"), replace(late, status="approved")),
        (Outcome(stale.id, refused="the arguments were edited", code="stale_card"), stale),
        (Outcome("f" * 32, refused="no approval ffff", code="unknown_approval"), None),
    ]
    blocks = [b.to_dict() for b in views.batch_result_blocks(
        views.BatchResult("approve", outcomes), sections=4)]
    text = dump(blocks)
    assert_inert(blocks)
    assert blocks[0]["text"]["text"] == T.BATCH_SUMMARY.format(total=5, parts=" · ".join([
        T.BATCH_PART_APPROVED.format(n=1), T.BATCH_PART_VOTED.format(n=1),
        T.BATCH_PART_REFUSED.format(n=3)]))
    lines = blocks[1]["text"]["text"].split("\n")
    assert [line.split(" ")[0] for line in lines] == [":warning:"] * 3 + [
        ":white_check_mark:", ":ballot_box_with_check:"]  # refused ones first
    assert 'Refused `issue_refund` `cccccccc` `{"order_id":"A-c"}`: ' in lines[0]
    # said once, from the request's fields: the runtime's message is not repeated after it
    assert T.REFUSAL_NOT_PENDING["approved"] in text and "U_BOB" not in text
    assert T.REFUSAL["stale_card"] in text
    assert "Refused `ffffffffffffffffffffffffffffffff`" in text
    assert "Approval recorded (1 of 2) `issue_refund` `bbbbbbbb`" in text
    denied = views.batch_result_blocks(views.BatchResult("deny", [
        (Outcome(ok.id, decision=_decision(ok, "denied")), ok)]), sections=4)
    assert ":no_entry_sign: 1 denied" in dump([b.to_dict() for b in denied])


def test_batch_results_for_nothing_a_refused_batch_and_a_failure() -> None:
    def text(result: views.BatchResult) -> str:
        return dump([b.to_dict() for b in views.batch_result_blocks(result, sections=4)])

    assert T.BATCH_NOTHING in text(views.BatchResult("approve"))
    too_many = text(views.BatchResult("deny", refused="At most 100 <!here>"))
    assert "At most 100 &lt;!here&gt;: nothing changed." in too_many
    assert T.BATCH_NOTHING not in too_many
    assert "OperationalError" in text(views.BatchResult("approve", error="OperationalError"))


def test_batch_results_are_capped_and_count_what_did_not_fit() -> None:
    a = approval()
    outcomes = [(Outcome(a.id, refused="x" * 400, code="not_pending"), a)] * 100
    blocks = views.batch_result_blocks(views.BatchResult("approve", outcomes), sections=2)
    assert len(blocks) == 3  # the summary and two sections of lines
    shown = "\n".join(b.to_dict()["text"]["text"] for b in blocks[1:])
    n = shown.count(":warning: Refused")
    assert 0 < n < 100 and shown.endswith(T.BATCH_LINES_MORE.format(n=100 - n))


def test_the_slash_list_has_checkboxes_and_results_within_a_message() -> None:
    many = pending(40)
    msg = views.approvals_list_message(many, now=NOW)
    check_message(msg)
    assert checkboxes(msg["blocks"]) == [f"v2:{a.id}:{TOKEN}" for a, _ in
                                         many[:views.LIST_MAX_PENDING]]
    assert "… and 30 more" in dump(msg) and "--limit 40" in dump(msg)
    outcomes = [(Outcome(a.id, refused="r <!channel>" * 60, code="bad_token"), a)
                for a, _ in many[:30]]
    after = views.approvals_list_message(many[30:], now=NOW,
                                         result=views.BatchResult("approve", outcomes))
    check_message(after)
    assert_inert(after)
    assert after["blocks"][0]["text"]["text"].startswith("*You decided 30")
    done = views.approvals_list_message([], now=NOW, result=views.BatchResult("approve"))
    check_message(done)
    assert T.BATCH_NOTHING in dump(done) and T.LIST_EMPTY in dump(done)


def test_the_deny_modal_lists_the_ticked_requests_ten_to_an_element() -> None:
    hostile = hostile_approval(3000, id="h" * 32)
    items: list[tuple[str, str, ApprovalRecord | None]] = [
        (a.id, TOKEN, a) for a, _ in pending(23)]
    items += [(hostile.id, TOKEN, hostile), ("u" * 32, TOKEN, None)]
    modal = views.batch_deny_modal(items, channel=None)
    check_view(modal)
    assert_inert(modal)
    assert modal["callback_id"] == cards.DENY_SELECTED_MODAL
    inputs = [b for b in modal["blocks"] if b["type"] == "input"]
    boxes = [b for b in inputs if b["element"]["type"] == "checkboxes"]
    assert [len(b["element"]["options"]) for b in boxes] == [10, 10, 5]
    assert boxes[0]["block_id"] == views.BATCH_FIRST_BLOCK
    for b in boxes:
        assert b["optional"] is True and b["element"]["initial_options"] == b["element"]["options"]
    values = [o["value"] for b in boxes for o in b["element"]["options"]]
    assert values == [f"v2:{i}:{TOKEN}" for i, _, _ in items]
    texts = [o["text"]["text"] for b in boxes for o in b["element"]["options"]]
    assert texts[0] == 'issue_refund `{"order_id":"A-1000","amount_cents":4200}`'
    assert texts[-1] == "u" * 32
    assert inputs[-1]["block_id"] == cards.REASON_BLOCK
    assert views.parse_batch_metadata(modal["private_metadata"]) is None
    in_channel = views.batch_deny_modal(items[:1], channel="C_APPROVALS")
    assert views.parse_batch_metadata(in_channel["private_metadata"]) == "C_APPROVALS"
    for bad in ("", "[]", '{"channel": 3}', '{"channel": ""}', "nope"):
        with pytest.raises(ValueError):
            views.parse_batch_metadata(bad)


def test_parse_selection_reads_ticked_options_and_skips_anything_else() -> None:
    def ticked(*values: Any) -> dict[str, Any]:
        return {"type": "checkboxes", "selected_options": [{"value": v} for v in values]}

    state = {
        f"{cards.SELECT_BLOCK}.a": {cards.SELECT: ticked(f"v2:a1:{TOKEN}")},  # now
        f"{cards.SELECT_BLOCK}.b": {cards.SELECT: ticked("not ours", None, f"b1:{TOKEN}",  # old
                                                         f"a1:{TOKEN}")},
        "elsewhere": {"other": ticked(f"c1:{TOKEN}")},
        "junk": "x",
        cards.REASON_BLOCK: {cards.REASON_INPUT: {"type": "plain_text_input", "value": "r"}},
    }
    assert views.parse_selection(state) == [("a1", TOKEN), ("b1", TOKEN)]
    assert views.parse_selection(None) == [] and views.parse_selection({}) == []
    assert views.parse_selection({"b": {cards.SELECT: {"selected_options": "x"}}}) == []


def test_a_checkbox_value_too_long_for_slack_leaves_only_the_buttons() -> None:
    long = "t" * 140
    [section, actions] = cards.compact_blocks(approval(), long, now=NOW, selectable=True)
    assert "accessory" not in section and actions["type"] == "actions"
    assert cards.select_value("a" * 32, TOKEN) == f"v2:{'a' * 32}:{TOKEN}"
    assert json.loads(json.dumps(cards.batch_buttons().to_dict()))["block_id"] == \
        cards.BATCH_BLOCK
