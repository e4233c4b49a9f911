"""The requests on the record kept folded, so that a reader does not fold every entry of
its window again (issue 51).

:func:`runtime.record.history.read_history` folds audit entries into requests. With the
audit key, what it folded is kept: a row per request in ``audit_requests`` (its fold, as
masked as the entries it comes from, MAC'd with the key) and, in ``audit_fold``, the entry
through which the chain was folded and how many entries the rows fold in all, MAC'd with
the key too. The next read verifies the chain as before (from its checkpoint), then takes
the kept rows instead of the entries up to ``through`` and folds only the entries after
it, with the same fold (:class:`runtime.record.history._Builder`), and keeps what changed.

Why a kept row cannot become a side door into the record (someone who can write the
database but does not hold the key):

* a row edited (its fold, its seq or its count) no longer matches its MAC;
* a row deleted, or put back as an older version (each carries the number of entries it
  folds, and that number only grows), makes the rows' total fall short of the MAC'd
  ``folded``;
* the whole table and its ``folded`` put back together to an older state is harmless:
  the older ``through`` makes the read fold the entries after it again, from the chain;
* rows are only ever written by a read that verified the chain through ``through``.

Any of these, caught, is reported (:attr:`History.problems`) and the record is folded
from its entries instead, then kept anew: a kept row that fails its check is never used.
A keep made with a key this reader does not hold, or under another unkeyed prefix, is
folded anew without a report. Without a key nothing is kept (a MAC needs it).

The rows are written by the readers (the replay, the insights, the operators' board)
after a verified read, not by the transactions that append the entries: a read folds the
entries appended since the last one, so what it returns is never behind the chain.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from approvald.runtime.kernel.canonical import compact_json
from approvald.runtime.kernel.collector import collector_paused
from approvald.runtime.policies.intake import Source
from approvald.runtime.record.audit import AuditKey, verify
from approvald.runtime.record.audit_checkpoint import record_checkpoint, verify_from_checkpoint
from approvald.runtime.record.history import (
    _READ,
    _UNASKED,
    ACTIONS,
    ChainBroken,
    History,
    Request,
    _Builder,
    _open,
)
from approvald.store.db import Database
from approvald.store.records import AuditRecord
from approvald.store.repos import Tx

_ROW = "approvald-audit-request-v1"
_FOLD = "approvald-audit-fold-v1"


def row_mac(key: AuditKey, seq: int, folded: int, state: str) -> str:
    """The MAC of a kept request: its first entry, how many entries it folds, its fold."""
    return key.mac(row_text(seq, folded, state))


def row_text(seq: int, folded: int, state: str) -> str:
    return f"{_ROW}\n{seq}:{folded}\n{state}"


def fold_mac(key: AuditKey, through: int, folded: int, unkeyed_until: int) -> str:
    return key.mac(f"{_FOLD}\n{through}:{folded}:{unkeyed_until}")


def dump(r: Request) -> str:
    """A request's fold as kept: what its entries say (``shown``: masked as they are),
    never the arguments opened from its sealed row."""
    return compact_json([
        r.key, r.at.isoformat(), r.tool, r.policy_name, r.source.kind, r.source.name,
        r.shown, r.answer, r.asked, r.approvers, r.quorum, r.rule, r.outcome, r.edited,
        r.decided_by, r.decided_at.isoformat() if r.decided_at is not None else None,
        r.reason, r.asked_of, r.shadow, r.masked, r.opened, r.rungs])


def load(seq: int, folded: int, state: str, sources: dict[tuple[str, str], Source]
         ) -> Request:
    (key, at, tool, policy_name, kind, name, shown, answer, asked, approvers, quorum, rule,
     outcome, edited, decided_by, decided_at, reason, asked_of, shadow, masked, opened,
     rungs) = json.loads(state)
    source = sources.get((kind, name))
    if source is None:
        source = sources[(kind, name)] = Source(kind, name)
    return Request(
        key=key, at=datetime.fromisoformat(at), tool=tool, policy_name=policy_name,
        source=source, shown=shown, args=shown, answer=answer, asked=asked,
        approvers=approvers, quorum=quorum, rule=rule, outcome=outcome, edited=edited,
        decided_by=decided_by,
        decided_at=datetime.fromisoformat(decided_at) if decided_at is not None else None,
        reason=reason, asked_of=asked_of, shadow=shadow, masked=masked, opened=opened,
        seq=seq, folded=folded, rungs=rungs)


@dataclass
class Kept:
    """What a read found kept: the requests folded through ``through`` (none: fold anew)."""

    through: int = 0
    requests: list[Request] = field(default_factory=list)
    was: tuple[int, str] | None = None  # the fold row as read (through, mac)
    anew: bool = True  # every row is written again
    problems: list[str] = field(default_factory=list)


async def kept(tx: Tx, keys: Sequence[AuditKey], unkeyed_until: int) -> Kept:
    """The kept requests, each checked (see the module docstring); none, with what was
    caught, when any check fails."""
    found = await tx.audit.fold()
    if found is None:
        out = Kept()
        if await tx.audit.any_folded():
            out.problems.append("the kept requests' fold row is missing: they were folded "
                                "from the audit entries instead")
        return out
    through, folded, unkeyed, key_id, mac = found
    out = Kept(was=(through, mac))
    by_id = {k.id: k for k in keys}
    key = by_id.get(key_id)
    if through < 0 or key is None or unkeyed != unkeyed_until:
        return out  # not kept (yet), or under a key or setting this reader does not use
    if not hmac.compare_digest(fold_mac(key, through, folded, unkeyed), mac):
        out.problems.append("the kept requests' fold row is not signed with the audit key: "
                            "they were folded from the audit entries instead")
        return out
    sources: dict[tuple[str, str], Source] = {}
    requests: list[Request] = []
    total = 0
    bad: list[int] = []
    compare = hmac.compare_digest
    macs = {k.id: k.macs() for k in keys}
    async for rows in tx.audit.folded():
        with collector_paused():  # (no await inside)
            for seq, n, state, kid, row in rows:
                mac_of = macs.get(kid)
                if mac_of is None or not compare(mac_of(row_text(seq, n, state)), row):
                    bad.append(seq)
                    continue
                total += n
                requests.append(load(seq, n, state, sources))
    if bad:
        out.problems.append(
            f"{len(bad)} kept request(s) do not match their MAC (first at entry {bad[0]}): "
            "edited outside approvald; the record was folded from the audit entries instead")
    elif total != folded:
        out.problems.append(
            f"the kept requests fold {total} entries, their fold row says {folded}: a kept "
            "request was deleted or put back to an older state; the record was folded from "
            "the audit entries instead")
    if out.problems:
        return out
    out.through, out.requests, out.anew = through, requests, False
    return out


async def read_kept(db: Database, *, since: datetime | None, keys: Sequence[AuditKey],
                    unkeyed_until: int) -> History:
    """:func:`runtime.record.history.read_history` with a key: the chain verified from its
    checkpoint, the kept requests checked and used, the entries after them folded, and
    what changed kept."""
    builder = _Builder()
    found = Kept()
    wanted = frozenset(ACTIONS)

    def visit(e: AuditRecord) -> None:  # in the walk that verifies the chain
        if e.seq > found.through and e.action in wanted:
            builder.add(e.seq, e.at, e.action, e.actor, e.run_id, e.approval_id, e.details)

    async def before(tx: Tx, seq: int) -> None:  # what is kept, then the entries after it
        nonlocal found
        found = await kept(tx, keys, unkeyed_until)
        builder.prime(found.requests)
        if found.through >= seq:
            return
        add = builder.add
        async for rows in tx.audit.records(actions=_READ, unasked=_UNASKED,
                                           after=found.through, upto=seq):
            for s, at, action, actor, run_id, approval_id, details in rows:
                add(s, at, action, actor, run_id, approval_id, details)

    async with db.read(snapshot=True) as tx:
        with collector_paused():
            report = await verify_from_checkpoint(tx, keys=keys, unkeyed_until=unkeyed_until,
                                                  before=before, after=visit)
    if report is None:  # no checkpoint to start from: the whole chain, folded anew
        async with db.read(snapshot=True) as tx:
            found = await kept(tx, keys, unkeyed_until)
        found = Kept(was=found.was, problems=found.problems)
        builder = _Builder()
        report = await verify(db, keys=keys, unkeyed_until=unkeyed_until, visit=visit)
    if not report.ok:
        raise ChainBroken(report.problems if report.problems else [str(report.cannot)])
    await record_checkpoint(db, report, keys, unkeyed_until)
    await keep(db, keys[0], unkeyed_until, builder, found, report.head[0])
    requests = builder.requests if since is None else [
        r for r in builder.requests if r.at >= since]
    async with db.read(snapshot=True) as tx:
        for r in requests:
            if r.masked:
                await _open(tx, r)
    return History(requests, since, report.head, report.entries, problems=found.problems)


async def keep(db: Database, key: AuditKey, unkeyed_until: int, builder: _Builder,
               found: Kept, through: int) -> bool:
    """Keep what ``builder`` folded through entry ``through`` (the rows that changed, or
    all of them when folded anew); False when another reader kept it first."""
    if not found.anew and not builder.changed and found.through == through:
        return True
    changed = builder.requests if found.anew else list(builder.changed.values())
    rows: list[dict[str, Any]] = []
    for r in changed:
        state = dump(r)
        rows.append({"seq": r.seq, "folded": r.folded, "state": state, "key_id": key.id,
                     "mac": row_mac(key, r.seq, r.folded, state)})
    folded = sum(r.folded for r in builder.requests)
    fold = {"through": through, "folded": folded, "unkeyed_until": unkeyed_until,
            "key_id": key.id, "mac": fold_mac(key, through, folded, unkeyed_until)}
    async with db.write() as tx:
        return await tx.audit.save_fold(was=found.was, fold=fold, rows=rows,
                                        replace_all=found.anew)
