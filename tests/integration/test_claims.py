"""Replicas share work instead of racing for it (issue 14).

Ready runs, outbox rows and overdue approvals are claimed: on PostgreSQL the candidates
are selected ``FOR ... SKIP LOCKED`` in the claiming transaction and then taken by the
usual compare-and-set in that same transaction. Two replicas claiming at once therefore
get disjoint sets, and one never waits for rows another holds: here replica 1 keeps its
claim transaction open while replica 2 claims, which must return the other rows at once.
On SQLite (one writer) the same claims run one after the other and are disjoint too.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import pytest
from approvald.runtime.approvals.decide import Actor
from approvald.runtime.engine import Engine, assemble
from approvald.runtime.kernel.outcomes import Paused
from approvald.runtime.runs.agent import Registry
from approvald.runtime.runs.demo import DemoLedger, refund_agent, steps_agent
from approvald.store.db import Database

from tests.conftest import SIGNER
from tests.helpers import Rows, parts, through_sqlalchemy

PROMPTLY = 5.0  # s: far more than a claim takes, far less than waiting on a lock would


@pytest.fixture
async def other(db_url: str) -> AsyncIterator[Database]:
    """A second replica: its own engine and connection pool on the same database."""
    database = Database(db_url, server_time=False)
    yield database
    await database.close()


@pytest.fixture
def make_replica(other, clock, ledger_path):  # type: ignore[no-untyped-def]
    """An engine of the second replica (same agents, clock and demo ledger)."""
    def make(owner: str) -> Engine:
        ledger = DemoLedger(str(ledger_path))
        return assemble(other, Registry([refund_agent(ledger), steps_agent(ledger)]),
                      clock=clock, owner=owner, signer=SIGNER)
    return make


async def test_outbox_claims_are_disjoint_and_do_not_wait(db, other, clock) -> None:
    now = clock.now()
    async with db.write() as tx:
        for i in range(6):
            await tx.outbox.add(kind="notice", group_key=f"g{i}", payload="{}", now=now)
        await tx.outbox.add(kind="notice", group_key="g0", payload="{}", now=now)
    until = now + timedelta(seconds=60)
    async with db.read() as tx:
        rows = await tx.outbox.recent()
    heads = {r.id for r in rows[:6]}  # the 7th row waits behind its group's head
    if db.dialect == "postgresql":
        async with db.write() as tx1:
            first = await tx1.outbox.claim_heads(owner="r1", now=now, until=until, limit=3)
            async with asyncio.timeout(PROMPTLY), other.write() as tx2:
                second = await tx2.outbox.claim_heads(owner="r2", now=now, until=until,
                                                      limit=10)
    else:
        async with db.write() as tx1:
            first = await tx1.outbox.claim_heads(owner="r1", now=now, until=until, limit=3)
        async with other.write() as tx2:
            second = await tx2.outbox.claim_heads(owner="r2", now=now, until=until, limit=10)
    mine, theirs = {r.id for r in first}, {r.id for r in second}
    assert len(mine) == 3 and mine.isdisjoint(theirs) and mine | theirs == heads
    assert all(r.attempts == 0 for r in first + second)  # as they were before the claim
    async with db.write() as tx:  # all claimed: nothing is left to take
        assert await tx.outbox.claim_heads(owner="r3", now=now, until=until, limit=10) == []
    async with db.read() as tx:
        claimed = {r.id: r.claimed_by for r in await tx.outbox.recent()}
    assert {claimed[i] for i in mine} == {"r1"} and {claimed[i] for i in theirs} == {"r2"}


async def _runs(db, clock, n: int) -> list[str]:
    now = clock.now()
    ids = [f"run{i:02d}" for i in range(n)]
    async with db.write() as tx:
        for run_id in ids:
            await tx.runs.create(run_id=run_id, agent="demo-steps", task="2",
                                 requested_by="U1", instructions_version="v1", now=now)
            clock.advance(1)  # ready runs are claimed oldest first
    return ids


async def test_ready_run_claims_are_disjoint_and_do_not_wait(db, other, clock) -> None:
    ids = await _runs(db, clock, 6)
    now = clock.now()
    async with db.write() as tx:  # run00's worker died: its lease lapsed; run01's is live
        await tx.runs.update(ids[0], lease_owner="host-z:1:zz",
                             lease_expires_at=now - timedelta(seconds=1))
        await tx.runs.update(ids[1], lease_owner="host-y:1:yy",
                             lease_expires_at=now + timedelta(seconds=30))
    until = now + timedelta(seconds=30)
    if db.dialect == "postgresql":
        async with db.write() as tx1:
            first = await tx1.runs.claim_runnable(owner="r1", now=now, until=until, limit=2)
            async with asyncio.timeout(PROMPTLY), other.write() as tx2:
                second = await tx2.runs.claim_runnable(owner="r2", now=now, until=until,
                                                       limit=10)
    else:
        async with db.write() as tx1:
            first = await tx1.runs.claim_runnable(owner="r1", now=now, until=until, limit=2)
        async with other.write() as tx2:
            second = await tx2.runs.claim_runnable(owner="r2", now=now, until=until,
                                                   limit=10)
    mine, theirs = [c.run.id for c in first], [c.run.id for c in second]
    assert mine == ids[0:3:2]  # oldest first; run01 is held by a live lease
    assert set(theirs) == set(ids[3:]) and set(mine).isdisjoint(theirs)
    # taking run00 over from its lapsed holder is reported; free runs were nobody's
    assert [(c.run.id, c.taken_from) for c in first if c.taken_over] == [(ids[0],
                                                                         "host-z:1:zz")]
    assert not any(c.taken_over for c in second)
    async with db.read() as tx:
        assert (await tx.runs.get(ids[2])).lease_owner == "r1"
        assert await tx.runs.runnable(now=now) == []  # every ready run is held now
    async with db.write() as tx:  # the claimer advances under its claim: no takeover
        got = await tx.runs.acquire_lease(ids[2], owner="r1", now=now, until=until)
        assert got is not None and not got.taken_over and got.run.lease_owner == "r1"
        assert await tx.runs.acquire_lease(ids[3], owner="r1", now=now, until=until) is None


async def _overdue(make_engine, clock, n: int):  # type: ignore[no-untyped-def]
    engine = make_engine()
    paused = []
    for i in range(n):
        p = await engine.run("demo-refund", f"Refund order A-{i}", requested_by="U_DANA")
        assert isinstance(p, Paused)
        paused.append(p)
    clock.advance(timedelta(hours=2))  # every request is past its 30 minutes
    return engine, paused


async def test_overdue_approval_claims_are_disjoint_and_skip_a_decision_in_flight(
        db, other, make_engine, clock) -> None:
    _, paused = await _overdue(make_engine, clock, 6)
    everything = {p.approval_ids[0] for p in paused}
    busy = paused[5]  # a click on this request is being recorded (run, then approval)
    now = clock.now()
    if db.dialect == "postgresql":
        async with db.write() as click, db.write() as tx1:
            await click.runs.lock(busy.run_id)
            await click.approvals.lock(busy.approval_ids[0])
            first = await tx1.approvals.claim_overdue(now=now, limit=2)
            async with asyncio.timeout(PROMPTLY), other.write() as tx2:
                second = await tx2.approvals.claim_overdue(now=now, limit=10)
        assert busy.approval_ids[0] not in first + second
        assert set(first) | set(second) == everything - {busy.approval_ids[0]}
    else:
        async with db.write() as tx1:
            first = await tx1.approvals.claim_overdue(now=now, limit=2)
            await tx1.approvals.expire_batch(first, now=now)
        async with other.write() as tx2:
            second = await tx2.approvals.claim_overdue(now=now, limit=10)
        assert set(first) | set(second) == everything
    assert len(first) == 2 and set(first).isdisjoint(second)


async def test_two_replicas_sweeping_at_once_expire_each_request_once(
        db, make_replica, make_engine, clock) -> None:
    engine, paused = await _overdue(make_engine, clock, 8)
    twin = make_replica("host-b:2:bb")
    a, b = await asyncio.gather(parts(engine).expiry.sweep(batch=3),
                                parts(twin).expiry.sweep(batch=3))
    assert set(a.expired).isdisjoint(b.expired)
    assert set(a.expired) | set(b.expired) == {p.approval_ids[0] for p in paused}
    async with db.read() as tx:
        assert [x.status for x in await tx.approvals.recent()] == ["expired"] * 8
        runs = [await tx.runs.get(p.run_id) for p in paused]
    assert {r.status for r in runs} == {"running"}  # each woken to hear of its expiry


async def test_two_workers_share_ready_runs_by_claiming_them(db, make_replica, make_engine,
                                                              clock) -> None:
    a = make_engine(owner="host-a:1:aa")
    b = make_replica("host-b:2:bb")
    runs = [await a.start_run("demo-steps", "2", requested_by="U1") for _ in range(6)]
    wa = a.worker(concurrency=2, poll_interval=3600)
    wb = b.worker(concurrency=3, poll_interval=3600)
    assert await wa.poll_once() == 2  # each takes what it can start now, no more
    assert await wb.poll_once() == 3
    assert wa.queued.isdisjoint(wb.queued) and len(wa.queued | wb.queued) == 5
    async with db.read() as tx:
        held = {r.id: r.lease_owner for r in await tx.runs.recent()}
    assert all(held[r].startswith("host-a:1:aa/") for r in wa.queued)
    assert all(held[r].startswith("host-b:2:bb/") for r in wb.queued)
    # both serve until every run is done; each advances the runs it claimed at once
    stop = asyncio.Event()
    serving = [asyncio.create_task(w.run(stop)) for w in (wa, wb)]
    try:
        async with asyncio.timeout(20):
            while True:
                async with db.read() as tx:
                    done = [(await tx.runs.get(r)).status for r in runs]
                if done == ["completed"] * 6:
                    break
                await wa.poll_once()  # the sixth run, and any slot freed since
                await asyncio.sleep(0.02)
    finally:
        stop.set()
        await asyncio.gather(*serving)


async def test_a_stopped_worker_gives_back_the_runs_it_claimed_but_did_not_start(
        db, make_engine, clock) -> None:
    a = make_engine(owner="host-a:1:aa")
    runs = [await a.start_run("demo-steps", "2", requested_by="U1") for _ in range(2)]
    w = a.worker(concurrency=2, poll_interval=3600)
    assert await w.poll_once() == 2
    stop = asyncio.Event()
    stop.set()  # stopped before it started them
    await w.run(stop)
    async with db.read() as tx:
        assert {r.id for r in await tx.runs.runnable(now=clock.now())} == set(runs)


async def test_a_run_woken_here_is_not_claimed_from_under_itself(db, make_engine,
                                                                 clock) -> None:
    a = make_engine(owner="host-a:1:aa")
    paused = await a.run("demo-refund", "Refund order A-1", requested_by="U_DANA")
    w = a.worker(concurrency=2, poll_interval=3600)
    await a.decide(paused.approval_ids[0], actor=Actor("U_ALICE", "cli"), verdict="approve")
    assert paused.run_id in w.queued  # woken by the decision
    assert await w.poll_once() == 0  # this worker's own poll leaves it to that wake-up
    stop = asyncio.Event()
    serving = asyncio.create_task(w.run(stop))
    try:
        async with asyncio.timeout(20):
            while True:
                async with db.read() as tx:
                    if (await tx.runs.get(paused.run_id)).status == "completed":
                        break
                await asyncio.sleep(0.02)
    finally:
        stop.set()
        await serving


# SQLite has one writer: a claim in progress cannot be seen, only waited for
@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_a_thread_another_replica_is_claiming_is_passed_over_not_waited_for(
        db, other, make_engine, clock) -> None:
    engine = make_engine()
    runs = [(await engine.run("demo-steps", "2", requested_by="U_DANA")).run_id
            for _ in range(2)]
    now = clock.now()
    async with db.write() as tx:  # both threads exist, posted, unclaimed, due
        for run_id in runs:
            await tx.threads.open(run_id, channel="C_OPS", owner="x", until=now)
            await tx.threads.finish(run_id, owner="x", now=now, ts="1.0001")
    until = now + timedelta(seconds=90)
    async with db.write() as tx1:
        assert await tx1.threads.claim(runs[0], owner="r1", seen_by=None, now=now,
                                       until=until) is not None
        async with asyncio.timeout(PROMPTLY), other.write() as tx2:
            assert await tx2.threads.claim(runs[0], owner="r2", seen_by=None, now=now,
                                           until=until) is None
            mine = await tx2.threads.claim(runs[1], owner="r2", seen_by=None, now=now,
                                           until=until)
    assert mine is not None and mine.claimed_by == "r2"
    async with db.read() as tx:
        assert (await tx.threads.get(runs[0])).claimed_by == "r1"


# SQLite has one writer: a decision in progress cannot be seen
@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_a_reminder_for_a_request_being_decided_is_not_waited_for(
        db, other, make_engine, clock) -> None:
    _, [paused] = await _overdue(make_engine, clock, 1)
    async with db.read() as tx:
        a = await tx.approvals.get(paused.approval_ids[0])
    async with db.write() as click:
        await click.runs.lock(paused.run_id)
        await click.approvals.lock(a.id)
        async with asyncio.timeout(PROMPTLY), other.write() as tx2:
            assert not await tx2.approvals.advance_reminder(a.id, sent=a.reminders_sent,
                                                            next_at=None)
    async with other.write() as tx2:  # once the click is over, it goes through
        assert await tx2.approvals.advance_reminder(a.id, sent=a.reminders_sent,
                                                    next_at=None)


async def test_a_decision_leases_the_run_to_its_running_worker_in_the_same_transaction(
        db, make_engine, make_replica, clock) -> None:
    a = make_engine(owner="host-a:1:aa")
    b = make_replica("host-b:2:bb")
    paused = [await a.run("demo-refund", f"Refund order A-{i}", requested_by="U_DANA")
              for i in range(2)]
    w = a.worker(concurrency=2, poll_interval=3600)
    stop = asyncio.Event()
    taken: list[tuple[str, str]] = []
    real_take = w.take
    w.take = lambda run_id, claim: taken.append((run_id, claim))  # type: ignore[method-assign]
    serving = asyncio.create_task(w.run(stop))
    try:
        await asyncio.sleep(0)  # the worker registers itself as the taker of decided runs
        assert a.takes_decided
        await a.decide(paused[0].approval_ids[0], actor=Actor("U_ALICE", "cli"),
                       verdict="approve")
        [(run_id, claim)] = taken
        async with db.read() as tx:
            run = await tx.runs.get(run_id)
        assert run_id == paused[0].run_id and run.status == "running"
        assert run.lease_owner == claim and claim.startswith("host-a:1:aa/")
        # nobody else can take it, nor is it ready to another replica's poll
        assert await b.worker(concurrency=2, poll_interval=3600).poll_once() == 0
        assert (await b.advance(run_id)).status == "running"  # Busy: it is leased
        real_take(run_id, claim)  # the worker advances it under the decision's lease
        async with asyncio.timeout(20):
            while True:
                async with db.read() as tx:
                    if (await tx.runs.get(run_id)).status == "completed":
                        break
                await asyncio.sleep(0.02)
    finally:
        stop.set()
        await serving
    assert not a.takes_decided  # a stopped worker takes no more
    # with no worker serving (the CLI, say) a decision leases nothing: any replica may
    # advance the run
    await a.decide(paused[1].approval_ids[0], actor=Actor("U_ALICE", "cli"), verdict="approve")
    async with db.read() as tx:
        run = await tx.runs.get(paused[1].run_id)
    assert run.status == "running" and run.lease_owner is None
    assert (await b.advance(paused[1].run_id)).status == "completed"


async def test_a_claim_of_the_heads_goes_by_plan(db, clock) -> None:
    # every drain round of every replica claims: by plan on both dialects, no statement
    # built or run through SQLAlchemy (on SQLite its compare-and-set took the ids read as
    # an IN list of their own, built per call). Disjoint and exact: the test above
    now = clock.now()
    async with db.write() as tx:
        for i in range(3):
            await tx.outbox.add(kind="notice", group_key=f"g{i}", payload="{}", now=now)
        await tx.outbox.add(kind="notice", group_key="g0", payload="{}", now=now)
    until = now + timedelta(seconds=60)
    with through_sqlalchemy(db, "outbox", "runs") as through:
        async with db.write() as tx:
            first = await tx.outbox.claim_heads(owner="r1", now=now, until=until, limit=2)
            second = await tx.outbox.claim_heads(owner="r2", now=now, until=until, limit=5)
            assert await tx.outbox.claim_heads(owner="r3", now=now, until=until,
                                               limit=5) == []
            assert sorted(await tx.outbox.claimers()) == ["r1", "r2"]
            assert await tx.runs.lease_owners() == []  # (with the claimers: dead ones?)
            await tx.outbox.delivered_many([(second[0].id, "ok")], owner="r2", now=now)
    if db.fast_path:  # (several parameter sets at once go through SQLAlchemy on PostgreSQL)
        assert [s for s in through if not (
            db.dialect == "postgresql" and s.startswith("UPDATE outbox SET status"))] == []
    heads = [r.id for r in await Rows(db).outbox(kind="notice")][:3]
    assert [r.id for r in first + second] == heads  # the 4th waits behind its group's head
    assert all(r.attempts == 0 and r.claimed_by is None for r in first + second)
    claimed = {r.id: (r.claimed_by, r.attempts) for r in await Rows(db).outbox(kind="notice")}
    assert [claimed[i] for i in heads] == [("r1", 1), ("r1", 1), ("r2", 1)]
    [done] = [r for r in await Rows(db).outbox(kind="notice") if r.status == "delivered"]
    assert (done.id, done.result, done.delivered_at, done.claimed_until) == (
        second[0].id, "ok", now, None)

@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_a_drain_claims_and_marks_in_one_statement_each_outside_any_transaction(
        db, make_engine, clock, monkeypatch) -> None:
    # issue 50: with three replicas each drain claims what is due when it wakes, so the
    # same rows go out in more, smaller batches than with one. A batch was BEGIN, SELECT,
    # UPDATE, COMMIT to claim and BEGIN, UPDATE, COMMIT to mark (a claim that found
    # nothing BEGIN, SELECT, COMMIT): each is one statement now, atomic on its own and
    # sent alone; the claim stays disjoint (test_outbox_claims_are_disjoint...).
    delivered: list[int] = []

    class Deliverer:
        async def deliver(self, row: Any) -> None:
            delivered.append(row.id)

    drain = make_engine().drain(Deliverer())
    assert await drain.drain_once() == 0  # (its first looks up dead claimers: not counted)
    now = clock.now()
    async with db.write() as tx:
        for i in range(3):
            await tx.outbox.add(kind="notice", group_key=f"g{i}", payload="{}", now=now)
    sent: list[str] = []

    def counting(cls: Any, name: str, sql_of: Any) -> None:
        real = getattr(cls, name)

        async def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            sent.append(" ".join(sql_of(self, args).split()))
            return await real(self, *args, **kwargs)

        monkeypatch.setattr(cls, name, call)

    for name in ("fetch", "fetchrow", "fetchval", "executemany"):
        counting(asyncpg.prepared_stmt.PreparedStatement, name, lambda s, a: s._query)
    for name in ("execute", "executemany", "fetch", "fetchrow", "fetchval"):
        counting(asyncpg.connection.Connection, name, lambda s, a: a[0])
    assert await drain.drain_once() == 3
    monkeypatch.undo()
    assert sorted(delivered) == [r.id for r in await Rows(db).outbox(kind="notice")]
    assert {r.status for r in await Rows(db).outbox(kind="notice")} == {"delivered"}
    # the claim of three, their mark, the claim that found nothing left: nothing else
    assert [s.split()[0] for s in sent] == ["WITH", "UPDATE", "WITH"], sent


async def test_a_dead_claimers_heads_are_claimed_again_before_their_claim_lapses(
        db, clock) -> None:
    # the claim's stale-owner path, in the one statement PostgreSQL now sends for it too
    now = clock.now()
    async with db.write() as tx:
        await tx.outbox.add(kind="notice", group_key="g", payload="{}", now=now)
    until = now + timedelta(seconds=60)
    async with db.write() as tx:
        [row] = await tx.outbox.claim_heads(owner="dead", now=now, until=until, limit=5)
    async with db.write() as tx:  # a live claimer's claim holds until it lapses
        assert await tx.outbox.claim_heads(owner="r2", now=now, until=until, limit=5) == []
    async with db.write() as tx:
        [again] = await tx.outbox.claim_heads(owner="r2", now=now, until=until, limit=5,
                                              stale_owners=["dead"])
    assert (again.id, again.attempts) == (row.id, 1)  # as it was before this claim
    [after] = await Rows(db).outbox(kind="notice")
    assert (after.claimed_by, after.attempts) == ("r2", 2)
