"""Run threads for ops teams: one parent message per run, kept current, with replies.

The follower tails the runs table and each run's events (the database is the source, so a
restart or another replica picks up where the last left off) and posts what happened as
thread replies. Lines that pile up between posts are coalesced into one message, and each
channel gets at most one post per second, so a fast run stays under Slack's rate limit.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import timedelta
from typing import Any

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from bot import messages
from runtime.engine import Engine
from runtime.periodic import repeat
from runtime.state import AssistantMessage, ToolMessage
from runtime.transcript import decode
from store.records import ApprovalRecord, RunRecord
from store.repos.threads import ThreadRecord

log = logging.getLogger("approvald.threads")
FAILED = ("denied", "expired", "forbidden", "invalid_arguments", "error", "cancelled")


class ThreadFollower:
    def __init__(self, engine: Engine, client: AsyncWebClient, *, channel: str,
                 per_channel_interval: float = 1.0, lookback: timedelta = timedelta(hours=1),
                 permalink: Any = None, patience: float = 0.5) -> None:
        self.e = engine
        self.client = client
        self.channel = channel
        self.interval = per_channel_interval
        self.since = engine.clock.now() - lookback
        self._next_ok: dict[str, float] = {}
        self._permalink = permalink
        self.patience = patience  # how long each post defers to decided runs

    async def run(self, stop: asyncio.Event, *, poll: float = 0.5) -> None:
        await repeat(self.sync_once, stop=stop, every=poll, what="run threads sync")

    def _ready(self, channel: str) -> bool:
        return time.monotonic() >= self._next_ok.get(channel, 0.0)

    def _posted(self, channel: str, pause: float | None = None) -> None:
        self._next_ok[channel] = time.monotonic() + (pause or self.interval)

    async def sync_once(self) -> int:
        """Bring every lagging thread up to date (as far as pacing allows); returns posts."""
        async with self.e.db.read() as tx:
            behind = await tx.threads.behind(since=self.since, limit=100)
        posts = 0
        for run, thread in behind:
            channel = thread.channel if thread else self.channel
            if not self._ready(channel):
                continue
            await self.e.urgency.settle(self.patience)
            try:
                posts += await self._sync(run, thread)
            except SlackApiError as exc:
                resp = exc.response
                if resp is not None and (resp.status_code == 429
                                         or resp.get("error") == "ratelimited"):
                    self._posted(channel, float(resp.headers.get("Retry-After", 1)))
                else:
                    log.warning("run %s: thread update failed: %s", run.id, exc)
                    self._posted(channel, 5.0)
            except Exception as exc:  # Slack unreachable: try again next round
                log.warning("run %s: thread update failed: %s", run.id, exc)
                self._posted(channel, 5.0)
        return posts

    async def _sync(self, run: RunRecord, thread: ThreadRecord | None) -> int:
        async with self.e.db.read() as tx:
            approvals = await tx.approvals.for_run(run.id)
        pending = sum(a.status == "pending" for a in approvals)
        if thread is None:
            parent = messages.run_parent(run, now=self.e.clock.now(), approvals_pending=pending)
            resp = await self.client.chat_postMessage(channel=self.channel, **parent)
            self._posted(self.channel)
            async with self.e.db.write() as tx:
                await tx.threads.create(run.id, channel=self.channel, ts=str(resp["ts"]),
                                        posted_status=run.status)
                thread = await tx.threads.get(run.id)
            assert thread is not None
            status_changed = True
            return 1 + await self._replies(run, thread, approvals, status_changed)
        status_changed = thread.posted_status != run.status
        posts = await self._replies(run, thread, approvals, status_changed)
        if status_changed:
            parent = messages.run_parent(run, now=self.e.clock.now(), approvals_pending=pending)
            await self.client.chat_update(channel=thread.channel, ts=thread.ts, **parent)
            async with self.e.db.write() as tx:
                await tx.threads.advance(run.id, posted_status=run.status)
        return posts

    async def _replies(self, run: RunRecord, thread: ThreadRecord,
                       approvals: list[ApprovalRecord], status_changed: bool) -> int:
        async with self.e.db.read() as tx:
            events = await tx.events.load(run.id, since=thread.posted_seq)
            executions = await tx.executions.for_run(run.id) if events else {}
        by_call = {a.call_id: a for a in approvals if a.kind == "tool_call"}
        lines: list[str] = []
        for ev in events:
            msg = decode(ev, executions)
            if isinstance(msg, ToolMessage):
                a = by_call.get(msg.call_id)
                if a is not None and a.status != "pending":
                    lines.append(messages.thread_approval_decided(a))
                status = msg.content.get("status") if isinstance(msg.content, dict) else None
                if a is None or status not in ("denied", "expired", "cancelled"):
                    lines.append(messages.thread_tool_call(msg.name, msg.content,
                                                           failed=status in FAILED))
            elif isinstance(msg, AssistantMessage) and not msg.tool_calls and msg.content:
                lines.append(messages.thread_final(msg.content))
        if status_changed:
            lines.extend(await self._status_lines(run, approvals))
        last_seq = events[-1].seq + 1 if events else thread.posted_seq
        posts = 0
        for chunk in messages.coalesce(lines):
            await self.client.chat_postMessage(channel=thread.channel, thread_ts=thread.ts,
                                               text=chunk)
            self._posted(thread.channel)
            posts += 1
        if last_seq != thread.posted_seq:
            async with self.e.db.write() as tx:
                await tx.threads.advance(run.id, posted_seq=last_seq)
        return posts

    async def _status_lines(self, run: RunRecord, approvals: list[ApprovalRecord]) -> list[str]:
        if run.status in ("awaiting_approval", "needs_attention"):
            out = []
            for a in approvals:
                if a.status == "pending":
                    url = None
                    if self._permalink is not None and a.channel and a.message_ts:
                        url = await self._permalink(a.channel, a.message_ts)
                    out.append(messages.thread_approval_requested(a, card_url=url))
            return out
        if run.status in ("failed", "cancelled") and run.error:
            return [messages.thread_error(run.error)]
        return []
