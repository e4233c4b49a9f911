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
from datetime import datetime, timedelta

from approvald.runtime import ReviewState

ANONYMOUS = "anonymous"  # the actor of a refusal before anyone is known
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

    def __init__(self, state: ReviewState) -> None:
        self.state = state

    async def refuse(self, reason: str, *, actor: str = ANONYMOUS, source: str | None = None,
                     approval_id: str | None = None, **details: str | None) -> None:
        """Record a refusal (its own transaction: nothing else is written). ``actor``:
        who was refused, :data:`ANONYMOUS` when nobody is known (then only counted, by
        ``source``, the request's address)."""
        now = self.state.now()
        if actor == ANONYMOUS:
            await self.state.count_refusal(minute=minute_of(now), source=source_of(source),
                                           reason=reason[:40])
            return
        await self.state.record_refusal(
            at=now, actor=actor[:LONGEST], approval_id=approval_id,
            details={"reason": reason, **{k: v[:LONGEST] for k, v in details.items()
                                          if v is not None}})

    async def fold(self) -> int:
        """Fold the counts of minutes over at least :data:`SETTLE` ago into the audit log,
        one entry per minute and source; how many entries were written."""
        return await self.state.fold_refusals(before=minute_of(self.state.now()) - SETTLE,
                                              actor=ANONYMOUS)
