"""The audit log: append-only, hash-chained, verifiable, exportable.

Each entry's hash covers its own fields and the previous entry's hash, so editing,
deleting or reordering any entry breaks the chain at a point :func:`verify` names.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from runtime.canonical import canonical_json, compact_json, sha256_hex
from store.db import Database
from store.records import AuditRecord
from store.repos import Tx
from store.repos.audit import GENESIS

ACTIONS = frozenset({
    "requested", "reminded", "voted", "approved", "denied", "edited", "expired", "escalated",
    "superseded", "executed", "outcome_unknown", "outcome_resolved", "cancelled",
})


def entry_hash(prev_hash: str, *, seq: int, at: datetime, action: str, actor: str, via: str,
               run_id: str | None, approval_id: str | None, digest: str | None,
               details: str) -> str:
    body = canonical_json({
        "seq": seq, "at": at.isoformat(), "action": action, "actor": actor, "via": via,
        "run_id": run_id, "approval_id": approval_id, "digest": digest,
        "details": json.loads(details),
    })
    return sha256_hex(prev_hash + "\n" + body)


async def append(tx: Tx, *, at: datetime, action: str, actor: str, via: str,
                 run_id: str | None = None, approval_id: str | None = None,
                 digest: str | None = None, details: dict[str, Any] | None = None) -> int:
    """Append one entry inside the caller's transaction; returns its seq."""
    if action not in ACTIONS:
        raise ValueError(f"unknown audit action {action!r}")
    last_seq, last_hash = await tx.audit.lock_head()
    seq = last_seq + 1
    text = compact_json(details or {})
    h = entry_hash(last_hash, seq=seq, at=at, action=action, actor=actor, via=via,
                   run_id=run_id, approval_id=approval_id, digest=digest, details=text)
    await tx.audit.append(seq=seq, at=at, action=action, actor=actor, via=via, run_id=run_id,
                          approval_id=approval_id, digest=digest, details=text,
                          prev_hash=last_hash, hash=h)
    return seq


@dataclass(frozen=True)
class Entry:
    """One audit entry to append (see :func:`append_many`)."""

    action: str
    actor: str
    via: str
    run_id: str | None = None
    approval_id: str | None = None
    digest: str | None = None
    details: dict[str, Any] = field(default_factory=dict)


async def append_many(tx: Tx, entries: list[Entry], *, at: datetime) -> None:
    """Append several entries under one lock of the chain head (a sweep's batch)."""
    if not entries:
        return
    for e in entries:
        if e.action not in ACTIONS:
            raise ValueError(f"unknown audit action {e.action!r}")
    seq, prev = await tx.audit.lock_head()
    rows = []
    for e in entries:
        seq += 1
        text = compact_json(e.details)
        h = entry_hash(prev, seq=seq, at=at, action=e.action, actor=e.actor, via=e.via,
                       run_id=e.run_id, approval_id=e.approval_id, digest=e.digest,
                       details=text)
        rows.append({"seq": seq, "at": at, "action": e.action, "actor": e.actor, "via": e.via,
                     "run_id": e.run_id, "approval_id": e.approval_id, "digest": e.digest,
                     "details": text, "prev_hash": prev, "hash": h})
        prev = h
    await tx.audit.append_rows(rows)


@dataclass
class VerifyReport:
    entries: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _describe(e: AuditRecord) -> str:
    return f"entry {e.seq} ({e.action} by {e.actor} at {e.at.isoformat()})"


async def verify(db: Database) -> VerifyReport:
    """Walk the chain; report the first entry where it breaks and what kind of break."""
    report = VerifyReport()
    async with db.read(snapshot=True) as tx:  # the entries and the head must agree
        prev_seq, prev_hash = 0, GENESIS
        async for e in tx.audit.iterate():
            report.entries += 1
            if e.seq != prev_seq + 1:
                missing = (f"entry {prev_seq + 1}" if e.seq == prev_seq + 2
                           else f"entries {prev_seq + 1}-{e.seq - 1}")
                report.problems.append(
                    f"{missing} deleted: the log jumps from {prev_seq} to {e.seq}")
                return report
            if e.prev_hash != prev_hash:
                report.problems.append(
                    f"{_describe(e)} does not follow entry {prev_seq}: reordered, or the "
                    "entry before it was rewritten"
                )
                return report
            recomputed = entry_hash(e.prev_hash, seq=e.seq, at=e.at, action=e.action,
                                    actor=e.actor, via=e.via, run_id=e.run_id,
                                    approval_id=e.approval_id, digest=e.digest, details=e.details)
            if recomputed != e.hash:
                report.problems.append(
                    f"{_describe(e)} was edited: its content does not match its hash"
                )
                return report
            prev_seq, prev_hash = e.seq, e.hash
        head_seq, head_hash = await tx.audit.head()
        if (head_seq, head_hash) != (prev_seq, prev_hash):
            if head_seq > prev_seq:
                report.problems.append(
                    f"entries {prev_seq + 1}-{head_seq} deleted from the end of the log"
                )
            else:
                report.problems.append(
                    f"the chain head (entry {head_seq}) does not match the last entry {prev_seq}"
                )
    return report


EXPORT_FIELDS = ("seq", "at", "action", "actor", "via", "run_id", "approval_id", "tool", "digest",
                 "args", "reason", "details", "prev_hash", "hash")


def export_row(e: AuditRecord) -> dict[str, Any]:
    details: dict[str, Any] = json.loads(e.details)
    return {
        "seq": e.seq, "at": e.at.isoformat(), "action": e.action, "actor": e.actor,
        "via": e.via, "run_id": e.run_id, "approval_id": e.approval_id,
        "tool": details.get("tool"), "digest": e.digest, "args": details.get("args"),
        "reason": details.get("reason"), "details": details, "prev_hash": e.prev_hash,
        "hash": e.hash,
    }


async def export(db: Database, *, run_id: str | None = None, since: datetime | None = None,
                 fmt: str = "jsonl") -> AsyncIterator[str]:
    """Yield the matching entries as JSON lines or CSV text (header first)."""
    if fmt not in ("jsonl", "csv"):
        raise ValueError(f"unknown export format {fmt!r} (jsonl or csv)")
    async with db.read() as tx:
        rows = await tx.audit.query(run_id=run_id, since=since)
    if fmt == "jsonl":
        for e in rows:
            yield json.dumps(export_row(e), ensure_ascii=False) + "\n"
        return
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=EXPORT_FIELDS)
    writer.writeheader()
    for e in rows:
        row = export_row(e)
        for key in ("args", "details"):
            row[key] = "" if row[key] is None else canonical_json(row[key])
        writer.writerow(row)
        yield buf.getvalue()
        buf.seek(0)
        buf.truncate()
    if buf.getvalue():
        yield buf.getvalue()
