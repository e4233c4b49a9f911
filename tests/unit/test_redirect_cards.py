"""Redirect in Block Kit: the button, the modal, the decided card, thread and list lines,
and the refusal texts; all valid for slack_sdk, within Slack's limits, and inert."""

from __future__ import annotations

import json

import pytest
from approvald.bot.slack import cards, messages, views
from approvald.bot.slack import texts as T
from approvald.bot.slack.mrkdwn import units

from tests.unit.test_cards import (
    HOSTILE,
    NOW,
    TOKEN,
    approval,
    assert_inert,
    buttons_of,
    check_message,
    check_view,
    decided,
    dump,
    packet,
)


def redirected(guidance: str = "Refund only the duplicate charge, $20", **kw):
    return decided("redirected", verdict="redirect", reason=guidance, **kw)


def test_a_pending_call_offers_redirect_beside_approve_deny_and_edit() -> None:
    for a in (approval(), approval(packet_=packet(risk="high")),
              approval(args={"x": "y" * 5000})):  # too long to edit or show: View, no Edit
        card = cards.approval_card(a, token=TOKEN, now=NOW)
        check_message(card)
        found = buttons_of(card)
        assert found[cards.REDIRECT]["value"] == f"v2:{a.id}:{TOKEN}"
        assert found[cards.REDIRECT]["text"]["text"] == T.BUTTON_REDIRECT
        assert "style" not in found[cards.REDIRECT] and "confirm" not in found[cards.REDIRECT]
        [actions] = [b for b in card["blocks"] if b["type"] == "actions"]
        assert len(actions["elements"]) <= 25
        assert all(units(e["text"]["text"]) <= 75 for e in actions["elements"])
    compact = cards.compact_blocks(approval(), TOKEN, now=NOW)  # App Home, /approvals
    assert cards.REDIRECT in dump(compact)


def test_an_outcome_question_has_no_redirect() -> None:
    question = approval(kind="outcome_unknown", packet_=packet(idempotency_key="run1:call1"))
    assert cards.REDIRECT not in buttons_of(cards.approval_card(question, token=TOKEN, now=NOW))


def test_the_redirected_card_leads_with_who_and_the_escaped_guidance() -> None:
    card = cards.approval_card(redirected(), token=TOKEN, now=NOW)
    check_message(card)
    assert not buttons_of(card)
    body = dump(card)
    assert card["blocks"][0]["text"]["text"] == "Redirected: issue_refund"
    assert "*Redirected* by <@U0BOB>: Refund only the duplicate charge, $20" in body
    assert "the call did not run" in body and "<!date^" in body
    assert "*Reason:*" not in body  # the guidance is said once, where it leads
    assert card["text"] == "issue_refund: redirected"

    hostile = cards.approval_card(redirected(HOSTILE * 30, decided_via="cli:op"), token=None,
                                  now=NOW)
    check_message(hostile)
    assert_inert(hostile)
    assert "&lt;!channel&gt;" in dump(hostile) and T.DECIDED_VIA_CLI in dump(hostile)


@pytest.mark.parametrize("tool", ["issue_refund", "<!here>`x", None])
def test_the_redirect_modal(tool: str | None) -> None:
    view = views.redirect_modal("abc", TOKEN, "C1", "1.2", tool=tool)
    check_view(view)
    assert_inert(view)
    assert view["callback_id"] == cards.REDIRECT_MODAL
    assert view["title"]["text"] == T.MODAL_REDIRECT_TITLE
    assert view["submit"]["text"] == T.MODAL_REDIRECT_SUBMIT
    block = view["blocks"][-1]
    assert block["block_id"] == cards.GUIDANCE_BLOCK and not block.get("optional")
    el = block["element"]
    assert el["action_id"] == cards.GUIDANCE_INPUT and el["multiline"]
    assert el["min_length"] == 1 and el["max_length"] == 2000
    assert views.parse_metadata(view["private_metadata"]) == ("abc", TOKEN, "C1", "1.2")
    assert "will not run" in dump(view["blocks"][0])


def test_thread_and_list_lines_say_redirected_with_the_guidance() -> None:
    from approvald.bot.slack import story
    from approvald.runtime.record.shown import RunMasking
    from approvald.store.records import AuditRecord

    a = redirected("Refund $20 <!channel>")
    entry = AuditRecord(seq=1, at=a.decided_at, action="redirected", actor="U0BOB",
                        via="slack", run_id=a.run_id, approval_id=a.id, digest=None,
                        details=json.dumps({"tool": a.tool}), key_id="", prev_hash="", hash="")
    [said] = story.entry_lines(entry, {a.id: a}, {}, {}, RunMasking())
    line = said.text
    assert line.startswith(":leftwards_arrow_with_hook: `issue_refund` redirected by <@U0BOB>:")
    assert "Refund $20 &lt;!channel&gt;" in line
    assert_inert(line)
    recent = cards.recent_line(redirected())
    assert "`issue_refund` redirected by <@U0BOB>" in recent
    assert cards.status_word(redirected()) == "redirected"


def test_refusal_texts_for_redirect() -> None:
    assert "guidance" in messages.refusal_text("guidance_required").lower()
    assert "2,000" in messages.refusal_text("guidance_too_long")
    assert messages.refusal_text("not_pending", status="redirected") == (
        "Too late: this request was already redirected.")
    texts = {messages.refusal_text(c) for c in ("guidance_required", "guidance_too_long",
                                                "reason_required", "reason_too_long")}
    assert len(texts) == 4 and T.REFUSAL_UNKNOWN not in texts
