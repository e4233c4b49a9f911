"""``approvald serve`` on PostgreSQL while the database drops its connections.

A real ``serve`` process works through refund runs (decided by clicks on its cards) and
tick runs, while every backend of the database is killed with ``pg_terminate_backend``,
again and again, in the middle of it. It must carry on: every run completes, each side
effect happens exactly once (the demo ledger; the one idempotent read may run again),
every request is decided once, each card is posted once and shows the decision, and the
audit chain is intact.

The tools here can all tell whether a call happened (a ``reconcile`` hook asking the demo
ledger, the stand-in for the outside world): a call whose result write died with its
connection is outcome unknown to the next attempt, which then settles it without a
person. (With a tool that has no such hook, that run stops and asks a person instead; the
ledger does not yet retry its own result write.)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import sys
import textwrap
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest
from approvald.bot.config import Settings
from approvald.bot.slack import cards
from approvald.bot.wiring import build_registry
from approvald.runtime.engine import assemble
from approvald.runtime.kernel.clock import FileClock
from approvald.runtime.kernel.ids import TokenSigner
from approvald.store.db import Database

from tests.acceptance.test_serve_lifecycle import Serve
from tests.acceptance.test_slack_serve import (
    TOKEN_SECRET,
    card_messages,
    free_port,
    run_cli,
    setup,
)
from tests.conftest import PG_ADMIN_URL
from tests.helpers import Cli, Rows
from tests.integration.slack_harness import CHANNEL, wait_for

# processes, browsers or hundreds of schedules: out of the inner loop (-m 'not slow')
pytestmark = pytest.mark.slow

T = TypeVar("T")
REFUNDS = 6
TICKERS = 3
TICKS = 30
DROPS = 8


async def terminate_backends(db_url: str) -> int:
    """Kill every other connection to the test database, as an operator (or a failover)
    would; returns how many there were."""
    import asyncpg  # type: ignore[import-untyped]

    name = db_url.rsplit("/", 1)[1]
    conn = await asyncpg.connect(PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}", timeout=5)
    try:
        return len(await conn.fetch(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"))
    finally:
        await conn.close()


async def look(db_url: str, read: Callable[[Any], Awaitable[T]]) -> T:
    """Read with a fresh connection, again if the terminator killed it meanwhile."""
    for attempt in range(20):
        db = Database(db_url)
        try:
            return await Rows(db).in_one_read(read)
        except Exception:
            if attempt == 19:
                raise
            await asyncio.sleep(0.1)
        finally:
            await db.close()
    raise AssertionError("unreachable")


REFUND_AGENT = '''
"""demo-refund's script, with tools that can each say whether a call happened."""

import os

from approvald.runtime.runs.agent import Agent
from approvald.runtime.runs.demo import REFUND_POLICY, DemoLedger, refund_script
from approvald.runtime.models.scripted import ScriptedModel
from approvald.runtime.policies.tools import Reconciled, ToolContext, tool

LEDGER = DemoLedger(os.environ.get("APPROVALD_DEMO_LEDGER"))


def lookup(ctx, order_id):
    return {"order_id": order_id, "customer_email": "dana@example.com",
            "charged_cents": 8400, "duplicate_charge_cents": 4200, "currency": "USD"}


def refund(ctx, order_id, amount_cents, reason):
    return {"refund_id": "rf_" + ctx.idempotency_key[-12:], "order_id": order_id,
            "amount_cents": amount_cents, "status": "issued"}


def email(ctx, order_id, subject, body):
    return {"sent": True, "to": "dana@example.com"}


def reconciling(result):
    async def reconcile(ctx, args):
        if LEDGER.find(ctx.idempotency_key) is None:
            return Reconciled(happened=False)
        return Reconciled(happened=True, result=result(ctx, **args))
    return reconcile


@tool(permission="read", reconcile=reconciling(lookup))
async def lookup_order(ctx: ToolContext, order_id: str) -> dict:
    """Look an order up."""
    LEDGER.record(ctx, "lookup_order", {"order_id": order_id})
    return lookup(ctx, order_id)


@tool(permission="execute", approval=REFUND_POLICY, reconcile=reconciling(refund))
async def issue_refund(ctx: ToolContext, order_id: str, amount_cents: int, reason: str) -> dict:
    """Refund part of an order's charge."""
    LEDGER.record(ctx, "issue_refund", {"order_id": order_id, "amount_cents": amount_cents,
                                        "reason": reason})
    return refund(ctx, order_id, amount_cents, reason)


@tool(permission="execute", policy="notify_after", reconcile=reconciling(email))
async def send_customer_email(ctx: ToolContext, order_id: str, subject: str, body: str) -> dict:
    """Email the customer."""
    LEDGER.record(ctx, "send_customer_email", {"order_id": order_id, "subject": subject,
                                               "body": body})
    return email(ctx, order_id, subject, body)


agent = Agent(name="refund", instructions="Refund duplicate charges.",
              model=ScriptedModel(refund_script),
              tools=[lookup_order, issue_refund, send_customer_email])
'''


async def start_runs(cli: Cli) -> list[str]:
    """Runs left ``running`` for serve to advance (nothing is advanced in this process)."""
    registry = build_registry(Settings(APPROVALD_DEMO_LEDGER=str(cli.ledger),
                                       APPROVALD_AGENTS="reconciling_refund"))
    db = Database(cli.db_url)
    engine = assemble(db, registry, clock=FileClock(str(cli.clock_file)))
    try:
        ids = [await engine.start_run("refund", f"Refund order A-{1000 + i}",
                                      requested_by="U_DANA") for i in range(REFUNDS)]
        ids += [await engine.start_run("demo-steps", str(TICKS), requested_by="U_DANA")
                for _ in range(TICKERS)]
    finally:
        await db.close()
    return ids


async def dump(db_url: str, serve: Serve) -> None:
    """What a failure needs to be understood: the rows that did not finish, serve's log."""
    for r in await look(db_url, lambda tx: tx.runs.recent(limit=100)):
        if r.status != "completed":
            print("RUN", r.id, r.status, r.error, r.lease_owner, r.lease_expires_at, r.step)
    for a in await look(db_url, lambda tx: tx.approvals.recent()):
        if a.status != "approved":
            print("APPROVAL", a.id, a.run_id, a.kind, a.status, a.message_ts)
    for o in await look(db_url, lambda tx: tx.outbox.recent()):
        if o.status != "delivered":
            print("OUTBOX", o)
    print(serve.text)


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_serve_carries_on_when_postgres_drops_its_connections(
        db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    emulator, cli = await setup(tmp_path, db_url)
    (tmp_path / "reconciling_refund.py").write_text(textwrap.dedent(REFUND_AGENT))
    monkeypatch.syspath_prepend(str(tmp_path))  # this process imports it too (start_runs)
    monkeypatch.delitem(sys.modules, "reconciling_refund", raising=False)
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)
    cli.env_extra.update(APPROVALD_AGENTS="reconciling_refund", PYTHONPATH=path)
    port = free_port()
    serve = await Serve.spawn(cli, APPROVALD_PORT=str(port), APPROVALD_LOG_LEVEL="INFO")
    signer = TokenSigner(TOKEN_SECRET)
    killed: list[int] = []
    try:
        await wait_for(lambda: "approvald: serving on" in serve.text, within=30,
                       what="serve to start")
        run_ids = await start_runs(cli)

        async def terminator() -> None:
            rng = random.Random(7)
            for _ in range(DROPS):
                await asyncio.sleep(rng.uniform(0.2, 0.8))
                killed.append(await terminate_backends(db_url))

        async def clicker() -> None:
            """Approve every posted card until every request is decided; a click that did
            not get its 200 (or was not recorded) is simply made again later."""
            async with emulator.client(f"http://127.0.0.1:{port}/slack/events") as slack:
                while True:
                    rows = await look(db_url, lambda tx: tx.approvals.recent())
                    if len(rows) == REFUNDS and all(a.status != "pending" for a in rows):
                        return
                    for a in rows:
                        if a.status != "pending" or not a.message_ts:
                            continue
                        value = f"{a.id}:{signer.token(a.id, a.token_nonce, a.digest)}"
                        with contextlib.suppress(Exception):
                            await slack.click(cards.APPROVE, value, user_id="U_ALICE",
                                              channel_id=CHANNEL, message_ts=a.message_ts)
                    await asyncio.sleep(0.2)

        clicking = asyncio.create_task(clicker())
        await terminator()
        assert serve.proc.returncode is None, serve.text
        # what a dying connection left claimed or leased lapses with time (engine time)
        cli.advance_time(timedelta(minutes=2))

        async def all_completed() -> bool:
            runs = await look(db_url, lambda tx: tx.runs.recent(limit=100))
            return sorted(r.id for r in runs if r.status == "completed") == sorted(run_ids)
        try:
            await asyncio.wait_for(clicking, 60)
            await wait_for(all_completed, within=60, what="every run to complete")
        except (AssertionError, TimeoutError):
            await dump(db_url, serve)
            raise
        assert serve.proc.returncode is None, serve.text
        assert killed and max(killed) > 0  # the drops did hit serve's connections

        # each side effect happened exactly once. ``lookup_order`` is a read, idempotent by
        # default: a fresh call of it writes no intent, so one whose result write died with
        # its connection is simply run again under its key (invariant 5 allows it; under
        # load the drops hit that window). Every other tool here changes something.
        keys = Counter((e["tool"], e["idempotency_key"]) for e in cli.ledger_lines())
        assert all(n == 1 for (t, _), n in keys.items() if t != "lookup_order"), \
            [k for k, n in keys.items() if n > 1]
        tools = Counter(tool for tool, _ in keys)
        assert tools == {"lookup_order": REFUNDS, "issue_refund": REFUNDS,
                         "send_customer_email": REFUNDS, "tick": TICKERS * TICKS}
        # every request was approved by the clicker, once, and its call executed once
        approvals = await look(db_url, lambda tx: tx.approvals.recent())
        assert all(a.status == "approved" and a.decided_by == "U_ALICE" for a in approvals)
        audit = [json.loads(x) for x in (await run_cli(cli, "audit", "export")).splitlines()]
        for action in ("requested", "approved", "executed"):
            per = Counter(e["approval_id"] for e in audit if e["action"] == action)
            ungated = per.pop(None, 0)
            assert per == dict.fromkeys((a.id for a in approvals), 1), action
            # every ungated call (auto and notify_after) is audited as it executes, once each
            # (a read run again is audited once: with the result that was recorded)
            assert ungated == (sum(1 for t, _ in keys if t != "issue_refund")
                               if action == "executed" else 0), (action, ungated)

        # one card per request, each showing its decision, once the outbox has drained
        async def drained() -> bool:
            rows = await look(db_url, lambda tx: tx.outbox.recent())
            # a notice waits (in engine time, frozen here) for its run's thread to tell what
            # came before it: time moves on as it would
            cli.advance_time(timedelta(seconds=1))
            return all(r.status == "delivered" for r in rows)
        try:
            await wait_for(drained, within=60, what="the outbox to drain")
        except AssertionError:
            await dump(db_url, serve)
            raise
        posted = Counter(m["metadata"]["event_payload"]["approval_id"]
                         for m in card_messages(emulator))
        assert posted == dict.fromkeys((a.id for a in approvals), 1)
        assert all("Approved" in json.dumps(m) for m in card_messages(emulator))
        verify = await run_cli(cli, "audit", "verify")
        assert "audit log OK" in verify
    finally:
        if serve.proc.returncode is None:
            serve.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(Exception):
                await serve.wait(60)
        await serve.kill()
        await emulator.stop()
    assert serve.proc.returncode == 0, serve.text
