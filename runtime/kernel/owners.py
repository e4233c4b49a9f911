"""Who this process is (its owner id, the prefix of its leases and claims) and which other
owners on this host are gone (their leases and claims may be taken over at once)."""

from __future__ import annotations

from approvald.runtime.kernel.ids import owner_is_dead, worker_id
from approvald.store.db import Database


class Owners:
    def __init__(self, db: Database, owner: str | None = None) -> None:
        self.db = db
        self.owner = owner or worker_id()

    async def stale(self) -> list[str]:
        """Lease and claim holders that ran on this host and whose process is gone."""
        async with self.db.read() as tx:
            owners = set(await tx.runs.lease_owners()) | set(await tx.outbox.claimers())
        return sorted(o for o in owners
                      if not o.startswith(self.owner) and owner_is_dead(o))
