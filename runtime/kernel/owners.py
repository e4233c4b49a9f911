"""Who this process is (its owner id, the prefix of its leases and claims) and which other
owners on this host are gone (their leases and claims may be taken over at once)."""

from __future__ import annotations

import time
from collections.abc import Callable

from approvald.runtime.kernel.ids import owner_is_dead, worker_id
from approvald.runtime.kernel.periodic import Pace
from approvald.store.db import Database


class Owners:
    def __init__(self, db: Database, owner: str | None = None, *,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.db = db
        self.owner = owner or worker_id()
        # this process's pace of periodic work: led or following (runtime.kernel.periodic)
        self.pace = Pace()
        self._monotonic = monotonic
        self._seen: tuple[float, tuple[str, ...]] | None = None  # the last look-up, when

    async def stale(self, *, within: float = 0.0) -> tuple[str, ...]:
        """Lease and claim holders (runs' leases, outbox and run-thread claims) that ran on
        this host and whose process is gone.

        ``within``: the answer of a look-up made at most that many seconds ago will do.
        The worker's poll, the outbox drain and the run threads' follower all want them
        (only takeovers need them, so not afresh each round): one look-up serves them all
        (issue 50: each did its own, two reads of every lease and claim holder per
        look-up, in every replica)."""
        now = self._monotonic()
        if self._seen is not None and within > 0 and now - self._seen[0] <= within:
            return self._seen[1]
        async with self.db.read() as tx:
            owners = {*await tx.runs.lease_owners(), *await tx.outbox.claimers(),
                      *await tx.threads.claimers()}
        found = tuple(sorted(o for o in owners
                             if not o.startswith(self.owner) and owner_is_dead(o)))
        self._seen = (now, found)
        return found
