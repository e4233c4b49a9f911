"""The resume worker: advances runs that are ready, in whichever process is alive.

A run is ready when its status is ``running`` and no live worker holds its lease: just
started, just decided, or abandoned by a dead process. Runs decided in this process are
picked up at once (:meth:`wake`); everything else is found by polling the database, so
any replica resumes any run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

from runtime.periodic import repeat

if TYPE_CHECKING:
    from runtime.engine import Engine

log = logging.getLogger("approvald.worker")
ANSWER_PATIENCE = 0.25  # s a woken run waits, at most, for clicks being answered


class ResumeWorker:
    def __init__(self, engine: Engine, *, concurrency: int = 8, poll_interval: float = 2.0) -> None:
        self.e = engine
        self.concurrency = concurrency
        self.poll_interval = poll_interval
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._queued: set[str] = set()  # a run waits in the queue at most once
        self._active: dict[str, asyncio.Task[None]] = {}
        self._slots = asyncio.Semaphore(concurrency)
        self._stop = asyncio.Event()
        self._stale: tuple[str, ...] = ()
        engine.on_ready(self.wake)

    def wake(self, run_id: str) -> None:
        if run_id not in self._queued and run_id not in self._active:
            self._queued.add(run_id)
            self._queue.put_nowait(run_id)

    async def poll_once(self) -> int:
        """Queue every ready run not already being advanced here; returns how many."""
        stale = tuple(await self.e.stale_owners())
        async with self.e.db.read() as tx:
            runs = await tx.runs.runnable(now=self.e.clock.now(), limit=100, stale_owners=stale)
        fresh = [r.id for r in runs if r.id not in self._active and r.id not in self._queued]
        for run_id in fresh:
            self.wake(run_id)
        self._stale = stale
        return len(fresh)

    async def _advance(self, run_id: str, slot: bool) -> None:
        try:
            # dead owners as of the last poll: a woken run needs none, a polled one may
            outcome = await self.e.advance(run_id, stop=self._stop, stale_owners=self._stale)
            log.info("run %s: %s", run_id, outcome.status)
        except Exception:
            log.exception("run %s: advancing failed; it stays resumable", run_id)
        finally:
            self._active.pop(run_id, None)
            if slot:
                self._slots.release()

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set, then let in-flight runs reach a step boundary."""
        poller = asyncio.create_task(self._poll(stop))
        try:
            while not stop.is_set():
                getter = asyncio.create_task(self._queue.get())
                stopper = asyncio.create_task(stop.wait())
                done, _ = await asyncio.wait({getter, stopper},
                                             return_when=asyncio.FIRST_COMPLETED)
                for t in (getter, stopper):
                    if t not in done:
                        t.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await t
                if getter not in done:
                    break
                run_id = getter.result()
                # clicks being answered go first; the runs they decide start right after
                await self.e.urgency.answered(ANSWER_PATIENCE)
                self._queued.discard(run_id)
                if run_id in self._active:
                    continue
                # a run a human just decided does not queue behind background runs
                slot = not self.e.urgency.presses(run_id)
                if slot:
                    await self._slots.acquire()
                self._active[run_id] = asyncio.create_task(self._advance(run_id, slot))
        finally:
            self._stop.set()  # in-flight runs stop at their next step boundary
            poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await poller
            if self._active:
                running = sorted(self._active)
                try:
                    await asyncio.gather(*self._active.values(), return_exceptions=True)
                except asyncio.CancelledError:  # the caller's grace ran out: they are cut off
                    log.warning("stopped mid-step: run(s) %s (a tool call cut off here is "
                                "outcome unknown to the next process)", ", ".join(running))
                    raise

    async def _poll(self, stop: asyncio.Event) -> None:
        await repeat(self.poll_once, stop=stop, every=self.poll_interval,
                     what="polling for ready runs")
