"""Three ``serve`` replicas on one PostgreSQL database (issue 14).

100 waiting ``demo-refund`` runs. Each of the first 70 gets a signed Approve click sent
to all three replicas at once; after the first 35 the clock jumps past the requests'
expiry as the other 35 clicks go out, and every replica sweeps five times a second (late
clicks race the sweeps for the same rows): each request ends approved or expired, never
both; exactly the approved ones refund, once; one card each; every run completes. Then
one replica is SIGKILLed in the middle of a second burst: the other two finish its runs
(its leases lapse on the database's clock), each refund still once.
"""

from __future__ import annotations

import asyncio
import json
import signal
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest
from approvald.bot.config import Settings
from approvald.bot.slack import cards
from approvald.bot.wiring import build_engine, open_database
from approvald.runtime.kernel import collect

from tests.acceptance.test_ack_durability import _pause_refunds
from tests.acceptance.test_slack_serve import (
    card_messages,
    free_port,
    serve_trouble,
    setup,
    start_serve,
    stop_all,
)
from tests.helpers import START, Rows
from tests.integration.slack_harness import CHANNEL, wait_for

RUNS, CLICKED = 100, 70


# processes, browsers or hundreds of schedules: out of the inner loop (-m 'not slow')
pytestmark = pytest.mark.slow

async def _start_while_serving(settings: Settings, n: int) -> list[tuple[str, str]]:
    """Start ``n`` refunds for the replicas to advance; (approval id, Approve value) of
    each once it is waiting (whichever replica took it)."""
    db = await open_database(settings, quiet=True)
    engine = build_engine(settings, db)
    try:
        run_ids = [await engine.start_run("demo-refund", f"Refund order B-{i}",
                                          requested_by="U_DANA") for i in range(n)]

        async def waiting() -> list[tuple[str, str]] | None:
            async def cards_of(tx):  # type: ignore[no-untyped-def]
                out = []
                for run_id in run_ids:
                    pending = [a for a in await tx.approvals.for_run(run_id)
                               if a.status == "pending"]
                    if not pending:
                        return None
                    a = pending[0]
                    out.append((a.id, cards.button_value(a.id, engine.button_token(a))))
                return out

            return await Rows(db).in_one_read(cards_of)  # type: ignore[no-any-return]
        return list(await wait_for(waiting, within=60, what="the new runs to wait"))
    finally:
        await engine.aclose()
        await db.close()


async def _rows(settings: Settings, ids: list[str]) -> dict[str, tuple[str, str]]:
    """approval id -> (approval status, its run's status)."""
    db = await open_database(settings, quiet=True)
    try:
        async def statuses(tx):  # type: ignore[no-untyped-def]
            out = {}
            for aid in ids:
                a = await tx.approvals.get(aid)
                run = await tx.runs.get(a.run_id)
                out[aid] = (a.status, run.status)
            return out

        return dict(await Rows(db).in_one_read(statuses))
    finally:
        await db.close()


async def _audit_actions(settings: Settings) -> Counter[tuple[str | None, str]]:
    db = await open_database(settings, quiet=True)
    try:
        async def actions(tx):  # type: ignore[no-untyped-def]
            return Counter([(e.approval_id, e.action) async for e in tx.audit.iterate()])

        return Counter(await Rows(db).in_one_read(actions))
    finally:
        await db.close()


async def _lapsed(settings: Settings) -> set[str]:
    """Approvals decided in time whose run resumed only after the request's window had
    closed (the clock jumped 31 minutes between the click and the resume): by the one
    window rule (runtime.kernel.collect) their calls did not run, and the audit says so."""
    db = await open_database(settings, quiet=True)
    try:
        async def lapsed(tx):  # type: ignore[no-untyped-def]
            return {e.approval_id async for e in tx.audit.iterate()
                    if e.action == "refused" and e.actor == collect.ACTOR
                    and e.approval_id is not None
                    and json.loads(e.details).get("reason") == collect.REASON}

        return set(await Rows(db).in_one_read(lapsed))
    finally:
        await db.close()


# replicas on several hosts share one PostgreSQL database
@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_three_replicas_race_clicks_and_expiry_and_survive_losing_one(
        db_url: str, tmp_path: Path) -> None:
    emulator, cli = await setup(tmp_path, db_url)
    settings = Settings(**{k: v for k, v in cli.env().items()
                           if k.startswith(("APPROVALD_", "SLACK_"))})
    procs: list[asyncio.subprocess.Process] = []
    try:
        buttons = await _pause_refunds(settings, RUNS)
        ids = [aid for aid, _ in buttons]
        ports = [free_port() for _ in range(3)]
        for port in ports:
            procs.append(await start_serve(cli, port, APPROVALD_SWEEP_INTERVAL="0.2",
                                           APPROVALD_LEASE_TTL="3"))
        clients = [emulator.client(f"http://127.0.0.1:{p}/slack/events") for p in ports]
        slacks = [await c.__aenter__() for c in clients]
        try:
            async def click_everywhere(value: str) -> None:
                got = await asyncio.gather(*(s.click(cards.APPROVE, value, user_id="U_ALICE",
                                                     channel_id=CHANNEL) for s in slacks))
                assert all(r.status == 200 for r in got), [r.status for r in got]

            half = CLICKED // 2
            await asyncio.gather(*(click_everywhere(v) for _, v in buttons[:half]))

            async def expire_now() -> None:  # lands among the second wave's clicks
                await asyncio.sleep(0.005)
                cli.set_time(START + timedelta(minutes=31))  # past every request's expiry
            await asyncio.gather(expire_now(),
                                 *(click_everywhere(v) for _, v in buttons[half:CLICKED]))

            async def settled() -> bool:
                rows = await _rows(settings, ids)
                return all(a in ("approved", "expired") and r == "completed"
                           for a, r in rows.values())
            try:
                await wait_for(settled, within=120, what="every request settled, every run done")
            except AssertionError as timed_out:
                stuck = Counter(v for v in (await _rows(settings, ids)).values()
                                if v[0] not in ("approved", "expired") or v[1] != "completed")
                raise AssertionError(f"not settled (approval, run status): {dict(stuck)}; "
                                     f"the replicas said:\n{serve_trouble(cli)}") from timed_out
            rows = await _rows(settings, ids)
            approved = {aid for aid, (a, _) in rows.items() if a == "approved"}
            assert set(ids[:half]) <= approved <= set(ids[:CLICKED])  # nothing unclicked
            refunds = Counter(line["idempotency_key"] for line in cli.ledger_lines()
                              if line["tool"] == "issue_refund")
            assert all(n == 1 for n in refunds.values()), refunds
            db = await open_database(settings, quiet=True)
            try:
                async def refunded_ids(tx):  # type: ignore[no-untyped-def]
                    return {a.id for a in [await tx.approvals.get(i) for i in ids]
                            if f"{a.run_id}:{a.call_id}" in refunds}

                refunded = await Rows(db).in_one_read(refunded_ids)
            finally:
                await db.close()
            lapsed = await _lapsed(settings)
            print(f"\nfirst burst: {len(approved)} approved ({len(lapsed)} of them resumed "
                  f"past the window), {RUNS - len(approved)} expired "
                  f"({CLICKED} clicked, each at all three replicas)")
            assert lapsed <= approved and not lapsed & refunded  # a lapsed call never ran
            # approved ones ran once (unless the clock closed their window before a replica
            # resumed them: then they never ran, audited); expired ones never
            assert refunded == approved - lapsed
            actions = await _audit_actions(settings)
            for aid in ids:
                ends = actions[(aid, "approved")] + actions[(aid, "expired")]
                assert ends == 1, (aid, ends)
            cards_of = Counter(m["metadata"]["event_payload"]["approval_id"]
                               for m in card_messages(emulator))
            assert all(cards_of[aid] == 1 for aid in ids), "a card was posted twice or never"

            # a second burst; one replica dies in the middle of it
            more = await _start_while_serving(settings, 30)
            ten_answered = asyncio.Event()
            answered = 0

            async def click_round_robin(i: int, value: str) -> None:
                nonlocal answered
                for k in range(3):  # a click to a dead replica goes to the next one
                    target = (i + k) % 3
                    if procs[target].returncode is not None:
                        continue
                    try:
                        r = await slacks[target].click(cards.APPROVE, value,
                                                       user_id="U_ALICE", channel_id=CHANNEL)
                    except Exception:
                        continue
                    if r.status == 200:
                        answered += 1
                        if answered >= 10:
                            ten_answered.set()
                        return

            async def kill_midway() -> None:
                await ten_answered.wait()
                procs[0].send_signal(signal.SIGKILL)
                await procs[0].wait()

            await asyncio.gather(kill_midway(),
                                 *(click_round_robin(i, v) for i, (_, v) in enumerate(more)))
            assert procs[0].returncode == -signal.SIGKILL
            later = [aid for aid, _ in more]

            async def done() -> bool:
                return all(r == "completed" for _, r in (await _rows(settings, later)).values())
            await wait_for(done, within=120, what="the survivors to finish the dead one's runs")
            assert all(a == "approved" for a, _ in (await _rows(settings, later)).values())
            refunds = Counter(line["idempotency_key"] for line in cli.ledger_lines()
                              if line["tool"] == "issue_refund")
            assert all(n == 1 for n in refunds.values()), refunds
            assert len(refunds) == len(refunded) + len(more)
        finally:
            for c in clients:
                await c.__aexit__(None, None, None)
    finally:
        await stop_all(procs, emulator)
