"""An in-process approvald (Service) wired to the Slack emulator over real HTTP."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from approvald.bot.config import Settings
from approvald.bot.sandbox import SlackEmulator
from approvald.bot.sandbox.client import SlackClientSim
from approvald.bot.serve import Service
from approvald.bot.wiring import open_database
from approvald.runtime.kernel.clock import Clock
from approvald.runtime.kernel.outcomes import Paused
from approvald.runtime.record.tracing import Tracer

from tests.helpers import Rows

SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
BOT_TOKEN = "xoxb-approvald-test"
APP_TOKEN = "xapp-approvald-test"
CHANNEL = "C_APPROVALS"
OPS = "C_OPS"
TASK = "Refund order A-1001, customer was double charged"


@dataclass
class Harness:
    service: Service
    emulator: SlackEmulator
    slack: SlackClientSim
    ledger: Path

    @property
    def engine(self):  # type: ignore[no-untyped-def]
        return self.service.engine

    async def pause_refund(self, *, requested_by: str = "U_DANA",
                           task: str = TASK, agent: str = "demo-refund") -> Paused:
        outcome = await self.engine.run(agent, task, requested_by=requested_by)
        assert isinstance(outcome, Paused), outcome
        return outcome

    async def outcome_question(self) -> tuple[Paused, Any]:
        """A refund approved and run, its customer email cut off before its result was
        recorded: the run needs attention, and its question (returned) is pending."""
        from approvald.runtime.approvals.decide import Actor
        from approvald.runtime.kernel import failpoints

        from tests.helpers import Crash, crash

        paused = await self.pause_refund()
        await self.engine.decide(paused.approval_ids[0], actor=Actor("U_ALICE", "slack"),
                                 verdict="approve")
        failpoints.arm("before_result@2", crash)  # the email ran; its result is lost
        try:
            try:
                await self.engine.advance(paused.run_id)
            except Crash:
                pass
            else:
                raise AssertionError("the failpoint did not fire")
        finally:
            failpoints.arm("")
        assert (await self.engine.advance(paused.run_id)).status == "needs_attention"
        [q] = [a for a in await Rows.of(self.engine).approvals(paused.run_id)
               if a.status == "pending"]
        assert q.kind == "outcome_unknown"
        return paused, q

    async def approval(self, approval_id: str):  # type: ignore[no-untyped-def]
        return await Rows.of(self.engine).approval(approval_id)

    async def run(self, run_id: str):  # type: ignore[no-untyped-def]
        return await Rows.of(self.engine).run(run_id)

    async def card(self, approval_id: str) -> dict[str, Any]:
        """The card as Slack holds it now (after waiting for it to be posted)."""
        await wait_for(lambda: self._card_ts(approval_id), what="the card to be posted")
        a = await self.approval(approval_id)
        msg = self.emulator.message(a.channel, a.message_ts)
        assert msg is not None
        return msg

    async def _card_ts(self, approval_id: str) -> bool:
        a = await self.approval(approval_id)
        return bool(a and a.message_ts)

    def token(self, a: Any) -> str:
        """The token of a card drawn now for ``a`` (bound to its current arguments)."""
        token = self.engine.button_token(a)
        assert token is not None
        return str(token)

    def value(self, a: Any) -> str:
        """The value of a card's button drawn now for ``a``."""
        from approvald.bot.slack.cards import button_value

        return button_value(a.id, self.token(a))

    def refunds(self) -> list[dict[str, Any]]:
        if not self.ledger.exists():
            return []
        return [e for e in map(json.loads, self.ledger.read_text().splitlines())
                if e["tool"] == "issue_refund"]


async def wait_for(predicate: Callable[[], Any], *, within: float = 10.0,
                   what: str = "the condition") -> Any:
    """Poll ``predicate`` (sync or async) until truthy: other tasks in this process
    (bolt's listener after its ack, the outbox drain, the worker) finish their work."""
    deadline = time.monotonic() + within
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def settings_for(url: str, db_url: str, ledger: Path, **extra: Any) -> Settings:
    values = {
        "SLACK_BOT_TOKEN": BOT_TOKEN, "SLACK_SIGNING_SECRET": SECRET, "SLACK_API_URL": url,
        "APPROVALD_DATABASE_URL": db_url, "APPROVALD_CHANNEL": CHANNEL,
        "APPROVALD_OPS_CHANNEL": OPS, "APPROVALD_PORT": 0, "APPROVALD_HOST": "127.0.0.1",
        "APPROVALD_DEMO_LEDGER": str(ledger), "APPROVALD_POLL_INTERVAL": 0.05,
        "APPROVALD_SECRET": "approvald-test-secret-0123456789",
    }
    values.update(extra)
    return Settings(**values)


@asynccontextmanager
async def harness(db_url: str, tmp_path: Path, *, clock: Clock | None = None,
                  tracer: Tracer | None = None, background: bool = True,
                  **extra: Any) -> AsyncIterator[Harness]:
    emulator = SlackEmulator(bot_token=BOT_TOKEN, app_token=APP_TOKEN, signing_secret=SECRET)
    # C_AUDIT exists before serve starts: serve posts the audit head it started on at once
    for channel in (CHANNEL, OPS, "C_FINANCE", "C_AUDIT"):
        emulator.add_channel(channel)
    for user in ("U_ALICE", "U_BOB", "U_CAROL", "U_DANA", "U_MALLORY", "U_CFO"):
        emulator.add_user(user, user.lower())
    emulator.add_usergroup("S_FINANCE", ["U_BOB", "U_CAROL"])
    url = await emulator.start()
    try:
        ledger = tmp_path / "ledger.jsonl"
        settings = settings_for(url, db_url, ledger, **extra)
        db = await open_database(settings, quiet=True)
        try:
            service = Service(settings, db, clock=clock, tracer=tracer)
            if service.slack is not None:
                service.slack.threads.interval = 0.02
                # and polls as the worker does (APPROVALD_POLL_INTERVAL), not every 0.5 s:
                # a run's thread is told a message a turn, a turn a round
                service.slack.threads.poll = 0.05
            try:
                await service.start(background=background)
                port = service.slack.port if service.slack else None
                async with emulator.client(f"http://127.0.0.1:{port}/slack/events") as client:
                    yield Harness(service, emulator, client, ledger)
            finally:
                await service.stop()
        finally:
            await db.close()
    finally:
        await emulator.stop()
