"""An exported audit log verified from the file alone (``audit verify --file``), by
whoever received it: with the key, each entry's MAC is recomputed from the fields the
export holds, and consecutive entries must link; with a head recorded elsewhere (the one
posted to the audit channel, say), the file must pass through it.

A JSON lines export (``audit export``, the default format) holds each entry's fields
(its details masked, as the chain records them, and every digest of arguments shown as
its keyed binding: invariant 20), its key's fingerprint, its chain MAC and the MAC
before it, and the row's own MAC (``export_mac``, recipe v1 of
:func:`runtime.record.audit.export_mac`) over all of those as exported: with the key, each row
is proven as it stands, bindings included, and tied to its place in the chain by the
chain MACs it carries, which link row to row. A row without an export MAC (an export
from before it, made with plain digests) is checked against its chain MAC
(:func:`runtime.record.audit.entry_hash`). A filtered export (``--run``, ``--since``) leaves
entries out: each entry in it is still proven, and the gaps are named, but only a full
export and a recorded head prove that nothing is missing. An export with ``--reveal``
shows real values where the chain recorded masked ones, and carries no export MAC, so its
entries do not verify: verify the masked export.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from approvald.runtime.kernel.canonical import compact_json
from approvald.runtime.record.audit import (
    EXPORT_MAC,
    EXPORT_RECIPE,
    AuditKey,
    EntryKeys,
    VerifyReport,
    export_mac,
    mac_matches,
)
from approvald.store.records import AuditRecord
from approvald.store.repos.audit import GENESIS

_FIELDS = ("seq", "at", "action", "actor", "via", "run_id", "approval_id", "digest",
           "details", "key_id", "prev_hash", "hash")


class ExportUnreadable(ValueError):
    """A line of the file is not an exported entry (the file is not a JSON lines export,
    or it was cut or mangled): the file cannot be verified, and the line is named."""


def entry_of(line: str, number: int) -> tuple[AuditRecord, dict[str, Any]]:
    """One exported line as the entry it was exported from, and the row as exported."""
    try:
        row: Any = json.loads(line)
        if not isinstance(row, dict) or any(f not in row for f in _FIELDS):
            raise ValueError("not an exported entry")
        return AuditRecord(
            seq=int(row["seq"]), at=datetime.fromisoformat(str(row["at"])),
            action=str(row["action"]), actor=str(row["actor"]), via=str(row["via"]),
            run_id=row["run_id"], approval_id=row["approval_id"], digest=row["digest"],
            details=compact_json(row["details"]), key_id=str(row["key_id"] or ""),
            prev_hash=str(row["prev_hash"]), hash=str(row["hash"])), row
    except (ValueError, TypeError) as exc:
        raise ExportUnreadable(
            f"line {number} is not an entry of a JSON lines audit export ({exc}): export "
            "with `approvald audit export` (the default format, not --format csv)") from None


def verify_export(lines: Iterable[str], *, keys: Sequence[AuditKey] = (),
                  expect: tuple[int, str] | None = None,
                  unkeyed_until: int = 0) -> VerifyReport:
    """Verify an exported log (its lines); the report's head is the file's last entry."""
    report = VerifyReport()
    walk = EntryKeys(keys, unkeyed_until)
    prev: AuditRecord | None = None
    gaps: list[str] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        e, row = entry_of(line, number)
        report.entries += 1
        if prev is not None and e.seq <= prev.seq:
            report.problems.append(f"entry {e.seq} comes after entry {prev.seq} in the file: "
                                   "entries were reordered or repeated")
            return report
        expected_prev = GENESIS if e.seq == 1 else prev.hash if prev is not None \
            and e.seq == prev.seq + 1 else None
        if expected_prev is None:  # the entry before it is not in the file
            gaps.append(f"{prev.seq + 1 if prev else 1}-{e.seq - 1}")
        elif e.prev_hash != expected_prev:
            report.problems.append(
                f"entry {e.seq} ({e.action} by {e.actor}) does not follow entry {e.seq - 1}: "
                "reordered, or the entry before it was rewritten")
            return report
        usable, key = walk.key_for(e, report)
        if not usable:
            return report
        wrong = _row_wrong(key, e, row)
        if wrong is not None:
            report.problems.append(
                f"entry {e.seq} ({e.action} by {e.actor} at {e.at.isoformat()}) {wrong}")
            return report
        if expect is not None and e.seq == expect[0] and e.hash != expect[1]:
            report.problems.append(
                f"entry {e.seq} is not the one recorded ({expect[1][:16]}…): the history up "
                "to it was rewritten")
            return report
        prev = e
    if prev is None:
        report.problems.append("the file holds no entry")
        return report
    report.head = (prev.seq, prev.hash)
    if expect is not None:
        if expect[0] > prev.seq:
            report.problems.append(
                f"the export ends at entry {prev.seq}, but a head at entry {expect[0]} was "
                f"recorded: entries {prev.seq + 1}-{expect[0]} are not in it")
        elif any(_within(expect[0], g) for g in gaps):
            report.problems.append(f"entry {expect[0]}, the recorded head, is not in the "
                                   "export: export the whole log to prove it")
        else:
            report.notes.append(f"the export passes through the recorded head "
                                f"{expect[0]}:{expect[1]}")
    if gaps:
        report.notes.append(
            f"entries {', '.join(gaps)} are not in this export (a filtered export): each entry "
            "in it is proven, not that none is missing; a full export and a recorded head "
            "prove that")
    if report.unkeyed and not keys:
        report.notes.append(
            "the entries are not keyed: the file detects accidental damage, but whoever "
            "made it could have recomputed every hash; compare its head with one recorded "
            "elsewhere (--expect)")
    return report


def _row_wrong(key: AuditKey | None, e: AuditRecord, row: dict[str, Any]) -> str | None:
    """Why exported ``row`` (entry ``e``) is not as exported from the chain, or None."""
    mac = row.get(EXPORT_MAC)
    if mac is None:  # an export from before export MACs: its plain digests, as recorded
        if mac_matches(key, e):
            return None
        return ("does not match its MAC, and its row carries no export MAC: it was edited, "
                "or exported with --reveal or without the audit key (export again with "
                "APPROVALD_AUDIT_KEY set, and without --reveal)")
    if not isinstance(mac, str) or mac.partition(":")[0] != EXPORT_RECIPE:
        return (f"carries an export MAC of a recipe this release does not know "
                f"({str(mac).partition(':')[0]!r}; it knows {EXPORT_RECIPE!r})")
    if hmac.compare_digest(export_mac(key, row), mac):
        return None
    return ("was edited in the export: its fields (its bindings, details, actor, time or "
            "chain MACs) do not match its export MAC")


def _within(seq: int, gap: str) -> bool:
    low, _, high = gap.partition("-")
    return int(low) <= seq <= int(high)
