"""Redirect through Slack over real HTTP: the button, its modal, the re-planned run, and the
refusals (a stranger, a request decided or expired while the modal was open)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from approvald.bot.slack import cards
from approvald.runtime.kernel.clock import ManualClock
from approvald.runtime.record.state import ToolMessage
from slack_sdk.models.blocks import Block

from tests.helpers import Rows
from tests.integration.slack_harness import CHANNEL, harness, wait_for

GUIDANCE = "Refund only $20 <!channel>: the customer kept one item"


def text_of(msg: dict) -> str:
    return json.dumps(msg, ensure_ascii=False)


def buttons_of(msg: dict) -> dict[str, dict]:
    return {e["action_id"]: e for b in msg["blocks"] if b["type"] == "actions"
            for e in b["elements"]}


async def _status(h, run_id: str, status: str):
    run = await h.run(run_id)
    return run if run.status == status else None


async def _card_says(h, approval_id: str, word: str):
    a = await h.approval(approval_id)
    msg = h.emulator.message(a.channel, a.message_ts)
    return msg if msg and word in text_of(msg) else None


async def _pending_other_than(h, run_id: str, approval_id: str):
    rows = await Rows.of(h.engine).approvals(run_id)
    return next((a for a in rows if a.id != approval_id and a.status == "pending"), None)


async def _thread_has(h, run_id: str, text: str) -> bool:
    thread = await Rows.of(h.engine).thread(run_id)
    if thread is None:
        return False
    return any(text in text_of(m) for m in h.emulator.thread(thread.channel, thread.ts))


async def _open_modal(h, a, user: str = "U_ALICE") -> dict:
    resp = await h.slack.click(cards.REDIRECT, h.value(a), user_id=user, channel_id=CHANNEL,
                               message_ts=a.message_ts)
    assert resp.status == 200
    [view] = await wait_for(lambda: h.emulator.views(callback_id=cards.REDIRECT_MODAL),
                            what="the redirect modal")
    return view


def _guidance(text: str) -> dict:
    return {cards.GUIDANCE_BLOCK: {cards.GUIDANCE_INPUT: text}}


async def test_redirect_opens_a_modal_and_the_agent_replans(sqlite_url: str,
                                                            tmp_path: Path) -> None:
    async with harness(sqlite_url, tmp_path) as h:
        paused = await h.pause_refund()
        [aid] = paused.approval_ids
        card = await h.card(aid)
        a = await h.approval(aid)
        assert buttons_of(card)[cards.REDIRECT]["value"] == h.value(a)

        view = await _open_modal(h, a)
        for b in view["blocks"]:
            assert Block.parse(b).to_dict() == b
        assert "issue_refund" in text_of(view)
        [box] = [b for b in view["blocks"] if b.get("block_id") == cards.GUIDANCE_BLOCK]
        assert box["element"]["multiline"] and box["element"]["max_length"] == 2000

        empty = await h.slack.submit_view(cards.REDIRECT_MODAL, _guidance("  \n "),
                                          user_id="U_ALICE")
        assert empty.status == 200
        body = empty.json()
        assert body["response_action"] == "errors"
        assert "guidance" in body["errors"][cards.GUIDANCE_BLOCK].lower()
        assert (await h.approval(aid)).status == "pending"

        done = await h.slack.submit_view(cards.REDIRECT_MODAL, _guidance(GUIDANCE),
                                         user_id="U_ALICE")
        assert done.status == 200 and done.body in ("", "{}")
        a = await h.approval(aid)
        assert (a.status, a.verdict, a.reason, a.decided_by) == (
            "redirected", "redirect", GUIDANCE, "U_ALICE")

        # the card says who redirected and what they said, escaped, with no buttons left
        updated = await wait_for(lambda: _card_says(h, aid, "Redirected"),
                                 what="the card to show the redirect")
        for b in updated["blocks"]:
            assert Block.parse(b).to_dict() == b
        assert not buttons_of(updated)
        assert "*Redirected* by <@U_ALICE>: Refund only $20 &lt;!channel&gt;" in text_of(updated)
        assert "<!channel>" not in text_of(updated)

        # the agent re-plans: a second request, for $20, which Slack approves
        second = await wait_for(lambda: _pending_other_than(h, paused.run_id, aid),
                                what="the re-planned request")
        assert second.effective_args()["amount_cents"] == 2000
        await h.card(second.id)
        await h.slack.click(cards.APPROVE, h.value(second), user_id="U_ALICE",
                            channel_id=CHANNEL)
        run = await wait_for(lambda: _status(h, paused.run_id, "completed"),
                             what="the run to complete")
        assert "$20.00" in run.result
        assert [r["args"]["amount_cents"] for r in h.refunds()] == [2000]
        state = await h.engine.state(paused.run_id)
        first = next(m for m in state.messages
                     if isinstance(m, ToolMessage) and m.name == "issue_refund")
        assert first.content == {"status": "redirected", "guidance": GUIDANCE, "by": "U_ALICE"}
        await wait_for(lambda: _thread_has(h, paused.run_id,
                                           "`issue_refund` redirected by <@U_ALICE>"),
                       what="the redirect in the run's thread")
        assert h.emulator.ephemeral(CHANNEL, "U_ALICE") == []  # nothing went wrong to say


async def test_the_requester_cannot_redirect_their_own_call(sqlite_url: str,
                                                            tmp_path: Path) -> None:
    async with harness(sqlite_url, tmp_path) as h:
        paused = await h.pause_refund()
        a = await h.approval(paused.approval_ids[0])
        resp = await h.slack.click(cards.REDIRECT, h.value(a), user_id="U_DANA",
                                   channel_id=CHANNEL)
        assert resp.status == 200
        said = await wait_for(lambda: h.emulator.ephemeral(CHANNEL, "U_DANA"),
                              what="the requester's refusal")
        assert "started this run" in said[0]["text"]
        assert h.emulator.views(callback_id=cards.REDIRECT_MODAL) == []
        assert (await h.approval(a.id)).status == "pending"


async def test_a_redirect_modal_left_open_past_a_decision_or_the_expiry_is_refused_inline(
        sqlite_url: str, tmp_path: Path) -> None:
    clock = ManualClock(datetime.now(UTC) + timedelta(days=1))  # no scheduler job fires
    policy = tmp_path / "policy.toml"
    policy.write_text('[tools.issue_refund]\napprovers = ["U_ALICE", "S_FINANCE"]\n'
                      'ttl = "10m"\nreminders = []\n')
    async with harness(sqlite_url, tmp_path, clock=clock,
                       APPROVALD_POLICY_FILE=str(policy)) as h:
        # a stranger's click opens nothing and changes nothing
        first = await h.pause_refund()
        a = await h.approval(first.approval_ids[0])
        await h.slack.click(cards.REDIRECT, h.value(a), user_id="U_MALLORY",
                            channel_id=CHANNEL)
        said = await wait_for(lambda: h.emulator.ephemeral(CHANNEL, "U_MALLORY"),
                              what="the stranger's refusal")
        assert "not an approver" in said[0]["text"]
        assert h.emulator.views(callback_id=cards.REDIRECT_MODAL) == []

        # Bob opens the modal; Alice approves meanwhile; Bob's redirect is too late
        await h.card(a.id)
        await _open_modal(h, a, user="U_BOB")
        await h.slack.click(cards.APPROVE, h.value(a), user_id="U_ALICE", channel_id=CHANNEL)
        await wait_for(lambda: _status(h, first.run_id, "completed"), what="the approval")
        late = await h.slack.submit_view(cards.REDIRECT_MODAL, _guidance("Refund $5 instead"),
                                         user_id="U_BOB")
        assert late.json()["response_action"] == "errors"
        assert "already approved" in late.json()["errors"][cards.GUIDANCE_BLOCK]
        assert (await h.approval(a.id)).status == "approved"
        assert [r["args"]["amount_cents"] for r in h.refunds()] == [4200]

        # Carol opens the modal on another request, which expires before she submits
        second = await h.pause_refund(task="Refund order B-2002, double charged")
        b = await h.approval(second.approval_ids[0])
        await h.card(b.id)
        resp = await h.slack.click(cards.REDIRECT, h.value(b), user_id="U_CAROL",
                                   channel_id=CHANNEL, message_ts=b.message_ts)
        assert resp.status == 200
        await wait_for(lambda: len(h.emulator.views(callback_id=cards.REDIRECT_MODAL)) == 2,
                       what="Carol's modal")
        clock.advance(timedelta(minutes=11))
        expired = await h.slack.submit_view(cards.REDIRECT_MODAL,
                                            _guidance("Refund $5 instead"), user_id="U_CAROL")
        assert expired.json()["response_action"] == "errors"
        assert "too late" in expired.json()["errors"][cards.GUIDANCE_BLOCK].lower()
        assert (await h.approval(b.id)).status == "expired"
        run = await wait_for(lambda: _status(h, second.run_id, "completed"),
                             what="the expired run to end")
        assert "expired" in run.result
        assert await wait_for(lambda: _card_says(h, b.id, "Expired"), what="the expired card")
