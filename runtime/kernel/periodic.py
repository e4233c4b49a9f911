"""The one background-loop shape: do the work, then wait for a wake-up, a timeout or stop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger("approvald")
# how many times slower a replica polls while another one leads (issue 50)
FOLLOWING = 5.0


class Pace:
    """How often this process does the periodic work every replica on one database also
    does (polls for ready runs, for due outbox rows, for run threads behind): at the
    rate it was given while it leads, :data:`FOLLOWING` times slower while another
    replica is known to lead (``store.wakeups``: it holds the database's lock on the
    lead). Three replicas then poll about as often as 1.4 would, not as three (issue 50),
    and a replica that follows still polls: should the leader stall without losing its
    lock, nothing waits for more than its slower period. Wake-ups are not paced: a
    replica acts on those at once, leading or not. Leads until told otherwise (one
    process alone, SQLite, a lost connection to the lock: the rate it was given).

    Some work is the fleet's, not a process's: a channel's run threads, paced at a post
    a second. It is the lead's alone (``ThreadFollower.run``); each replica pacing a
    channel on its own told the runs lagging a burst once per replica, in more, smaller
    turns (issue 50)."""

    __slots__ = ("leading",)

    def __init__(self) -> None:
        self.leading = True

    def lead(self, leading: bool) -> None:
        self.leading = leading

    def every(self, seconds: float) -> float:
        return seconds if self.leading else seconds * FOLLOWING


async def repeat(work: Callable[[], Awaitable[object]], *, stop: asyncio.Event, every: float,
                 what: str, wake: asyncio.Event | None = None, settle: float = 0.0,
                 pace: Pace | None = None) -> None:
    """Call ``work`` until ``stop`` is set: every ``every`` seconds (slower while another
    replica leads, with ``pace``), and at once when ``wake`` is set (after ``settle``
    seconds, so a burst is handled as one batch).

    A failure is logged and retried on the next round; it never ends the loop. A wake-up
    that arrives while ``work`` runs is kept, so nothing waits a whole period for it.

    Each round waits on one event under a timeout, no task of its own (issue 50: a round
    per click's run and card): ``stop`` rings ``wake`` too, from one task for the loop.
    """
    bell = stop if wake is None else wake
    ringer = None if wake is None else asyncio.create_task(_ring(stop, wake))
    try:
        while not stop.is_set():
            if wake is not None:
                wake.clear()
            try:
                await work()
            except Exception:
                log.exception("%s failed; retrying", what)
            if stop.is_set():
                break
            await waited(bell, every if pace is None else pace.every(every))
            if wake is not None and wake.is_set() and settle and not stop.is_set():
                await waited(stop, settle)
    finally:
        if ringer is not None:
            ringer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ringer


async def waited(event: asyncio.Event, patience: float) -> bool:
    """Wait until ``event`` is set, at most ``patience`` seconds; True if it was. No task
    is made for it (``asyncio.wait_for`` makes one per wait on Python 3.11)."""
    if event.is_set():
        return True
    try:
        async with asyncio.timeout(patience):
            await event.wait()
    except TimeoutError:
        return False
    return True


async def _ring(stop: asyncio.Event, wake: asyncio.Event) -> None:
    await stop.wait()
    wake.set()
