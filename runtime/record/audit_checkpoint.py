"""The chain verified once, then read from where it was verified (issue 51).

A full :func:`runtime.record.audit.verify` recomputes every entry's MAC: minutes over a million
entries on a small machine. When one passes with the audit key, it records a
*verified-through checkpoint*: the head it reached (seq and that entry's MAC), MAC'd with
the key, so that someone who can write the database but does not hold the key cannot move
it past an entry they changed, nor make one up. A reader of the record (the policy replay,
the insights) then checks, instead of the whole chain:

* the checkpoint's own MAC (a forged or altered one: the chain is reported broken);
* the checkpointed entry: still there, its MAC recomputed from its content and equal to
  the checkpoint's (an edit to that entry, or a rewrite that changed its MAC, is caught);
* that no entry up to it was deleted (their count is its seq: one indexed count);
* every entry after it, fully, as ``audit verify`` does (seq, link, key, MAC);

and moves the checkpoint to the head it verified. What it does **not** recheck is the
content of the entries before the checkpoint: an entry edited there by someone without
the key is caught by ``audit verify`` (which always walks the whole chain) and by
``--full`` on the readers, not by a reader that trusts the checkpoint. The table
cross-checks of ``audit verify`` (issue 52) are its own, too. See docs/how-to/audit.md.

Without a key there is no checkpoint: an unkeyed chain can be rewritten whole by a
writer, so each read walks it all.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Sequence

from approvald.runtime.record.audit import AuditKey, ChainWalk, VerifyReport, still_verified
from approvald.store.db import Database
from approvald.store.records import AuditRecord
from approvald.store.repos import Tx

_TAG = "approvald-audit-checkpoint-v1"


def checkpoint_mac(key: AuditKey, seq: int, digest: str, unkeyed_until: int) -> str:
    """The MAC that binds a checkpoint to the key (and to the unkeyed prefix it was
    verified under: a checkpoint made under another setting is not used)."""
    return key.mac(f"{_TAG}\n{seq}:{digest}:{unkeyed_until}")


async def record_checkpoint(db: Database, report: VerifyReport, keys: Sequence[AuditKey],
                            unkeyed_until: int) -> bool:
    """After a verify that passed with ``keys`` (the current key first), record its head
    as verified; False when there is nothing to record (no key, a failed report, an
    empty log)."""
    if not keys or not report.ok or report.head[0] == 0:
        return False
    seq, digest = report.head
    key = keys[0]
    async with db.write() as tx:
        await tx.audit.advance_checkpoint(
            seq=seq, hash=digest, key_id=key.id, unkeyed_until=unkeyed_until,
            mac=checkpoint_mac(key, seq, digest, unkeyed_until))
    return True


async def verify_from_checkpoint(
        tx: Tx, *, keys: Sequence[AuditKey], unkeyed_until: int,
        before: Callable[[Tx, int], Awaitable[None]],
        after: Callable[[AuditRecord], None]) -> VerifyReport | None:
    """Verify the chain from its checkpoint in ``tx`` (a snapshot); None when there is no
    checkpoint this reader can use (none recorded, made with a key not given, or under
    another unkeyed prefix): then the whole chain must be verified.

    ``before(tx, seq)``: awaited once the checkpoint (at ``seq``) holds, to read what the
    reader wants of the entries up to it, in ``tx``. ``after(entry)``: called with each
    entry past it, once its MAC is checked. Trust what they saw only when the report is ok.
    """
    found = await tx.audit.checkpoint()
    if found is None:
        return None
    seq, digest, key_id, unkeyed, mac = found
    key = {k.id: k for k in keys}.get(key_id)
    if key is None or unkeyed != unkeyed_until:
        return None
    report = VerifyReport()
    report.head = await tx.audit.head()
    if not hmac.compare_digest(checkpoint_mac(key, seq, digest, unkeyed), mac):
        report.problems.append(
            f"the verified-through checkpoint (entry {seq}) is not signed with the audit "
            "key: it was written by someone without the key")
        return report
    if seq > report.head[0]:
        report.problems.append(
            f"the log ends at entry {report.head[0]}, but it was verified through entry "
            f"{seq}: entries {report.head[0] + 1}-{seq} were deleted")
        return report
    walk = ChainWalk(report, keys, unkeyed_until, (seq, digest))
    entry = await tx.audit.entry(seq)
    if not still_verified(entry, (seq, digest), report, "the verified-through checkpoint",
                          lambda e, _: walk.mac_matches(e)):
        return report
    assert entry is not None
    walk.seen_keyed = bool(entry.key_id)
    if (count := await tx.audit.count_upto(seq)) != seq:
        report.problems.append(
            f"{seq - count} entries up to entry {seq}, the verified-through checkpoint, "
            "were deleted")
        return report
    report.entries = seq
    await before(tx, seq)
    async for e in tx.audit.iterate(after=seq, upto=report.head[0], batch=5000):
        if not walk.check(e):
            return report
        after(e)
    walk.reached_head()
    return report
