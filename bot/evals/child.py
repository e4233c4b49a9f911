"""One advance of an eval run in a process of its own, armed to SIGKILL itself at a
failpoint: the evaluator's crash interruptions (:func:`in_child`, a process forked from a
server that imported this module once, or ``python -m bot.evals.child``).

The parent hands over everything the process needs: the database URL, the run, the
instant its clock stands at, the policy file as JSON, the ``APPROVALD_AGENTS`` modules
(the demo agents are always there) and the failpoint, e.g. ``before_call@2``. The child
advances the run once, as a worker would; if the failpoint fires the process dies by
SIGKILL where it stands, else it prints ``{"status": …, "hits": n}`` (how many times it
passed the point) so the parent knows how far the count has got.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from datetime import datetime
from multiprocessing.connection import Connection

from approvald.runtime import ManualClock, PolicyFile, Registry, assemble, demo_agents, failpoints
from approvald.store.db import Database


async def advance_once(argv: list[str]) -> dict[str, object]:
    p = argparse.ArgumentParser(prog="python -m bot.evals.child")
    p.add_argument("--db", required=True)
    p.add_argument("--run", required=True)
    p.add_argument("--now", required=True, help="the clock's instant (ISO 8601)")
    p.add_argument("--failpoint", required=True, help="NAME@N")
    p.add_argument("--policy", default="{}", help="the policy file as JSON")
    p.add_argument("--agents", default="", help="APPROVALD_AGENTS modules")
    p.add_argument("--ledger", default=None, help="the demo ledger's path")
    a = p.parse_args(argv)
    failpoints.arm(a.failpoint)  # with no action given: SIGKILL this process
    registry = Registry(demo_agents(a.ledger), policy=PolicyFile.model_validate_json(a.policy))
    if a.agents:
        registry.load_modules(a.agents)
    db = Database(a.db)
    try:
        engine = assemble(db, registry, clock=ManualClock(datetime.fromisoformat(a.now)))
        outcome = await engine.advance(a.run)
    finally:
        await db.close()
    name = a.failpoint.partition("@")[0]
    return {"status": outcome.status, "hits": failpoints.hits(name)}


def in_child(argv: list[str], env: dict[str, str], answer: Connection) -> None:
    """The advance in a process forked for it (:mod:`multiprocessing`'s forkserver, whose
    server imported this module once: a process a crash interruption needs no longer
    imports approvald itself), in the evaluator's environment as it is now; what it says
    goes back on ``answer`` (``{"status", "hits"}``, or ``{"error"}`` and exit 1), and
    nothing on the standard output or error it was forked with (the evaluator's)."""
    os.environ.clear()
    os.environ.update(env)
    quiet = os.open(os.devnull, os.O_WRONLY)
    os.dup2(quiet, 1)
    os.dup2(quiet, 2)
    try:
        said = asyncio.run(advance_once(argv))
    except BaseException as exc:  # any failure is the evaluator's to report
        answer.send({"error": f"{type(exc).__name__}: {exc}"})
        sys.exit(1)
    answer.send(said)


if __name__ == "__main__":
    print(json.dumps(asyncio.run(advance_once(sys.argv[1:]))))
