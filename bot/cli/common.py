"""What every command group shares: the usage error and argument types (from
:mod:`.argtypes`), the operator's name, printing, exit codes, following a run another
process advances, and running a command with an engine."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from datetime import datetime
from typing import Any

from approvald.bot.cli.argtypes import Subparsers as Subparsers  # re-exported: the groups
from approvald.bot.cli.argtypes import UsageError as UsageError  # import them from here
from approvald.bot.cli.argtypes import count as count
from approvald.bot.cli.argtypes import port as port
from approvald.bot.cli.argtypes import seconds as seconds
from approvald.bot.cli.argtypes import slack_user as slack_user
from approvald.bot.config import Settings
from approvald.bot.wiring import build_engine, open_database
from approvald.runtime import (
    Actor,
    Busy,
    Engine,
    Outcome,
    Waiting,
    Yielded,
    id_help,
    status_outcome,
)

# what a command's parser stores as ``fn``: the handler ``main`` awaits
Handler = Callable[[Settings, argparse.Namespace], Coroutine[Any, Any, int]]

EXIT = {"completed": 0, "awaiting_approval": 0, "running": 0, "failed": 1, "cancelled": 1,
        "needs_attention": 3}
ELSEWHERE = 6  # the run goes on without this command: another process, or a wait
POLL = 0.2  # seconds between looks at a run another process is advancing

RUN_ID = id_help("a run id")
APPROVAL_ID = id_help("an approval request id")
JSON = ("print a JSON document (stable keys; each document's keys: the JSON documents "
        "reference, docs/reference/json-documents.md)")


def exit_code(outcome: Outcome) -> int:
    if isinstance(outcome, Busy | Waiting | Yielded):
        return ELSEWHERE
    return EXIT.get(outcome.status, 1)


async def follow(engine: Engine, outcome: Outcome, *, patience: float) -> Outcome:
    """While another process advances the run, wait (up to ``patience`` seconds) for it to
    complete, fail or pause, taking over if that process lets go of it."""
    deadline = time.monotonic() + patience
    while isinstance(outcome, Busy) and time.monotonic() < deadline:
        await asyncio.sleep(POLL)
        run, approvals = await engine.run_and_approvals(outcome.run_id)
        if run is None:
            break
        if run.status != "running":
            return status_outcome(run, approvals)
        if run.lease_owner is None:  # let go of (or waiting): try it here
            outcome = await engine.advance(run.id)
    return outcome


def operator() -> str:
    try:
        return f"cli:{getpass.getuser()}"
    except Exception:
        return "cli:unknown"


def acting_as(user: str) -> Actor:
    """The Slack user ``user`` acting through this command line, as the audit records it."""
    return Actor(user, f"cli:{operator().removeprefix('cli:')}")


def out(obj: Any) -> None:
    print(json.dumps(obj, indent=2, ensure_ascii=False))


def describe(outcome: Outcome) -> str:
    extra = ""
    for attr in ("result", "error", "reason"):
        value = getattr(outcome, attr, None)
        if value:
            extra = f": {value}"
            break
    ids = getattr(outcome, "approval_ids", ())
    if ids:
        extra = f" (approval {', '.join(ids)})"
    if isinstance(outcome, Busy):
        return (f"run {outcome.run_id}: being advanced by another process "
                f"({outcome.holder or 'unknown'}); follow it with `approvald runs show "
                f"{outcome.run_id}`")
    if isinstance(outcome, Waiting):
        until = outcome.until.isoformat() if outcome.until else "later"
        return (f"run {outcome.run_id}: waiting until {until} ({outcome.reason}); "
                "`approvald serve` (or `approvald recover` then) resumes it")
    return f"run {outcome.run_id}: {outcome.status}{extra}"


def iso(value: datetime | None) -> str:
    return value.isoformat() if value else "an unknown time"


async def with_engine(s: Settings, fn: Callable[[Engine], Awaitable[int]], *,
                      acts: bool = False) -> int:
    """Run ``fn`` with an engine. ``acts``: the command opens or decides requests, so the
    policy file it loaded is on record: audited as this process's load whenever it is not
    the one in force (:meth:`Engine.note_policy`, ``command``); commands that only read
    leave the log alone."""
    db = await open_database(s)
    engine = None
    try:
        engine = build_engine(s, db)
        if acts:
            await engine.note_policy(command=True)
        return await fn(engine)
    finally:
        if engine is not None:
            await engine.aclose()
        await db.close()


def write_file(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8", newline="") as fh:
        fh.write(text)


async def write_out(path: str | None, text: str) -> None:
    """``text`` to the file ``--output`` names, or to stdout."""
    if path:
        await asyncio.to_thread(write_file, path, text)
    else:
        sys.stdout.write(text)
