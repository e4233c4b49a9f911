"""Refusals of the web review queue, audited without letting anyone grow the log at will.

Every refusal is audited as ``web_refused`` (invariant 11), but anyone on the network can
be refused as often as they can send a request, and each entry of the hash-chained log is
permanent. So a refusal is recorded by who it refused:

* **someone known** (a live session's approver, a Slack user Slack vouched for): one
  entry each, at once, with its reason and what identifies the attempt;
* **someone unknown** (no session, a forged one, a sign-in that did not get that far):
  counted, by one upsert of a row (minute, source, reason) in ``web_refusal_counts``, no
  entry and no lock on the chain's head. A minute is folded by :meth:`Refusals.fold`
  (``serve`` runs it every minute) into one entry per source, ``{"source", "minute",
  "count", "reasons": {reason: n}}``, and its rows deleted in the same transaction, so
  each count reaches the log once, whichever replica counted or folds it. The count lives
  in the database until then: a replica's crash loses none of it.

The source is the address the request came from as ``serve`` saw it (a proxy's, behind
one), an IPv6 address by its /64 (one machine has a whole /64 to send from). Nothing an
entry records is the request's to make long: a route's pattern, never its path; each
value at most :data:`LONGEST` characters.
"""

from __future__ import annotations

import ipaddress
from collections import defaultdict
from datetime import datetime, timedelta

from approvald.runtime.audit import AuditTrail, Entry
from approvald.runtime.clock import Clock
from approvald.store.db import Database
from approvald.store.repos import Tx

ANONYMOUS = "anonymous"  # the actor of a refusal before anyone is known
VIA = "web"
MINUTE = timedelta(minutes=1)
# a minute is folded once it has been over this long: a replica whose clock is a little
# behind may still count into it meanwhile
SETTLE = timedelta(minutes=1)
LONGEST = 200  # characters of any one value a refusal's entry records
UNKNOWN = "unknown"


def source_of(remote: str | None) -> str:
    """Where a request came from, as counted: its IPv4 address, its IPv6 /64, or
    ``unknown``."""
    if not remote:
        return UNKNOWN
    try:
        address = ipaddress.ip_address(remote.split("%", 1)[0])
    except ValueError:
        return remote[:64]
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


def minute_of(at: datetime) -> datetime:
    return at.replace(second=0, microsecond=0)


class Refusals:
    """Audits each refusal of someone known, counts those of someone unknown, and folds
    the counts into the audit log (see the module's docstring)."""

    def __init__(self, db: Database, clock: Clock, audit: AuditTrail) -> None:
        self.db = db
        self.clock = clock
        self.audit = audit

    async def refuse(self, reason: str, *, actor: str = ANONYMOUS, source: str | None = None,
                     approval_id: str | None = None, **details: str | None) -> None:
        """Record a refusal (its own transaction: nothing else is written). ``actor``:
        who was refused, :data:`ANONYMOUS` when nobody is known (then only counted, by
        ``source``, the request's address)."""
        now = self.clock.now()
        if actor == ANONYMOUS:
            async def count(tx: Tx) -> None:
                await tx.web.count_refusal(minute=minute_of(now), source=source_of(source),
                                           reason=reason[:40])

            await self.db.transact(count, what="a refusal")
            return

        async def write(tx: Tx) -> None:
            self.audit.record(tx, at=now, action="web_refused", actor=actor[:LONGEST],
                              via=VIA, approval_id=approval_id,
                              details={"reason": reason,
                                       **{k: v[:LONGEST] for k, v in details.items()
                                          if v is not None}})

        await self.db.transact(write, what="a refusal")

    async def fold(self) -> int:
        """Fold the counts of minutes over at least :data:`SETTLE` ago into the audit log,
        one entry per minute and source; how many entries were written."""
        now = self.clock.now()

        async def write(tx: Tx) -> int:
            rows = await tx.web.take_refusal_counts(minute_of(now) - SETTLE)
            by: dict[tuple[datetime, str], dict[str, int]] = defaultdict(dict)
            for minute, source, reason, n in rows:
                by[minute, source][reason] = by[minute, source].get(reason, 0) + n
            if by:
                self.audit.record_many(tx, [
                    Entry(at=now, action="web_refused", actor=ANONYMOUS, via=VIA,
                          details={"source": source, "minute": minute.isoformat(),
                                   "count": sum(reasons.values()), "reasons": reasons})
                    for (minute, source), reasons in sorted(by.items())])
            return len(by)

        folded: int = await self.db.transact(write, what="folding refusals")
        return folded
