"""``approvald trace RUN`` and ``approvald eval DATASET``: a run's timeline, and journey
evals scored."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

from approvald.bot.cli.common import (
    JSON,
    RUN_ID,
    Subparsers,
    UsageError,
    out,
    with_engine,
    write_file,
    write_out,
)
from approvald.bot.config import Settings
from approvald.runtime import Engine


def register(sub: Subparsers) -> None:
    """Add ``trace`` and ``eval``."""
    tr = sub.add_parser("trace", help="a run's timeline: model steps, tool calls, approvals "
                        "and every transition, with times",
                        description="Print a run's timeline: each model step (model, "
                        "instructions version, latency, tokens and cost where reported), "
                        "each tool call (arguments, result, latency, error class, "
                        "idempotency key), each approval (who decided, when, on which "
                        "digest, how long it waited) and every audited transition.")
    tr.add_argument("id", help=RUN_ID)
    tr.add_argument("--format", choices=["text", "json", "html"], default="text",
                    help="text (default), json (stable keys), or html: one self-contained "
                         "page with a swimlane of model / tools / humans")
    tr.add_argument("--json", action="store_true", help="the same as --format json")
    tr.add_argument("--output", "-o", metavar="FILE", help="write to a file instead of stdout")
    tr.set_defaults(fn=cmd_trace)

    ev = sub.add_parser(
        "eval", help="run journey evals: each task of a dataset, uninterrupted and under "
        "each interruption, scored",
        description="Run every task of DATASET.toml with its scripted human decisions, in a "
        "scratch database per journey (not APPROVALD_DATABASE_URL), uninterrupted and under "
        "each interruption the dataset lists, and score completion, tool selection, "
        "arguments, approval compliance, recovery, cost and latency (the README's \"Journey "
        "evals\" describes the format). Exit 1 when any journey fails its expectations, 2 "
        "for a dataset that cannot be evaluated as written.")
    ev.add_argument("dataset", help="the dataset file (TOML)")
    ev.add_argument("--agent", help="evaluate this agent instead of the one the dataset "
                    "names (a demo agent, or one APPROVALD_AGENTS loads)")
    ev.add_argument("--json", action="store_true", help=JSON)
    ev.add_argument("--report", metavar="PATH",
                    help="also write an HTML report to PATH: one self-contained file "
                    "with the verdict, a bar per score, the journeys with their reasons, "
                    "and the trace of every failing journey")
    ev.set_defaults(fn=cmd_eval)


async def cmd_trace(s: Settings, a: argparse.Namespace) -> int:
    from approvald.bot import trace_view

    fmt = "json" if a.json else a.format
    if a.json and a.format not in ("text", "json"):
        raise UsageError(f"--json and --format {a.format} ask for different things")

    async def go(engine: Engine) -> int:
        run = await engine.resolve_run(a.id)
        trace = await engine.trace(run.id)
        if fmt == "json":
            text = json.dumps(trace.to_document(), indent=2, ensure_ascii=False) + "\n"
        elif fmt == "html":
            text = trace_view.html(trace)
        else:
            text = trace_view.text(trace)
        await write_out(a.output, text)
        return 0
    return await with_engine(s, go)


def report_path(path: str) -> str:
    """A ``--report`` path that can be written, made absolute; else one line (exit 2)
    saying why not: a directory, a missing or read-only folder, a read-only file."""
    where = os.path.abspath(path)
    folder = os.path.dirname(where)
    why = None
    if os.path.isdir(where):
        why = "it is a directory"
    elif not os.path.isdir(folder):
        why = f"no such directory {folder}"
    elif os.path.exists(where) and not os.access(where, os.W_OK):
        why = "the file is not writable"
    elif not os.path.exists(where) and not os.access(folder, os.W_OK):
        why = f"the directory {folder} is not writable"
    if why:
        raise UsageError(f"approvald eval: cannot write the report to {path}: {why}")
    return where


async def cmd_eval(s: Settings, a: argparse.Namespace) -> int:
    # runs nothing in APPROVALD_DATABASE_URL: every journey gets a scratch database
    from approvald.bot.eval_run import load_dataset, run_dataset, table
    from approvald.bot.wiring import build_registry
    from approvald.store.scratch import ScratchDatabases

    dataset = load_dataset(a.dataset, agent=a.agent)
    # a report that cannot be written is refused before the journeys run, not after
    where = report_path(a.report) if a.report else ""
    scratch = ScratchDatabases()
    before = os.environ.get("APPROVALD_DEMO_LEDGER")  # put back after (a caller in-process)
    try:
        # side effects are counted in the demo ledger; modules APPROVALD_AGENTS loads read
        # its path from the environment when they are imported, which is after this
        ledger = s.demo_ledger or str(scratch.dir / "ledger.jsonl")
        os.environ["APPROVALD_DEMO_LEDGER"] = ledger
        registry = build_registry(s.model_copy(update={"demo_ledger": ledger}))
        report = await run_dataset(
            dataset, agents=[registry.get(n) for n in registry.names()],
            databases=scratch.new, policy=registry.policy, ledger_path=ledger,
            agent_modules=s.agents or "")
    finally:
        if before is None:
            os.environ.pop("APPROVALD_DEMO_LEDGER", None)
        else:
            os.environ["APPROVALD_DEMO_LEDGER"] = before
        scratch.cleanup()
    if a.json:
        out(report.to_json())
    else:
        print(table(report))
    if a.report:
        from approvald.bot import eval_report

        try:
            await asyncio.to_thread(write_file, a.report, eval_report.html(report))
        except OSError as exc:
            raise UsageError(f"approvald eval: cannot write the report to {a.report}: "
                             f"{exc.strerror or exc}") from None
        print(f"approvald eval: wrote the report to {where}", file=sys.stderr)
    return 0 if report.ok else 1
