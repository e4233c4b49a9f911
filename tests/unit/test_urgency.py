"""Decided runs go first: the urgency marks, the SQLite write queue (oldest waiter first),
the worker."""

from __future__ import annotations

import asyncio

from approvald.runtime.approvals.decide import Actor
from approvald.runtime.kernel.urgency import Urgency
from approvald.runtime.models.scripted import ScriptedModel, reply
from approvald.runtime.policies.tools import ToolContext, tool
from approvald.runtime.record.outbox import DrainConfig
from approvald.runtime.runs.agent import Agent
from approvald.store.db import Database, WriteLock
from approvald.store.waiting import waiting

from tests.helpers import Rows, parts

ALICE = Actor("U_ALICE", "slack")


class Ticks:
    """An injected monotonic clock."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


async def test_settle_is_immediate_when_nothing_presses() -> None:
    u = Urgency()
    assert u.pressing == 0
    assert await u.settle(60) is True


async def test_settle_returns_when_the_last_mark_ends() -> None:
    u = Urgency()
    u.begin("run-a")
    u.begin("run-b")
    waiter = asyncio.create_task(u.settle(60))
    await asyncio.sleep(0)
    u.end("run-a")
    await asyncio.sleep(0)
    assert not waiter.done()  # run-b still presses
    u.end("run-b")
    assert await asyncio.wait_for(waiter, 5) is True
    u.end("never-begun")  # harmless


async def test_patience_bounds_the_wait_and_marks_expire_on_their_own() -> None:
    ticks = Ticks()
    u = Urgency(hold=5.0, monotonic=ticks)
    u.begin("run-a")
    assert u.presses("run-a") and u.pressing == 1
    assert await u.settle(0) is False  # out of patience: go ahead anyway
    ticks.t += 5.0  # decided here, advanced elsewhere: the mark must not hold forever
    assert not u.presses("run-a")
    assert u.pressing == 0
    assert await u.settle(60) is True


async def hand_over_order(lock: WriteLock, writers: list[tuple[str, float | None]]) -> list[str]:
    """Queue ``writers`` (name, since: when its person began waiting, None for an
    ordinary writer) behind a held ``lock``, in list order; the order they got it."""
    await lock.acquire()
    order: list[str] = []

    async def writer(name: str, since: float | None) -> None:
        await lock.acquire(since=since)
        order.append(name)
        lock.release()

    tasks = []
    for name, since in writers:
        tasks.append(asyncio.create_task(writer(name, since)))
        await asyncio.sleep(0)  # queued in list order
    lock.release()
    await asyncio.gather(*tasks)
    return order


async def test_write_lock_serves_pressing_waiters_first_oldest_first() -> None:
    """Writers someone waits on go ahead of ordinary ones, whoever has waited longest
    first, not in the order they queued; one person's writes (equal ``since``) and
    ordinary writers keep their queue order."""
    order = await hand_over_order(WriteLock(), [
        ("slow-1", None), ("slow-2", None), ("click-late", 12.0), ("click-early", 10.0),
        ("run-early-lease", 10.0), ("click-middle", 11.0)])
    assert order == ["click-early", "run-early-lease", "click-middle", "click-late",
                     "slow-1", "slow-2"]


async def test_a_burst_of_clicks_starts_each_call_in_click_order() -> None:
    """The order that bounds the last approver's wait: a run decided by an early click
    (its writes inherit the click's time) goes ahead of the decisions of clicks that
    came well after it, but a decision is served ``answer_lead`` ahead of its age."""
    ticks = Ticks()
    u = Urgency(answer_lead=0.04, monotonic=ticks)
    first, first_rank = u.begin_answer("click-1")
    u.end("click-1")
    u.begin("run-1", since=first)  # the decision committed: its run inherits the click
    ticks.t += 0.01
    _, soon_rank = u.begin_answer("click-2")  # 10 ms later: answered first
    ticks.t += 0.05
    _, late_rank = u.begin_answer("click-3")  # 60 ms later: the run goes first
    run_since = u.since("run-1")
    assert run_since == first and first_rank == first - 0.04
    order = await hand_over_order(WriteLock(), [
        ("click-3", late_rank), ("intent-1", run_since), ("click-2", soon_rank)])
    assert order == ["click-2", "intent-1", "click-3"]


async def test_a_woken_run_waits_only_for_answers_to_people_who_waited_longer() -> None:
    ticks = Ticks()
    u = Urgency(answer_lead=0.04, monotonic=ticks)
    u.begin("run-1", since=ticks.t)  # decided by a click at t
    ticks.t += 0.1
    u.begin_answer("click-2")  # a click 100 ms later: ranks at t + 60 ms
    # the run does not wait for it (it waited longer); a background run does
    assert await u.answered(60, before=u.since("run-1")) is True
    assert await u.answered(0.01) is False
    waiter = asyncio.create_task(u.answered(60, before=ticks.t))  # a run of a click just now
    await asyncio.sleep(0)
    assert not waiter.done()
    u.end("click-2")
    assert await asyncio.wait_for(waiter, 5) is True


async def test_a_woken_run_waits_for_clicks_being_answered_within_patience() -> None:
    u = Urgency()
    assert await u.answered(0.0) is True  # nothing being answered: no wait at all
    u.begin_answer("click")
    assert u.presses("click")
    assert await u.answered(0.01) is False  # patience is bounded
    waiter = asyncio.create_task(u.answered(60))
    await asyncio.sleep(0)
    assert not waiter.done()
    u.end("click")
    assert await asyncio.wait_for(waiter, 5) is True
    assert u.pressing == 0


async def test_write_lock_never_starves_ordinary_writers() -> None:
    """A stream of pressing writes (a burst of clicks) still lets a lease renewal or a
    result write through after ``streak`` hand-overs ahead of it."""
    order = await hand_over_order(WriteLock(streak=2), [("renew", None)] + [
        (f"click-{i}", float(i)) for i in range(1, 6)])
    assert order == ["click-1", "click-2", "renew", "click-3", "click-4", "click-5"]


async def test_write_lock_skips_cancelled_waiters_and_frees_when_idle() -> None:
    lock = WriteLock()
    await lock.acquire()
    gone = asyncio.create_task(lock.acquire(since=1.0))
    stays = asyncio.create_task(lock.acquire())
    await asyncio.sleep(0)
    gone.cancel()
    await asyncio.sleep(0)
    lock.release()  # goes past the cancelled waiter
    await asyncio.wait_for(stays, 5)
    lock.release()
    await asyncio.wait_for(lock.acquire(), 1)  # free again: no one is left holding it
    lock.release()


async def test_a_pressing_sqlite_write_commits_ahead_of_queued_writes(sqlite_url) -> None:
    db = Database(sqlite_url)
    order: list[str] = []

    async def write(name: str, since: float | None) -> None:
        with waiting(since):  # where the person waits: the store reads it from the context
            async with db.write() as tx:
                await (await tx.conn.connection()).exec_driver_sql("SELECT 1")
                order.append(name)

    try:
        async with db.write():
            tasks = [asyncio.create_task(write("background", None)),
                     asyncio.create_task(write("click", 1.0))]
            for _ in range(3):
                await asyncio.sleep(0)  # both are queued behind the open transaction
        await asyncio.gather(*tasks)
    finally:
        await db.close()
    assert order == ["click", "background"]


async def test_a_decided_run_does_not_wait_for_a_worker_slot(make_engine) -> None:
    """concurrency=1 and the slot is held by a run whose tool hangs: a run a human just
    approved still starts its call, instead of queueing behind background work."""
    release = asyncio.Event()
    started: list[str] = []
    crawling, deploying = asyncio.Event(), asyncio.Event()

    @tool(permission="read")
    async def crawl(ctx: ToolContext, site: str) -> str:
        """A long background call."""
        started.append(f"crawl {site}")
        crawling.set()
        await release.wait()
        return "crawled"

    @tool(permission="execute")
    async def deploy(ctx: ToolContext, service: str) -> str:
        """Deploy (gated)."""
        started.append(f"deploy {service}")
        deploying.set()
        return "deployed"

    crawler = Agent(name="crawler", instructions="", tools=[crawl], model=ScriptedModel.sequence(
        [reply("crawling", ("crawl", {"site": "a"})), reply("done", turn=1)]))
    deployer = Agent(name="deployer", instructions="", tools=[deploy],
                     model=ScriptedModel.sequence(
                         [reply("deploying", ("deploy", {"service": "web"})),
                          reply("done", turn=1)]))
    engine = make_engine(agents=[crawler, deployer])
    paused = await engine.run("deployer", "deploy web", requested_by="U_DANA")
    worker = engine.worker(concurrency=1, poll_interval=3600)
    stop = asyncio.Event()
    serving = asyncio.create_task(worker.run(stop))
    try:
        background = await engine.start_run("crawler", "crawl a", requested_by="U_DANA")
        worker.wake(background)
        await asyncio.wait_for(crawling.wait(), 10)
        assert started == ["crawl a"]  # the only slot is now held
        await engine.decide(paused.approval_ids[0], actor=ALICE, verdict="approve")
        # without the bypass this times out: the only slot stays held until release
        await asyncio.wait_for(deploying.wait(), 10)
        assert started == ["crawl a", "deploy web"]
        assert parts(engine).urgency.pressing == 0  # the mark ended when the call started
    finally:
        release.set()
        stop.set()
        await asyncio.wait_for(serving, 10)


async def test_outbox_batches_shrink_while_a_decision_presses(make_engine, db) -> None:
    """With a decided run pressing, the drain sends small batches (and once it is quiet,
    full ones); every row is still delivered exactly once."""
    ticks = Ticks()
    engine = make_engine(urgency=Urgency(monotonic=ticks))
    for i in range(5):
        await engine.run("demo-refund", f"Refund order A-100{i}", requested_by="U_DANA")
    batches: list[int] = []

    class Counting:
        inflight = 0

        async def deliver(self, row):  # type: ignore[no-untyped-def]
            Counting.inflight += 1
            batches.append(Counting.inflight)
            await asyncio.sleep(0)
            Counting.inflight -= 1
            return {"ok": True}

    parts(engine).urgency.begin("someone's run")
    drain = engine.drain(Counting(), DrainConfig(patience=0, busy_batch=2))
    assert await drain.drain_once() == 5
    assert max(batches) == 2
    for i in range(5, 10):
        await engine.run("demo-refund", f"Refund order A-100{i}", requested_by="U_DANA")
    batches.clear()
    parts(engine).urgency.end("someone's run")
    assert await drain.drain_once() == 5
    assert max(batches) == 5


async def test_a_decided_run_presses_since_its_click(make_engine) -> None:
    """The run a decision makes ready inherits when its decider began waiting, so its
    lease and intent writes queue by the click, not by when the worker got to them."""
    ticks = Ticks()
    engine = make_engine(urgency=Urgency(monotonic=ticks))
    paused = await engine.run("demo-refund", "Refund order A-1001", requested_by="U_DANA")
    clicked = ticks.t
    decision = await engine.decide(paused.approval_ids[0], actor=ALICE, verdict="approve")
    ticks.t += 0.5  # the worker gets to it later
    assert decision.run_ready
    assert parts(engine).urgency.since(decision.approval.run_id) == clicked
    await engine.advance(decision.approval.run_id)
    assert parts(engine).urgency.since(decision.approval.run_id) is None


async def test_priority_is_the_contexts_and_no_decider_or_executor_passes_it() -> None:
    """Scheduling priority lives in one place (issue 47): the code that decides and
    executes, and the store's writer, take no ``since``/``trace`` parameter; the context
    set where a person waits is what the writer reads."""
    import inspect

    from approvald.runtime.approvals.decide import Decider
    from approvald.runtime.record.ledger import Ledger
    from approvald.store import waiting as ctx

    for fn in (Decider.decide, Ledger.execute, Database.write, Database.transact):
        assert not {"since", "trace"} & set(inspect.signature(fn).parameters), fn
    assert ctx.since() is None
    with waiting(3.0):
        assert ctx.since() == 3.0
        with waiting(None):  # a block for nobody inside one for someone
            assert ctx.since() is None
        assert ctx.since() == 3.0
    assert ctx.since() is None


async def test_a_decisions_writes_queue_by_the_deciders_rank(make_engine, db,
                                                             monkeypatch) -> None:
    """A click's decision is written at its rank (its person's wait, less the lead an open
    request gets), and the resumed run's lease and intent at the click's time; the writes
    of a run nobody waits on are ordinary. Read where the store queues them."""
    ticks = Ticks()
    engine = make_engine(urgency=Urgency(monotonic=ticks))
    paused = await engine.run("demo-refund", "Refund order A-1001", requested_by="U_DANA")
    seen: list[float | None] = []
    real = WriteLock.acquire

    async def acquire(self: WriteLock, *, since: float | None = None) -> None:
        seen.append(since)
        await real(self, since=since)

    monkeypatch.setattr(WriteLock, "acquire", acquire)
    if db.dialect != "sqlite":  # PostgreSQL has no in-process write queue
        return
    await engine.decide(paused.approval_ids[0], actor=ALICE, verdict="approve")
    rank = ticks.t - parts(engine).urgency.answer_lead
    assert seen and set(seen) == {rank}  # the decision's transaction (and nothing else)
    seen.clear()
    await engine.advance(paused.run_id)
    # the lease and the call's intent: the click's time, which the run inherited; once
    # its call started (its checkpoint, its card's redraw) nobody waits on its writes
    assert seen[:2] == [ticks.t, ticks.t] and set(seen[2:]) == {None}, seen
    assert parts(engine).urgency.pressing == 0


class Delivered:
    async def deliver(self, row):  # type: ignore[no-untyped-def]
        return {"ok": True}


async def test_the_drains_writes_queue_by_when_its_rows_were_announced(make_engine, db,
                                                                       monkeypatch) -> None:
    """In a burst of clicks the ordinary write line holds every run's later steps: a card
    queued there trailed the burst by seconds (issue 50). The drain's claim and marks
    queue ``lag`` after the wake-up that announced their rows, behind everyone who
    clicked before that and ahead of the rest; a batch nobody announced ranks from now."""
    ticks = Ticks()
    engine = make_engine(urgency=Urgency(monotonic=ticks))
    await engine.run("demo-refund", "Refund order A-1001", requested_by="U_DANA")
    drain = engine.drain(Delivered(), DrainConfig(patience=0, lag=0.1))
    seen: list[float | None] = []
    real = WriteLock.acquire

    async def acquire(self: WriteLock, *, since: float | None = None) -> None:
        seen.append(since)
        await real(self, since=since)

    monkeypatch.setattr(WriteLock, "acquire", acquire)
    announced = ticks.t
    drain.wake()
    drain.wake()  # a second announcement does not make the first one younger
    ticks.t += 0.5  # the drain gets to the rows later
    assert await drain.drain_once() == 1
    if db.dialect != "sqlite":  # PostgreSQL has no in-process write queue
        return
    # the claim and the mark at the announcement's rank, and so the look for what the
    # delivered rows freed in their groups (theirs too)
    assert seen == [announced + 0.1] * 3, seen
    seen.clear()
    assert await drain.drain_once() == 0  # a look nobody announced: from now
    assert seen == [ticks.t + 0.1], seen


async def test_rows_announced_longer_ago_than_patience_go_while_a_decision_presses(
        make_engine) -> None:
    """Patience counts from the announcement, not from each batch: under a stream of
    clicks something always presses, and a drain that waited its patience before every
    batch kept cards back for the whole burst."""
    ticks = Ticks()
    engine = make_engine(urgency=Urgency(monotonic=ticks))
    for i in range(3):
        await engine.run("demo-refund", f"Refund order A-100{i}", requested_by="U_DANA")
    urgency = parts(engine).urgency
    urgency.begin("someone's run")
    pressed: list[bool] = []

    class Telling:
        async def deliver(self, row):  # type: ignore[no-untyped-def]
            pressed.append(urgency.presses("someone's run"))
            if len(pressed) == 3:
                urgency.end("someone's run")  # a look for more rows nobody announced waits
            return {"ok": True}

    drain = engine.drain(Telling(), DrainConfig(patience=0.2, busy_batch=2))
    drain.wake()
    ticks.t += 0.2  # as long as its patience since the rows were announced: no more waiting
    # the batch, and the one after it that takes what the full batch left, both at once
    assert await asyncio.wait_for(drain.drain_once(), 5) == 3
    assert pressed == [True] * 3


async def test_the_worker_waits_for_its_next_run_without_a_task_per_run(make_engine) -> None:
    """Between runs the worker waits on its queue, which stopping wakes with a sentinel:
    it makes a task per run only to advance it, not two more to wait for it (a getter
    and a stopper, each cancelled after; issue 50: about 15 tasks were made per click)."""
    import sys

    engine = make_engine()
    paused = [await engine.run("demo-refund", f"Refund order A-100{i}", requested_by="U_DANA")
              for i in range(3)]
    worker = engine.worker(poll_interval=3600)
    loop = asyncio.get_running_loop()
    real = loop.create_task
    made: list[str] = []

    def spy(coro, **kw):  # type: ignore[no-untyped-def]
        f = sys._getframe(1)
        while f is not None and "asyncio" in f.f_code.co_filename:
            f = f.f_back  # type: ignore[assignment]
        if f is not None and f.f_code.co_qualname == "ResumeWorker.run":
            made.append(coro.__qualname__)
        return real(coro, **kw)

    stop = asyncio.Event()
    loop.create_task = spy  # type: ignore[method-assign]
    try:
        serving = asyncio.create_task(worker.run(stop))
        # the worker serving (it takes decided runs) before the clicks: a click before it
        # is announced instead, and under load the worker's first poll could claim that
        # run too, an extra attempt that finds it leased (test_worker_handover.py)
        for _ in range(100):
            if parts(engine).signals.takes_decided:
                break
            await asyncio.sleep(0)
        assert parts(engine).signals.takes_decided
        for p in paused:
            await engine.decide(p.approval_ids[0], actor=ALICE, verdict="approve")
        for _ in range(1000):
            runs = [await Rows.of(engine).run(p.run_id) for p in paused]
            if all(r is not None and r.status == "completed" for r in runs):
                break
            await asyncio.sleep(0.01)
        else:
            raise AssertionError("the runs did not complete")
        stop.set()
        await asyncio.wait_for(serving, 10)
    finally:
        del loop.create_task
    assert sorted(made) == sorted(["ResumeWorker._poll", "ResumeWorker._stop_queue",
                                   *["ResumeWorker._advance"] * 3]), made


async def test_rows_nobody_announced_defer_again_after_the_announced_batch(make_engine,
                                                                          monkeypatch) -> None:
    """What a batch leaves (a full batch) or frees in its groups is its work for one more
    batch, at once; after that, rows nobody announced (a poll's, a backlog's) count from
    now again, so a stream of them keeps deferring to decided runs rather than running
    flat out past everyone's clicks."""
    ticks = Ticks()
    engine = make_engine(urgency=Urgency(monotonic=ticks))
    for i in range(5):
        await engine.run("demo-refund", f"Refund order A-100{i}", requested_by="U_DANA")
    urgency = parts(engine).urgency
    asked: list[float] = []

    async def settle(patience: float) -> bool:
        asked.append(round(patience, 6))
        return False  # something presses throughout

    monkeypatch.setattr(urgency, "settle", settle)
    drain = engine.drain(Delivered(), DrainConfig(patience=0.2, busy_batch=2))
    drain.wake()
    ticks.t += 0.2
    assert await drain.drain_once() == 5
    # announced (2 rows), what it left (2), then from now: the last row, then a last look
    assert asked == [0.0, 0.0, 0.2, 0.2], asked


async def test_a_woken_run_reads_the_earliest_answer_not_each_one() -> None:
    """Issue 50: a burst of clicks has about its concurrency of answers in progress; the
    worker asks ``answered`` before every run it starts, and the earliest answer alone
    decides (no generator stepped over every answer: its Python calls per approval grew
    with the burst)."""
    import sys
    from collections import Counter
    from types import FrameType

    ticks = Ticks()
    u = Urgency(answer_lead=0.04, monotonic=ticks)
    u.begin("run-1", since=ticks.t)
    ticks.t += 0.1
    ranks = []
    for i in range(20):
        ranks.append(u.begin_answer(f"click-{i}")[1])  # from t + 60 ms on
        ticks.t += 0.001
    earliest = ranks[0]
    seen: Counter[str] = Counter()

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event == "call":
            seen[frame.f_code.co_name] += 1

    sys.setprofile(profile)
    try:
        run_first = await u.answered(60, before=u.since("run-1"))
        at_the_rank = await u.answered(60, before=earliest)  # not earlier than it: no wait
    finally:
        sys.setprofile(None)
    assert run_first is True and at_the_rank is True
    assert seen["answered"] == 2 and seen["<genexpr>"] == 0, seen
    assert await u.answered(0.0, before=earliest + 1e-6) is False  # one ranks earlier
