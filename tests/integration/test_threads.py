"""Run threads against the Slack emulator: replicas, crashes between post and record,
deleted parents, and fairness between the threads of one channel (issue 9, items 4 and 8).

Followers are driven round by round (``sync_once``) with per-channel pacing off, so each
round gives every lagging thread one turn; time moves on a manual clock shared with the
emulator. The assertions count messages as Slack holds them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from approvald.bot.sandbox import SlackEmulator
from approvald.bot.slack.threads import ThreadFollower
from approvald.runtime.approvals.decide import Actor
from approvald.runtime.engine import Engine, assemble
from approvald.runtime.kernel import failpoints
from approvald.runtime.kernel.clock import ManualClock
from approvald.runtime.kernel.ids import TokenSigner
from approvald.runtime.kernel.outcomes import Paused
from approvald.runtime.runs.agent import Registry
from approvald.runtime.runs.demo import DemoLedger, refund_agent, steps_agent
from approvald.store.db import Database
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from tests.helpers import Rows, parts

BOT = "xoxb-threads-test"
OPS = "C_OPS"
SIGNER = TokenSigner("test-secret-0123456789abcdef")


@dataclass
class World:
    clock: ManualClock
    emulator: SlackEmulator
    engines: list[Engine]
    followers: list[ThreadFollower]

    @property
    def engine(self) -> Engine:
        return self.engines[0]

    async def steps(self, n: int) -> str:
        outcome = await self.engine.run("demo-steps", str(n), requested_by="U_DANA")
        assert outcome.status == "completed"
        return outcome.run_id

    async def refund(self) -> Paused:
        outcome = await self.engine.run("demo-refund", "Refund order A-1001",
                                        requested_by="U_DANA")
        assert isinstance(outcome, Paused), outcome
        return outcome

    async def thread(self, run_id: str) -> Any:
        return await Rows.of(self.engine).thread(run_id)

    async def caught_up(self, *run_ids: str) -> bool:
        for run_id in run_ids:
            t, run = await Rows.of(self.engine).thread_and_run(run_id)
            if run is None or t is None or t.ts is None or t.posted_seq < run.next_seq \
                    or t.posted_status != run.status:
                return False
        return True

    def parents(self, run_id: str) -> list[dict[str, Any]]:
        """Top-level messages in the ops channel that are about ``run_id``."""
        return [m for m in self.emulator.messages(OPS)
                if m.get("thread_ts") in (None, m["ts"]) and run_id in json.dumps(m)]

    def reply_lines(self, ts: str) -> list[str]:
        return [line for m in self.emulator.thread(OPS, ts) if m["ts"] != ts
                for line in m["text"].splitlines()]

    def parent_posts(self, run_id: str) -> int:
        """chat.postMessage calls that posted a top-level message about ``run_id``."""
        return sum(1 for c in self.emulator.calls("chat.postMessage")
                   if c.ok and "thread_ts" not in c.params and run_id in json.dumps(c.params))


@asynccontextmanager
async def world(db_url: str, tmp_path: Path, *, replicas: int = 1) -> AsyncIterator[World]:
    clock = ManualClock()
    emulator = SlackEmulator(bot_token=BOT, clock=clock)
    emulator.add_channel(OPS)
    emulator.add_channel("C_APPROVALS")
    url = await emulator.start()
    ledger = DemoLedger(str(tmp_path / "ledger.jsonl"))
    dbs = [Database(db_url) for _ in range(replicas)]  # one pool per replica, as in prod
    try:
        engines = [assemble(db, Registry([refund_agent(ledger), steps_agent(ledger)]),
                          clock=clock, signer=SIGNER, owner=f"replica-{i}:{i + 1}:abc")
                   for i, db in enumerate(dbs)]
        followers = [ThreadFollower(e, AsyncWebClient(token=BOT, base_url=url), channel=OPS,
                                    per_channel_interval=0.0, patience=0.05,
                                    card_wait=timedelta(0))  # no cards are posted here
                     for e in engines]
        yield World(clock, emulator, engines, followers)
    finally:
        for db in dbs:
            await db.close()
        await emulator.stop()


async def rounds(w: World, until: Callable[[], Any], *, within: float = 10.0,
                 what: str = "the threads to catch up") -> None:
    """Sync round after round (all replicas at once) until ``until()`` holds.

    Between rounds it yields a little real time: a follower that paused a channel after a
    failure gets it back in real seconds, whatever the test clock says.
    """
    deadline = time.monotonic() + within
    while True:
        await asyncio.gather(*(f.sync_once() for f in w.followers))
        if await until():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def assert_told_once(w: World, run_id: str, ts: str, ticks: int) -> None:
    lines = w.reply_lines(ts)
    assert len(lines) == len(set(lines)), f"a reply was posted twice: {lines}"
    assert sum("tick" in line for line in lines) == ticks
    assert any(f"Ticked {ticks} times." in line for line in lines)


# -- item 4: one parent per run, replies once, across replicas and crashes ----------------

async def test_two_replicas_post_one_parent_per_run_and_each_reply_once(db_url, tmp_path):
    async with world(db_url, tmp_path, replicas=2) as w:
        runs = [await w.steps(3), await w.steps(5)]
        waiting = await w.refund()
        w.emulator.delay("chat.postMessage", 0.05)  # both replicas are mid-post at once
        everyone = (*runs, waiting.run_id)
        await rounds(w, lambda: w.caught_up(*everyone))
        for run_id, ticks in zip(runs, (3, 5), strict=True):
            [parent] = w.parents(run_id)
            assert parent["ts"] == (await w.thread(run_id)).ts
            assert_told_once(w, run_id, parent["ts"], ticks)
        [parent] = w.parents(waiting.run_id)
        lines = w.reply_lines(parent["ts"])
        assert len(lines) == len(set(lines))
        assert sum("Asked anyone but <@U_DANA> to approve" in line for line in lines) == 1


def crash_recording_after(w: World, db: Database, posts: int,
                          monkeypatch: pytest.MonkeyPatch) -> Callable[[], bool]:
    """From the ``posts``-th chat.postMessage on, every write to ``db`` fails, as if the
    process died right after Slack took the message; returns "has it crashed yet?"."""
    real = db.write
    base = len(w.emulator.calls("chat.postMessage"))
    crashed: list[bool] = []

    def write(*args: Any, **kwargs: Any) -> Any:
        if len(w.emulator.calls("chat.postMessage")) - base >= posts:
            crashed.append(True)
            raise ConnectionError("the process died after posting, before recording")
        return real(*args, **kwargs)

    monkeypatch.setattr(db, "write", write)
    return lambda: bool(crashed)


@pytest.mark.parametrize("posts", [1, 2], ids=["after-parent", "after-reply"])
async def test_a_crash_between_post_and_record_leaves_no_orphan_and_no_repeat(
        db_url, tmp_path, monkeypatch, posts):
    async with world(db_url, tmp_path) as w:
        run_id = await w.steps(4)
        crashed = crash_recording_after(w, parts(w.engine).db, posts, monkeypatch)

        async def has_crashed() -> bool:
            return crashed()

        await rounds(w, has_crashed, what="the crash")
        monkeypatch.undo()  # the process comes back
        assert len(w.parents(run_id)) == 1
        w.clock.advance(timedelta(minutes=5))  # the dead claim's lease runs out
        await rounds(w, lambda: w.caught_up(run_id))
        [parent] = w.parents(run_id)  # found by its metadata, not posted again
        assert_told_once(w, run_id, parent["ts"], 4)
        assert ":white_check_mark:" in json.dumps(parent)  # and brought up to date
        thread = await w.thread(run_id)
        assert parent["ts"] == thread.ts and thread.claimed_by is None


@pytest.mark.parametrize("hit", [1, 2, 3], ids=["parent", "first-reply", "second-reply"])
async def test_a_failure_after_posting_is_reconciled_from_slack(db_url, tmp_path, hit):
    def fail(name: str) -> None:
        raise RuntimeError(f"failpoint {name}")

    async with world(db_url, tmp_path) as w:
        w.followers[0].backoff = 0.0
        run_id = await w.steps(100)  # long enough for two replies
        failpoints.arm(f"after_thread_post_before_record@{hit}", fail)
        try:
            for _ in range(hit):
                await w.followers[0].sync_once()
        finally:
            failpoints.arm("")
        thread = await w.thread(run_id)
        assert thread.claimed_by is not None and thread.failures == 1  # left for a look
        await rounds(w, lambda: w.caught_up(run_id))
        [parent] = w.parents(run_id)
        assert parent["ts"] == (await w.thread(run_id)).ts
        assert_told_once(w, run_id, parent["ts"], 100)
        assert w.emulator.calls("conversations.history" if hit == 1
                                else "conversations.replies")


# -- item 8: a deleted parent is re-posted once, and never starves the channel -----------

async def test_a_deleted_parent_is_posted_again_once_and_others_keep_going(
        db_url, tmp_path, caplog):
    caplog.set_level(logging.INFO, "approvald.threads")
    async with world(db_url, tmp_path) as w:
        waiting = await w.refund()
        other = await w.steps(2)
        await rounds(w, lambda: w.caught_up(waiting.run_id, other))
        first = (await w.thread(waiting.run_id)).ts

        # someone deletes the parent; then the run moves (approved: running again)
        w.emulator.delete_message(OPS, first)
        w.clock.advance(1)
        await w.engine.decide(waiting.approval_ids[0], actor=Actor("U_ALICE", "slack"),
                              verdict="approve")
        w.clock.advance(1)
        newcomer = await w.steps(3)  # a run that starts later, in the same channel
        await w.followers[0].sync_once()
        # one round: the lost parent is posted again, and the newcomer got its turn too
        assert w.parent_posts(waiting.run_id) == 2
        assert (await w.thread(newcomer)) is not None, "the newcomer's thread waited"
        for _ in range(3):
            await w.followers[0].sync_once()
        assert await w.caught_up(waiting.run_id, newcomer, other)
        assert w.parent_posts(waiting.run_id) == 2  # the first, and one re-post
        [second] = w.parents(waiting.run_id)
        assert second["ts"] == (await w.thread(waiting.run_id)).ts != first
        assert "running" in json.dumps(second)
        assert_told_once(w, newcomer, w.parents(newcomer)[0]["ts"], 3)

        # deleted again: not posted a third time; one line in the log; the thread is let go
        w.emulator.delete_message(OPS, second["ts"])
        await w.engine.advance(waiting.run_id)  # completes
        w.emulator.reset_calls()
        for _ in range(4):
            await w.followers[0].sync_once()
        assert w.parent_posts(waiting.run_id) == 0
        assert w.parents(waiting.run_id) == []
        gave_up = [r for r in caplog.records if "no longer following" in r.getMessage()]
        assert len(gave_up) == 1
        calls_now = len(w.emulator.calls())
        for _ in range(3):
            await w.followers[0].sync_once()
        assert len(w.emulator.calls()) == calls_now  # nothing more is tried for it


async def test_a_card_links_the_thread_where_it_is_now_and_permalinks_stay_bounded(
        db_url, tmp_path, monkeypatch):
    """The card's "follow the run" link follows a re-posted parent (a serve process that
    drew the card before must not keep the deleted parent's link), and the permalink cache
    of a long-lived serve process keeps at most ``PERMALINKS_KEPT`` entries."""
    from approvald.bot.slack import delivery

    async with world(db_url, tmp_path) as w:
        waiting = await w.refund()
        deliverer = delivery.SlackDeliverer(w.engine, w.followers[0].client,
                                            channel="C_APPROVALS", ops_channel=OPS)
        a = await Rows.of(w.engine).approval(waiting.approval_ids[0])
        def p(ts: str) -> str:  # how a parent's permalink names it
            return f"/p{ts.replace('.', '')}"

        assert f"archives/{OPS}" not in json.dumps(await deliverer.render(a))  # no thread yet
        await rounds(w, lambda: w.caught_up(waiting.run_id))
        first = (await w.thread(waiting.run_id)).ts
        assert p(first) in json.dumps(await deliverer.render(a))

        w.emulator.delete_message(OPS, first)
        w.clock.advance(1)
        await w.engine.cancel(waiting.run_id, actor=Actor("U_ALICE", "slack"))
        await rounds(w, lambda: w.caught_up(waiting.run_id))
        second = (await w.thread(waiting.run_id)).ts
        assert second != first
        card = json.dumps(await deliverer.render(a))
        assert p(second) in card and p(first) not in card

        monkeypatch.setattr(delivery, "PERMALINKS_KEPT", 3)
        for _ in range(3):
            w.emulator.add_message(OPS, "more to link to", user="U_DANA")
        links = [await deliverer._permalink(OPS, m["ts"]) for m in w.emulator.messages(OPS)]
        assert len(links) > 3 and all(links)
        assert len(deliverer._permalinks) == 3


async def test_status_lines_are_told_once_when_the_parent_is_gone(db_url, tmp_path):
    async with world(db_url, tmp_path) as w:
        waiting = await w.refund()
        others = [await w.steps(2) for _ in range(3)]
        await rounds(w, lambda: w.caught_up(waiting.run_id, *others))
        w.emulator.delete_message(OPS, (await w.thread(waiting.run_id)).ts)
        await w.engine.cancel(waiting.run_id, actor=Actor("U_ALICE", "slack"))
        w.clock.advance(1)
        late = [await w.steps(2) for _ in range(3)]
        for _ in range(6):
            await w.followers[0].sync_once()
        assert await w.caught_up(waiting.run_id, *late)
        said = [m for m in w.emulator.messages(OPS)
                if "<@U_ALICE> cancelled the run" in m.get("text", "")]
        assert len(said) == 1  # the error line, once, under the re-posted parent
        assert said[0]["thread_ts"] == (await w.thread(waiting.run_id)).ts


async def test_the_emulator_deletes_like_slack(tmp_path):
    emulator = SlackEmulator(bot_token=BOT)
    emulator.add_channel(OPS)
    client = AsyncWebClient(token=BOT, base_url=await emulator.start())
    try:
        ts = (await client.chat_postMessage(channel=OPS, text="parent"))["ts"]
        await client.chat_postMessage(channel=OPS, text="reply", thread_ts=ts)
        human = emulator.add_message(OPS, "mine", user="U_DANA")
        with pytest.raises(SlackApiError) as refused:
            await client.chat_delete(channel=OPS, ts=human)
        assert refused.value.response["error"] == "cant_delete_message"
        assert (await client.chat_delete(channel=OPS, ts=ts))["ts"] == ts
        assert [m["text"] for m in emulator.messages(OPS)] == ["reply", "mine"]
        for call in (lambda: client.chat_update(channel=OPS, ts=ts, text="x"),
                     lambda: client.chat_delete(channel=OPS, ts=ts)):
            with pytest.raises(SlackApiError) as gone:
                await call()
            assert gone.value.response["error"] == "message_not_found"
    finally:
        await emulator.stop()


# -- issue 33 item 4: the thread tells the truth, in the order things happened -------------

def _parent_text(w: World, run_id: str) -> str:
    [parent] = w.parents(run_id)
    return json.dumps(parent)


async def test_the_parent_shows_the_run_as_it_is_now_not_as_it_was(db_url, tmp_path):
    """The parent moves with the run on the turn that tells what the run did, and says
    nothing that goes stale by itself ("running for 2s" while minutes pass)."""
    async with world(db_url, tmp_path) as w:
        waiting = await w.refund()
        await rounds(w, lambda: w.caught_up(waiting.run_id))
        shown = _parent_text(w, waiting.run_id)
        assert "waiting for approval" in shown
        assert "running for" not in shown and "<!date^" in shown  # when it started
        w.clock.advance(timedelta(minutes=5))
        await w.engine.decide(waiting.approval_ids[0], actor=Actor("U_ALICE", "slack"),
                              verdict="approve")
        assert (await w.engine.advance(waiting.run_id)).status == "completed"
        await w.followers[0].sync_once()  # one turn: it tells what happened...
        assert any("approved by <@U_ALICE>" in line for line in
                   w.reply_lines((await w.thread(waiting.run_id)).ts))
        shown = _parent_text(w, waiting.run_id)  # ...and the parent moved with it
        assert "waiting for approval" not in shown and "completed" in shown, shown


async def test_a_notice_comes_after_the_approval_it_followed(sqlite_url, tmp_path):
    """The refund is approved, then the customer is emailed (notify_after): the thread
    says so in that order, and once (issue 52: the outbox's notice said it a second time
    in the thread; the thread tells it from the call's audit entry)."""
    from approvald.bot.slack import cards
    from approvald.bot.slack.delivery import SlackDeliverer

    from tests.integration.slack_harness import CHANNEL, harness, wait_for
    from tests.integration.slack_harness import OPS as HARNESS_OPS

    async with harness(sqlite_url, tmp_path) as h:
        assert isinstance(h.service.slack.deliverer, SlackDeliverer)
        h.service.slack.threads.interval = 0.3  # a follower slower than the outbox
        paused = await h.pause_refund()
        a = await h.approval(paused.approval_ids[0])
        await h.card(a.id)
        a = await h.approval(a.id)
        await h.slack.click(cards.APPROVE, h.value(a), user_id="U_ALICE",
                            channel_id=CHANNEL, message_ts=a.message_ts)

        async def told() -> list[str] | None:
            t, run = await Rows.of(h.engine).thread_and_run(paused.run_id)
            if t is None or t.ts is None or run is None or run.status != "completed" \
                    or t.posted_status != "completed":
                return None
            texts = [m["text"] for m in h.emulator.thread(HARNESS_OPS, t.ts)[1:]]
            return texts if any("notify-after" in x for x in texts) else None

        texts = await wait_for(told, what="the thread and the notice")
        said = "\n".join(texts)
        assert said.index("approved by <@U_ALICE>") < said.index("notify-after"), texts
        assert said.count("send_customer_email") == 1, texts
