"""Run-thread bookkeeping: the claim compare-and-set, the turn order, and reply packing."""

from __future__ import annotations

from datetime import timedelta

import pytest
from approvald.bot.slack import messages
from approvald.bot.slack.mrkdwn import units
from approvald.runtime.kernel.clock import ManualClock
from approvald.store import fastsql
from approvald.store.repos import threads as threads_repo

from tests.helpers import through_sqlalchemy


async def _run(make_engine) -> str:
    outcome = await make_engine().run("demo-steps", "2", requested_by="U_DANA")
    return str(outcome.run_id)


async def test_one_claim_wins_and_an_unclean_one_is_seen_by_its_taker(make_engine, db,
                                                                      clock: ManualClock):
    run_id = await _run(make_engine)
    now = clock.now()
    lease = now + timedelta(seconds=90)
    async with db.write() as tx:
        first = await tx.threads.open(run_id, channel="C_OPS", owner="a", until=lease)
        second = await tx.threads.open(run_id, channel="C_OPS", owner="b", until=lease)
    assert first is not None and first.claimed_by == "a" and first.ts is None
    assert second is None  # the row exists: b must claim, and cannot while a holds it
    async with db.write() as tx:
        assert await tx.threads.claim(run_id, owner="b", seen_by="a", now=now,
                                      until=lease) is None
    # a dies without recording; after the lease b takes over, knowing a left it unclean
    later = lease + timedelta(seconds=1)
    async with db.write() as tx:
        assert await tx.threads.claim(run_id, owner="b", seen_by=None, now=later,
                                      until=later + timedelta(seconds=90)) is None
        taken = await tx.threads.claim(run_id, owner="b", seen_by="a", now=later,
                                       until=later + timedelta(seconds=90))
        assert taken is not None and taken.claimed_by == "b"
        # a, back from the dead, can record nothing any more
        assert not await tx.threads.finish(run_id, owner="a", now=later, ts="1.000100")
        assert await tx.threads.finish(run_id, owner="b", now=later, ts="1.000200")
    async with db.read() as tx:
        done = await tx.threads.get(run_id)
    assert done is not None and done.ts == "1.000200" and done.claimed_by is None
    assert done.claimed_until is None and done.next_attempt_at == later


async def test_the_engine_hands_a_face_its_thread_claims_not_the_database(make_engine, db,
                                                                          clock: ManualClock):
    """The thread follower's claim logic, as the runtime keeps it (runtime.threads): a thread
    seen without a row is opened already claimed; a replica that saw it claimed waits out
    the lease; taken over from a holder that left no record, the claim says it is unsure."""
    run_id = await _run(make_engine)
    a, b = make_engine(owner="a"), make_engine(owner="b")
    ttl = timedelta(seconds=90)
    [(run, seen)] = await a.threads.behind(since=clock.now() - ttl, limit=10)
    assert run.id == run_id and seen is None
    first = await a.threads.claim(run_id, seen, channel="C_OPS", ttl=ttl)
    assert first is not None and not first.unsure and first.thread.claimed_by == "a"
    assert first.lease_end == clock.now() + ttl
    assert await b.threads.claim(run_id, None, channel="C_OPS", ttl=ttl) is None
    assert await b.threads.claim(run_id, first.thread, channel="C_OPS", ttl=ttl) is None
    clock.advance(91)  # a died without recording what it posted
    taken = await b.threads.claim(run_id, first.thread, channel="C_OPS", ttl=ttl)
    assert taken is not None and taken.unsure and taken.thread.claimed_by == "b"
    assert not await a.threads.finish(run_id, {"ts": "1.000100"})  # a's lease is gone
    await b.threads.fail(run_id, retry_in=timedelta(seconds=30), unsure=False, failed=True,
                         progress={"ts": "1.000200"})
    async with db.read() as tx:
        row = await tx.threads.get(run_id)
    assert row is not None and row.ts == "1.000200" and row.failures == 1
    assert row.claimed_by is None and row.next_attempt_at == clock.now() + timedelta(seconds=30)


async def test_a_failing_thread_waits_its_backoff_then_goes_behind_the_others(make_engine, db,
                                                                            clock: ManualClock):
    engine = make_engine()
    ids = [(await engine.run("demo-steps", "1", requested_by="U_DANA")).run_id
           for _ in range(3)]
    now = clock.now()
    async with db.write() as tx:
        for rid in ids:
            assert await tx.threads.open(rid, channel="C", owner="me",
                                         until=now + timedelta(seconds=90))
        # the first failed (unsure: kept claimed_by), the others were served just now
        assert await tx.threads.fail(ids[0], owner="me", now=now,
                                     retry_at=now + timedelta(seconds=30), unsure=True)
        for rid in ids[1:]:
            assert await tx.threads.finish(rid, owner="me", now=now)

    async def order(at):
        async with db.read() as tx:
            rows = await tx.threads.behind(now=at, since=at - timedelta(hours=1), limit=10,
                                           max_reposts=1)
        return [run.id for run, _ in rows]

    assert ids[0] not in await order(now)  # backing off
    clock.advance(timedelta(seconds=35))
    async with db.write() as tx:  # one of the others is served again meanwhile
        assert await tx.threads.claim(ids[1], owner="me", seen_by=None, now=clock.now(),
                                      until=clock.now() + timedelta(seconds=90))
        assert await tx.threads.finish(ids[1], owner="me", now=clock.now())
    clock.advance(timedelta(seconds=5))
    assert await order(clock.now()) == [ids[2], ids[0], ids[1]]  # least recently served
    async with db.read() as tx:
        failed = await tx.threads.get(ids[0])
    assert failed is not None and failed.failures == 1 and failed.claimed_by == "me"
    async with db.write() as tx:  # a thread let go (its parent lost twice) is left alone
        assert await tx.threads.claim(ids[2], owner="me", seen_by=None, now=clock.now(),
                                      until=clock.now() + timedelta(seconds=90))
        assert await tx.threads.finish(ids[2], owner="me", now=clock.now(), reposts=2)
    assert ids[2] not in await order(clock.now())



@pytest.mark.parametrize("callers", [False, True])
async def test_the_followers_poll_goes_by_plan_and_reads_what_sqlalchemy_reads(
        make_engine, db, clock: ManualClock, callers: bool):
    """Every replica's follower polls ``behind``: it is a plan (no statement built, no
    SQLAlchemy execution per poll), and reads the same rows, with the same types, as
    SQLAlchemy itself: a run without a thread, one behind, one claimed, one told."""
    engine = make_engine()
    ids = [(await engine.run("demo-steps", "1", requested_by="U_DANA")).run_id
           for _ in range(4)]
    now = clock.now()
    async with db.write() as tx:
        for rid in ids[1:]:
            assert await tx.threads.open(rid, channel="C", owner="me",
                                         until=now + timedelta(seconds=90))
        assert await tx.threads.finish(ids[1], owner="me", now=now, ts="1.000100")
        assert await tx.threads.fail(ids[3], owner="me", now=now, retry_at=now,
                                     unsure=True, ts="1.000300", posted_seq=2)
    clock.advance(1)
    params = {"now": clock.now(), "since": now - timedelta(hours=1), "lim": 10,
              "max_reposts": 1}
    stmt = threads_repo._BEHIND[callers]
    async with db.write() as tx:  # inside a transaction: every plan applies
        conn = tx.threads.conn
        mine = await conn.execute(stmt, params)
        if db.fast_path:
            assert isinstance(mine, fastsql.Rows)
        theirs = await (await conn.connection()).execute(stmt, params)
        got = [dict(r._mapping) for r in mine]
        assert got == [dict(r._mapping) for r in theirs]
        assert len(got) == 3 and ids[2] not in {r["id"] for r in got}  # claimed: skipped
        behind = await tx.threads.behind(now=clock.now(), since=now - timedelta(hours=1),
                                         limit=10, max_reposts=1, callers=callers)
    assert [(run.id, t and t.ts) for run, t in behind] == [
        (r["id"], r["t_ts"]) for r in got]
    assert [run.id for run, t in behind if t is None] == [ids[0]]


async def test_a_followers_turns_go_by_plan(make_engine, db, clock: ManualClock):
    """A follower's poll, its claims (a new thread's, an existing one's) and their release
    (clean or failed) send no statement through SQLAlchemy: each is a plan."""
    run_id = await _run(make_engine)
    a = make_engine(owner="a")
    ttl = timedelta(seconds=90)
    with through_sqlalchemy(db, "run_threads") as through:
        [(_, none)] = await a.threads.behind(since=clock.now() - ttl, limit=10)
        first = await a.threads.claim(run_id, none, channel="C_OPS", ttl=ttl)
        assert first is not None and await a.threads.finish(run_id, {"ts": "1.000100"})
        [(_, row)] = await a.threads.behind(since=clock.now() - ttl, limit=10)
        again = await a.threads.claim(run_id, row, channel="C_OPS", ttl=ttl)
        assert again is not None and again.thread.ts == "1.000100"
        await a.threads.fail(run_id, retry_in=ttl, unsure=True, failed=True,
                             progress={"posted_seq": 2})
    if db.fast_path:
        assert through == []
    async with db.read() as tx:
        left = await tx.threads.get(run_id)
    assert left is not None and (left.ts, left.posted_seq, left.failures) == ("1.000100", 2, 1)
    assert left.claimed_by == "a" and left.next_attempt_at == clock.now() + ttl

def test_a_reply_holds_whole_events_and_says_how_far_it_goes() -> None:
    from approvald.bot.slack.story import Item, Line, story_reply

    def items(*groups: tuple[str, int, list[str]]) -> list[Item]:
        return [Item(src, seq, [Line(t) for t in lines]) for src, seq, lines in groups]

    groups = items(("audit", 1, ["a" * 1000]), ("audit", 2, []),
                   ("audit", 3, ["b" * 1000, "c" * 900]), ("event", 4, ["d" * 500]),
                   ("event", 5, []))
    r = story_reply("run", groups, limit=3000)
    assert (r.told_audit, r.upto, r.taken) == (3, None, 3)
    assert r.text == "\n".join(["a" * 1000, "b" * 1000, "c" * 900])
    r = story_reply("run", groups[3:], limit=3000)
    assert (r.text, r.upto, r.told_audit) == ("d" * 500, 6, None)  # rides along
    r = story_reply("run", items(("event", 7, []), ("event", 8, [""])))
    assert (r.text, r.upto) == ("", 9)
    big = story_reply("run", items(("event", 1, ["x" * 5000]), ("event", 2, ["y"])),
                      limit=3000)
    assert big.upto == 2 and units(big.text) <= 3000 and big.text.endswith("…")  # cut
    button = story_reply("run", [Item("audit", 1, [Line("ran", call="c1")])]).blocks[0]
    assert button["accessory"]["value"] == "run c1"
    assert units(messages.thread_status(["z" * 4000], limit=3000)) <= 3000
