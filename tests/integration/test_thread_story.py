"""A run's thread tells an on-call engineer the truth (issue 52 items 1-5), through the Slack
emulator: one parent that is always true (an honest icon, on whom and until when the run
waits, the step it is at) and a reply for every event that changes who or what the run
waits on, people as mentions, requests as links, results in words with their JSON one
click away, nothing said twice.

Six stories: an approval, a denial, an escalation on expiry (with its reminder), a redirect,
a quorum of two votes, and a crash after the refund's intent with its retry.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from approvald.bot.sandbox import SlackEmulator
from approvald.bot.slack.delivery import SlackDeliverer
from approvald.bot.slack.threads import ThreadFollower
from approvald.runtime.approvals.decide import Actor
from approvald.runtime.engine import Engine, assemble
from approvald.runtime.kernel import failpoints
from approvald.runtime.kernel.clock import ManualClock
from approvald.runtime.kernel.ids import TokenSigner
from approvald.runtime.kernel.outcomes import Paused
from approvald.runtime.policies.policy import ApprovalPolicy, Rung
from approvald.runtime.runs.agent import Registry
from approvald.runtime.runs.demo import REFUND_POLICY, DemoLedger, refund_agent
from approvald.store.db import Database
from slack_sdk.web.async_client import AsyncWebClient

from tests.helpers import Crash, Rows, crash

BOT = "xoxb-thread-story"
OPS = "C_OPS"
CARDS = "C_APPROVALS"
SIGNER = TokenSigner("test-secret-0123456789abcdef")
# a Slack date whose fallback reads on its own: "2026-12-05 at 18:39 UTC"
DATE = r"<!date\^\d+\^[^|>]*\|\d{4}-\d\d-\d\d at \d\d:\d\d UTC>"
LINK = r"<https?://[^|>]+\|[^>]+>"


@dataclass
class Story:
    clock: ManualClock
    emulator: SlackEmulator
    engine: Engine
    follower: ThreadFollower
    deliverer: SlackDeliverer

    async def refund(self, task: str = "Refund order A-1001") -> Paused:
        outcome = await self.engine.run("demo-refund", task, requested_by="U_DANA")
        assert isinstance(outcome, Paused), outcome
        await self.tell()
        return outcome

    async def tell(self) -> None:
        """Deliver the outbox (cards, reminders) and let the follower catch up."""
        drain = self.engine.drain(self.deliverer)
        for _ in range(4):
            await drain.drain_once()
            for _ in range(6):
                if not await self.follower.sync_once():
                    break

    async def pending(self, run_id: str) -> list[Any]:
        return [a for a in await Rows.of(self.engine).approvals(run_id) if a.status == "pending"]

    async def thread_ts(self, run_id: str) -> str:
        t = await Rows.of(self.engine).thread(run_id)
        assert t is not None and t.ts is not None
        return str(t.ts)

    async def parent(self, run_id: str) -> str:
        """The parent's words as a reader sees them (its blocks' text)."""
        ts = await self.thread_ts(run_id)
        [m] = [m for m in self.emulator.messages(OPS) if m["ts"] == ts]
        return _block_text(m)

    async def replies(self, run_id: str) -> list[dict[str, Any]]:
        ts = await self.thread_ts(run_id)
        return [m for m in self.emulator.thread(OPS, ts) if m["ts"] != ts]

    async def said(self, run_id: str) -> str:
        return "\n".join(_block_text(m) or m.get("text", "")
                         for m in await self.replies(run_id))


def _block_text(m: dict[str, Any]) -> str:
    out: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("type") in ("mrkdwn", "plain_text") and "text" in node:
                out.append(str(node["text"]))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(m.get("blocks") or [])
    return "\n".join(out) if out else str(m.get("text", ""))


def _fallbacks(text: str) -> str:
    """``text`` with each Slack date replaced by its fallback, as a client that cannot
    format the date shows it."""
    return re.sub(r"<!date\^[^|>]*\|([^>]*)>", r"\1", text)


@asynccontextmanager
async def story(db_url: str, tmp_path: Path,
                approval: ApprovalPolicy = REFUND_POLICY) -> AsyncIterator[Story]:
    clock = ManualClock()
    emulator = SlackEmulator(bot_token=BOT, clock=clock)
    emulator.add_channel(OPS)
    emulator.add_channel(CARDS)
    url = await emulator.start()
    ledger = DemoLedger(str(tmp_path / "ledger.jsonl"))
    db = Database(db_url)
    try:
        engine = assemble(db, Registry([refund_agent(ledger, approval=approval)]),
                          clock=clock, signer=SIGNER)
        client = AsyncWebClient(token=BOT, base_url=url)
        deliverer = SlackDeliverer(engine, client, channel=CARDS, ops_channel=OPS)
        follower = ThreadFollower(engine, client, channel=OPS, per_channel_interval=0.0,
                                  patience=0.0, permalink=deliverer._permalink)
        yield Story(clock, emulator, engine, follower, deliverer)
    finally:
        await db.close()
        await emulator.stop()


def assert_nothing_twice(replies: list[dict[str, Any]]) -> None:
    lines = [line for m in replies for line in _block_text(m).splitlines()
             if line.strip() and line != "Show JSON"]
    assert len(lines) == len(set(lines)), f"said twice: {lines}"


def assert_no_raw_ids_or_json(text: str, *ids: str) -> None:
    for i in ids:
        assert i not in text, f"a raw id {i} in {text}"
    assert '{"' not in text and "{&quot;" not in text, f"raw JSON in {text}"
    assert "cli:" not in text and "U_ALICE" not in text.replace("<@U_ALICE>", "")


async def test_an_approval_is_told_with_whom_until_when_who_and_what_ran(db_url, tmp_path):
    async with story(db_url, tmp_path) as s:
        paused = await s.refund()
        [a] = await s.pending(paused.run_id)
        parent = await s.parent(paused.run_id)
        # on whom (anyone but the requester, who is named), until when, at which step
        assert "waiting for approval" in parent
        assert re.search(r"Waiting on\*? anyone but <@U_DANA> to approve `issue_refund` until "
                         + DATE, parent), parent
        assert "until 20" in _fallbacks(parent)
        assert re.search(r"[Ss]tep \d", parent)
        said = await s.said(paused.run_id)
        # the request, with a link to its card (not its id)
        assert re.search(r"`issue_refund`.*" + LINK, said), said
        assert a.id not in said

        await s.engine.decide(a.id, actor=Actor("U_ALICE", "slack"), verdict="approve")
        assert (await s.engine.advance(paused.run_id)).status == "completed"
        await s.tell()
        said = await s.said(paused.run_id)
        assert "`issue_refund` approved by <@U_ALICE>" in said, said
        assert re.search(r"`issue_refund` succeeded", said), said
        assert said.count("send_customer_email") == 1, said  # once, not twice
        replies = await s.replies(paused.run_id)
        assert_nothing_twice(replies)
        assert_no_raw_ids_or_json(said, a.id, paused.run_id)
        # the JSON one click away: a button on the result's line
        buttons = [e for m in replies for b in m.get("blocks") or []
                   for e in [b.get("accessory") or {}] if e.get("type") == "button"]
        assert any(e["text"]["text"] == "Show JSON" for e in buttons), replies
        parent = await s.parent(paused.run_id)
        assert ":white_check_mark:" in parent and "Waiting on" not in parent


async def test_a_denial_never_gets_a_green_check(db_url, tmp_path):
    async with story(db_url, tmp_path) as s:
        paused = await s.refund()
        [a] = await s.pending(paused.run_id)
        await s.engine.decide(a.id, actor=Actor("U_BOB", "slack"), verdict="deny",
                              reason="Customer already got store credit")
        await s.engine.advance(paused.run_id)
        await s.tell()
        said = await s.said(paused.run_id)
        assert (":no_entry: `issue_refund` denied by <@U_BOB>: Customer already got store "
                "credit") in said
        parent = await s.parent(paused.run_id)
        assert ":white_check_mark:" not in parent, parent
        assert ":no_entry:" in parent and "denied" in parent, parent
        assert_nothing_twice(await s.replies(paused.run_id))


ESCALATING = ApprovalPolicy(approvers=["U_ALICE"], ttl=timedelta(minutes=30),
                            reminders=[0.5], on_expire="escalate", risk="high",
                            escalate=[Rung(approvers=["U_CFO"], ttl=timedelta(hours=1))])


async def test_an_escalation_on_expiry_names_whom_and_links_the_new_request(db_url, tmp_path):
    async with story(db_url, tmp_path, ESCALATING) as s:
        paused = await s.refund()
        [first] = await s.pending(paused.run_id)
        s.clock.advance(timedelta(minutes=16))  # half the time: the reminder
        await s.engine.sweep()
        await s.tell()
        said = await s.said(paused.run_id)
        reminder = [line for line in said.splitlines() if "Reminder" in line]
        assert reminder and "<@U_ALICE>" in reminder[0], said  # in the run's thread too
        assert re.search(LINK, reminder[0])
        # item 5: where the date cannot be formatted, the sentence keeps its verb
        assert re.search(r"expires \d{4}-\d\d-\d\d at \d\d:\d\d UTC",
                         _fallbacks(reminder[0])), reminder[0]

        s.clock.advance(timedelta(minutes=15))  # past the deadline: escalated to the CFO
        await s.engine.sweep()
        await s.tell()
        [second] = await s.pending(paused.run_id)
        assert second.id != first.id
        said = await s.said(paused.run_id)
        escalated = [line for line in said.splitlines() if "escalated" in line]
        assert escalated and "<@U_CFO>" in escalated[0], said
        assert re.search(LINK, escalated[0]) and second.id not in said
        second = await Rows.of(s.engine).approval(second.id)
        url = await s.deliverer._permalink(second.channel, second.message_ts)
        assert url is not None and url in escalated[0]  # the new card, not the old one
        parent = await s.parent(paused.run_id)
        assert re.search(r"Waiting on\*? <@U_CFO> to approve `issue_refund` until " + DATE,
                         parent), parent
        assert_nothing_twice(await s.replies(paused.run_id))


async def test_a_redirect_announces_and_links_the_new_request(db_url, tmp_path):
    async with story(db_url, tmp_path) as s:
        paused = await s.refund()
        [a] = await s.pending(paused.run_id)
        await s.engine.decide(a.id, actor=Actor("U_ALICE", "slack"), verdict="redirect",
                              reason="Refund only $12.50, the duplicate charge")
        assert isinstance(await s.engine.advance(paused.run_id), Paused)
        await s.tell()
        [b] = await s.pending(paused.run_id)
        said = await s.said(paused.run_id)
        assert "`issue_refund` redirected by <@U_ALICE>: Refund only $12.50" in said, said
        after = said.split("redirected", 1)[1]
        b = await Rows.of(s.engine).approval(b.id)
        url = await s.deliverer._permalink(b.channel, b.message_ts)
        assert url is not None and url in after, said  # the new request, linked
        assert b.id not in said
        assert "$12.50" in await s.parent(paused.run_id)  # what is asked now
        assert_nothing_twice(await s.replies(paused.run_id))


QUORUM = ApprovalPolicy(approvers=["U_BOB", "U_CAROL"], quorum=2, risk="high")


async def test_each_vote_of_a_quorum_is_told(db_url, tmp_path):
    async with story(db_url, tmp_path, QUORUM) as s:
        paused = await s.refund()
        [a] = await s.pending(paused.run_id)
        assert "<@U_BOB>" in await s.parent(paused.run_id)
        await s.engine.decide(a.id, actor=Actor("U_BOB", "slack"), verdict="approve")
        await s.tell()
        said = await s.said(paused.run_id)
        assert "<@U_BOB> approved `issue_refund` (1 of 2 approvals)" in said, said
        parent = await s.parent(paused.run_id)
        assert "1 of 2" in parent and "<@U_CAROL>" in parent, parent
        await s.engine.decide(a.id, actor=Actor("U_CAROL", "slack"), verdict="approve")
        await s.engine.advance(paused.run_id)
        await s.tell()
        said = await s.said(paused.run_id)
        assert "`issue_refund` approved by <@U_CAROL> (2 of 2 approvals" in said, said
        assert_nothing_twice(await s.replies(paused.run_id))


async def test_a_crash_and_its_retry_are_told_and_audited(db_url, tmp_path):
    async with story(db_url, tmp_path) as s:
        paused = await s.refund()
        [a] = await s.pending(paused.run_id)
        await s.engine.decide(a.id, actor=Actor("U_ALICE", "slack"), verdict="approve")
        failpoints.arm("after_intent@1", crash)  # the refund's intent, then the crash
        try:
            try:
                await s.engine.advance(paused.run_id)
            except Crash:
                pass
            else:
                raise AssertionError("the failpoint did not fire")
        finally:
            failpoints.arm("")
        assert (await s.engine.advance(paused.run_id)).status == "completed"
        await s.tell()
        entries = await Rows.of(s.engine).audit(run_id=paused.run_id)
        [retried] = [e for e in entries if e.action == "retried"]
        details = json.loads(retried.details)
        assert details["attempt"] == 2 and details["tool"] == "issue_refund"
        assert "did not happen" in details["why"]
        said = await s.said(paused.run_id)
        assert re.search(r"`issue_refund`.*attempt 2", said), said
        assert "ran once" in said, said
        assert_nothing_twice(await s.replies(paused.run_id))


async def test_a_cancel_from_the_command_line_is_told_in_words(db_url, tmp_path):
    async with story(db_url, tmp_path) as s:
        paused = await s.refund()
        await s.engine.cancel(paused.run_id, actor=Actor("cli:root", "cli"))
        await s.tell()
        said = await s.said(paused.run_id)
        assert "root (on the command line)" in said and "cli:root" not in said, said
        parent = await s.parent(paused.run_id)
        assert ":white_check_mark:" not in parent and "cancelled" in parent
        assert "cli:root" not in parent
        assert_nothing_twice(await s.replies(paused.run_id))


async def test_show_json_opens_the_result_masked_and_whole(sqlite_url, tmp_path):
    """The result's JSON is one click away: the thread line's button, clicked through the
    signed Slack face, opens a modal with the call's result."""
    from approvald.bot.slack import cards, story

    from tests.integration.slack_harness import CHANNEL, harness, wait_for
    from tests.integration.slack_harness import OPS as HARNESS_OPS

    async with harness(sqlite_url, tmp_path) as h:
        paused = await h.pause_refund()
        a = await h.approval(paused.approval_ids[0])
        await h.card(a.id)
        a = await h.approval(a.id)
        await h.slack.click(cards.APPROVE, h.value(a), user_id="U_ALICE",
                            channel_id=CHANNEL, message_ts=a.message_ts)

        async def button() -> dict[str, Any] | None:
            t = await Rows.of(h.engine).thread(paused.run_id)
            if t is None or t.ts is None or t.posted_status != "completed":
                return None
            for m in h.emulator.thread(HARNESS_OPS, t.ts):
                for b in m.get("blocks") or []:
                    e = b.get("accessory") or {}
                    if e.get("action_id") == story.SHOW_JSON and "issue_refund" in json.dumps(b):
                        return {"value": e["value"], "ts": m["ts"]}
            return None

        found = await wait_for(button, what="the refund's line with its button")
        trigger = h.emulator.issue_trigger_id("U_CAROL")
        await h.slack.click(story.SHOW_JSON, found["value"], user_id="U_CAROL",
                            channel_id=HARNESS_OPS, message_ts=found["ts"], trigger_id=trigger)

        async def modal() -> list[Any] | None:
            return h.emulator.views(user_id="U_CAROL") or None

        [view] = await wait_for(modal, what="the result's modal")
        shown = json.dumps(view)
        assert "refund_id" in shown and "rf_" in shown and '\\"status\\": \\"issued\\"' in shown
