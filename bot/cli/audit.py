"""``approvald audit verify|export``: the hash-chained audit log checked and exported."""

from __future__ import annotations

import argparse
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
from approvald.runtime import audit
from approvald.runtime.engine import Engine
from approvald.runtime.errors import ConfigError
from approvald.runtime.prefix import id_help
from approvald.store.db import Database


def register(sub: Subparsers) -> None:
    """Add ``audit verify|export``."""
    au = sub.add_parser("audit", help="verify and export the audit log").add_subparsers(
        dest="sub", required=True, metavar="COMMAND")
    av = au.add_parser("verify", help="check the chain (with APPROVALD_AUDIT_KEY) and print "
                       "its head")
    av.add_argument("--expect", metavar="SEQ:HASH",
                    help="a head recorded earlier: prove nothing up to it changed or was cut")
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
    db = await open_database(s)
    try:
        report = await audit.verify(db, keys=keys, expect=expect,
                                    unkeyed_until=s.audit_unkeyed_until)
    finally:
        await db.close()
    # the head is printed every time: record it somewhere the database's writers cannot
    # reach, and a later `--expect` proves that nothing up to it has changed since
    print(f"head {report.head_text}")
    if report.ok:
        keyed = "keyed" if keys else "unkeyed"
        print(f"audit log OK: {report.entries} entries, chain intact ({keyed})")
        for note in report.notes:
            print(f"  note: {note}")
        return 0
    for p in report.problems:
        print(f"audit log BROKEN: {p}")
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
        await _export(db, a, since)
    finally:
        await db.close()
    return 0


async def _export(db: Database, a: argparse.Namespace, since: datetime | None) -> None:
    chunks = [c async for c in audit.export(db, run_id=a.run, since=since, fmt=a.format,
                                            reveal=a.reveal)]
    await write_out(a.output, "".join(chunks))
