"""``approvald outbox list|retry``: deliveries to Slack seen and re-driven."""

from __future__ import annotations

import argparse
from datetime import datetime
from typing import Any

from approvald.bot.cli.common import JSON, Subparsers, UsageError, count, out, with_engine
from approvald.bot.config import Settings
from approvald.runtime import Engine


def register(sub: Subparsers) -> None:
    """Add ``outbox list|retry``."""
    ob = sub.add_parser("outbox", help="see and re-drive deliveries to Slack").add_subparsers(
        dest="sub", required=True, metavar="COMMAND")
    ol = ob.add_parser("list", help="rows not yet delivered (pending and dead), newest last")
    which = ol.add_mutually_exclusive_group()
    which.add_argument("--dead", action="store_true", help="only rows that were given up")
    which.add_argument("--all", action="store_true", help="every status, delivered too")
    ol.add_argument("--limit", type=count, default=50, metavar="N",
                    help="show the newest N rows (default 50)")
    ol.add_argument("--json", action="store_true", help=JSON)
    ol.set_defaults(fn=cmd_list)
    orr = ob.add_parser("retry", help="put a dead row back to work now, with a fresh "
                        "give-up window (a waiting row: try it now)")
    orr.add_argument("id", nargs="?", type=int, help="the outbox row's number (as `outbox "
                     "list` shows it)")
    orr.add_argument("--all", action="store_true", help="every dead row")
    orr.set_defaults(fn=cmd_retry)


def _when(t: datetime | None) -> str:
    return "-" if t is None else t.strftime("%Y-%m-%d %H:%M:%S")


def _about(payload: dict[str, Any]) -> str:
    """What an outbox row is about, for one line: "approval ID", "run ID", "outbox ID"."""
    for key in ("approval_id", "run_id", "outbox_id"):
        if payload.get(key) is not None:
            return f"{key.removesuffix('_id')} {payload[key]}"
    return "-"


async def cmd_list(s: Settings, a: argparse.Namespace) -> int:
    statuses = ("dead",) if a.dead else () if a.all else ("pending", "dead")

    async def go(engine: Engine) -> int:
        # each with the deadline a failing row will be held to (rows that never failed
        # have none stored yet: it is worked out the same way the drain will)
        listed = await engine.outbox_rows(statuses=statuses, limit=a.limit)
        rows = [r for r, _ in listed]
        give_up = {r.id: at for r, at in listed if at is not None}
        if a.json:
            out([{"id": r.id, "kind": r.kind, "status": r.status, "group": r.group_key,
                  "payload": r.payload_value(), "attempts": r.attempts, "waits": r.waits,
                  "created_at": r.created_at.isoformat(),
                  "next_try_at": r.not_before.isoformat() if r.status == "pending" else None,
                  "died_at": r.not_before.isoformat() if r.status == "dead" else None,
                  "give_up_at": give_up[r.id].isoformat() if r.id in give_up else None,
                  "delivered_at": r.delivered_at.isoformat() if r.delivered_at else None,
                  "last_error": r.last_error} for r in rows])
            return 0
        if not rows:
            print("no dead outbox rows" if a.dead else "outbox is empty" if a.all
                  else "nothing waiting in the outbox")
        for r in rows:
            if r.status == "pending":
                when = f"next try {_when(r.not_before)}, gives up {_when(give_up[r.id])}"
            elif r.status == "dead":
                when = f"died {_when(r.not_before)}"
            else:
                when = f"delivered {_when(r.delivered_at)}"
            error = (r.last_error or "").replace("\n", " ")
            print(f"{r.id:>6}  {r.status:<9} {r.kind:<18} {_about(r.payload_value())}  "
                  f"{r.attempts} attempt(s), {r.waits} wait(s)  created "
                  f"{_when(r.created_at)}  {when}"
                  + (f"  last error: {error[:120]}" if error else ""))
        return 0
    return await with_engine(s, go)


async def cmd_retry(s: Settings, a: argparse.Namespace) -> int:
    if (a.id is None) == (not a.all):
        raise UsageError("approvald outbox retry: give one outbox ID or --all")

    async def go(engine: Engine) -> int:
        before = None
        if a.id is not None:
            before = await engine.outbox_row(a.id)
            if before is None:
                raise UsageError(f"no outbox row {a.id}")
            if before.status == "delivered":
                raise UsageError(f"outbox {a.id} was delivered at "
                                 f"{_when(before.delivered_at)}; nothing to retry")
        redriven = await engine.redrive_outbox(None if a.all else [a.id])
        rows = [r for r, _ in redriven]
        give_up = {r.id: at for r, at in redriven}
        if before is not None and not rows:  # delivered between the look and the change
            raise UsageError(f"outbox {a.id} is no longer waiting; nothing to retry")
        if not rows:
            print("no dead outbox rows")
        for r in rows:
            was = before.status if before is not None else "dead"
            change = "dead -> pending" if was == "dead" else "pending"
            print(f"outbox {r.id} ({r.kind}, {_about(r.payload_value())}): {change}, "
                  f"next try now, gives up {_when(give_up[r.id])}")
        return 0
    return await with_engine(s, go, acts=True)
