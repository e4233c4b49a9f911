"""Run threads for ops teams: one parent message per run, kept current, with replies.

Runs of approvald's own agents, that is: a caller's request (a coding assistant's hook, an
MCP gateway's call, an HTTP API token's) is told by its card when a person is asked, and a
call the policy answers posts nothing (a thread per call was noise in the channel); with
``APPROVALD_CALLER_THREADS=asked`` a request that asked a person gets a thread too.

The follower tails the runs table, each run's audit entries and its events (the database
is the source, so a restart or another replica picks up where the last left off) and posts
what happened as thread replies: every entry that changes who or what the run waits on
(a request with a link to its card, a reminder, an escalation, a vote, a decision, an
execution, a retry after a crash: :mod:`story`), then the agent's final words. The parent
says how the run stands, on whom and until when it waits. A request's line waits for its
card to be posted (``card_wait`` at most), so that it links to it.

With several replicas on one database the lead replica tells the runs
(:meth:`ThreadFollower.run`), so each channel is paced once for the fleet. While the lead
changes hands two may follow the same runs, so each thread's work is claimed first: a
compare-and-set on its row (inserted already claimed, before the parent exists) gives one
replica a lease, and only the holder posts for that run until the lease ends (the engine
keeps the claims, :mod:`runtime.threads`; a turn reads what it tells from the engine's
view of the run, :meth:`runtime.views.Views.turn`, one snapshot). Every post
carries message metadata: the parent names its run, a reply names the seq its events run
up to. What a turn posted is recorded as the claim is released; when a claim is taken over
uncleanly (the last holder crashed or failed after posting, before recording), the new
holder first looks in Slack for what its predecessor posted (``conversations.history``
for the parent, ``conversations.replies`` for the last reply) and carries on from there,
so nothing is posted twice.

A turn does a bounded amount of work (at most one new message, one parent update, and the
lookups those need); the parent is redrawn on every turn that tells something, so it shows
the run as it is now even while the run keeps going. Each channel gets at most one post per
``per_channel_interval``, and threads are served least recently served first, a failing one
only after its backoff: one thread cannot hold up the others. A parent someone deleted is
posted again once; lost a second time, that run's thread is left alone.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from approvald.bot.slack import messages, story
from approvald.bot.slack.delivery import slack_error
from approvald.runtime import (
    MAX_REPOSTS,
    AssistantMessage,
    Claim,
    Engine,
    RunMasking,
    decode_event,
    failpoint,
    of_run,
    repeat_every,
)
from approvald.store.records import (
    ApprovalRecord,
    AuditRecord,
    EventRecord,
    ExecutionRecord,
    RunRecord,
)
from approvald.store.repos.threads import ThreadRecord
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

log = logging.getLogger("approvald.threads")
THREAD_EVENT = "approvald_thread"  # metadata of a run's parent message: {run_id}
REPLY_EVENT = "approvald_thread_reply"  # of a reply: {run_id, upto, audit[, status]}
GONE = frozenset({"message_not_found", "thread_not_found"})
_HISTORY_PAGES = 5  # pages of 200 searched for a parent an unclean claim may have posted
_REPLY_PAGES = 20


class _OutOfLease(Exception):
    """Too little of the claim is left to start a post that must land inside it."""


@dataclass
class _Turn:
    """One claimed thread's work this round, and what it has done so far."""

    thread: ThreadRecord  # as claimed
    lease_end: datetime
    unsure: bool  # something may be in Slack that neither the row nor ``progress`` shows
    progress: dict[str, Any] = field(default_factory=dict)
    told_status: str | None = None  # status lines known posted at ``posted_seq``
    posts: int = 0
    # what may be shown of the run's calls (runtime.record.shown): its task, results and words
    # with each call's declared values masked, as everywhere
    shown: RunMasking = field(default_factory=RunMasking)

    @property
    def ts(self) -> str | None:
        return self.progress.get("ts", self.thread.ts)

    @property
    def posted_seq(self) -> int:
        return int(self.progress.get("posted_seq", self.thread.posted_seq))

    @property
    def told_audit(self) -> int:
        return int(self.progress.get("told_audit", self.thread.told_audit))


# a message's link from its channel and ts (None when Slack gives none)
Permalink = Callable[[str | None, str | None], Awaitable[str | None]]


class ThreadFollower:
    def __init__(self, engine: Engine, client: AsyncWebClient, *, channel: str,
                 per_channel_interval: float = 1.0, lookback: timedelta = timedelta(hours=1),
                 permalink: Permalink | None = None, patience: float = 0.5,
                 claim_ttl: timedelta = timedelta(seconds=90), batch: int = 100,
                 backoff: float = 2.0, max_backoff: float = 600.0,
                 callers: bool = False, card_wait: timedelta = timedelta(seconds=30),
                 poll: float = 0.5) -> None:
        self.e = engine
        self.client = client
        self.channel = channel
        self.interval = per_channel_interval
        self.since = engine.now() - lookback
        self.claim_ttl = claim_ttl
        self.batch = batch
        self.backoff = backoff
        self.max_backoff = max_backoff
        self._next_ok: dict[str, float] = {}
        self._permalink = permalink
        self.patience = patience  # how long each turn defers to decided runs
        # callers' requests (hooks, MCP gateways, API tokens) that asked a person get a
        # thread too; off, their card is their one message (and a policy's answer none)
        self.callers = callers
        # a request is told with a link to its card: how long its line waits for the card
        # to be posted before it is told without one
        self.card_wait = card_wait
        # how often :meth:`run` looks for runs behind (while this replica leads)
        self.poll = poll

    async def run(self, stop: asyncio.Event, *, poll: float | None = None) -> None:
        await repeat_every(self._round, stop=stop, every=self.poll if poll is None else poll,
                           what="run threads sync", pace=self.e.pace)

    async def _round(self) -> int:
        """A round of :meth:`run`: the lead replica's alone (``Engine.pace``). A channel's
        pacing is the fleet's budget, kept in one process: each replica pacing a channel
        on its own told the runs lagging a burst about as many times as fast as there are
        replicas, in more, smaller turns (issue 50). A replica that takes the lead takes
        the turns at its next round; the claims below still keep two leads (a moment
        while the lead changes hands) from telling a thread twice. Replicas are meant
        to be configured alike: a replica running ``serve`` without the Slack app can
        lead too, and while it does no replica tells the run threads."""
        return await self.sync_once() if self.e.pace.leading else 0

    def _ready(self, channel: str) -> bool:
        return time.monotonic() >= self._next_ok.get(channel, 0.0)

    def _posted(self, channel: str, pause: float | None = None) -> None:
        self._next_ok[channel] = time.monotonic() + (pause or self.interval)

    async def sync_once(self) -> int:
        """Give each lagging thread one turn (as far as pacing allows); returns posts."""
        behind = await self.e.threads.behind(since=self.since, limit=self.batch,
                                             callers=self.callers)
        posts = 0
        for run, seen in behind:
            channel = seen.channel if seen else self.channel
            if not self._ready(channel):
                continue
            await self.e.settle(self.patience)
            posts += await self._turn(run, seen, channel)
        return posts

    # -- one claimed turn ----------------------------------------------------------------

    async def _turn(self, run: RunRecord, seen: ThreadRecord | None, channel: str) -> int:
        claim: Claim | None = await self.e.threads.claim(run.id, seen, channel=channel,
                                                         ttl=self.claim_ttl)
        if claim is None:
            return 0  # another replica has this thread
        turn = _Turn(claim.thread, lease_end=claim.lease_end, unsure=claim.unsure)
        try:
            try:
                await self._work(turn)
            except _OutOfLease:
                pass
            kept = await self.e.threads.finish(run.id, turn.progress)
            if not kept:
                log.warning("run %s: thread claim lapsed before its turn was recorded", run.id)
        except Exception as exc:
            await self._failed(turn, exc)
        return turn.posts

    async def _failed(self, turn: _Turn, exc: Exception) -> None:
        t = turn.thread
        resp = exc.response if isinstance(exc, SlackApiError) else None
        limited = resp is not None and (resp.status_code == 429
                                        or _error(exc) == "ratelimited")
        if limited and resp is not None:
            after = float(resp.headers.get("Retry-After", 1))
            self._posted(t.channel, after)
        else:
            after = min(self.max_backoff, self.backoff * 2 ** min(t.failures, 20))
            log.warning("run %s: thread update failed (%d in a row; next try in %.0f s): %s",
                        t.run_id, t.failures + 1, after, exc)
        try:
            await self.e.threads.fail(t.run_id, retry_in=timedelta(seconds=after),
                                      unsure=turn.unsure, failed=not limited,
                                      progress=turn.progress)
        except Exception as db_exc:  # the claim then lapses on its own at its lease end
            log.warning("run %s: could not record a failed thread turn: %s", t.run_id, db_exc)

    async def _work(self, turn: _Turn) -> None:
        t = turn.thread
        view = await self.e.views.turn(t.run_id, since_seq=t.posted_seq,
                                       after_audit=t.told_audit, limit=self.batch)
        run, executions = view.run, view.executions
        approvals, events, entries = list(view.approvals), list(view.events), list(view.entries)
        if run is None:
            return
        told = [decode_event(ev, executions) for ev in events if ev.seq >= turn.posted_seq]
        turn.shown = of_run(told, approvals, executions, view.external)
        if turn.unsure:
            await self._reconcile(turn, run)
        if turn.ts is None:
            await self._post_parent(turn, run, approvals, executions)
            return
        events = [ev for ev in events if ev.seq >= turn.posted_seq]
        entries = [e for e in entries if e.seq > turn.told_audit]
        all_audit = len(entries) < self.batch  # every untold entry is in ``entries``
        if events or entries:
            items, whole = await self._items(entries, events, approvals, executions,
                                             turn.shown)
            reply = story.story_reply(run.id, items)
            all_audit = all_audit and whole and reply.taken == len(items)
            if reply.text:
                # the parent moves with what is told: a run that keeps going would otherwise
                # never be caught up with, and its parent never redrawn. It goes first: its
                # update finds a deleted parent, under which a reply would be lost
                if await self._update_parent(turn, run, approvals, executions):
                    await self._reply(turn, run, reply, approvals, executions)
                return
            self._told(turn, reply)
        if turn.posted_seq < run.next_seq or not all_audit \
                or run.status == t.posted_status:
            return
        # the parent first (an update is idempotent), then why the run stopped
        if not await self._update_parent(turn, run, approvals, executions):
            return
        if turn.told_status != run.status:
            lines = self._status_lines(run, turn.shown)
            if lines and not await self._reply(
                    turn, run, story.Reply(messages.thread_status(lines), [], run.next_seq,
                                           None, 0),
                    approvals, executions, status=run.status):
                return
        turn.progress["posted_status"] = run.status

    async def _items(self, entries: list[AuditRecord], events: list[EventRecord],
                     approvals: list[ApprovalRecord],
                     executions: dict[str, ExecutionRecord],
                     shown: RunMasking) -> tuple[list[story.Item], bool]:
        """What the untold audit entries and events say, in order: the entries (committed
        in the order things happened), then the events (the agent's final words). A
        request whose card is still being posted holds the story back, for a while, so
        that its line links to the card; ``False`` then: not all was said."""
        by_id = {a.id: a for a in approvals}
        links: dict[str, str | None] = {}
        items: list[story.Item] = []
        now = self.e.now()
        for e in entries:
            a = by_id.get(e.approval_id or "")
            if e.action in ("requested", "escalated", "reminded") and a is not None:
                if not (a.channel and a.message_ts) and a.status == "pending" \
                        and now - a.requested_at < self.card_wait:
                    return items, False  # its card is not posted yet: told with its link
                if a.id not in links:
                    links[a.id] = await self._link(a)
            items.append(story.Item("audit", e.seq,
                                    story.entry_lines(e, by_id, executions, links, shown)))
        for ev in events:
            msg = decode_event(ev, executions)
            lines = []
            if isinstance(msg, AssistantMessage) and not msg.tool_calls and msg.content:
                lines.append(story.Line(messages.thread_final(shown.run.text(msg.content))))
            items.append(story.Item("event", ev.seq, lines))
        return items, True

    async def _link(self, a: ApprovalRecord) -> str | None:
        if self._permalink is None or not (a.channel and a.message_ts):
            return None
        return await self._permalink(a.channel, a.message_ts)

    @staticmethod
    def _told(turn: _Turn, reply: story.Reply) -> None:
        if reply.upto is not None:
            turn.progress["posted_seq"] = reply.upto
        if reply.told_audit is not None:
            turn.progress["told_audit"] = reply.told_audit

    # -- Slack calls ---------------------------------------------------------------------

    async def _post(self, turn: _Turn, **kwargs: Any) -> str:
        """chat.postMessage, started only while the claim outlasts the call's timeout;
        returns the new message's ts."""
        margin = timedelta(seconds=float(self.client.timeout or 30))
        if self.e.now() + margin >= turn.lease_end:
            raise _OutOfLease
        turn.unsure = True
        try:
            resp = await self.client.chat_postMessage(**kwargs)
        except SlackApiError as exc:
            if exc.response is not None and exc.response.status_code < 500:
                turn.unsure = False  # Slack answered: nothing was posted
            raise
        self._posted(kwargs["channel"])
        turn.posts += 1
        failpoint("after_thread_post_before_record")
        return str(resp["ts"])

    def _parent(self, turn: _Turn, run: RunRecord, approvals: list[ApprovalRecord],
                executions: dict[str, ExecutionRecord]) -> dict[str, Any]:
        return messages.run_parent(run, now=self.e.now(),
                                   pending=[a for a in approvals if a.status == "pending"],
                                   ended=story.ended_badly(approvals, executions),
                                   shown=turn.shown.run)

    async def _post_parent(self, turn: _Turn, run: RunRecord,
                           approvals: list[ApprovalRecord],
                           executions: dict[str, ExecutionRecord]) -> None:
        parent = self._parent(turn, run, approvals, executions)
        turn.progress["ts"] = await self._post(turn, channel=turn.thread.channel,
                                               metadata=_parent_metadata(run.id), **parent)
        turn.unsure = False

    async def _reply(self, turn: _Turn, run: RunRecord, reply: story.Reply,
                     approvals: list[ApprovalRecord], executions: dict[str, ExecutionRecord],
                     *, status: str | None = None) -> bool:
        """Post a reply telling what ``reply`` tells (and ``status``); False if the parent
        turned out to be gone (the turn is then over)."""
        payload: dict[str, Any] = {"run_id": run.id,
                                   "upto": reply.upto if reply.upto is not None
                                   else turn.posted_seq,
                                   "audit": reply.told_audit if reply.told_audit is not None
                                   else turn.told_audit}
        if status is not None:
            payload["status"] = status
        extra: dict[str, Any] = {"blocks": reply.blocks} if reply.blocks else {}
        try:
            await self._post(turn, channel=turn.thread.channel, thread_ts=turn.ts,
                             text=reply.text, **extra,
                             metadata={"event_type": REPLY_EVENT, "event_payload": payload})
        except SlackApiError as exc:
            if _error(exc) not in GONE:
                raise
            await self._parent_lost(turn, run, approvals, executions)
            return False
        self._told(turn, reply)
        turn.unsure = False
        return True

    async def _update_parent(self, turn: _Turn, run: RunRecord,
                             approvals: list[ApprovalRecord],
                             executions: dict[str, ExecutionRecord]) -> bool:
        """Show the run's status on its parent; False if the parent was gone."""
        parent = self._parent(turn, run, approvals, executions)
        assert turn.ts is not None
        try:
            await self.client.chat_update(channel=turn.thread.channel, ts=turn.ts,
                                          metadata=_parent_metadata(run.id), **parent)
            return True
        except SlackApiError as exc:
            if _error(exc) not in GONE:
                raise
        await self._parent_lost(turn, run, approvals, executions)
        return False

    async def _parent_lost(self, turn: _Turn, run: RunRecord,
                           approvals: list[ApprovalRecord],
                           executions: dict[str, ExecutionRecord]) -> None:
        """Someone deleted the parent: post it again, once; after that let the thread go."""
        t = turn.thread
        if t.reposts >= MAX_REPOSTS:
            log.warning("run %s: its thread's parent message was deleted again; no longer "
                        "following that thread", t.run_id)
            turn.progress["reposts"] = t.reposts + 1
            return
        found = None
        if turn.unsure:  # the last holder may have re-posted it without recording that
            found = await self._find_parent(t.channel, run, not_ts=turn.ts)
        if found is None:
            parent = self._parent(turn, run, approvals, executions)
            found = await self._post(turn, channel=t.channel,
                                     metadata=_parent_metadata(run.id), **parent)
            log.info("run %s: its thread's parent message was deleted; posted it again",
                     t.run_id)
        turn.progress.update(ts=found, reposts=t.reposts + 1)
        turn.unsure = False

    # -- finding what an unclean claim posted ------------------------------------------

    async def _reconcile(self, turn: _Turn, run: RunRecord) -> None:
        t = turn.thread
        if t.ts is None:
            found = await self._find_parent(t.channel, run)
            if found is not None:
                turn.progress["ts"] = found
        else:
            upto, audit, status = await self._last_reply(t.channel, t.ts, run.id)
            if upto is not None and upto > t.posted_seq:
                turn.progress["posted_seq"] = upto
            if audit is not None and audit > t.told_audit:
                turn.progress["told_audit"] = audit
            if upto is not None and upto == turn.posted_seq:
                turn.told_status = status
        turn.unsure = False

    async def _find_parent(self, channel: str, run: RunRecord, *,
                           not_ts: str | None = None) -> str | None:
        """The newest parent message of ``run`` in ``channel`` (other than ``not_ts``).

        Only an unclean claim asks, and what it looks for was posted during that claim, so
        it sits near the newest end: a few pages suffice, and no clock has to agree with
        Slack's."""
        cursor = None
        for _ in range(_HISTORY_PAGES):
            resp = await self.client.conversations_history(
                channel=channel, include_all_metadata=True, limit=200, cursor=cursor)
            for m in resp.get("messages") or []:
                if _meta(m, THREAD_EVENT, run.id) is not None and m.get("ts") != not_ts:
                    return str(m["ts"])
            cursor = (resp.get("response_metadata") or {}).get("next_cursor")
            if not cursor:
                break
        return None

    async def _last_reply(self, channel: str, ts: str,
                          run_id: str) -> tuple[int | None, int | None, str | None]:
        """``(upto, audit, status)`` of the newest reply of ours under ``ts``, if any."""
        last: dict[str, Any] | None = None
        cursor = None
        for _ in range(_REPLY_PAGES):
            try:
                resp = await self.client.conversations_replies(
                    channel=channel, ts=ts, include_all_metadata=True, limit=200,
                    cursor=cursor)
            except SlackApiError as exc:
                if _error(exc) in GONE:
                    break
                raise
            for m in resp.get("messages") or []:
                if m.get("ts") != ts and _meta(m, REPLY_EVENT, run_id) is not None:
                    last = m
            cursor = (resp.get("response_metadata") or {}).get("next_cursor")
            if not cursor:
                break
        payload = _meta(last, REPLY_EVENT, run_id) if last else None
        if payload is None:
            return None, None, None
        status = payload.get("status")
        audit = payload.get("audit")
        return (int(payload["upto"]), int(audit) if audit is not None else None,
                str(status) if status is not None else None)

    # -- what to tell ------------------------------------------------------------------

    @staticmethod
    def _status_lines(run: RunRecord, shown: RunMasking) -> list[str]:
        """Why a run stopped, where no audit entry of its says it (a failure's error)."""
        if run.status == "failed" and run.error:
            return [messages.thread_error(shown.run.text(run.error))]
        return []


def _parent_metadata(run_id: str) -> dict[str, Any]:
    return {"event_type": THREAD_EVENT, "event_payload": {"run_id": run_id}}


def _meta(message: dict[str, Any] | None, event_type: str,
          run_id: str) -> dict[str, Any] | None:
    """The metadata payload of ``message`` if it is ours, of ``event_type``, for ``run_id``."""
    meta = (message or {}).get("metadata") or {}
    payload = meta.get("event_payload") or {}
    if meta.get("event_type") == event_type and payload.get("run_id") == run_id:
        return dict(payload)
    return None


def _error(exc: BaseException) -> str | None:
    """Slack's error code, if the answer had a JSON body (a 5xx may be plain text)."""
    return slack_error(exc) if isinstance(exc, SlackApiError) else None
