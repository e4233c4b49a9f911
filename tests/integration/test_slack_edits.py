"""A request an approver edited, over real HTTP: every place Slack shows it (the card, the
modals, the App Home, /approvals, the editor's ephemeral reply, the run's thread, and the
sandbox page drawing them) tells the arguments that will run and *their* impact; the
agent's words, written about the arguments it asked for, are shown only labelled as such.

The demo refund agent asks to refund the duplicate charge of order A-1001, $42.00
("... I will refund the duplicate charge: $42.00."), and its tool's impact hook says
"$42.00 goes back to the customer's card for order A-1001."; an approver edits the amount
to $20.00.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from approvald.bot.sandbox import render
from approvald.bot.slack import cards
from approvald.bot.slack import texts as T
from slack_sdk.models.blocks import Block

from tests.helpers import Rows
from tests.integration.slack_harness import CHANNEL, OPS, Harness, harness, wait_for

EDIT = {"order_id": "A-1001", "amount_cents": 2000, "reason": "partial refund"}
IMPACT_42 = "$42.00 goes back to the customer's card for order A-1001."
IMPACT_20 = "$20.00 goes back to the customer's card for order A-1001."
DOING = "I will refund the duplicate charge: $42.00"
# a passage labelled as the agent's words about the original arguments: the label, then
# the rest of its line (its text)
LABELLED = re.compile("(?:" + "|".join(re.escape(x) for x in T.DOING_BEFORE_EDIT.values())
                      + r")[*_]*\s*[^\n]*")


def texts_of(value: Any) -> list[str]:
    """Every text a person can read in a message or view (blocks, fallback, labels)."""
    if isinstance(value, dict):
        return [t for k, v in value.items()
                for t in ([v] if k == "text" and isinstance(v, str) else texts_of(v))]
    if isinstance(value, list):
        return [t for v in value for t in texts_of(v)]
    return []


def unlabelled_42(value: Any) -> list[str]:
    """The texts that present $42.00 other than as the agent's labelled words."""
    return [t for t in texts_of(value) if "$42.00" in LABELLED.sub("", t)]


def labelled_doing(value: Any) -> bool:
    return any(DOING in m.group(0) for t in texts_of(value) for m in LABELLED.finditer(t))


def assert_valid_blocks(blocks: list[dict[str, Any]]) -> None:
    for b in blocks:
        assert Block.parse(b).to_dict() == b


async def _card_when(h: Harness, approval_id: str, word: str) -> dict[str, Any] | None:
    a = await h.approval(approval_id)
    msg = h.emulator.message(a.channel, a.message_ts)
    return msg if msg and word in json.dumps(msg, ensure_ascii=False) else None


async def _thread(h: Harness, run_id: str) -> list[dict[str, Any]] | None:
    """The run's thread replies once the thread has told the run's end."""
    t, run = await Rows.of(h.engine).thread_and_run(run_id)
    if t is None or t.ts is None or t.posted_status != run.status \
            or run.status != "completed":
        return None
    return [m for m in h.emulator.thread(OPS, t.ts) if m["ts"] != t.ts]


async def _edit(h: Harness, user: str, approval_id: str) -> dict[str, Any]:
    """Open the edit modal from the card and submit EDIT; the modal as it was shown."""
    a = await h.approval(approval_id)
    before = len(h.emulator.views(user_id=user, callback_id=cards.EDIT_MODAL))
    await h.slack.click(cards.EDIT, h.value(a), user_id=user, channel_id=CHANNEL,
                        message_ts=a.message_ts)
    shown = await wait_for(
        lambda: h.emulator.views(user_id=user, callback_id=cards.EDIT_MODAL)[before:],
        what="the edit modal")
    ok = await h.slack.submit_view(cards.EDIT_MODAL, {"args": {"args_input": json.dumps(EDIT)}},
                                   user_id=user)
    assert ok.status == 200 and ok.body in ("", "{}"), ok.body
    return dict(shown[-1])


async def test_a_card_approved_with_edits_tells_the_edited_call_and_its_impact(
        sqlite_url: str, tmp_path: Path) -> None:
    async with harness(sqlite_url, tmp_path) as h:
        h.engine.pace.lead(False)  # the thread is told from the edit on (see the next test)
        paused = await h.pause_refund()
        [aid] = paused.approval_ids
        card = await h.card(aid)
        # before the edit, the agent's words and the impact are about what will run
        assert DOING in json.dumps(card) and IMPACT_42 in json.dumps(card)
        assert T.SECTION_DOING.format(text="").strip() in json.dumps(card)

        await _edit(h, "U_ALICE", aid)  # edits = "approve": the edit is Alice's approval
        await wait_for(lambda: _edited(h, aid), what="the edit")
        h.engine.pace.lead(True)
        done = await wait_for(lambda: _thread(h, paused.run_id), what="the thread to end")
        assert [r["args"]["amount_cents"] for r in h.refunds()] == [2000]

        updated = await wait_for(lambda: _card_when(h, aid, "Approved with edits"),
                                 what="the card to show the approval")
        assert_valid_blocks(updated["blocks"])
        assert unlabelled_42(updated) == []
        assert labelled_doing(updated)
        said = texts_of(updated)
        assert T.SECTION_IMPACT_EDITED.format(text=IMPACT_20) in said
        assert not any(IMPACT_42 in t for t in said)
        # the sandbox page draws the same blocks
        page = render.message(updated, render.Names(), author="approvald")
        assert "$20.00 goes back" in page and "before the edit" in page

        # the thread says the call was approved with edits, and what the edit runs
        assert unlabelled_42(done) == []
        decided = next(t for t in texts_of(done) if "`issue_refund` approved with edits by" in t)
        assert IMPACT_20 in decided


async def test_a_proposed_edit_is_told_everywhere_as_the_call_that_will_run(
        sqlite_url: str, tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text('[tools.issue_refund]\nedits = "propose"\n')
    async with harness(sqlite_url, tmp_path, APPROVALD_POLICY_FILE=str(policy)) as h:
        # the run's thread is told from the proposal on (a line told before it rightly
        # quotes the call as it then was): until then another replica leads, as far as
        # this one knows, and tells no thread (ThreadFollower.run). With a follower polling
        # every 0.5 s that was left to timing; the harness's polls every 0.05 s
        h.engine.pace.lead(False)
        paused = await h.pause_refund()
        [aid] = paused.approval_ids
        await h.card(aid)
        await _edit(h, "U_ALICE", aid)
        a = await wait_for(lambda: _edited(h, aid), what="the proposal")
        assert a.status == "pending"
        h.engine.pace.lead(True)

        # the proposer's ephemeral reply
        [reply] = await wait_for(lambda: h.emulator.ephemeral(CHANNEL, "U_ALICE"),
                                 what="the proposer's reply")
        assert IMPACT_20 in reply["text"] and unlabelled_42(reply) == []

        # the pending card, redrawn with the proposal and live buttons
        pending = await wait_for(lambda: _card_when(h, aid, "Arguments proposed by"),
                                 what="the card to show the proposal")
        assert_valid_blocks(pending["blocks"])
        assert any(b["type"] == "actions" for b in pending["blocks"])
        assert unlabelled_42(pending) == [] and labelled_doing(pending)
        assert T.SECTION_IMPACT_EDITED.format(text=IMPACT_20) in texts_of(pending)

        # Bob's App Home and /approvals list it as the call that will run
        await h.slack.event({"type": "app_home_opened", "user": "U_BOB", "channel": "D_BOB",
                             "tab": "home"})
        home = await wait_for(lambda: h.emulator.home_view("U_BOB"), what="Bob's App Home")
        assert_valid_blocks(home["blocks"])
        assert unlabelled_42(home) == [] and labelled_doing(home)
        assert any(IMPACT_20 in t for t in texts_of(home))
        await h.slack.slash("/approvals", "", user_id="U_BOB", channel_id=CHANNEL)
        [answer] = await wait_for(lambda: h.emulator.responses(), what="the /approvals answer")
        listed = answer.body
        assert unlabelled_42(listed) == [] and labelled_doing(listed)
        assert any(IMPACT_20 in t for t in texts_of(listed))

        # the modals Bob may open on it: approve-and-standing, and a further edit
        a = await h.approval(aid)
        await h.slack.click(cards.STANDING, h.value(a), user_id="U_BOB", channel_id=CHANNEL,
                            message_ts=a.message_ts)
        [standing] = await wait_for(
            lambda: h.emulator.views(user_id="U_BOB", callback_id=cards.STANDING_MODAL),
            what="the standing approval modal")
        assert unlabelled_42(standing) == [] and any(IMPACT_20 in t for t in texts_of(standing))
        await h.slack.click(cards.EDIT, h.value(a), user_id="U_BOB", channel_id=CHANNEL,
                            message_ts=a.message_ts)
        [edit] = await wait_for(
            lambda: h.emulator.views(user_id="U_BOB", callback_id=cards.EDIT_MODAL),
            what="Bob's edit modal")
        assert unlabelled_42(edit) == [] and any(IMPACT_20 in t for t in texts_of(edit))

        # Bob approves the proposal: the closed card and the thread
        await h.slack.click(cards.APPROVE, h.value(a), user_id="U_BOB", channel_id=CHANNEL,
                            message_ts=a.message_ts)
        done = await wait_for(lambda: _thread(h, paused.run_id), what="the thread to end")
        assert [r["args"]["amount_cents"] for r in h.refunds()] == [2000]
        closed = await wait_for(lambda: _card_when(h, aid, "Approved with edits"),
                                what="the card to show the approval")
        assert_valid_blocks(closed["blocks"])
        assert unlabelled_42(closed) == [] and labelled_doing(closed)
        assert T.SECTION_IMPACT_EDITED.format(text=IMPACT_20) in texts_of(closed)
        assert unlabelled_42(done) == []
        decided = next(t for t in texts_of(done) if "`issue_refund` approved with edits by" in t)
        assert IMPACT_20 in decided


async def _edited(h: Harness, approval_id: str) -> Any:
    a = await h.approval(approval_id)
    return a if a.edited_args is not None else None


async def test_the_edit_modal_asks_why_and_the_audit_log_keeps_it_with_the_editors_name(
        sqlite_url: str, tmp_path: Path) -> None:
    async with harness(sqlite_url, tmp_path) as h:
        paused = await h.pause_refund()
        [aid] = paused.approval_ids
        await h.card(aid)  # posted
        a = await h.approval(aid)
        await h.slack.click(cards.EDIT, h.value(a), user_id="U_ALICE", channel_id=CHANNEL,
                            message_ts=a.message_ts)
        [shown] = await wait_for(
            lambda: h.emulator.views(user_id="U_ALICE", callback_id=cards.EDIT_MODAL),
            what="the edit modal")
        assert T.MODAL_EDIT_REASON_LABEL in json.dumps(shown)
        ok = await h.slack.submit_view(
            cards.EDIT_MODAL, {"args": {"args_input": json.dumps(EDIT)},
                               cards.REASON_BLOCK: {cards.REASON_INPUT: "only the duplicate"}},
            user_id="U_ALICE")
        assert ok.status == 200 and ok.body in ("", "{}"), ok.body
        entries = await Rows.of(h.engine).audit(approval_id=aid)
        [edited] = [json.loads(e.details) for e in entries if e.action == "edited"]
        assert edited["reason"] == "only the duplicate"
        assert edited["actor_name"]  # who U_ALICE was, as Slack said then
        # where and when the card the editor was shown had been posted
        assert edited["card_posted"]["channel"] == CHANNEL and edited["card_posted"]["at"]
