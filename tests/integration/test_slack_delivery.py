"""Delivery while Slack misbehaves, quorum and escalation cards, questions, Socket Mode."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from approvald.bot.slack import cards
from approvald.runtime.approvals.decide import Actor
from approvald.runtime.kernel import failpoints
from approvald.runtime.kernel.clock import ManualClock

from tests.helpers import Crash, Rows, opened_by_faces, parts
from tests.helpers import crash as _crash
from tests.integration.slack_harness import CHANNEL, harness, wait_for
from tests.integration.test_slack import _status, assert_valid_blocks, text_of


def card_messages(h) -> list[dict]:
    return [m for m in h.emulator.messages(CHANNEL)
            if (m.get("metadata") or {}).get("event_type") == "approvald_card"]


def slack_calls(h, *methods: str) -> list[str]:
    return [c.method for c in h.emulator.calls() if c.method in methods and c.ok]


async def test_slack_down_then_back_delivers_each_card_and_update_once_in_order(
        sqlite_url, tmp_path):
    clock = ManualClock()
    async with harness(sqlite_url, tmp_path, clock=clock, background=False) as h:
        await h.emulator.down()
        paused = await h.pause_refund()
        [aid] = paused.approval_ids
        assert (await h.approval(aid)).status == "pending"  # state first, whatever Slack does
        assert await h.service.drain.drain_once() == 0
        await h.engine.decide(aid, actor=Actor("U_ALICE", "cli:ops"), verdict="approve")
        assert await h.service.drain.drain_once() == 0
        await h.emulator.up()
        h.emulator.fail_next(2, status=500)
        for _ in range(6):  # backoff doubles; move time past each retry
            clock.advance(timedelta(minutes=2))
            await h.service.drain.drain_once()
        assert slack_calls(h, "chat.postMessage", "chat.update") == ["chat.postMessage",
                                                                     "chat.update"]
        [card] = card_messages(h)
        assert "Approved" in text_of(card)
        rows = await Rows.of(h.engine).outbox()
        assert [(r.kind, r.status) for r in rows] == [("approval.requested", "delivered"),
                                                      ("approval.updated", "delivered")]
        assert rows[0].attempts >= 2


async def test_rate_limited_delivery_waits_for_retry_after(sqlite_url, tmp_path):
    clock = ManualClock()
    async with harness(sqlite_url, tmp_path, clock=clock, background=False) as h:
        h.emulator.rate_limit_next(1, retry_after=30)
        paused = await h.pause_refund()
        assert await h.service.drain.drain_once() == 0
        [row] = await Rows.of(h.engine).outbox()
        assert row.not_before - clock.now() == timedelta(seconds=30)
        clock.advance(timedelta(seconds=29))
        assert await h.service.drain.drain_once() == 0
        clock.advance(timedelta(seconds=1))
        assert await h.service.drain.drain_once() == 1
        assert len(card_messages(h)) == 1
        assert (await h.approval(paused.approval_ids[0])).message_ts


async def test_crash_after_post_before_mark_does_not_post_twice(sqlite_url, tmp_path):
    clock = ManualClock()
    async with harness(sqlite_url, tmp_path, clock=clock, background=False) as h:
        await h.pause_refund()
        failpoints.arm("after_post_before_mark", _crash)
        try:
            with pytest.raises(Crash):
                await h.service.drain.drain_once()
        finally:
            failpoints.arm("")
        assert len(card_messages(h)) == 1
        from approvald.store.models import Approval

        # what a restart sees: bookkeeping lost too
        await Rows.of(h.engine).forge(Approval, channel=None, message_ts=None)
        clock.advance(timedelta(minutes=5))  # the dead worker's claim expires
        assert await h.service.drain.drain_once() == 1
        assert len(card_messages(h)) == 1  # found by its metadata, not posted again
        [row] = await Rows.of(h.engine).outbox()
        assert json.loads(row.result)["reused"] is True


async def test_quorum_card_shows_progress_and_keeps_its_buttons(sqlite_url, tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text('[tools.issue_refund]\napprovers = ["U_ALICE", "U_BOB", "U_CAROL"]\n'
                      'quorum = 2\n')
    async with harness(sqlite_url, tmp_path, APPROVALD_POLICY_FILE=str(policy)) as h:
        paused = await h.pause_refund()
        [aid] = paused.approval_ids
        await h.card(aid)
        a = await h.approval(aid)
        await h.slack.click(cards.APPROVE, h.value(a), user_id="U_ALICE", channel_id=CHANNEL)
        said = await wait_for(lambda: h.emulator.ephemeral(CHANNEL, "U_ALICE"), what="reply")
        assert "1 of 2" in said[0]["text"]

        async def progress():
            msg = h.emulator.message(a.channel, a.message_ts)
            return msg if "1 of 2" in text_of(msg) else None
        card = await wait_for(progress, what="the card to show 1 of 2")
        assert [b for b in card["blocks"] if b["type"] == "actions"]  # still open
        await h.slack.click(cards.APPROVE, h.value(a), user_id="U_BOB", channel_id=CHANNEL)
        await wait_for(lambda: _status(h, paused.run_id, "completed"), what="completion")
        assert len(h.refunds()) == 1


async def test_a_click_decided_at_once_hands_nothing_off_after_its_ack(sqlite_url, tmp_path):
    """A click that decides its request at once, on a card in a channel, has nothing to
    tell the clicker (the card tells it, through the outbox): no task is made after its
    ack for nothing (issue 50; most clicks are that). A vote short of its quorum is still
    told (test_quorum_card_shows_progress_and_keeps_its_buttons)."""
    async with harness(sqlite_url, tmp_path) as h:
        paused = await h.pause_refund()
        [aid] = paused.approval_ids
        await h.card(aid)
        a = await h.approval(aid)
        handlers = h.service.slack.handlers
        handed: list[Any] = []
        real = handlers._later

        def later(work: Any) -> None:
            handed.append(work)
            real(work)

        handlers._later = later
        r = await h.slack.click(cards.APPROVE, h.value(a), user_id="U_ALICE",
                                channel_id=CHANNEL)
        assert r.status == 200
        assert (await h.approval(aid)).status == "approved"
        assert handed == []
        await wait_for(lambda: _status(h, paused.run_id, "completed"), what="completion")
        assert h.emulator.ephemeral(CHANNEL, "U_ALICE") == []


async def test_escalation_updates_the_old_card_and_posts_a_linked_new_one(sqlite_url,
                                                                         tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text('[tools.issue_refund]\napprovers = ["U_ALICE"]\nttl = "30m"\n'
                      'on_expire = "escalate"\nescalate = [{ approvers = ["U_CFO"], '
                      'ttl = "1h" }]\n')
    clock = ManualClock()
    async with harness(sqlite_url, tmp_path, clock=clock, background=False,
                       APPROVALD_POLICY_FILE=str(policy)) as h:
        paused = await h.pause_refund()
        [old_id] = paused.approval_ids
        await h.service.drain.drain_once()
        old = await h.approval(old_id)
        clock.advance(timedelta(minutes=31))
        swept = await h.engine.sweep()
        [(_, new_id)] = swept.escalated
        for _ in range(3):
            await h.service.drain.drain_once()
        cards_now = card_messages(h)
        assert len(cards_now) == 2
        old_card = h.emulator.message(old.channel, old.message_ts)
        assert not [b for b in old_card["blocks"] if b["type"] == "actions"]
        assert "scalat" in text_of(old_card)  # escalated
        new = await h.approval(new_id)
        new_card = h.emulator.message(new.channel, new.message_ts)
        assert_valid_blocks(new_card["blocks"])
        assert "U_CFO" in text_of(new_card)
        # the old button is dead; the new one works for the next rung
        await h.slack.click(cards.APPROVE, h.value(old), user_id="U_ALICE", channel_id=CHANNEL)
        said = await wait_for(lambda: h.emulator.ephemeral(CHANNEL, "U_ALICE"), what="reply")
        assert said
        await h.slack.click(cards.APPROVE, h.value(new), user_id="U_CFO", channel_id=CHANNEL)
        await wait_for(lambda: _approved(h, new_id), what="the escalated approval")


async def _approved(h, approval_id):
    a = await h.approval(approval_id)
    return a.status == "approved"


async def test_click_after_expiry_is_explained(sqlite_url, tmp_path):
    clock = ManualClock()
    async with harness(sqlite_url, tmp_path, clock=clock) as h:
        paused = await h.pause_refund()
        [aid] = paused.approval_ids
        await h.card(aid)
        a = await h.approval(aid)
        clock.advance(timedelta(minutes=31))
        await h.engine.sweep()

        async def card_expired():
            msg = h.emulator.message(a.channel, a.message_ts)
            return msg if "xpired" in text_of(msg) else None
        card = await wait_for(card_expired, what="the card to show the expiry")
        assert not [b for b in card["blocks"] if b["type"] == "actions"]
        await h.slack.click(cards.APPROVE, h.value(a), user_id="U_ALICE", channel_id=CHANNEL)
        said = await wait_for(lambda: h.emulator.ephemeral(CHANNEL, "U_ALICE"), what="reply")
        assert "expired" in said[0]["text"].lower()
        await wait_for(lambda: _status(h, paused.run_id, "completed"), what="completion")
        assert h.refunds() == []


async def test_outcome_question_is_answered_from_slack(sqlite_url, tmp_path):
    async with harness(sqlite_url, tmp_path, background=False) as h:
        paused, q = await h.outcome_question()
        for _ in range(3):
            await h.service.drain.drain_once()
        q = await h.approval(q.id)
        card = h.emulator.message(q.channel, q.message_ts)
        assert_valid_blocks(card["blocks"])
        actions = {e["action_id"] for b in card["blocks"] if b["type"] == "actions"
                   for e in b["elements"]}
        assert {cards.RETRY, cards.MARK_DONE, cards.ABORT} <= actions
        await h.slack.click(cards.MARK_DONE, h.value(q), user_id="U_ALICE", channel_id=CHANNEL)
        await wait_for(lambda: _ready(h, paused.run_id), what="the run to be ready")
        done = await h.engine.advance(paused.run_id)
        assert done.status == "completed"
        emails = [e for e in map(json.loads, h.ledger.read_text().splitlines())
                  if e["tool"] == "send_customer_email"]
        assert len(emails) == 1


async def _ready(h, run_id):
    run = await h.run(run_id)
    return run.status == "running"


async def test_socket_mode_click(sqlite_url: str, tmp_path: Path) -> None:
    async with harness(sqlite_url, tmp_path, SLACK_APP_TOKEN="xapp-approvald-test",
                       SLACK_SIGNING_SECRET=None) as h:
        assert h.service.slack.mode == "Socket Mode"
        await h.emulator.wait_connected(5)
        paused = await h.pause_refund()
        [aid] = paused.approval_ids
        await h.card(aid)
        a = await h.approval(aid)
        payload = h.slack.envelope_for_click(cards.APPROVE, h.value(a), user_id="U_ALICE",
                                             channel_id=CHANNEL, message_ts=a.message_ts)
        ack = await h.emulator.send_envelope("interactive", payload)
        assert ack["envelope_id"]
        await wait_for(lambda: _status(h, paused.run_id, "completed"), what="completion")
        assert len(h.refunds()) == 1


async def test_a_card_update_is_drawn_from_its_view_in_one_read(sqlite_url, tmp_path,
                                                                 monkeypatch):
    """Delivery draws a card from the engine's card view (issue 47): the request and what
    its card shows (votes, thread, escalations, standing grants) in one read, and no
    write (the card was posted already)."""
    async with harness(sqlite_url, tmp_path, clock=ManualClock(), background=False) as h:
        paused = await h.pause_refund()
        [aid] = paused.approval_ids
        assert await h.service.drain.drain_once() == 1
        await h.engine.decide(aid, actor=Actor("U_ALICE", "cli:ops"), verdict="approve")
        [row] = [r for r in await Rows.of(h.engine).outbox() if r.kind == "approval.updated"]
        opened = opened_by_faces(monkeypatch, parts(h.engine).db)
        assert (await h.service.slack.deliverer.deliver(row))["ts"]
        assert opened == ["read:runtime/views"]
        [card] = card_messages(h)
        assert "Approved" in text_of(card)


async def test_a_drain_batch_s_cards_are_drawn_from_one_read(db_url, tmp_path, monkeypatch):
    """The cards of one drain batch are drawn from views read together (issue 50: a read
    per card), each card as its own read drew it; the posts' batch too."""
    async with harness(db_url, tmp_path, clock=ManualClock(), background=False) as h:
        ids = [(await h.pause_refund()).approval_ids[0] for _ in range(3)]
        opened = opened_by_faces(monkeypatch, h.service.db)  # serve's database
        assert await h.service.drain.drain_once() == 3
        assert opened.count("read:runtime/views") == 1
        for aid in ids:
            await h.engine.decide(aid, actor=Actor("U_ALICE", "cli:ops"), verdict="approve")
        later = (await h.pause_refund()).approval_ids[0]  # a post in the updates' batch
        opened.clear()
        assert await h.service.drain.drain_once() == 4
        assert opened.count("read:runtime/views") == 1
        assert (await h.approval(later)).message_ts and len(card_messages(h)) == 4
        updates = [c for c in h.emulator.calls("chat.update") if c.ok]
        assert sorted(c.params["ts"] for c in updates) == sorted(
            [(await h.approval(aid)).message_ts for aid in ids])
        # each card as a read of its own draws it
        sent = {c.params["ts"]: c for c in updates}
        for aid in ids:
            call = sent[(await h.approval(aid)).message_ts]
            view = await h.engine.views.card(aid)
            assert view is not None
            card = await h.service.slack.deliverer.draw(view)
            assert call.params["blocks"] == card["blocks"] and call.params["text"] == card["text"]
