"""Decided runs go first: background work defers to a decision on its way to its tool.

A human who clicks Approve is waiting for the call to run. From the moment a decision is
being recorded until the resumed run starts its next tool call (or parks, or finishes),
the run is *pressing*, and this process serves it first:

* its writes (the decision, the lease, the ledger intent) are made inside
  :meth:`Urgency.waits`, a context (:mod:`store.waiting`) holding the monotonic time its
  person began waiting (``since``: the click's, which the run it decides inherits), set
  here and where a decided run goes on, never passed to the code that decides or
  executes; where
  the store queues writers in-process they go ahead of ordinary ones, whoever has waited
  longest first (the store still gives ordinary writers a regular turn, so nothing
  starves). A decision's request is held open until it commits, so it ranks
  ``answer_lead`` earlier than its age: a person watching a spinner goes ahead of calls
  about to start for people who clicked a little earlier, never ahead of those who have
  waited longer than that. In a burst of clicks each approver's call starts about as long
  after their click as everyone else's, instead of the first clicks' calls waiting
  for every later click to be answered;
* the resume worker starts it without waiting for a concurrency slot;
* loops that only tell people about things (the outbox drain, run threads) call
  :meth:`Urgency.settle` before each batch: it returns at once when nothing presses,
  else when the pressing runs are through or ``patience`` has passed (the drain counts
  it from when its rows were announced, and queues its writes a bounded ``lag`` behind
  that: a card is for the person who clicked, too);
* while a decision is being recorded for someone whose request is held open, the worker
  starts no run whose person began waiting later than that decision ranks
  (:meth:`Urgency.answered`); background runs wait for every such decision.

Each mark also expires on its own (``hold``), so a run decided here but advanced by
another process cannot hold anything back for long. This is scheduling inside one
process only: nothing about correctness rests on it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Hashable
from contextlib import AbstractContextManager

from approvald.runtime.kernel.periodic import waited
from approvald.store import waiting

ANSWER_LEAD = 0.04  # s: how much sooner than its age an answer is served


class Urgency:
    def __init__(self, *, hold: float = 5.0, answer_lead: float = ANSWER_LEAD,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.hold = hold
        self.answer_lead = answer_lead
        self._now = monotonic
        self._marks: dict[Hashable, float] = {}  # key -> monotonic deadline
        self._since: dict[Hashable, float] = {}  # key -> when its person began waiting
        self._quiet = asyncio.Event()
        self._quiet.set()
        self._answers: dict[Hashable, float] = {}  # decisions someone's open request waits on
        self._answer_ended = asyncio.Event()  # replaced by a fresh one at each answer's end

    def now(self) -> float:
        """This process's monotonic clock, as the marks read it (what a writer someone
        waits on from now passes as ``since``)."""
        return self._now()

    # ``with urgency.waits(since)``: inside, the writes this task makes are for someone who
    # has waited since ``since`` (None: nobody); the store queues them by it
    # (:mod:`store.waiting`; its block itself, no call of this class's in between)
    waits: Callable[[float | None], AbstractContextManager[None]] = \
        staticmethod(waiting.waiting)

    def begin(self, key: Hashable, *, since: float | None = None) -> float:
        """``key`` (a run id, or a token for a decision in progress) is pressing for
        someone who has waited since ``since`` (monotonic; now if not given: a run a
        decision made ready inherits the click's). Returns ``since``."""
        now = self._now()
        self._marks[key] = now + self.hold
        self._since[key] = now if since is None else since
        self._quiet.clear()
        return self._since[key]

    def end(self, key: Hashable) -> None:
        """``key`` is no longer pressing (ending an unknown key is fine)."""
        self._since.pop(key, None)
        if self._marks.pop(key, None) is not None and not self._marks:
            self._quiet.set()
        if self._answers.pop(key, None) is not None:
            self._answer_ended.set()
            self._answer_ended = asyncio.Event()

    def begin_answer(self, key: Hashable) -> tuple[float, float]:
        """``key`` presses, and someone's request is held open until it ends. Returns
        when that person began waiting (now: what the run it decides inherits), and the
        rank its writes queue by: ``answer_lead`` earlier, so a person watching a
        spinner goes ahead of calls about to start for people who clicked a little
        earlier, but not of those who have waited longer than that."""
        since = self.begin(key)
        self._answers[key] = rank = since - self.answer_lead
        return since, rank

    async def answered(self, patience: float, *, before: float | None = None) -> bool:
        """Wait until no answer is being recorded for anyone who began waiting earlier
        than ``before`` (for anyone at all if None), at most ``patience`` s; True if none.

        A run decided by an earlier click does not wait for later clicks' answers: the
        person who has waited longest goes first."""
        give_up = self._now() + patience
        # the earliest answer alone decides (one C call, not a generator over every
        # answer in progress: a burst of clicks has ~concurrency of them; issue 50)
        while self._answers and (before is None or min(self._answers.values()) < before):
            left = give_up - self._now()
            if left <= 0:
                return False
            if not await waited(self._answer_ended, left):
                return False
        return True

    def presses(self, key: Hashable) -> bool:
        """Is ``key`` pressing now?"""
        return self.since(key) is not None

    def since(self, key: Hashable) -> float | None:
        """When the person ``key`` presses for began waiting (monotonic), if it presses
        now; what the store's write queue orders pressing writers by, oldest first."""
        deadline = self._marks.get(key)
        return self._since.get(key) if deadline is not None and deadline > self._now() else None

    @property
    def pressing(self) -> int:
        """How many marks are live (expired ones are dropped)."""
        now = self._now()
        expired = [k for k, deadline in self._marks.items() if deadline <= now]
        for key in expired:
            del self._marks[key]
            self._since.pop(key, None)
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
            await waited(self._quiet, max(wake - now, 0.001))
        return True
