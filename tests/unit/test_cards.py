"""Block Kit builders: every card and view they can make parses and validates with slack_sdk,
stays inside Slack's limits, and never lets agent-written text ping, link or break out."""

from __future__ import annotations

import html
import json
import random
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from approvald.bot.slack import cards, messages, views
from approvald.bot.slack import texts as T
from approvald.bot.slack.mrkdwn import clip, code_block, escape_mrkdwn, pretty_json, safe_cut, units
from approvald.runtime.kernel.vocabulary import WORDS, outcome_of
from approvald.store.records import ApprovalRecord, RunRecord, VoteRecord
from slack_sdk.models.blocks import Block
from slack_sdk.models.views import View

NOW = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
TOKEN = "tOk-3n_abcDEF123"
PINGS = ("<!channel>", "<!here>", "<!everyone>", "<@U123>", "<@W999|boss>", "<#C42>",
         "<!subteam^S1>", "<http://evil|bank.com>", "<https://evil.example>", "<mailto:x@y|z>")
HOSTILE = " ".join(PINGS) + " ``` `` ` ```` &amp; & > < | *bold* _it_ ~s~ \u202egnp.exe"
UNICODE = "emoji 🎉👩‍👩‍👧‍👦👍🏽 cjk 漢字かなカナ 한국어 rtl שלום مرحبا e\u0301 \U0001d54f"
BAD_PREFIXES = ("<!channel", "<!here", "<!everyone", "<@U123", "<@W999", "<#C42",
                "<!subteam^S1", "<http://evil", "<https://evil", "<mailto", "```` ")


def packet(**kw: Any) -> dict[str, Any]:
    base = {"agent": "support-bot", "task": "Refund order 1234", "requested_by": "U0ALICE",
            "doing": "Refunding the duplicate charge.",
            "evidence": [{"tool": "lookup_order", "call_id": "c0", "result": '{"paid":2}'}],
            "impact": "$42.00 back to the customer", "risk": "medium",
            "why": "Refunds move money.", "description": "Issue a refund"}
    return {**base, **kw}


def approval(*, args: Any = None, packet_: dict[str, Any] | None = None,
             approvers: Any = ("U0BOB", "S0FIN"), policy: dict[str, Any] | None = None,
             edited_args: Any = None, **kw: Any) -> ApprovalRecord:
    fields: dict[str, Any] = dict(
        id="3f2a9c0d4b5e6f708192a3b4c5d6e7f8", run_id="run1", call_id="call1", kind="tool_call",
        tool="issue_refund", args=json.dumps(args if args is not None else
                                              {"order": "1234", "amount": 42}),
        digest="d1", edited_args=None if edited_args is None else json.dumps(edited_args),
        edited_digest=None if edited_args is None else "d2",
        edited_by=None if edited_args is None else "U0CAROL",
        edited_at=None if edited_args is None else NOW - timedelta(minutes=2),
        status="pending", rung=0,
        supersedes=None, approvers=json.dumps(list(approvers)), quorum=1, approve_count=0,
        policy=json.dumps(policy or {"approvers": list(approvers), "quorum": 1, "ttl": "30m",
                                     "on_expire": "cancel", "escalate": [], "risk": "medium"}),
        packet=json.dumps(packet_ or packet()), requested_by="U0ALICE", token_nonce="n0",
        requested_at=NOW - timedelta(minutes=5), expires_at=NOW + timedelta(minutes=25),
        reminders_sent=0, next_reminder_at=None, decided_at=None, decided_by=None,
        decided_via=None, verdict=None, reason=None, channel="C0OPS", message_ts="1.2")
    fields.update(kw)
    return ApprovalRecord(**fields)


def decided(status: str, **kw: Any) -> ApprovalRecord:
    base: dict[str, Any] = {"status": status, "decided_at": NOW, "decided_by": "U0BOB",
                            "decided_via": "slack", "verdict": {"approved": "approve",
                                                                "denied": "deny"}.get(status)}
    return approval(**{**base, **kw})


def vote(actor: str, digest: str = "d1", verdict: str = "approve") -> VoteRecord:
    return VoteRecord(approval_id="a", actor=actor, verdict=verdict, digest=digest, via="slack",
                      at=NOW)


def run(status: str, **kw: Any) -> RunRecord:
    fields: dict[str, Any] = dict(
        id="run1", agent="support-bot", status=status, step=7, next_seq=12,
        task="Refund <!channel> order", requested_by="U0ALICE", instructions_version="v1",
        result=None, error=None, inflight=None, cancel_requested=False,
        cancel_requested_by=None, cancel_reason=None, lease_owner=None,
        lease_expires_at=None, wait_until=None, wait_reason=None, failures=0,
        created_at=NOW - timedelta(minutes=90), updated_at=NOW - timedelta(minutes=1))
    fields.update(kw)
    return RunRecord(**fields)


# -- validation helpers --------------------------------------------------------------------

def dump(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def texts_of(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [t for k, v in value.items()
                for t in ([v] if k == "text" and isinstance(v, str) else texts_of(v))]
    if isinstance(value, list):
        return [t for v in value for t in texts_of(v)]
    return []


def check_blocks(blocks: list[dict[str, Any]], max_blocks: int) -> None:
    assert 0 < len(blocks) <= max_blocks
    for b in blocks:
        parsed = Block.parse(b)
        assert parsed is not None and type(parsed) is not Block, b
        assert parsed.to_dict() == b  # to_dict runs every validator
        if b["type"] == "section":
            assert units(b["text"]["text"]) <= 3000
            if b["text"]["type"] == "mrkdwn":
                assert b["text"]["verbatim"] is True
        if b["type"] == "header":
            assert units(b["text"]["text"]) <= 150
        for e in [*b.get("elements", []), b.get("accessory") or {}, b.get("element") or {}]:
            if e.get("action_id") in (cards.APPROVE_SELECTED, cards.DENY_SELECTED):
                assert "value" not in e  # they decide what is ticked, never a value they carry
            elif e.get("action_id") in (cards.STANDING_REVOKE, cards.STANDING_GRANT):
                assert 0 < len(e["value"]) <= 64  # a standing approval's id, nothing else
            elif e.get("type") == "button":
                assert cards.parse_value(e["value"]) and len(e["value"]) <= 2000
            if e.get("type") == "checkboxes":
                check_checkboxes(e)
            if e.get("type") == "mrkdwn":
                assert e["verbatim"] is True


def check_checkboxes(e: dict[str, Any]) -> None:
    """Slack's limits on a checkboxes element, and that every option is one of ours (a
    request to decide, or an argument name in the standing approval modal)."""
    assert e["action_id"] in (cards.SELECT, cards.FIELDS_INPUT) and 0 < len(e["options"]) <= 10
    for o in e["options"] + e.get("initial_options", []):
        assert e["action_id"] == cards.FIELDS_INPUT or cards.parse_value(o["value"])
        assert 0 < len(o["value"]) <= 150
        assert 0 < units(o["text"]["text"]) <= 75
        assert "description" not in o or units(o["description"]["text"]) <= 75


def check_message(msg: dict[str, Any]) -> None:
    check_blocks(msg["blocks"], 50)
    assert 0 < units(msg["text"]) <= 3000
    assert sum(units(t) for t in texts_of(msg["blocks"])) <= 12_000
    dump(msg).encode("utf-8")  # no lone surrogate can be sent


def check_view(view: dict[str, Any]) -> None:
    assert View(**view).to_dict() == view
    check_blocks(view["blocks"], 100)
    dump(view).encode("utf-8")


def assert_inert(obj: Any) -> None:
    text = dump(obj)
    for bad in BAD_PREFIXES:
        assert bad not in text, bad
    assert "\u202e" not in text


def buttons_of(msg: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["action_id"]: e for b in msg["blocks"] if b["type"] == "actions"
            for e in b["elements"]}


def code_contents(text: str) -> list[str]:
    parts = text.split("```")
    return parts[1::2]


# -- pending cards ----------------------------------------------------------------------------

def test_pending_card_buttons_carry_only_id_and_token() -> None:
    a = approval(args={"order": "1234", "amount": 42, "note": "secret-arg-value"})
    card = cards.approval_card(a, token=TOKEN, now=NOW)
    check_message(card)
    found = buttons_of(card)
    assert set(found) == {cards.APPROVE, cards.STANDING, cards.DENY, cards.EDIT,
                          cards.REDIRECT}
    for e in found.values():
        assert e["value"] == f"v2:{a.id}:{TOKEN}"  # (v2: its token shows a binding)
        assert "secret-arg-value" not in e["value"]
    assert found[cards.APPROVE]["style"] == "primary" and "confirm" not in found[cards.APPROVE]
    assert found[cards.DENY]["style"] == "danger"
    body = dump(card)
    assert "Approval needed: issue_refund · medium risk" in body
    assert "<@U0ALICE>" in body and "<!subteam^S0FIN>" in body and "<@U0BOB>" in body
    assert "<!date^" in body and "^expires {date_short_pretty} at {time}|" in body
    assert "secret-arg-value" in body and "Refunding the duplicate charge." in body
    assert "lookup_order" in body and "$42.00" in body and "Refunds move money." in body
    assert card["text"] == "support-bot needs approval to run issue_refund (medium risk)"


def test_high_risk_approve_asks_for_confirmation() -> None:
    card = cards.approval_card(approval(packet_=packet(risk="high")), token=TOKEN, now=NOW)
    check_message(card)
    confirm = buttons_of(card)[cards.APPROVE]["confirm"]
    assert confirm["confirm"]["text"] == T.CONFIRM_APPROVE_YES and "issue_refund" in dump(
        confirm)
    assert "high risk" in card["blocks"][0]["text"]["text"]


def test_quorum_progress_counts_votes_on_the_current_arguments() -> None:
    a = approval(quorum=2, approve_count=1)
    card = cards.approval_card(a, token=TOKEN, now=NOW, votes=[vote("U0BOB"), vote("U0X", "d0")])
    check_message(card)
    body = dump(card)
    assert "1 of 2 approvals" in body and "<@U0BOB>" in body and "<@U0X>" not in body
    assert "of 1 approvals" not in dump(cards.approval_card(approval(), token=TOKEN,
                                                                  now=NOW))


def test_requester_mentioned_only_when_it_is_a_slack_user_id() -> None:
    for requester, shown in (("U0ALICE", "<@U0ALICE>"), ("W0BOB", "<@W0BOB>"),
                             ("cli:root", "cli:root"), ("<!channel>", "&lt;!channel&gt;")):
        card = cards.approval_card(approval(requested_by=requester), token=TOKEN, now=NOW)
        assert shown in card["blocks"][1]["text"]["text"]
        assert_inert(card)


def test_thread_link_and_escalation_links() -> None:
    a = approval(supersedes="old1", rung=1)
    card = cards.approval_card(a, token=TOKEN, now=NOW,
                               thread_url="https://x.slack.com/archives/C1/p1?a=1&b=2",
                               supersedes_url="https://x.slack.com/archives/C1/p0")
    check_message(card)
    body = dump(card)
    assert "<https://x.slack.com/archives/C1/p1?a=1&amp;b=2|Open the run's thread>" in body
    assert "<https://x.slack.com/archives/C1/p0|earlier request>" in body
    bad = cards.approval_card(a, token=TOKEN, now=NOW, thread_url="javascript:alert(1)")
    assert "javascript" not in dump(bad) and T.CTX_ESCALATED_FROM in dump(bad)
    piped = cards.approval_card(a, token=TOKEN, now=NOW, thread_url="https://x/a|<!here>")
    assert_inert(piped)


def test_overdue_pending_card_says_it_is_closing() -> None:
    card = cards.approval_card(approval(), token=TOKEN, now=NOW + timedelta(hours=1))
    check_message(card)
    assert "deadline passed" in dump(card)


def test_escalating_policy_says_so() -> None:
    pol = {"on_expire": "escalate", "escalate": [{"approvers": ["U0CFO"], "ttl": "1h"}]}
    body = dump(cards.approval_card(approval(policy=pol), token=TOKEN, now=NOW))
    assert T.CTX_ON_EXPIRE["escalate"] in body
    last = approval(policy=pol, rung=1)  # the ladder is exhausted: silence cancels
    assert T.CTX_ON_EXPIRE["cancel"] in dump(cards.approval_card(last, token=TOKEN,
                                                                       now=NOW))


# -- cards without buttons ----------------------------------------------------------------

@pytest.mark.parametrize(("status", "words"), [
    ("approved", "*Approved* by <@U0BOB>"), ("denied", "*Denied* by <@U0BOB>"),
    ("expired", "*Expired*"), ("superseded", "*Expired and escalated*"),
    ("cancelled", "*Cancelled* by <@U0BOB>"),
])
def test_every_decided_status_has_a_decision_line_and_no_buttons(status: str, words: str) -> None:
    card = cards.approval_card(decided(status), token=TOKEN, now=NOW)
    check_message(card)
    assert not buttons_of(card)
    body = dump(card)
    assert words in body and "<!date^" in body
    label = WORDS[outcome_of(decided(status))].label  # as every view names it
    assert card["blocks"][0]["text"]["text"] == T.HEADER_DONE.format(label=label,
                                                                     tool="issue_refund")


def test_denial_reason_is_escaped_and_cli_decisions_are_marked() -> None:
    a = decided("denied", reason="no <!channel> way <http://evil|bank.com>", decided_via="cli:op")
    card = cards.approval_card(a, token=None, now=NOW)
    check_message(card)
    assert_inert(card)
    assert "*Reason:* no &lt;!channel&gt; way" in dump(card)
    assert T.DECIDED_VIA_CLI in dump(card)


def test_approved_with_edits_shows_the_edited_arguments() -> None:
    a = decided("approved", edited_args={"order": "1234", "amount": 21})
    card = cards.approval_card(a, token=None, now=NOW, votes=[vote("U0BOB", "d2")])
    check_message(card)
    body = dump(card)
    assert "*Approved with edits* by <@U0BOB>" in body
    assert T.SECTION_EDITED in body and T.SECTION_ARGS_ORIGINAL in body
    assert '\\"amount\\": 21' in body and '\\"amount\\": 42' in body


def test_pending_card_with_an_edit_awaiting_quorum() -> None:
    a = approval(edited_args={"amount": 1}, quorum=2, approve_count=1)
    card = cards.approval_card(a, token=TOKEN, now=NOW, votes=[vote("U0BOB", "d2")])
    check_message(card)
    assert T.SECTION_EDITED in dump(card) and "1 of 2 approvals" in dump(card)
    assert "Arguments edited by <@U0CAROL>" in dump(card)


def test_an_edit_says_whose_earlier_approvals_stopped_counting() -> None:
    a = approval(edited_args={"amount": 1}, quorum=2, approve_count=1)
    votes = [vote("U0DAN", "d1"), vote("U0CAROL", "d2")]  # Dan approved the old amount
    card = cards.approval_card(a, token=TOKEN, now=NOW, votes=votes)
    check_message(card)
    text = dump(card)
    assert "1 of 2 approvals" in text and "<@U0CAROL>" in text
    assert "earlier approvals by <@U0DAN> were on the previous arguments" in text
    # once Dan approves the new amount too, nothing is stale any more
    both = cards.approval_card(a, token=TOKEN, now=NOW, votes=[*votes, vote("U0DAN", "d2")])
    assert "no longer count" not in dump(both) and "2 of 2 approvals" in dump(both)


def test_a_proposed_edit_says_someone_else_must_approve() -> None:
    policy = {"approvers": ["U0BOB"], "quorum": 1, "ttl": "30m", "on_expire": "cancel",
              "escalate": [], "risk": "medium", "edits": "propose"}
    a = approval(edited_args={"amount": 1}, policy=policy)
    card = cards.approval_card(a, token=TOKEN, now=NOW)
    check_message(card)
    assert "proposed by <@U0CAROL>" in dump(card) and "someone else must approve" in dump(card)
    modal = views.edit_modal(a, TOKEN, "C0OPS", "1.2")
    assert modal["submit"]["text"] == T.MODAL_PROPOSE_SUBMIT


@pytest.mark.parametrize("case", ["worked_out", "caller", "before_impacts"])
@pytest.mark.parametrize("status", ["pending", "approved"])
def test_an_edited_request_says_what_the_edit_does_and_labels_the_original_words(
        case: str, status: str) -> None:
    # the packet says $42.00; the edit refunds $20.00 (see tests/unit/test_edited_packet.py
    # and tests/integration/test_slack_edits.py for the paths that write these rows)
    p = packet(doing=f"I will refund $42.00 {HOSTILE}", impact=f"$42.00 back {HOSTILE}")
    if case != "before_impacts":  # an edit recorded before edits had impacts has none
        p["edited_impact"] = {"digest": "d2", "asked_digest": "d1",
                              "impact": None if case == "caller" else f"$20.00 back {HOSTILE}"}
    a = (decided(status) if status != "pending" else approval())
    a = replace(a, packet=json.dumps(p), edited_args=json.dumps({"amount": 20}),
                edited_digest="d2", edited_by="U0CAROL", edited_at=NOW,
                run_id="x" + "0" * 31 if case == "caller" else "run1")
    author = "caller" if case == "caller" else "agent"
    card = cards.approval_card(a, token=TOKEN, now=NOW)
    compact = cards.compact_blocks(a, TOKEN, now=NOW, selectable=True)
    for msg in (card, {"text": "x", "blocks": compact}):
        check_message(msg)
        assert_inert(msg)
        text = dump(msg)
        assert T.DOING_BEFORE_EDIT[author] in text and "What the agent is doing" not in text
        if case == "worked_out":
            assert "$20.00 back" in text and "$42.00 back" not in text
            assert "of the edited arguments" in text
        else:  # nothing could work the edit's impact out: the original's, labelled
            assert T.IMPACT_BEFORE_EDIT[author] in text and "$20.00" not in text
            assert "Expected impact*" not in text and "*Impact:*" not in text
    line = _story("approved", a) if status == "approved" else ""
    assert_inert(line)
    assert "$42.00" not in line
    if status == "approved":
        assert ("$20.00 back" in line) if case == "worked_out" else ('{"amount":20}' in line)


def test_quorum_approval_lists_every_approver() -> None:
    a = decided("approved", quorum=2, approve_count=2)
    card = cards.approval_card(a, token=None, now=NOW, votes=[vote("U0BOB"), vote("U0CAROL")])
    assert "Approvals: <@U0BOB>, <@U0CAROL>" in dump(card)


def test_superseded_card_points_at_the_new_request() -> None:
    a = decided("superseded", decided_by=None)
    by_url = cards.approval_card(a, token=None, now=NOW,
                                 superseded_by="https://x.slack.com/archives/C1/p9")
    by_id = cards.approval_card(a, token=None, now=NOW, superseded_by="newid42")
    for card in (by_url, by_id):
        check_message(card)
    assert "<https://x.slack.com/archives/C1/p9|See the new request>" in dump(by_url)
    assert "New request: `newid42`" in dump(by_id)


def test_pending_without_token_has_no_buttons() -> None:
    card = cards.approval_card(approval(), token=None, now=NOW)
    check_message(card)
    assert not buttons_of(card)
    assert "Waiting for a decision" in dump(card)


def test_token_is_ignored_once_decided() -> None:
    for status in ("approved", "denied", "expired", "superseded", "cancelled", "weird<!here>"):
        card = cards.approval_card(decided(status), token=TOKEN, now=NOW)
        check_message(card)
        assert not buttons_of(card)
        assert_inert(card)


# -- outcome questions ---------------------------------------------------------------------

def question(**kw: Any) -> ApprovalRecord:
    p = packet(doing="refund started (attempt 1) but the process stopped. Did it take effect?",
               evidence=[], impact=None, idempotency_key="run1:call1")
    return approval(kind="outcome_unknown", packet_=p, expires_at=NOW + timedelta(days=3650),
                    **kw)


def test_outcome_question_asks_with_retry_mark_done_abort() -> None:
    card = cards.approval_card(question(), token=TOKEN, now=NOW)
    check_message(card)
    found = buttons_of(card)
    assert set(found) == {cards.RETRY, cards.MARK_DONE, cards.ABORT}
    assert "confirm" in found[cards.RETRY] and found[cards.ABORT]["style"] == "danger"
    body = dump(card)
    assert "Did this happen? issue_refund" in body and "run1:call1" in body
    assert "expires" not in body  # a question never expires on its own


def test_outcome_question_shows_the_attempt_and_what_reconcile_said() -> None:
    a = question()
    p = json.loads(a.packet)
    p.update(attempt=2, started_at=(NOW - timedelta(minutes=9)).isoformat(),
             heard_at=(NOW - timedelta(minutes=7)).isoformat(), worker="host-a:77:ab/cd",
             reconcile="its reconcile hook raised ConnectionError: <!channel> down")
    card = cards.approval_card(replace(a, packet=json.dumps(p)), token=TOKEN, now=NOW)
    check_message(card)
    body = dump(card)
    assert "*Attempt 2* started" in body and "last heard from" in body
    assert "host-a:77:ab/cd" in body and "raised ConnectionError" in body
    assert "<!channel>" not in body  # reconcile's words are escaped like any agent text


@pytest.mark.parametrize(("verdict", "status", "words"), [
    ("retry", "approved", "*Retried* by"), ("mark_done", "approved", "*Marked done*"),
    ("abort", "denied", "*Aborted*")])
def test_answered_question(verdict: str, status: str, words: str) -> None:
    a = replace(question(), status=status, verdict=verdict, decided_by="U0BOB", decided_at=NOW,
                reason="checked the ledger" if verdict == "abort" else None)
    card = cards.approval_card(a, token=TOKEN, now=NOW)
    check_message(card)
    assert words in dump(card) and not buttons_of(card)


# -- approved calls the deployed release cannot run -----------------------------------------

REASON = "approved call `issue_refund` cannot run on agent support-bot v2: no such tool <!here>"


def cannot_run(**kw: Any) -> ApprovalRecord:
    p = packet(doing="issue_refund was approved but was not executed.", evidence=[],
               impact=None, reason=REASON, approval_id="a0")
    return approval(kind="cannot_run", packet_=p, expires_at=NOW + timedelta(days=3650), **kw)


def test_cannot_run_question_asks_to_replan_or_abort() -> None:
    card = cards.approval_card(cannot_run(), token=TOKEN, now=NOW)
    check_message(card)
    found = buttons_of(card)
    assert set(found) == {cards.REPLAN, cards.ABORT}
    assert found[cards.ABORT]["style"] == "danger"
    body = dump(card)
    assert "Approved but not run: issue_refund" in body and "not executed" in body
    assert "no such tool" in body and "<!here>" not in body  # the reason is escaped
    assert "expires" not in body
    assert "cannot run" in card["text"]
    compact = cards.compact_blocks(cannot_run(), TOKEN, now=NOW)
    check_blocks(compact, 5)
    assert "cannot run" in dump(compact)


@pytest.mark.parametrize(("verdict", "status", "words"), [
    ("replan", "approved", "*Re-planned* by"), ("abort", "denied", "*Aborted*")])
def test_answered_cannot_run(verdict: str, status: str, words: str) -> None:
    a = replace(cannot_run(), status=status, verdict=verdict, decided_by="U0BOB",
                decided_at=NOW, reason="paid by hand" if verdict == "abort" else None)
    card = cards.approval_card(a, token=TOKEN, now=NOW)
    check_message(card)
    assert words in dump(card) and not buttons_of(card)
    assert cards.status_word(a) == ("re-planned" if verdict == "replan" else "aborted")


def test_an_approved_card_says_its_call_was_not_executed() -> None:
    p = packet(not_executed=REASON)
    a = decided("approved", packet_=p)
    card = cards.approval_card(a, token=TOKEN, now=NOW)
    check_message(card)
    body = dump(card)
    assert "*Not executed:*" in body and "no such tool" in body and "<!here>" not in body


def test_the_thread_and_reminders_say_an_approved_call_cannot_run() -> None:
    said = _story("requested", cannot_run())
    assert "not executed" in said and "no such tool" in said and "<!here>" not in said
    reminder = messages.reminder_text(cannot_run(), now=NOW)
    assert "re-plan or abort" in reminder


# -- hostile and huge input ----------------------------------------------------------------

def hostile_approval(size: int = 20_000, **kw: Any) -> ApprovalRecord:
    args = {"memo": HOSTILE, "unicode": UNICODE, "nested": {"k<!here>": [HOSTILE] * 3},
            "lone": "\ud800", "blob": ("<!channel>`" + UNICODE) * (size // 40)}
    p = packet(task=HOSTILE * 40, doing=HOSTILE * 60, impact=HOSTILE * 30, why=HOSTILE * 30,
               agent="bot<!here>", risk="high",
               evidence=[{"tool": "t`<!here>", "call_id": "c", "result": HOSTILE * 20}] * 5)
    return approval(args=args, packet_=p, **kw)


def test_hostile_arguments_cannot_ping_link_or_break_the_card() -> None:
    a = hostile_approval()
    assert len(a.args) > 20_000
    card = cards.approval_card(a, token=TOKEN, now=NOW)
    check_message(card)
    assert_inert(card)
    assert cards.VIEW_ARGS in buttons_of(card)
    args_block = next(b for b in card["blocks"] if T.SECTION_ARGS in b["text"].get("text", ""))
    text = args_block["text"]["text"]
    assert "more characters_" in text
    inner = code_contents(text)
    assert len(inner) == 1 and "``" not in inner[0]  # input backticks cannot close the fence
    assert "漢字" in text and "🎉" in text


def test_maximal_cards_stay_within_the_message_budget() -> None:
    big = {"blob": "<" * 30_000}
    for a in (hostile_approval(),
              hostile_approval(edited_args=big, status="approved", decided_by="U0BOB",
                               decided_at=NOW, reason="<" * 2000,
                               approvers=[f"U0{i:03d}" for i in range(30)]),
              hostile_approval(edited_args=big, quorum=3, approve_count=2),
              hostile_approval(status="denied", decided_by="x" * 500, decided_at=NOW,
                               reason="&" * 2000)):
        for token in (TOKEN, None):
            card = cards.approval_card(a, token=token, now=NOW,
                                       votes=[vote(f"U0{i:03d}", "d2") for i in range(20)],
                                       thread_url="https://x.slack.com/" + "a" * 400)
            check_message(card)
            assert_inert(card)


def test_random_hostile_inputs_property() -> None:
    rnd = random.Random(9)
    alphabet = [*PINGS, "`", "``", "```", "&", "<", ">", "|", "\n", "*", "_", "~", " ", "a",
                "🎉", "👩‍👩‍👧", "e\u0301", "\u202e", "\u2067", "\ud83d", "漢", "ש", "\x00", "\\"]
    statuses = ["pending", "approved", "denied", "expired", "superseded", "cancelled"]
    for i in range(120):
        blob = "".join(rnd.choice(alphabet) for _ in range(rnd.choice([5, 200, 2000, 6000])))
        kind = "outcome_unknown" if i % 5 == 0 else "tool_call"
        a = approval(args={"x": blob, blob[:30]: [blob[:100]]}, kind=kind,
                     packet_=packet(doing=blob, task=blob, impact=blob[:500], why=blob[-300:],
                                    risk=rnd.choice(["low", "medium", "high", "<!here>"]),
                                    evidence=[{"tool": blob[:20], "result": blob}]),
                     status=rnd.choice(statuses), reason=blob[:2000] or None,
                     decided_by=rnd.choice([None, "U0BOB", blob[:50]]), decided_at=NOW,
                     edited_args={"y": blob[::-1]} if i % 3 == 0 else None,
                     quorum=rnd.choice([1, 2, 3]), approve_count=rnd.choice([0, 1]))
        card = cards.approval_card(a, token=TOKEN, now=NOW)
        check_message(card)
        assert_inert(card)
        for b in card["blocks"]:
            for inner in code_contents(b.get("text", {}).get("text", "")):
                assert "``" not in inner
        check_message({"text": "x", "blocks": cards.compact_blocks(a, TOKEN, now=NOW)})


def test_astral_characters_count_double_and_graphemes_stay_whole() -> None:
    family = "👩‍👩‍👧‍👦"
    a = approval(args={"x": family * 2000})
    card = cards.approval_card(a, token=TOKEN, now=NOW)
    check_message(card)
    text = next(b["text"]["text"] for b in card["blocks"]
                if T.SECTION_ARGS in b.get("text", {}).get("text", ""))
    shown = code_contents(text)[0].rstrip("\n")
    assert shown.endswith("👦") and units(text) <= 3000
    assert clip("e\u0301" * 10, 6) == "e\u0301e\u0301" + "…"


def test_escape_and_clip_helpers() -> None:
    assert escape_mrkdwn("<!channel> & <@U1>") == "&lt;!channel&gt; &amp; &lt;@U1&gt;"
    assert clip("a<b", 10) == "a&lt;b"
    assert clip("<<<<", 9) == "&lt;&lt;…"  # never half an entity
    assert "\u202e" not in clip("x\u202ey", 20) and "[U+202E]" in clip("x\u202ey", 20)
    shown, cut = code_block("a```b" * 100, 100)
    assert cut > 0 and "``" not in code_contents(shown)[0] and units(shown) <= 100
    assert json.loads(pretty_json({"k": "\u202e\ud800"})) == {"k": "\u202e\ud800"}
    assert safe_cut("ab &lt; <@U1> cd", 7) == "ab …"
    assert safe_cut("ab &lt; <@U1> cd", 11) == "ab &lt; …"


# -- values, metadata ------------------------------------------------------------------------

def test_button_values_round_trip_and_reject_garbage() -> None:
    assert cards.parse_value(cards.button_value("abc", TOKEN)) == ("abc", TOKEN)
    for bad in ("", "abc", ":tok", "abc:", "a:b:c", "a b:c", "a:" + "x" * 600, None, 42):
        with pytest.raises(ValueError):
            cards.parse_value(bad)  # type: ignore[arg-type]
    for bad_id, bad_token in (("a:b", "t"), ("a", ""), ("", "t"), ("a" * 200, "t")):
        with pytest.raises(ValueError):
            cards.button_value(bad_id, bad_token)


def test_modal_metadata_round_trip() -> None:
    meta = views.modal_metadata("abc", TOKEN, "C1", "1.2")
    assert views.parse_metadata(meta) == ("abc", TOKEN, "C1", "1.2")
    assert views.parse_metadata(views.modal_metadata("abc", TOKEN, None, None)).channel is None
    for bad in ("", "[]", "{}", '{"approval_id":"a"}', '{"approval_id":"a","token":"t","ts":1}',
                "not json"):
        with pytest.raises(ValueError):
            views.parse_metadata(bad)


# -- modals ----------------------------------------------------------------------------------

def unescape(text: str) -> str:
    return html.unescape(text.replace("\u200b", ""))


def test_args_modal_shows_all_of_20kb() -> None:
    a = hostile_approval()
    view = views.args_modal(a)
    check_view(view)
    assert_inert(view)
    chunks = [c for b in view["blocks"][1:] for c in code_contents(b["text"]["text"])]
    shown = "".join(c[1:-1] for c in chunks)  # drop the fence newlines
    expected = pretty_json(json.loads(a.args)).replace("\ud800", "\\ud800")
    assert unescape(shown) == expected.replace("\u202e", "\\u202e")


def test_args_modal_for_too_much_says_how_much_is_missing() -> None:
    a = approval(args={"x": "<" * 400_000}, edited_args={"y": 1})
    view = views.args_modal(a)
    check_view(view)
    assert len(view["blocks"]) == 100
    assert "more characters not shown" in view["blocks"][-1]["text"]["text"]
    assert "Full arguments" == view["title"]["text"]


def test_deny_and_abort_modals() -> None:
    for build, callback in ((views.deny_modal, cards.DENY_MODAL),
                            (views.resolve_abort_modal, cards.RESOLVE_MODAL)):
        for tool in ("issue_refund", "<!here>`x", None):
            view = build("abc", TOKEN, "C1", "1.2", tool=tool)
            check_view(view)
            assert_inert(view)
            assert view["callback_id"] == callback
            block = view["blocks"][-1]
            assert block["block_id"] == cards.REASON_BLOCK and not block.get("optional")
            el = block["element"]
            assert el["action_id"] == cards.REASON_INPUT and el["multiline"]
            assert el["max_length"] == 2000
            assert views.parse_metadata(view["private_metadata"]) == ("abc", TOKEN, "C1", "1.2")


def test_edit_modal_prefills_the_effective_arguments() -> None:
    for a in (approval(args={"amount": 42, "memo": HOSTILE + UNICODE}),
              approval(edited_args={"amount": 7})):
        view = views.edit_modal(a, TOKEN, "C1", "1.2")
        check_view(view)
        assert view["callback_id"] == cards.EDIT_MODAL
        block = view["blocks"][-2]
        assert block["block_id"] == cards.ARGS_BLOCK and not block.get("optional")
        why = view["blocks"][-1]  # the edit's reason, kept in the audit log (issue 52)
        assert why["block_id"] == cards.REASON_BLOCK and why["optional"]
        el = block["element"]
        assert el["action_id"] == cards.ARGS_INPUT and el["multiline"]
        assert json.loads(el["initial_value"]) == a.effective_args()
        assert "issue_refund" in dump(view) and "schema" in dump(view)
        assert_inert(view["blocks"][0])


def test_edit_modal_for_arguments_too_long_to_edit_in_slack() -> None:
    a = approval(args={"x": "y" * 5000})
    assert cards.EDIT not in buttons_of(cards.approval_card(a, token=TOKEN, now=NOW))
    view = views.edit_modal(a, TOKEN, None, None)
    check_view(view)
    assert "submit" not in view and "approvald approvals edit" in dump(view)
    mid = approval(args={"x": "y" * 2000, "z": list(range(200))})  # compact fits, pretty not
    el = views.edit_modal(mid, TOKEN, None, None)["blocks"][-2]["element"]
    assert json.loads(el["initial_value"]) == mid.args_value() and "\n" not in el["initial_value"]


def test_edit_errors() -> None:
    body = views.edit_errors([{"loc": ["items", 0, "amount"], "msg": "must be > 0"},
                              {"loc": [], "msg": "bad"}])
    assert body == {"response_action": "errors",
                    "errors": {"args": "items[0].amount: must be > 0; bad"}}
    assert "Not valid JSON" in views.edit_errors("Expecting value: line 1")["errors"]["args"]
    assert views.edit_errors([])["errors"]["args"] == T.EDIT_ERROR_GENERIC
    many = views.edit_errors([{"loc": [f"f{i}"], "msg": "x" * 500} for i in range(40)])
    assert len(many["errors"]["args"]) <= 1000


def test_parse_edit() -> None:
    assert views.parse_edit('{"amount": 7}') == ({"amount": 7}, None)
    deep = '{"a":' * 1000 + "1" + "}" * 1000  # issue 45: a RecursionError, not an answer
    for text, words in (("[1]", "JSON object"), ("{", "Not valid JSON"), ("", "Not valid JSON"),
                        (deep, "nested deeper than 64 levels"),
                        ('{"a":' * 65 + "1" + "}" * 65, "nested deeper than 64 levels")):
        args, answer = views.parse_edit(text)
        assert args is None and answer is not None and words in answer["errors"]["args"]


# -- App Home and /approvals -----------------------------------------------------------------

def many(n: int) -> list[tuple[ApprovalRecord, str]]:
    return [(replace(hostile_approval(2000), id=f"a{i}",
                     kind="outcome_unknown" if i % 7 == 0 else "tool_call"), TOKEN)
            for i in range(n)]


def test_home_view_empty_and_full() -> None:
    empty = views.home_view([], [], now=NOW)
    check_view(empty)
    assert T.HOME_EMPTY in dump(empty) and T.HOME_RECENT_EMPTY in dump(empty)
    recent = [decided(s, id=f"r{i}") for i, s in
              enumerate(["approved", "denied", "expired", "superseded", "cancelled"] * 4)]
    full = views.home_view(many(40), recent, now=NOW)
    check_view(full)
    assert_inert(full)
    assert full["type"] == "home" and len(full["blocks"]) <= 100
    # the oldest that fit (here the text budget stops them), with the batch buttons on top
    shown = sum(b["type"] == "actions" and b.get("block_id") != cards.BATCH_BLOCK
                for b in full["blocks"])
    assert 20 <= shown < 40
    assert f"Showing the oldest {shown} of 40" in dump(full) and T.HOME_RECENT_TITLE in dump(full)
    values = {e.get("value") for b in full["blocks"] if b["type"] == "actions"
              for e in b["elements"]}
    assert values - {None} == {f"v2:a{i}:{TOKEN}" for i in range(shown)}


def test_approvals_list_message_empty_and_full() -> None:
    empty = views.approvals_list_message([], now=NOW)
    check_message(empty)
    assert T.LIST_EMPTY in empty["text"]
    for n in (1, 3, 40):
        msg = views.approvals_list_message(many(n), now=NOW)
        check_message(msg)
        assert_inert(msg)
        actions = sum(b["type"] == "actions" and b.get("block_id") != cards.BATCH_BLOCK
                      for b in msg["blocks"])
        assert 0 < actions <= min(n, views.LIST_MAX_PENDING)
        assert (T.LIST_MORE[:5] in dump(msg)) == (n > actions)


# -- messages ----------------------------------------------------------------------------------

REFUSAL_CODES = ("not_pending", "bad_token", "not_authorized", "self_approval", "already_voted",
                 "invalid_arguments", "wrong_kind", "reason_required", "reason_too_long",
                 "directory_unavailable")


def test_refusal_text_for_every_code() -> None:
    seen = set()
    for code in REFUSAL_CODES:
        text = messages.refusal_text(code)
        assert text and text != T.REFUSAL_UNKNOWN
        seen.add(text)
    assert len(seen) == len(REFUSAL_CODES)
    assert messages.refusal_text("not_authorized") == "You're not an approver for this request."
    assert messages.refusal_text("bad_token") == (
        "This button no longer belongs to a live request.")
    late = {messages.refusal_text("not_pending", status=s) for s in
            ("approved", "denied", "expired", "superseded", "cancelled")}
    assert len(late) == 5
    assert messages.refusal_text("nope") == T.REFUSAL_UNKNOWN
    detailed = messages.refusal_text("invalid_arguments", detail="amount: <!channel>")
    assert "&lt;!channel&gt;" in detailed


def test_reminders() -> None:
    text = messages.reminder_text(approval(quorum=2, approve_count=1), now=NOW,
                                  card_url="https://x.slack.com/p1")
    assert "1 of 2 approvals" in text and "25m left" in text and "<@U0BOB>" in text
    assert "<https://x.slack.com/p1|Open the request>" in text
    overdue = messages.reminder_text(approval(), now=NOW + timedelta(hours=2))
    assert "deadline has passed" in overdue
    assert "took effect" in messages.reminder_text(question(), now=NOW)
    assert_inert(messages.reminder_text(hostile_approval(), now=NOW))


@pytest.mark.parametrize("status", ["running", "awaiting_approval", "needs_attention",
                                    "completed", "failed", "cancelled", "mystery<!here>"])
def test_run_parent_for_every_status(status: str) -> None:
    r = run(status, error="boom <!channel>" if status in ("failed", "cancelled") else None,
            result='"done <@U123>"' if status == "completed" else None,
            task="Refund <!channel> " + "x" * 5000, cancel_requested=status == "running")
    waiting = [approval(quorum=2, approve_count=1), question()]
    msg = messages.run_parent(r, now=NOW, pending=waiting)
    check_message(msg)
    assert_inert(msg)
    body = dump(msg)
    assert "support-bot" in body and "Step 7" in body and "<@U0ALICE>" in body
    going = status not in ("completed", "failed", "cancelled")
    # on whom, for what and until when (a date whose fallback reads on its own)
    assert ("*Waiting on* <@U0BOB>, <!subteam^S0FIN> to approve `issue_refund` (1 of 2 "
            "approvals so far) until <!date^" in body) == going, body
    assert ("to say whether `issue_refund` took effect" in body) == going
    emoji, word = T.RUN_STATUS.get(status, (T.UNKNOWN_EMOJI, "mystery"))
    assert emoji in body and word in body
    assert ("took 1h 29m" in body) == (status in ("completed", "failed", "cancelled"))


@pytest.mark.parametrize("ended", ["denied", "expired", "redirected"])
def test_a_completed_run_whose_call_did_not_run_gets_no_green_check(ended: str) -> None:
    from approvald.bot.slack import story

    honest = story.ended_badly([decided(ended)], {})
    assert honest is not None
    body = dump(messages.run_parent(run("completed"), now=NOW, ended=honest))
    assert ":white_check_mark:" not in body and ended in body, body
    assert story.ended_badly([decided("approved")], {}) is None
    # an escalated request is not how the call ended; the request after it is
    assert story.ended_badly([decided("superseded"), decided("approved")], {}) is None


def test_a_date_fallback_keeps_the_words_around_it() -> None:
    from approvald.bot.slack.mrkdwn import slack_date

    when = datetime(2026, 12, 5, 18, 39, tzinfo=UTC)
    said = slack_date(when, T.DATE_EXPIRES)
    assert said.endswith("|expires 2026-12-05 at 18:39 UTC>"), said
    assert "It " + said.rsplit("|", 1)[1].rstrip(">") == "It expires 2026-12-05 at 18:39 UTC"
    assert slack_date(when, "{date_short_pretty} at {time}").endswith("|2026-12-05 at 18:39 UTC>")


def _entry(action: str, actor: str = "U0BOB", via: str = "slack", approval_id: str | None = None,
           **details: Any) -> Any:
    from approvald.store.records import AuditRecord

    return AuditRecord(seq=1, at=NOW, action=action, actor=actor, via=via, run_id="run1",
                       approval_id=approval_id, digest=None, details=json.dumps(details),
                       key_id="", prev_hash="", hash="")


def _story(action: str, a: ApprovalRecord) -> str:
    """What a run's thread says of ``a``'s audit entry ``action``."""
    from approvald.bot.slack import story
    from approvald.runtime.record.shown import RunMasking

    e = _entry(action, approval_id=a.id, tool=a.tool)
    return "\n".join(ln.text for ln in story.entry_lines(e, {a.id: a}, {}, {}, RunMasking()))


def test_thread_lines_are_escaped_and_short() -> None:
    from approvald.bot.slack import story
    from approvald.runtime.record.shown import RunMasking

    a = approval(quorum=2, reason=HOSTILE)
    found = {a.id: a}
    links = {a.id: "https://x/p1"}

    def said(e: Any) -> str:
        return "\n".join(ln.text for ln in story.entry_lines(e, found, {}, links,
                                                               RunMasking()))

    lines = [
        said(_entry("requested", "agent:bot", "agent", a.id, tool=HOSTILE, approvers=["U0BOB"])),
        said(_entry("reminded", "system:expiry", "scheduler", a.id, tool="t", n=1)),
        said(_entry("voted", approval_id=a.id, tool="t", approvals=1, quorum=2)),
        said(_entry("approved", approval_id=a.id, tool="t", approvers=["U0BOB", "U0CAROL"])),
        said(_entry("denied", approval_id=a.id, tool="t")),
        said(_entry("redirected", approval_id=a.id, tool="t")),
        said(_entry("escalated", "system:expiry", "scheduler", a.id, tool="t",
                    approvers=["U0CFO"])),
        said(_entry("cancelled", "cli:root", "cli", reason=HOSTILE)),
        said(_entry("retried", "system:runtime", "runtime", tool="t", attempt=2,
                    why=HOSTILE, once=True)),
        messages.thread_error(HOSTILE * 100),
        messages.thread_final(HOSTILE * 500),
    ]
    for line in lines:
        assert 0 < units(line) <= 3000, line
        assert_inert(line)
    assert "Asked <@U0BOB> to approve" in lines[0] and "<https://x/p1|Open the request>" in lines[0]
    assert "(2 approvals needed)" in lines[0]
    assert "Reminder 1 sent to <@U0BOB>, <!subteam^S0FIN>" in lines[1]
    assert "<@U0BOB> approved `t` (1 of 2 approvals)" in lines[2]
    assert "(0 of 2 approvals: <@U0BOB>, <@U0CAROL>)" in lines[3]
    assert lines[4].startswith(":no_entry: `t` denied by <@U0BOB>: ")
    assert "escalated to <@U0CFO>" in lines[6] and "Open the new request" in lines[6]
    assert lines[7].startswith(":no_entry_sign: root (on the command line) cancelled the run")
    assert "attempt 2" in lines[8] and "ran once" in lines[8]
    assert story.result_words({"sent": True, "to": "a@b", "n": 3, "x": 4}) == \
        "sent yes, to a@b, n 3 and 1 more"


def test_coalesce_packs_in_order_under_the_limit() -> None:
    lines = [f"line {i} &lt;x&gt; <@U{i:04d}>" for i in range(500)]
    out = messages.coalesce(lines, limit=3000)
    assert all(units(m) <= 3000 for m in out)
    assert "\n".join(out).split("\n") == lines
    assert len(out) == -(-sum(units(x) + 1 for x in lines) // 3000)  # as few as possible
    assert messages.coalesce([]) == [] and messages.coalesce(["", ""]) == []
    long = "a" * 2998 + "&lt;" + "b" * 10 + "<@U123>" + "🎉" * 3000
    parts = messages.coalesce([long], limit=3000)
    assert "".join(parts) == long and all(units(p) <= 3000 for p in parts)
    assert parts[0].endswith("a") and parts[1].startswith("&lt;")
    with pytest.raises(ValueError):
        messages.coalesce(["x"], limit=3)


def test_a_refusal_is_told_once_with_people_as_slack_shows_them() -> None:
    """Issue 33: the reply is one sentence from the refusal's fields, not the summary
    followed by the runtime's own message about the same thing in raw ids."""
    raw = "U_EVE is not an approver for this request (approvers: U_ALICE, S_FINANCE)"
    said = messages.refusal_text("not_authorized", detail=raw,
                                 approvers=["U_ALICE", "S_FINANCE"])
    assert said == ("You're not an approver for this request (its approvers: <@U_ALICE>, "
                    "<!subteam^S_FINANCE>).")
    # where mentions do not render (a modal's plain-text error), nobody is named by id
    plain = messages.refusal_text("not_authorized", detail=raw,
                                  approvers=["U_ALICE", "S_FINANCE"], mentions=False)
    assert plain == "You're not an approver for this request."
    late = messages.refusal_text("not_pending", status="denied", decided_by="U_BOB",
                                 detail="approval x is already denied by U_BOB at …")
    assert late == "Too late: <@U_BOB> already denied this request."
    assert messages.refusal_text("not_pending", status="denied", decided_by="U_BOB",
                                 mentions=False) == T.REFUSAL_NOT_PENDING["denied"]
    schema = messages.refusal_text("invalid_arguments", detail="amount_cents: too large.")
    assert schema == "Those arguments don't match the tool's schema: amount_cents: too large."


def test_a_late_click_by_the_one_who_decided_says_their_decision_stands() -> None:
    said = messages.refusal_text("not_pending", status="denied", decided_by="U_BOB",
                                 viewer="U_BOB")
    assert said == T.REPLY_REPEATED["denied"]
    assert "<@U_BOB>" in messages.refusal_text("not_pending", status="denied",
                                               decided_by="U_BOB", viewer="U_EVE")


def test_a_standing_refusal_is_told_once() -> None:
    scope = messages.standing_refusal_text(
        "scope", "the scope does not cover the request it is granted on")
    assert scope == T.STANDING_REFUSAL["scope"]
    window = messages.standing_refusal_text(
        "window", "a standing approval of issue_refund lasts 1m to 1h (asked: 2h)")
    assert window == ("That window is not allowed for this tool: a standing approval of "
                      "issue_refund lasts 1m to 1h (asked: 2h).")


def test_a_reason_a_template_ends_ends_once() -> None:
    cannot = approval(kind="cannot_run", packet_={"reason": "release 7 has no tool issue_refund."})
    line = _story("requested", cannot)
    assert "issue_refund. Asked" in line and ".." not in line


@pytest.mark.parametrize(("action", "verdict", "name"), [
    ("approved", None, "approved"), ("approved", None, "approved_with_edits"),
    ("approved", None, "approved_standing"), ("approved", None, "auto"),
    ("denied", None, "denied"), ("redirected", None, "redirected"),
    ("expired", None, "expired"), ("escalated", None, "escalated"),
    ("outcome_resolved", "retry", "retried"), ("outcome_resolved", "mark_done", "marked_done"),
    ("outcome_resolved", "abort", "aborted"), ("cannot_run_resolved", "replan", "replanned"),
])
def test_thread_lines_say_outcomes_with_the_one_vocabulary(action: str, verdict: str | None,
                                                           name: str) -> None:
    """Issue 48 item 2 in a run's thread: a decision's line names its outcome with the
    words and emoji of runtime/kernel/vocabulary.py, as the CLI, the cards and the audit do."""
    from approvald.bot.slack import story
    from approvald.runtime.kernel.vocabulary import WORDS, OutcomeName
    from approvald.runtime.record.shown import RunMasking

    a = approval()
    actor, via = {"approved_standing": ("standing:s1", "standing"),
                  "auto": ("system:policy", "policy")}.get(name, ("U0BOB", "slack"))
    details: dict[str, Any] = {"tool": "t", "outcome": name, "approvers": ["U0CFO"]}
    if verdict:
        details["verdict"] = verdict
    if name == "approved_standing":
        details.update(standing_approval="s1", granted_by=["U0BOB"])
    e = _entry(action, actor, via, a.id, **details)
    [line] = story.entry_lines(e, {a.id: a}, {}, {}, RunMasking())
    w = WORDS[OutcomeName(name)]
    assert line.text.startswith(f":{w.emoji}:"), line.text
    assert f" {w.words}" in line.text, line.text
    # and the words of no other outcome of the same icon
    others = [o.words for o in WORDS.values()
              if o.words != w.words and not w.words.startswith(o.words)
              and o.name not in (OutcomeName.APPROVED,)]
    assert not [o for o in others if f"`t` {o} " in line.text], line.text


def test_a_finished_runs_headline_says_the_outcome_with_the_vocabulary() -> None:
    from approvald.bot.slack import story
    from approvald.runtime.kernel.vocabulary import WORDS, OutcomeName

    for status, name in (("denied", OutcomeName.DENIED), ("expired", OutcomeName.EXPIRED),
                         ("redirected", OutcomeName.REDIRECTED)):
        ended = story.ended_badly([approval(status=status)], {})
        assert ended is not None
        assert ended[0] == f":{WORDS[name].emoji}:" and WORDS[name].words in ended[1], ended
    assert story.ended_badly([approval(status="approved")], {}) is None


def test_a_retry_says_whether_the_call_ran_once() -> None:
    """A crash after a call's intent, and its retry, in the run's thread (issue 52): which
    attempt it is, why running it again was safe, and whether the call ran once."""
    from approvald.bot.slack import story
    from approvald.runtime.record.shown import RunMasking

    def said(**details: Any) -> str:
        e = _entry("retried", "system:runtime", "runtime", tool="issue_refund", **details)
        [line] = story.entry_lines(e, {}, {}, {}, RunMasking())
        return line.text

    once = said(attempt=2, once=True, why="its reconcile hook says it did not happen")
    assert "runs again as attempt 2: attempt 1 was cut off" in once
    assert "its reconcile hook says it did not happen" in once and "ran once" in once
    again = said(attempt=3, once=False,
                 why="the tool is idempotent, so running it again under its key is harmless")
    assert "attempt 3" in again and "ran once" not in again
    assert "idempotent: had attempt 2 taken effect" in again
