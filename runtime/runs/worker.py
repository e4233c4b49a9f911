"""The resume worker: advances runs that are ready, in whichever process is alive.

A run is ready when its status is ``running`` and no live worker holds its lease: just
started, just decided, or abandoned by a dead process. Runs decided in this process are
picked up at once (:meth:`wake`); everything else is found by polling the database, so
any replica resumes any run.

A poll claims what it finds (``RunsRepo.claim_runnable``): it takes the leases of as many
ready runs as this worker has free slots, passing over runs another replica is claiming at
that moment, and advances each under the lease id it claimed it with (``claim``). A run
claimed here is not ready to anyone else, so replicas share the ready runs instead of each
queueing all of them and racing for every lease; what this worker has no room for stays
in the database for whichever replica has room first. Leases taken this way, like those
taken by ``acquire_lease``, are still the compare-and-set that decides who advances a run.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
from collections.abc import Awaitable
from datetime import timedelta
from typing import Protocol

from approvald.runtime.kernel.clock import Clock
from approvald.runtime.kernel.ids import lease_id
from approvald.runtime.kernel.metrics import Meter
from approvald.runtime.kernel.outcomes import Outcome
from approvald.runtime.kernel.owners import Owners
from approvald.runtime.kernel.periodic import repeat
from approvald.runtime.kernel.signals import Signals
from approvald.runtime.kernel.urgency import Urgency
from approvald.store.db import Database

log = logging.getLogger("approvald.worker")
STALE_CHECK = 2.0  # s between lookups of dead processes' leases (a lapsed lease needs none)
ANSWER_PATIENCE = 0.25  # s a woken run waits, at most, for clicks being answered
_STOP = "\x00stop"  # what the queue yields once the worker is told to stop (no run id)


class Advance(Protocol):
    """Drive one run until it pauses or ends (:meth:`runtime.runs.runner.Runner.advance`)."""

    def __call__(self, run_id: str, *, stop: asyncio.Event | None = None,
                 stale_owners: tuple[str, ...] = (),
                 claim: str | None = None) -> Awaitable[Outcome]: ...


class ResumeWorker:
    """Advances runs that can go on: woken here (a decision, a new run), or found by a poll
    of the database (another process decided them, or their worker died)."""

    def __init__(self, db: Database, clock: Clock, owners: Owners, signals: Signals,
                 urgency: Urgency, meter: Meter, advance: Advance, *, lease_ttl: timedelta,
                 concurrency: int = 8, poll_interval: float = 2.0) -> None:
        self.db = db
        self.clock = clock
        self.owners = owners
        self.signals = signals
        self.urgency = urgency
        self.meter = meter
        self.advance = advance  # the runner's: drive one run (under a claim, maybe)
        self.lease_ttl = lease_ttl
        self.concurrency = concurrency
        self.poll_interval = poll_interval
        # runs to advance, the pressing first (runtime/kernel/urgency.py): by when their
        # person began waiting, oldest first; then the others, in the order they came
        self._queue: asyncio.PriorityQueue[tuple[float, int, str]] = asyncio.PriorityQueue()
        self._order = itertools.count()  # ties keep their arrival order
        self._queued: set[str] = set()  # a run waits in the queue at most once
        self._active: dict[str, asyncio.Task[None]] = {}
        self._slots = asyncio.Semaphore(concurrency)
        self._stop = asyncio.Event()
        self._stale: tuple[str, ...] = ()  # dead owners as of the last poll
        self._claims: dict[str, str] = {}  # queued run -> the lease id a poll claimed it with
        self._more = asyncio.Event()  # poll again: a run ended after a poll that filled up
        self._full = False  # the last poll had no room for every ready run, maybe
        self._chores: set[asyncio.Task[None]] = set()
        signals.on_ready(self.wake)

    @property
    def queued(self) -> frozenset[str]:
        """Runs waiting here to be advanced (woken here, or claimed by a poll)."""
        return frozenset(self._queued)

    def wake(self, run_id: str) -> None:
        if run_id not in self._queued and run_id not in self._active:
            self._queued.add(run_id)
            since = self.urgency.since(run_id)
            self._queue.put_nowait((math.inf if since is None else since, next(self._order),
                                    run_id))

    def take(self, run_id: str, claim: str) -> None:
        """A decision in this process made ``run_id`` ready and leased it under ``claim``
        in its own transaction: advance it under that lease, with no claim of our own."""
        if run_id in self._active or self._claims.get(run_id, claim) != claim:
            # an attempt here is still winding down (or holds another claim): give the
            # lease back, and the next poll (woken now) takes the run
            task = asyncio.get_running_loop().create_task(self._hand_back(run_id, claim))
            self._chores.add(task)
            task.add_done_callback(self._chores.discard)
            return
        self._claims[run_id] = claim
        self.wake(run_id)

    async def _hand_back(self, run_id: str, claim: str) -> None:
        await self._give_back({run_id: claim})
        self._more.set()

    async def poll_once(self) -> int:
        """Claim as many ready runs as there are free slots and queue them; returns how
        many were claimed (see the module docstring)."""
        room = self.concurrency - len(self._active) - len(self._queued)
        self._full = room <= 0
        if room <= 0 or self._stop.is_set():
            return 0  # (no query: a busy worker is polled again each time a run ends)
        # only takeovers need them: not afresh each poll (one look-up serves the drain too)
        stale = self._stale = await self.owners.stale(within=STALE_CHECK)
        owner = lease_id(self.owners.owner)  # this claim's
        now = self.clock.now()
        mine = [*self._active, *self._queued]  # being advanced here, or about to be
        async with self.db.write() as tx:
            claimed = await tx.runs.claim_runnable(owner=owner, now=now, limit=room,
                                                   until=now + self.lease_ttl,
                                                   stale_owners=stale, exclude=mine)
        self._full = len(claimed) >= room
        if taken := sum(c.taken_over for c in claimed):
            self.meter.lease_taken_over(taken)
        for c in claimed:
            if c.run.id in self._active:  # started here meanwhile, under a lease id of its own
                await self._give_back({c.run.id: owner})
                self._full = True  # poll again once that attempt is over
                continue
            self._claims[c.run.id] = owner  # a woken run already queued goes with it too
            self.wake(c.run.id)
        return len(claimed)

    async def _give_back(self, claims: dict[str, str]) -> None:
        """Release leases claimed here for runs that will not be advanced here."""
        if not claims:
            return
        try:
            async with self.db.write() as tx:
                for run_id, owner in claims.items():
                    await tx.runs.release_lease(run_id, owner=owner)
        except Exception:
            log.warning("could not give back claimed run(s) %s; their leases lapse in %s",
                        ", ".join(sorted(claims)), self.lease_ttl, exc_info=True)

    async def _advance(self, run_id: str, slot: bool, claim: str | None) -> None:
        try:
            # dead owners as of the last poll: a woken run needs none, a polled one may
            outcome = await self.advance(run_id, stop=self._stop, stale_owners=self._stale,
                                           claim=claim)
            log.info("run %s: %s", run_id, outcome.status)
        except Exception:
            log.exception("run %s: advancing failed; it stays resumable", run_id)
        finally:
            self._active.pop(run_id, None)
            if slot:
                self._slots.release()
            if self._full:  # room again, and more may be ready: no need to wait a period
                self._more.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set, then let in-flight runs reach a step boundary.
        While it serves, runs decided in this process are leased to it by the decision."""
        poller = asyncio.create_task(self._poll(stop))
        # one task for the whole serve, not two per run (issue 50): ``stop`` puts
        # :data:`_STOP` in the queue, so the loop waits on the queue alone
        stopper = asyncio.create_task(self._stop_queue(stop))
        self.signals.take_decided(self.take)
        try:
            while not stop.is_set():
                _, _, run_id = await self._queue.get()
                if run_id is _STOP:  # (one left by an earlier serve of this worker: not ours)
                    if stop.is_set():
                        break
                    continue
                # clicks being answered go first, unless this run's approver clicked
                # before them (runtime/kernel/urgency.py); background runs wait for them all
                await self.urgency.answered(ANSWER_PATIENCE, before=self.urgency.since(run_id))
                if run_id in self._active:
                    self._queued.discard(run_id)
                    await self._give_back(_pop(self._claims, run_id))
                    continue
                # a run a human just decided does not queue behind background runs
                slot = not self.urgency.presses(run_id)
                if slot:
                    await self._slots.acquire()
                # queued until now: a poll meanwhile leaves it alone (it would claim it and
                # queue it again, to be advanced twice), a wake is not queued twice
                self._queued.discard(run_id)
                claim = self._claims.pop(run_id, None)
                self._active[run_id] = asyncio.create_task(self._advance(run_id, slot, claim))
        finally:
            self.signals.take_decided(None)
            self._stop.set()  # in-flight runs stop at their next step boundary
            for task in (poller, stopper):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            # claimed but never started: other replicas need not wait for the leases to lapse
            unstarted, self._claims = self._claims, {}
            await self._give_back(unstarted)
            if self._active:
                running = sorted(self._active)
                try:
                    await asyncio.gather(*self._active.values(), return_exceptions=True)
                except asyncio.CancelledError:  # the caller's grace ran out: they are cut off
                    log.warning("stopped mid-step: run(s) %s (a tool call cut off here is "
                                "outcome unknown to the next process)", ", ".join(running))
                    raise

    async def _stop_queue(self, stop: asyncio.Event) -> None:
        """Wake :meth:`run`'s wait on the queue once ``stop`` is set."""
        await stop.wait()
        self._queue.put_nowait((-math.inf, next(self._order), _STOP))

    async def _poll(self, stop: asyncio.Event) -> None:
        await repeat(self.poll_once, stop=stop, every=self.poll_interval,
                     what="polling for ready runs", wake=self._more, pace=self.owners.pace)


def _pop(claims: dict[str, str], run_id: str) -> dict[str, str]:
    owner = claims.pop(run_id, None)
    return {} if owner is None else {run_id: owner}
