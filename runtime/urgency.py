"""Decided runs go first: background work defers to a decision on its way to its tool.

A human who clicks Approve is waiting for the call to run. From the moment a decision is
being recorded until the resumed run starts its next tool call (or parks, or finishes),
the run is *pressing*, and this process serves it first:

* its writes (the decision, the lease, the ledger intent) are ``urgent``: where the
  store queues writers in-process, they go to the front of that queue (the store still
  gives ordinary writers a regular turn, so nothing starves);
* the resume worker starts it without waiting for a concurrency slot;
* loops that only tell people about things (the outbox drain, run threads) call
  :meth:`Urgency.settle` before each batch: it returns at once when nothing presses,
  else when the pressing runs are through or ``patience`` has passed;
* while a decision is being recorded for someone whose request is held open until it
  commits (a click is acknowledged only then), the worker starts no run, not even a
  decided one (:meth:`Urgency.answered`): a burst of clicks is answered first, and the
  runs it decided start right after, in the order they were decided.

Each mark also expires on its own (``hold``), so a run decided here but advanced by
another process cannot hold anything back for long. This is scheduling inside one
process only: nothing about correctness rests on it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Hashable


class Urgency:
    def __init__(self, *, hold: float = 5.0,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.hold = hold
        self._now = monotonic
        self._marks: dict[Hashable, float] = {}  # key -> monotonic deadline
        self._quiet = asyncio.Event()
        self._quiet.set()
        self._answers: set[Hashable] = set()  # decisions someone's open request waits on
        self._no_answers = asyncio.Event()
        self._no_answers.set()

    def begin(self, key: Hashable) -> None:
        """``key`` (a run id, or a token for a decision in progress) is pressing."""
        self._marks[key] = self._now() + self.hold
        self._quiet.clear()

    def end(self, key: Hashable) -> None:
        """``key`` is no longer pressing (ending an unknown key is fine)."""
        if self._marks.pop(key, None) is not None and not self._marks:
            self._quiet.set()
        self._answers.discard(key)
        if not self._answers:
            self._no_answers.set()

    def begin_answer(self, key: Hashable) -> None:
        """``key`` presses, and someone's request is held open until it ends."""
        self.begin(key)
        self._answers.add(key)
        self._no_answers.clear()

    async def answered(self, patience: float) -> bool:
        """Wait until no answer is being recorded, at most ``patience`` s; True if none."""
        if not self._answers:
            return True
        try:
            await asyncio.wait_for(self._no_answers.wait(), timeout=patience)
        except TimeoutError:
            return False
        return True

    def presses(self, key: Hashable) -> bool:
        """Is ``key`` pressing now?"""
        deadline = self._marks.get(key)
        return deadline is not None and deadline > self._now()

    @property
    def pressing(self) -> int:
        """How many marks are live (expired ones are dropped)."""
        now = self._now()
        expired = [k for k, deadline in self._marks.items() if deadline <= now]
        for key in expired:
            del self._marks[key]
        if expired and not self._marks:
            self._quiet.set()
        return len(self._marks)

    async def settle(self, patience: float) -> bool:
        """Wait until nothing is pressing, at most ``patience`` seconds; True if quiet.

        Waiters wake once, when the last mark ends (or expires), not at every mark.
        """
        give_up = self._now() + patience
        while self.pressing:
            now = self._now()
            if now >= give_up:
                return False
            wake = min(give_up, min(self._marks.values()))
            try:
                await asyncio.wait_for(self._quiet.wait(), timeout=max(wake - now, 0.001))
            except TimeoutError:
                pass
        return True
