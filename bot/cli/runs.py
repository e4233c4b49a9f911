"""``approvald run``, ``runs list|show|cancel``, ``recover``, ``prune`` and ``db upgrade``:
starting, inspecting, cancelling and resuming runs, and the database they live in."""

from __future__ import annotations

import argparse
import json
import sys

from approvald.bot import documents
from approvald.bot.cli.common import (
    JSON,
    RUN_ID,
    Subparsers,
    UsageError,
    count,
    describe,
    exit_code,
    follow,
    operator,
    out,
    seconds,
    slack_user,
    with_engine,
)
from approvald.bot.config import Settings
from approvald.bot.wiring import open_database
from approvald.runtime import Actor, Engine, mask_text


def register(sub: Subparsers) -> None:
    """Add ``db``, ``run``, ``runs``, ``recover`` and ``prune``."""
    db = sub.add_parser("db", help="database schema").add_subparsers(
        dest="sub", required=True, metavar="COMMAND")
    db.add_parser("upgrade", help="apply migrations and print the schema revision"
                  ).set_defaults(fn=cmd_db_upgrade)

    run = sub.add_parser("run", help="start a run and advance it until it finishes or pauses")
    run.add_argument("agent", help="the agent's name (a demo agent, or one APPROVALD_AGENTS "
                     "loads)")
    run.add_argument("--task", required=True, help="what the agent is asked to do")
    run.add_argument("--requested-by", metavar="USER",
                     help="the Slack user id who asked for this run (default cli:<os user>)")
    run.add_argument("--wait", type=seconds, default=60.0, metavar="SECONDS",
                     help="if another process is advancing the run, wait this long for it to "
                          "complete, fail or pause (default 60)")
    run.set_defaults(fn=cmd_run)

    runs = sub.add_parser("runs", help="inspect and cancel runs").add_subparsers(
        dest="sub", required=True, metavar="COMMAND")
    ls = runs.add_parser("list", help="recent runs, newest first (a waiting run shows why "
                         "and until when)")
    ls.add_argument("--status", help="only runs with this status (running, "
                    "awaiting_approval, completed, failed, cancelled, needs_attention)")
    ls.add_argument("--limit", type=count, default=50, metavar="N",
                    help="show at most N runs (default 50)")
    ls.add_argument("--json", action="store_true", help=JSON)
    ls.set_defaults(fn=cmd_runs_list)
    show = runs.add_parser("show", help="one run with its transcript")
    show.add_argument("id", help=RUN_ID)
    show.add_argument("--json", action="store_true", help=JSON)
    show.set_defaults(fn=cmd_runs_show)
    cancel = runs.add_parser("cancel", help="cancel a run now, or at its next step boundary "
                             "if a worker is mid-step")
    cancel.add_argument("id", help=RUN_ID)
    cancel.add_argument("--reason", help="why (recorded in the audit log and on the cards)")
    cancel.set_defaults(fn=cmd_runs_cancel)

    sub.add_parser("recover", help="resume runs whose worker died").set_defaults(fn=cmd_recover)

    pr = sub.add_parser("prune", help="delete finished runs' transcripts, execution records "
                        "and settled outbox rows past a horizon, and the web review queue's "
                        "sign-in rows a day after they expired (never an audit entry)")
    pr.add_argument("--older-than", required=True, metavar="AGE",
                    help="finished (or settled) before this long ago, e.g. 90d; at least 1d")
    pr.add_argument("--dry-run", action="store_true",
                    help="count what would be deleted, delete nothing")
    pr.set_defaults(fn=cmd_prune)


async def cmd_db_upgrade(s: Settings, a: argparse.Namespace) -> int:
    db = await open_database(s, quiet=True)
    from approvald.store import migrate

    rev = await migrate.current_revision(db)
    await db.close()
    print(f"database {db.display_url} is at schema {rev}")
    return 0


async def cmd_run(s: Settings, a: argparse.Namespace) -> int:
    # the default names the operator (not a Slack id); a value given must be a Slack user id
    requested_by = (operator() if a.requested_by is None
                    else slack_user("--requested-by", a.requested_by))

    async def go(engine: Engine) -> int:
        engine.agent(a.agent)
        claim = engine.new_claim()  # ours from the start: a serve's worker waits
        run_id = await engine.start_run(a.agent, a.task, requested_by=requested_by,
                                        claim=claim)
        print(run_id, flush=True)
        outcome = await follow(engine, await engine.advance(run_id, claim=claim),
                               patience=a.wait)
        print(describe(outcome), file=sys.stderr)
        return exit_code(outcome)
    return await with_engine(s, go, acts=True)


async def cmd_runs_list(s: Settings, a: argparse.Namespace) -> int:
    async def go(engine: Engine) -> int:
        runs = await engine.recent_runs(status=a.status, limit=a.limit)
        if a.json:
            out([documents.run_summary(r) for r in runs])
            return 0
        if not runs:
            print("no runs")
        now = engine.now()
        for r in runs:
            waits = (f"  waiting until {r.wait_until:%Y-%m-%d %H:%M:%S}: "
                     f"{mask_text(r.wait_reason or '')}"
                     if r.wait_until is not None and r.wait_until > now else "")
            print(f"{r.id}  {r.status:<18} step {r.step:<5} {r.agent:<14} "
                  f"{r.created_at:%Y-%m-%d %H:%M:%S}  {r.requested_by}{waits}")
        return 0
    return await with_engine(s, go)


async def cmd_runs_show(s: Settings, a: argparse.Namespace) -> int:
    async def go(engine: Engine) -> int:
        run = await engine.resolve_run(a.id)
        state = await engine.state(run.id)
        approvals = await engine.run_approvals(run.id)
        doc = documents.run_document(run, state, approvals, await engine.run_masking(run.id))
        for ap in doc["approvals"]:  # each row against the audit chain (issue 52)
            ap["disagrees_with_audit_log"] = await engine.approval_check(ap["id"])
        if a.json:
            out(doc)
            return 0
        print(f"run {doc['id']}\n  agent: {doc['agent']}\n  status: {doc['status']}\n"
              f"  step: {doc['step']}\n  requested by: {doc['requested_by']}\n"
              f"  task: {doc['task']}")
        if doc["result"] is not None:
            print(f"  result: {doc['result']}")
        if doc["error"]:
            print(f"  error: {doc['error']}")
        if doc["waiting"]:
            print(f"  waiting until {doc['waiting']['until']}: {doc['waiting']['reason']}")
        for ap in doc["approvals"]:
            for d in ap["disagrees_with_audit_log"]:
                print(f"  WARNING: request {ap['id']} disagrees with the audit log: {d}")
        for p in doc["pending"]:
            print(f"  pending: approval {p['approval_id']} {p['tool']} "
                  f"{json.dumps(p['args'], ensure_ascii=False)}")
        for d in doc["approvals"]:
            if d["outcome"] != "pending":
                print(f"  request {d['id']} {d['tool']} ({d['kind']}): {d['outcome']}"
                      + (f" by {d['decided_by']}" if d["decided_by"] else ""))
        print("  transcript:")
        for m in doc["transcript"]:
            if m["role"] == "assistant":
                if m.get("content"):
                    print(f"    assistant: {m['content']}")
                for c in m.get("tool_calls", []):
                    print(f"    -> {c['name']}({json.dumps(c['arguments'], ensure_ascii=False)})"
                          f" [{c['id']}]")
            elif m["role"] == "tool":
                text = json.dumps(m["content"], ensure_ascii=False)
                print(f"    <- {m['name']}: {text[:200]}{'…' if len(text) > 200 else ''}")
            else:
                print(f"    {m['role']}: {m['content']}")
        return 0
    return await with_engine(s, go)


async def cmd_runs_cancel(s: Settings, a: argparse.Namespace) -> int:
    async def go(engine: Engine) -> int:
        run = await engine.resolve_run(a.id)
        result = await engine.cancel(run.id, actor=Actor(operator(), "cli"), reason=a.reason)
        if result == "cancelled":
            print(f"run {run.id}: cancelled")
        else:
            print(f"run {run.id}: cancellation requested; the worker stops at its next step")
        return 0
    return await with_engine(s, go, acts=True)


async def cmd_recover(s: Settings, a: argparse.Namespace) -> int:
    async def go(engine: Engine) -> int:
        outcomes = await engine.recover()
        for o in outcomes:
            print(describe(o))
        attention = (await engine.runs_by_status()).get("needs_attention", 0)
        hint = " (see `approvald approvals list`)" if attention else ""
        print(f"recovered {len(outcomes)} run(s); {attention} need attention{hint}",
              file=sys.stderr)
        return 3 if attention else 0
    return await with_engine(s, go, acts=True)


async def cmd_prune(s: Settings, a: argparse.Namespace) -> int:
    from approvald.runtime import parse_duration

    try:
        horizon = parse_duration(a.older_than)
    except ValueError as exc:
        raise UsageError(f"--older-than: {exc}") from None

    async def go(engine: Engine) -> int:
        try:
            report = await engine.prune(horizon, dry_run=a.dry_run)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        print(report.summary())
        return 0
    return await with_engine(s, go)
