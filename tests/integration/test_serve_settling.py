"""What ``serve``'s first requests build to keep (statements, compiled plans, prepared
statements) leaves the cyclic collector's sight too (issue 50): the first full collections
after start-up each freeze what they left alive, a bounded number of times. Every full
collection walked those objects again, a stall of the event loop each, the open loop's
p99. The collector is switched off around each step, so only the test's own
``gc.collect()`` runs (each a full collection)."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator
from pathlib import Path

import pytest
from approvald.bot.config import Settings
from approvald.bot.serve import GC_YOUNG, SETTLE_AGAIN, Service, Settling, _run, settle_heap
from approvald.store.db import Database


@pytest.fixture
def quiet_collector() -> Iterator[None]:
    """No automatic collection meanwhile, nothing frozen before or after."""
    assert gc.get_freeze_count() == 0
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.unfreeze()


def tracked(obj: object) -> bool:
    """Whether the collector walks ``obj`` (frozen objects are not among its generations)."""
    return any(o is obj for o in gc.get_objects())


def test_the_first_full_collections_freeze_what_they_left_then_no_more(
        quiet_collector: None) -> None:
    settling = Settling(times=2)
    settling.install()
    try:
        # start-up's heap, as settle_heap leaves it: whatever this process holds (a test
        # worker's middle generation can hold more than SETTLE_LEAST) out of the count
        gc.freeze()
        cache = [[n] for n in range(100)]  # what a first request built, to keep
        gc.collect(0)  # not a full collection: nothing frozen
        assert tracked(cache) and settling.left == 2
        gc.collect()
        assert not tracked(cache) and not any(tracked(x) for x in cache[:3])
        assert settling.left == 1
        second = [[1]]
        gc.collect()
        assert not tracked(second) and settling.left == 0
        later = [[2]]  # after the bound: collected as before, never frozen
        gc.collect()
        assert tracked(later)
    finally:
        settling.remove()
    assert settling._collected not in gc.callbacks


def test_after_them_a_full_collection_that_left_many_freezes_them_a_bounded_number_of_times(
        quiet_collector: None) -> None:
    """What lives long built again after the first freezes (a statement shape met later,
    a larger batch's statement): a full collection that leaves at least ``least`` objects
    in the oldest generation freezes them too, ``more`` times at most; one that leaves
    fewer (what is in flight) does not."""
    settling = Settling(times=0, more=2, least=1000)
    settling.install()
    try:
        gc.freeze()  # start-up's heap, as settle_heap leaves it
        few = [[n] for n in range(100)]
        gc.collect()
        assert tracked(few) and settling.more == 2  # fewer than least: collected as before
        many = [[n] for n in range(1000)]  # with the few, at least 1,000
        gc.collect()
        assert not tracked(many) and not tracked(few) and settling.more == 1
        again = [[n] for n in range(1200)]
        gc.collect()
        assert not tracked(again) and settling.more == 0
        later = [[n] for n in range(1200)]  # after the bound: never frozen
        gc.collect()
        assert tracked(later) and settling.more == 0
    finally:
        settling.remove()


def test_a_young_collection_that_left_many_in_the_middle_generation_freezes_them(
        quiet_collector: None) -> None:
    """At GC_YOUNG = 10,000 the middle generation is collected every ~100,000 allocations:
    what the first minutes of traffic built to keep (the group commit's statements of each
    batch size met) piled up there, and the first middle collection walked it all, 40-52
    ms of the event loop in one step (the hook's open-loop p99 in bench_fleet, issue 50).
    A young collection that leaves at least ``least`` objects in the middle generation
    freezes them, as a full one does in the oldest; a middle one, what it left in the
    oldest; within the same bound ``more``."""
    settling = Settling(times=3, more=2, least=1000)
    settling.install()
    try:
        gc.freeze()  # start-up's heap, as settle_heap leaves it
        few = [[n] for n in range(100)]  # what is in flight
        gc.collect(0)
        assert tracked(few) and settling.more == 2
        many = [[n] for n in range(1000)]  # with the few, at least 1,000
        gc.collect(0)
        assert not tracked(many) and not tracked(few) and settling.more == 1
        assert settling.left == 3  # the full collections' own freezes still to come
        again = [[n] for n in range(1200)]
        gc.collect(0)  # 1,200 left in the middle generation: frozen
        assert not tracked(again) and settling.more == 0
        later = [[n] for n in range(1200)]  # after the bound: never frozen by a young one
        gc.collect(0)
        gc.collect(1)
        assert tracked(later) and settling.more == 0
    finally:
        settling.remove()


def test_a_middle_collection_that_left_many_in_the_oldest_generation_freezes_them(
        quiet_collector: None) -> None:
    settling = Settling(times=3, more=1, least=1000)
    settling.install()
    try:
        gc.freeze()
        settling.least = 10**9  # the young collection freezes nothing
        built = [[n] for n in range(1000)]
        gc.collect(0)
        assert tracked(built) and settling.more == 1
        settling.least = 1000
        gc.collect(1)  # into the oldest generation: at least 1,000 there
        assert not tracked(built) and settling.more == 0 and settling.left == 3
    finally:
        settling.remove()


async def test_serve_settles_its_heap_again_while_it_runs_and_stops_after(
        sqlite_url: str, tmp_path: Path, quiet_collector: None) -> None:
    db = Database(sqlite_url)
    settings = Settings(APPROVALD_DATABASE_URL=sqlite_url, APPROVALD_POLL_INTERVAL="600",
                        APPROVALD_DEMO_LEDGER=str(tmp_path / "ledger.jsonl"))
    service = Service(settings, db)
    before = list(gc.callbacks)
    running = asyncio.create_task(_run(service))
    try:
        for _ in range(3000):  # until start-up is over (its heap frozen)
            if gc.get_freeze_count() or running.done():
                break
            await asyncio.sleep(0.01)
        [settling] = [cb.__self__ for cb in gc.callbacks
                      if isinstance(getattr(cb, "__self__", None), Settling)]
        assert settling.left == SETTLE_AGAIN
        built = [[n] for n in range(100)]  # the first requests' statements and plans
        gc.collect()
        assert not tracked(built)
        service.stop_event.set()
        assert await asyncio.wait_for(running, 30) is None
        assert gc.callbacks == before  # stopped: nothing left behind
    finally:
        service.stop_event.set()
        await db.close()


def test_settling_the_heap_sets_the_young_generation_s_threshold_alone() -> None:
    """The young generation is collected every GC_YOUNG allocations from start-up on;
    the older generations keep their thresholds."""
    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 11, 12)
        settle_heap()
        assert gc.get_threshold() == (GC_YOUNG, 11, 12) and GC_YOUNG > 700
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
