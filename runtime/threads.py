"""Each run's thread in chat, as the runtime keeps it for a face: who tells it, how far.

A face that tells runs in threads (Slack's thread follower) owns this state, and reaches it
through :class:`RunThreads` only, never through the database: which threads lag behind, a
turn's claim (a compare-and-set on the thread's row that gives one replica a lease), what
the turn told when it is released, and a failed turn's backoff. The claim logic lives here:
a thread seen without a row is opened already claimed; one seen with a row is claimed only
if nobody took it since; a claim taken over from a holder that left ``claimed_by`` set is
*unsure* (the last holder may have posted more than it recorded).

:func:`place` says where a line about a run goes so that it reads in order after what the
thread tells (see :class:`Place`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from approvald.runtime.kernel.clock import Clock
from approvald.runtime.kernel.owners import Owners
from approvald.store.db import Database
from approvald.store.records import RunRecord
from approvald.store.repos import Tx
from approvald.store.repos.threads import EXTERNAL, ThreadRecord

MAX_REPOSTS = 1  # a deleted thread parent is posted again once; then the thread is let go
# how far behind the clock a run's write may commit: a transaction that read the time, then
# waited (for SQLite's write lock, at most its busy timeout of 10 s; for a row lock on
# PostgreSQL), then committed, shows a time older than its commit by that much
COMMIT_MARGIN = timedelta(minutes=5)
STALE_CHECK = 2.0  # s between look-ups of dead owners, whose claims are taken at once


@dataclass(frozen=True)
class Claim:
    """A thread claimed for one turn: the row as claimed, until when, and whether something
    may be in chat that the row does not show (``unsure``)."""

    thread: ThreadRecord
    lease_end: datetime
    unsure: bool


@dataclass(frozen=True)
class Place:
    """Where a line about a run goes: the thread (``channel``, ``ts``), the face's ops
    channel (``channel`` None), or nowhere yet (``wait``: the thread has not told what came
    before the line; try again shortly)."""

    channel: str | None = None
    ts: str | None = None
    wait: bool = False


OPS = Place()
WAIT = Place(wait=True)


class RunThreads:
    """The run threads' rows, for the face that tells them (its narrow part of the store)."""

    def __init__(self, db: Database, clock: Clock, owners: Owners) -> None:
        self._db = db
        self._clock = clock
        self._owners = owners  # a dead process's claims are taken over at once
        self._owner = owners.owner
        self._stale: tuple[str, ...] = ()  # dead owners, as the last :meth:`behind` found
        # per poll (``callers``): the ``since`` it was given and how far that has moved on
        self._marks: dict[bool, tuple[datetime, datetime]] = {}

    async def behind(self, *, since: datetime, limit: int, callers: bool = False
                     ) -> list[tuple[RunRecord, ThreadRecord | None]]:
        """Runs whose thread has something untold, least recently served first (see
        :meth:`store.repos.threads.ThreadsRepo.behind`); runs without a thread only from
        ``since`` on, a mark this poll moves forward as it finds them threaded.

        A run needs a thread from the commit that made it (or, a caller's request, the
        commit that asked a person) until one is opened for it: a condition on two tables,
        which no index of either can hold, so the read of such runs goes by time. It read
        every run updated since the follower began, a read that grew with the process's
        uptime; now it starts at a mark, moved after each read that was not cut short by
        ``limit`` to the earlier of: the oldest run it found still without a thread (one
        skipped, paced or whose claim failed is read again), and the time before the read
        less :data:`COMMIT_MARGIN` (a write whose time is older than that, still
        uncommitted as this read began, is the one case it could pass over).

        A thread claimed by a process on this host that is gone is behind at once, not
        only when its claim lapses (:meth:`runtime.kernel.owners.Owners.stale`).
        """
        given, mark = self._marks.get(callers, (since, since))
        if given != since:  # (a mark holds for the ``since`` it started from)
            mark = since
        stale = self._stale = await self._owners.stale(within=STALE_CHECK)
        now = self._clock.now()
        async with self._db.read() as tx:
            rows = await tx.threads.behind(now=now, since=mark, limit=limit,
                                           max_reposts=MAX_REPOSTS, callers=callers,
                                           stale_owners=stale)
        if len(rows) < limit:  # every run without a thread from ``mark`` on is in ``rows``
            # (a caller's request, found by its requests' time and not its run's: no
            # further while it waits for its thread)
            held = [mark if run.agent.startswith(EXTERNAL) else run.updated_at
                    for run, seen in rows if seen is None]
            self._marks[callers] = since, max(mark, min([now - COMMIT_MARGIN, *held]))
        return rows

    async def claim(self, run_id: str, seen: ThreadRecord | None, *, channel: str,
                    ttl: timedelta) -> Claim | None:
        """Take run ``run_id``'s thread for a turn of at most ``ttl`` (None: another
        replica has it). ``seen``: the row as :meth:`behind` found it (None: no thread yet,
        opened in ``channel`` already claimed, before its parent exists). A claim of a
        process found gone (as :meth:`behind` last looked) is taken at once, unsure."""
        now = self._clock.now()
        until = now + ttl
        async with self._db.write() as tx:
            if seen is None:
                claimed = await tx.threads.open(run_id, channel=channel, owner=self._owner,
                                                until=until)
            else:
                claimed = await tx.threads.claim(run_id, owner=self._owner, now=now,
                                                 until=until, seen_by=seen.claimed_by,
                                                 stale_owners=self._stale)
        if claimed is None:
            return None
        # claimed_by left set: the last holder may have posted more than it recorded
        return Claim(claimed, lease_end=until,
                     unsure=seen is not None and seen.claimed_by is not None)

    async def finish(self, run_id: str, progress: Mapping[str, Any]) -> bool:
        """Release the claim, recording what the turn told; False if the claim lapsed."""
        async with self._db.write() as tx:
            return await tx.threads.finish(run_id, owner=self._owner, now=self._clock.now(),
                                           **progress)

    async def fail(self, run_id: str, *, retry_in: timedelta, unsure: bool, failed: bool,
                   progress: Mapping[str, Any]) -> None:
        """Release the claim after a failed turn: no turn again for ``retry_in``
        (``failed`` False: a wait, not a failure; the failure count is left alone)."""
        now = self._clock.now()
        async with self._db.write() as tx:
            await tx.threads.fail(run_id, owner=self._owner, now=now, retry_at=now + retry_in,
                                  unsure=unsure, failed=failed, **progress)


async def place(tx: Tx, run_id: str, thread: ThreadRecord | None, seq: Any, *,
                call_id: str | None = None) -> Place:
    """Where a line about run ``run_id`` goes (``thread``: its row, read in ``tx``).

    The run's thread is told by the face's thread follower from the run's events; a line
    delivered there waits until the thread has told the events before ``seq`` (the run's
    next seq when the line was written) and, for ``call_id``, that call's result, so lines
    appear in the order things happened. A line from before ``seq`` was recorded goes where
    the thread is now, and so does a line whose thread is failing (order cannot be kept
    there; the line is not held back for it); a run whose thread was let go gets its lines
    in the ops channel.
    """
    if thread is not None and thread.reposts > MAX_REPOSTS:
        return OPS
    if not isinstance(seq, int) or (thread is not None and thread.failures > 0):
        if thread is not None and thread.ts:
            return Place(thread.channel, thread.ts)
        return OPS
    if thread is None or thread.ts is None or thread.posted_seq < seq:
        return WAIT
    if call_id is not None:
        run = await tx.runs.get(run_id)
        if run is not None and run.next_seq <= seq:
            return WAIT  # the call's step is not recorded yet
        for ev in await tx.events.load(run_id, since=max(seq, thread.posted_seq)):
            body = json.loads(ev.body)
            if body.get("role") == "tool" and body.get("call_id") == call_id:
                return WAIT  # its result is not told yet
    return Place(thread.channel, thread.ts)
