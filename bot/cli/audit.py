"""``approvald audit verify|export``: the hash-chained audit log checked and exported."""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime

from approvald.bot.cli.common import (
    Subparsers,
    UsageError,
    operator,
    with_engine,
    write_out,
)
from approvald.bot.config import Settings
from approvald.bot.wiring import open_database
from approvald.runtime import (
    ConfigError,
    Engine,
    ExportUnreadable,
    audit,
    id_help,
    record_checkpoint,
    verify_export,
)
from approvald.store.db import Database


def register(sub: Subparsers) -> None:
    """Add ``audit verify|export``."""
    au = sub.add_parser("audit", help="verify and export the audit log").add_subparsers(
        dest="sub", required=True, metavar="COMMAND")
    av = au.add_parser("verify", help="check the chain (with APPROVALD_AUDIT_KEY) and print "
                       "its head")
    av.add_argument("--expect", metavar="SEQ:HASH",
                    help="a head recorded earlier: prove nothing up to it changed or was cut")
    av.add_argument("--file", metavar="EXPORT",
                    help="verify an exported log (JSON lines, from `audit export`; - for "
                         "stdin) instead of the database: with the key, and --expect a head "
                         "recorded elsewhere")
    av.set_defaults(fn=cmd_verify)
    ex = au.add_parser("export", help="every transition with its arguments (sensitive values "
                       "masked unless --reveal)")
    ex.add_argument("--run", metavar="RUN_ID",
                    help=id_help("only the entries of this run: its id"))
    ex.add_argument("--since", help="ISO date or date-time (UTC if no zone)")
    ex.add_argument("--format", choices=["jsonl", "csv"], default="jsonl",
                    help="JSON lines (exact values, the default) or CSV")
    ex.add_argument("--output", "-o", metavar="FILE", help="write to a file instead of stdout")
    ex.add_argument("--reveal", action="store_true",
                    help="export the real arguments (read from their sealed requests, so "
                         "APPROVALD_DATA_KEY is needed) instead of masked ones; the export "
                         "is itself audited (action revealed, by this operator)")
    ex.set_defaults(fn=cmd_export)


async def cmd_verify(s: Settings, a: argparse.Namespace) -> int:
    expect = None
    if a.expect:
        try:
            expect = audit.parse_head(a.expect)
        except ValueError as exc:
            raise UsageError(f"--expect: {exc}") from None
    keys = s.audit_keys()
    if a.file:
        return _said(_verify_file(a.file, keys, expect, s.audit_unkeyed_until), keys,
                     what="export")
    db = await open_database(s)
    try:
        report = await audit.verify(db, keys=keys, expect=expect,
                                    unkeyed_until=s.audit_unkeyed_until)
        # later reads of the record (policy replay, insights) verify from here on
        await record_checkpoint(db, report, keys, s.audit_unkeyed_until)
    finally:
        await db.close()
    return _said(report, keys, what="audit log")


def _verify_file(path: str, keys: list[audit.AuditKey], expect: tuple[int, str] | None,
                 unkeyed_until: int) -> audit.VerifyReport:
    try:
        if path == "-":
            return verify_export(sys.stdin, keys=keys, expect=expect,
                                 unkeyed_until=unkeyed_until)
        with open(path, encoding="utf-8") as f:
            return verify_export(f, keys=keys, expect=expect, unkeyed_until=unkeyed_until)
    except OSError as exc:
        raise UsageError(f"--file: cannot read {path}: {exc.strerror or exc}") from None
    except ExportUnreadable as exc:
        raise UsageError(f"--file {path}: {exc}") from None


def _said(report: audit.VerifyReport, keys: list[audit.AuditKey], *, what: str) -> int:
    """Print a verification: 0 verified, 5 broken, 7 cannot be verified without the key."""
    # the head is printed every time: record it somewhere the database's writers cannot
    # reach, and a later `--expect` proves that nothing up to it has changed since
    print(f"head {report.head_text}")
    if report.cannot is not None:
        print(f"{what} NOT VERIFIED: {report.cannot}")
        return 7
    if report.ok:
        keyed = "keyed" if keys else "unkeyed"
        print(f"{what} OK: {report.entries} entries, chain intact ({keyed})")
        for note in report.notes:
            print(f"  note: {note}")
        return 0
    for p in report.problems:
        print(f"{what} BROKEN: {p}")
    return 5


async def cmd_export(s: Settings, a: argparse.Namespace) -> int:
    since = None
    if a.since:
        try:
            since = datetime.fromisoformat(a.since)
        except ValueError:
            raise UsageError(f"--since is not an ISO date/time: {a.since!r}") from None
        if since.tzinfo is None:
            since = since.replace(tzinfo=UTC)
    if a.reveal:
        if s.sealer().current is None:  # refused before anything is audited or read
            raise ConfigError(
                "APPROVALD_DATA_KEY is not set: audit export --reveal reads the real "
                "arguments from the sealed requests, which needs the data key")

        async def revealing(engine: Engine) -> int:
            # audited first: a revealing export that is not on record never runs
            await engine.note("revealed", operator(), "cli", {
                "what": "audit export", "run": a.run,
                "since": since.isoformat() if since else None, "format": a.format})
            return 0

        await with_engine(s, revealing)
    db = await open_database(s)
    try:
        keys = s.audit_keys()
        # each row carries its export MAC under the key its entry names, so that whoever
        # receives the file proves it with the key (`audit verify --file`)
        await _export(db, a, since, keys)
        # an export is checked as it is handed over: a log that does not verify is said
        # (the export is written all the same: it is the evidence)
        report = await audit.verify(db, keys=keys, unkeyed_until=s.audit_unkeyed_until)
    finally:
        await db.close()
    if report.cannot is not None:
        print(f"approvald: note: the exported log was not verified: {report.cannot}",
              file=sys.stderr)
    elif not report.ok:
        print(f"approvald: the exported log does not verify: {report.problems[0]}"
              + (f" (and {len(report.problems) - 1} more: run `approvald audit verify`)"
                 if len(report.problems) > 1 else ""), file=sys.stderr)
        return 5
    return 0


async def _export(db: Database, a: argparse.Namespace, since: datetime | None,
                  keys: list[audit.AuditKey]) -> None:
    chunks = [c async for c in audit.export(db, run_id=a.run, since=since, fmt=a.format,
                                            reveal=a.reveal, keys=keys)]
    await write_out(a.output, "".join(chunks))
