"""The ``approvald`` command line.

User mistakes (unknown agent or run, bad URL, bad flag) and an environment that refuses
(a database that cannot be reached, a port in use) are one line on stderr and a non-zero
exit, never a traceback. Exit codes: 0 ok (a run completed or is waiting for approval),
1 a run failed or was cancelled, 2 usage, input or configuration error, 3 a run needs
attention, 4 a decision was refused, 5 the audit log does not verify, 6 the run goes on
without this command (another process is advancing it, or it waits for a rate limit or
an outage to pass; `approvald serve` resumes it), 70 an internal error (a bug). Output
whose reader has gone (``| head -1``) is dropped quietly.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import logging
import math
import os
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from approvald.bot import cli_standing, documents
from approvald.bot.api.cli import add_commands as add_token_commands
from approvald.bot.config import Settings, load_settings
from approvald.bot.deploy_cli import add_command as add_deploy_check
from approvald.bot.mcp.cli import add_commands as add_mcp_commands
from approvald.bot.wiring import build_engine, check_environment, open_database
from approvald.runtime import audit
from approvald.runtime.decide import Actor
from approvald.runtime.engine import Engine
from approvald.runtime.errors import ApprovaldError, DecisionRefused
from approvald.runtime.identity import InvalidIdentity, normalize_user_id
from approvald.runtime.ids import lease_id
from approvald.runtime.outcomes import Busy, Outcome, Waiting, Yielded
from approvald.runtime.runner import status_outcome
from approvald.runtime.standing import StandingRefused
from approvald.store.records import ApprovalRecord

EXIT = {"completed": 0, "awaiting_approval": 0, "running": 0, "failed": 1, "cancelled": 1,
        "needs_attention": 3}
ELSEWHERE = 6  # the run goes on without this command: another process, or a wait
POLL = 0.2  # seconds between looks at a run another process is advancing


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
        async with engine.db.read() as tx:
            run = await tx.runs.get(outcome.run_id)
            approvals = await tx.approvals.for_run(outcome.run_id) if run else []
        if run is None:
            break
        if run.status != "running":
            return status_outcome(run, approvals)
        if run.lease_owner is None:  # let go of (or waiting): try it here
            outcome = await engine.advance(run.id)
    return outcome


class UsageError(ApprovaldError):
    pass


def operator() -> str:
    try:
        return f"cli:{getpass.getuser()}"
    except Exception:
        return "cli:unknown"


def slack_user(flag: str, value: str) -> str:
    """The Slack user id a flag names, upper-cased; anything else is a usage error (exit 2)."""
    try:
        return normalize_user_id(value)
    except InvalidIdentity as exc:
        raise UsageError(f"{flag}: {exc}") from None


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


# -- commands --------------------------------------------------------------------------

async def cmd_db_upgrade(s: Settings, a: argparse.Namespace) -> int:
    db = await open_database(s, quiet=True)
    from approvald.store import migrate

    rev = await migrate.current_revision(db)
    await db.close()
    print(f"database {db.display_url} is at schema {rev}")
    return 0


async def with_engine(s: Settings, fn: Callable[[Engine], Awaitable[int]], *,
                      acts: bool = False) -> int:
    """Run ``fn`` with an engine. ``acts``: the command opens or decides requests, so the
    policy file it loaded is recorded as the one in force (audited when it changed);
    commands that only read leave the log alone."""
    db = await open_database(s)
    engine = None
    try:
        engine = build_engine(s, db)
        if acts:
            await engine.note_policy()
        return await fn(engine)
    finally:
        if engine is not None:
            await engine.registry.aclose()
        await db.close()


async def cmd_run(s: Settings, a: argparse.Namespace) -> int:
    # the default names the operator (not a Slack id); a value given must be a Slack user id
    requested_by = (operator() if a.requested_by is None
                    else slack_user("--requested-by", a.requested_by))

    async def go(engine: Engine) -> int:
        engine.registry.get(a.agent)
        claim = lease_id(engine.owner)  # ours from the start: a serve's worker waits
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
        async with engine.db.read() as tx:
            runs = await tx.runs.recent(status=a.status, limit=a.limit)
        if a.json:
            out([documents.run_summary(r) for r in runs])
            return 0
        if not runs:
            print("no runs")
        now = engine.clock.now()
        for r in runs:
            waits = (f"  waiting until {r.wait_until:%Y-%m-%d %H:%M:%S}: {r.wait_reason}"
                     if r.wait_until is not None and r.wait_until > now else "")
            print(f"{r.id}  {r.status:<18} step {r.step:<5} {r.agent:<14} "
                  f"{r.created_at:%Y-%m-%d %H:%M:%S}  {r.requested_by}{waits}")
        return 0
    return await with_engine(s, go)


async def cmd_runs_show(s: Settings, a: argparse.Namespace) -> int:
    async def go(engine: Engine) -> int:
        run = await engine.resolve_run(a.id)
        state = await engine.state(run.id)
        async with engine.db.read() as tx:
            approvals = await tx.approvals.for_run(run.id)
        doc = documents.run_document(run, state, approvals)
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
        for p in doc["pending"]:
            print(f"  pending: approval {p['approval_id']} {p['tool']} "
                  f"{json.dumps(p['args'], ensure_ascii=False)}")
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


async def cmd_trace(s: Settings, a: argparse.Namespace) -> int:
    from approvald.bot import trace_view
    from approvald.runtime.trace import load_trace

    fmt = "json" if a.json else a.format
    if a.json and a.format not in ("text", "json"):
        raise UsageError(f"--json and --format {a.format} ask for different things")

    async def go(engine: Engine) -> int:
        run = await engine.resolve_run(a.id)
        trace = await load_trace(engine.db, run.id, now=engine.clock.now())
        if fmt == "json":
            text = json.dumps(trace.to_document(), indent=2, ensure_ascii=False) + "\n"
        elif fmt == "html":
            text = trace_view.html(trace)
        else:
            text = trace_view.text(trace)
        if a.output:
            await asyncio.to_thread(_write_file, a.output, text)
        else:
            sys.stdout.write(text)
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
        async with engine.db.read() as tx:
            attention = (await tx.runs.count_by_status()).get("needs_attention", 0)
        hint = " (see `approvald approvals list`)" if attention else ""
        print(f"recovered {len(outcomes)} run(s); {attention} need attention{hint}",
              file=sys.stderr)
        return 3 if attention else 0
    return await with_engine(s, go, acts=True)


async def cmd_prune(s: Settings, a: argparse.Namespace) -> int:
    from approvald.runtime.policy import parse_duration
    from approvald.runtime.retention import prune

    try:
        horizon = parse_duration(a.older_than)
    except ValueError as exc:
        raise UsageError(f"--older-than: {exc}") from None

    async def go(engine: Engine) -> int:
        try:
            report = await prune(engine.db, engine.clock, horizon, dry_run=a.dry_run)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        print(report.summary())
        return 0
    return await with_engine(s, go)


async def cmd_approvals_list(s: Settings, a: argparse.Namespace) -> int:
    async def go(engine: Engine) -> int:
        status = None if a.all else a.status
        run_id = None if a.run is None else (await engine.resolve_run(a.run)).id
        async with engine.db.read() as tx:
            rows = await tx.approvals.oldest(status=status, run_id=run_id, limit=a.limit)
            total = (await tx.approvals.count(status=status, run_id=run_id)
                     if len(rows) == a.limit else len(rows))
        if total > len(rows):  # on stderr: `--ids | head -1` stays the oldest, and clean
            what = "approvals" if status is None else f"{status} approvals"
            print(f"approvald: showing the oldest {len(rows)} of {total} {what}; "
                  "--limit N shows more", file=sys.stderr)
        if a.json:
            out([documents.approval_document(r) for r in rows])
            return 0
        if a.ids:
            for r in rows:
                print(r.id)
            return 0
        if not rows:
            print("no approvals" if status is None else f"no {status} approvals")
        for r in rows:
            when = r.expires_at.strftime("%Y-%m-%d %H:%M:%S") if r.kind == "tool_call" else "-"
            print(f"{r.id}  {r.status:<10} {r.tool:<20} run {r.run_id[:12]}  "
                  f"expires {when}  {json.dumps(r.effective_args(), ensure_ascii=False)[:80]}")
        return 0
    return await with_engine(s, go)


async def cmd_approvals_show(s: Settings, a: argparse.Namespace) -> int:
    async def go(engine: Engine) -> int:
        r = await engine.decider.get(a.id)
        doc = documents.approval_document(r)
        async with engine.db.read() as tx:
            # a vote counts only for the arguments it was cast on
            doc["votes"] = [{"actor": v.actor, "verdict": v.verdict, "via": v.via,
                             "at": v.at.isoformat(), "digest": v.digest,
                             "counts": v.digest == r.effective_digest}
                            for v in await tx.approvals.votes(r.id)]
        if a.json:
            out(doc)
            return 0
        for key in ("id", "run_id", "kind", "tool", "status", "approvers", "quorum", "approvals",
                    "requested_by", "requested_at", "expires_at", "decided_by", "verdict",
                    "reason", "digest"):
            print(f"{key:>13}: {doc[key]}")
        if doc["rule"]:
            print(f"{'policy rule':>13}: {doc['rule']}")
        print(f"{'args':>13}: {json.dumps(doc['args'], ensure_ascii=False, indent=2)}")
        if doc["edited_args"] is not None:
            print(f"{'edited args':>13}: {json.dumps(doc['edited_args'], ensure_ascii=False)}")
            print(f"{'edited by':>13}: {doc['edited_by']} at {doc['edited_at']} "
                  f"(digest {doc['edited_digest']})")
        for v in doc["votes"]:
            counts = "" if v["counts"] else " (on earlier arguments: does not count)"
            print(f"{'vote':>13}: {v['actor']} {v['verdict']} {v['digest'][:12]}{counts}")
        packet = doc["packet"]
        # after an edit, the request's words are about the arguments first asked for
        before = "(as asked, before the edit) " if doc["words_about_original"] else ""
        print(f"{'doing':>13}: {before}{packet.get('doing')}\n{'why':>13}: {packet.get('why')}")
        if doc["impact"]:
            print(f"{'impact':>13}: {doc['impact']}")
        elif doc["original_impact"]:
            print(f"{'impact':>13}: {doc['original_impact']} (of the original arguments, "
                  "not worked out for the edit)")
        return 0
    return await with_engine(s, go)


def decide_command(verdict: str) -> Callable[[Settings, argparse.Namespace], Awaitable[int]]:
    async def cmd(s: Settings, a: argparse.Namespace) -> int:
        as_user = slack_user("--as", a.as_user)  # refused before the database is opened
        if isinstance(a.id, list):  # approve / deny take several ids
            if len(a.id) > 1:
                if a.digest or getattr(a, "standing", None):
                    raise UsageError("--digest and --standing go with one approval id")
                return await with_engine(s, lambda engine: decide_batch(engine, a, as_user,
                                                                        verdict), acts=True)
            a.id = a.id[0]

        if getattr(a, "standing", None):
            actor = Actor(as_user, f"cli:{operator().removeprefix('cli:')}")
            return await with_engine(s, lambda engine: cli_standing.grant(
                engine, a, actor, UsageError), acts=True)

        async def go(engine: Engine) -> int:
            args = None
            if verdict == "edit":
                try:
                    args = json.loads(a.args)
                except json.JSONDecodeError as exc:
                    raise UsageError(f"--args is not valid JSON: {exc}") from None
            v = a.outcome if verdict == "resolve" else verdict
            actor = Actor(as_user, f"cli:{operator().removeprefix('cli:')}")
            # a redirect's guidance travels where a denial's reason does
            reason = a.guidance if verdict == "redirect" else getattr(a, "reason", None)
            try:
                decision = await engine.decide(a.id, actor=actor, verdict=v,
                                               reason=reason, args=args,
                                               expect_digest=getattr(a, "digest", None))
            except DecisionRefused as exc:
                standing = await decision_stands(engine, a.id, v, exc, actor=as_user)
                if standing is None:
                    raise
                # the same decision was already made (say the process died right after
                # committing it): it stands, and the run still needs resuming
                print(f"approval {standing.id}: already {standing.status} by "
                      f"{standing.decided_by} at {iso(standing.decided_at)}; the decision "
                      "stands")
                if a.no_resume:
                    return 0
                outcome = await follow(engine, await engine.advance(standing.run_id),
                                       patience=60.0)
                print(describe(outcome))
                return exit_code(outcome)
            rec = decision.approval
            if decision.outcome == "voted":
                print(f"approval {rec.id}: {decision.approvals} of {decision.quorum} approvals "
                      f"on arguments {rec.effective_digest[:12]}")
            elif decision.outcome == "edited":
                print(f"approval {rec.id}: arguments replaced by {as_user} (now "
                      f"{rec.effective_digest[:12]}); someone else must approve them")
            else:
                print(f"approval {rec.id}: {decision.outcome} by {as_user}")
            if decision.discarded:
                print(f"  earlier approvals by {', '.join(decision.discarded)} were on the "
                      "previous arguments and no longer count; they must approve again")
            if decision.run_ready and not a.no_resume:
                outcome = await engine.advance(rec.run_id)
                print(describe(outcome))
                return exit_code(outcome)
            return 0
        return await with_engine(s, go, acts=True)
    return cmd


async def decide_batch(engine: Engine, a: argparse.Namespace, as_user: str,
                       verdict: str) -> int:
    """``approvals approve ID ID…``: each request decided on its own (its own checks and
    compare-and-set), a line for each, then the runs they made ready resumed. Exit 0 when
    every one was decided as asked, 4 when any was refused (the others stand)."""
    from approvald.runtime.batch import Target, decide_each

    actor = Actor(as_user, f"cli:{operator().removeprefix('cli:')}")
    try:
        outcomes = await decide_each(engine.decisions, [Target(i) for i in a.id], actor=actor,
                                     verdict="approve" if verdict == "approve" else "deny",
                                     reason=getattr(a, "reason", None))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    ready: list[str] = []
    for o in outcomes:
        if o.decision is None:
            print(f"approval {o.approval_id}: refused ({o.code}): {o.refused}")
            continue
        d = o.decision
        if d.outcome == "voted":
            print(f"approval {d.approval.id}: {d.approvals} of {d.quorum} approvals")
        else:
            print(f"approval {d.approval.id}: {d.outcome} by {as_user}")
        if d.run_ready and d.approval.run_id not in ready:
            ready.append(d.approval.run_id)
    done = sum(o.ok for o in outcomes)
    print(f"{done} of {len(outcomes)} decided; {len(outcomes) - done} refused")
    if not a.no_resume:
        for run_id in ready:
            print(describe(await engine.advance(run_id)))
    return 0 if done == len(outcomes) else 4


RESULTING = {"approve": "approved", "edit": "approved", "deny": "denied",
             "redirect": "redirected", "retry": "approved", "mark_done": "approved",
             "abort": "denied", "replan": "approved"}


async def decision_stands(engine: Engine, approval_id: str, verdict: str,
                          refused: DecisionRefused, *, actor: str) -> ApprovalRecord | None:
    """The approval, when a refused decision is the very one already recorded (the same
    person approved it, say): repeating one's own decision is not a mistake to report but
    a run to resume. Anyone else's attempt stays refused."""
    if refused.reason != "not_pending":
        return None
    a = await engine.decider.get(approval_id)
    if a.status != RESULTING.get(verdict) or a.decided_by != actor:
        return None
    if a.kind != "tool_call" and a.verdict != verdict:
        return None
    return a


async def cmd_approvals_sweep(s: Settings, a: argparse.Namespace) -> int:
    async def go(engine: Engine) -> int:
        result = await engine.expiry.sweep()
        print(f"{len(result.expired)} expired, {len(result.escalated)} escalated, "
              f"{len(result.reminded)} reminders queued")
        for run_id in sorted(result.runs_ready):
            print(describe(await engine.advance(run_id)))
        return 0
    return await with_engine(s, go, acts=True)


def iso(value: datetime | None) -> str:
    return value.isoformat() if value else "an unknown time"


async def cmd_audit_verify(s: Settings, a: argparse.Namespace) -> int:
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


async def cmd_audit_export(s: Settings, a: argparse.Namespace) -> int:
    since = None
    if a.since:
        try:
            since = datetime.fromisoformat(a.since)
        except ValueError:
            raise UsageError(f"--since is not an ISO date/time: {a.since!r}") from None
        if since.tzinfo is None:
            since = since.replace(tzinfo=UTC)
    db = await open_database(s)
    try:
        chunks = [c async for c in audit.export(db, run_id=a.run, since=since, fmt=a.format)]
        if a.output:
            await asyncio.to_thread(_write_file, a.output, "".join(chunks))
        else:
            sys.stdout.write("".join(chunks))
    finally:
        await db.close()
    return 0


def _write_file(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8", newline="") as fh:
        fh.write(text)


async def cmd_serve(s: Settings, a: argparse.Namespace) -> int:
    from approvald.bot.serve import serve

    return await serve(s)


async def cmd_sandbox(s: Settings, a: argparse.Namespace) -> int:
    if a.slack_only:
        from approvald.bot.sandbox.server import run_forever

        try:
            await run_forever(host=a.host, port=a.port)
        except OSError as exc:
            raise UsageError(f"approvald sandbox: cannot listen on {a.host}:{a.port}: "
                             f"{exc.strerror or exc}") from None
        return 0
    from approvald.bot.sandbox.workspace import run_sandbox

    return await run_sandbox(s, host=a.host, port=a.port)


def _when(t: datetime | None) -> str:
    return "-" if t is None else t.strftime("%Y-%m-%d %H:%M:%S")


def _outbox_about(payload: dict[str, Any]) -> str:
    """What an outbox row is about, for one line: "approval ID", "run ID", "outbox ID"."""
    for key in ("approval_id", "run_id", "outbox_id"):
        if payload.get(key) is not None:
            return f"{key.removesuffix('_id')} {payload[key]}"
    return "-"


async def cmd_outbox_list(s: Settings, a: argparse.Namespace) -> int:
    from approvald.runtime.outbox import deadline

    statuses = ("dead",) if a.dead else () if a.all else ("pending", "dead")

    async def go(engine: Engine) -> int:
        async with engine.db.read() as tx:
            rows = await tx.outbox.newest(statuses=statuses, limit=a.limit)
            # the deadline a failing row will be held to (rows that never failed have none
            # stored yet: it is worked out the same way the drain will)
            give_up = {r.id: await deadline(tx, r) for r in rows if r.status != "delivered"}
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
            print(f"{r.id:>6}  {r.status:<9} {r.kind:<18} {_outbox_about(r.payload_value())}  "
                  f"{r.attempts} attempt(s), {r.waits} wait(s)  created "
                  f"{_when(r.created_at)}  {when}"
                  + (f"  last error: {error[:120]}" if error else ""))
        return 0
    return await with_engine(s, go)


async def cmd_outbox_retry(s: Settings, a: argparse.Namespace) -> int:
    from approvald.runtime.outbox import WINDOW, deadline

    if (a.id is None) == (not a.all):
        raise UsageError("approvald outbox retry: give one outbox ID or --all")

    async def go(engine: Engine) -> int:
        now = engine.clock.now()
        async with engine.db.write() as tx:
            before = None
            if a.id is not None:
                before = await tx.outbox.get(a.id)
                if before is None:
                    raise UsageError(f"no outbox row {a.id}")
                if before.status == "delivered":
                    raise UsageError(f"outbox {a.id} was delivered at "
                                     f"{_when(before.delivered_at)}; nothing to retry")
            rows = await tx.outbox.redrive(None if a.all else [a.id], now=now,
                                           give_up_at=now + WINDOW)
            give_up = {r.id: await deadline(tx, r) for r in rows}
        if before is not None and not rows:  # delivered between the look and the change
            raise UsageError(f"outbox {a.id} is no longer waiting; nothing to retry")
        if not rows:
            print("no dead outbox rows")
        for r in rows:
            was = before.status if before is not None else "dead"
            change = "dead -> pending" if was == "dead" else "pending"
            print(f"outbox {r.id} ({r.kind}, {_outbox_about(r.payload_value())}): {change}, "
                  f"next try now, gives up {_when(give_up[r.id])}")
        return 0
    return await with_engine(s, go, acts=True)


# -- parser ----------------------------------------------------------------------------

class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one line, exit 2
        raise UsageError(f"{self.prog}: {message}")


async def cmd_eval(s: Settings, a: argparse.Namespace) -> int:
    # runs nothing in APPROVALD_DATABASE_URL: every journey gets a scratch database
    from approvald.bot.evals.dataset import load_dataset
    from approvald.bot.evals.evaluate import evaluate, table
    from approvald.bot.wiring import build_registry
    from approvald.store.scratch import ScratchDatabases

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

    dataset = load_dataset(a.dataset, agent=a.agent)
    # a report that cannot be written is refused before the journeys run, not after
    where = report_path(a.report) if a.report else ""
    scratch = ScratchDatabases()
    try:
        # side effects are counted in the demo ledger; modules APPROVALD_AGENTS loads read
        # its path from the environment when they are imported, which is after this
        ledger = s.demo_ledger or str(scratch.dir / "ledger.jsonl")
        os.environ["APPROVALD_DEMO_LEDGER"] = ledger
        registry = build_registry(s.model_copy(update={"demo_ledger": ledger}))
        report = await evaluate(dataset, agents=[registry.get(n) for n in registry.names()],
                                databases=scratch.new, policy=registry.policy,
                                ledger_path=ledger, agent_modules=s.agents or "")
    finally:
        scratch.cleanup()
    if a.json:
        out(report.to_json())
    else:
        print(table(report))
    if a.report:
        from approvald.bot import eval_report

        try:
            await asyncio.to_thread(_write_file, a.report, eval_report.html(report))
        except OSError as exc:
            raise UsageError(f"approvald eval: cannot write the report to {a.report}: "
                             f"{exc.strerror or exc}") from None
        print(f"approvald eval: wrote the report to {where}", file=sys.stderr)
    return 0 if report.ok else 1


def count(text: str) -> int:
    """A ``--limit``: a whole number of 1 or more."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of 1 or more (got {text!r})")
    return value


def port(text: str) -> int:
    """A TCP port: 0 (any free one) to 65535."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port from 0 to 65535 (got {text!r})")
    return value


def seconds(text: str) -> float:
    """A duration in seconds: 0 or more."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, 0 or more "
                                         f"(got {text!r})")
    return value


RUN_ID = "a run id (or a unique prefix of one)"
APPROVAL_ID = "an approval request id (or a unique prefix of one)"
JSON = "print a JSON document (stable keys; see the README)"


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="approvald", description="Durable agent runs with human approval.")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser, metavar="COMMAND")

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

    cli_standing.add_parsers(sub, with_engine=with_engine, slack_user=slack_user,
                             operator=operator)
    sub.add_parser("recover", help="resume runs whose worker died").set_defaults(fn=cmd_recover)

    pr = sub.add_parser("prune", help="delete finished runs' transcripts, execution records "
                        "and settled outbox rows past a horizon (never an audit entry)")
    pr.add_argument("--older-than", required=True, metavar="AGE",
                    help="finished (or settled) before this long ago, e.g. 90d; at least 1d")
    pr.add_argument("--dry-run", action="store_true",
                    help="count what would be deleted, delete nothing")
    pr.set_defaults(fn=cmd_prune)

    ap = sub.add_parser("approvals", help="list and decide approval requests").add_subparsers(
        dest="sub", required=True, metavar="COMMAND")
    al = ap.add_parser("list", help="pending (or all) approval requests, oldest first")
    al.add_argument("--status", default="pending",
                    help="only requests with this status (default pending; also approved, "
                         "denied, redirected, expired, superseded, cancelled)")
    al.add_argument("--all", action="store_true", help="every status")
    al.add_argument("--run", metavar="RUN_ID",
                    help="only the requests of this run (its id or a unique prefix of one)")
    al.add_argument("--limit", type=count, default=100, metavar="N",
                    help="show the oldest N (default 100); stderr says when more are left out")
    al.add_argument("--json", action="store_true", help=JSON)
    al.add_argument("--ids", action="store_true", help="print only ids, oldest first")
    al.set_defaults(fn=cmd_approvals_list)
    ash = ap.add_parser("show", help="one request: exact arguments, digest, editor, packet, "
                        "votes")
    ash.add_argument("id", help=APPROVAL_ID)
    ash.add_argument("--json", action="store_true", help=JSON)
    ash.set_defaults(fn=cmd_approvals_show)
    for name, verdict, what in (
            ("approve", "approve", "approve a request as a Slack user"),
            ("deny", "deny", "deny a request; the model receives the reason"),
            ("edit", "edit", "replace a request's arguments (an approval too, unless the "
             "policy says edits = \"propose\")"),
            ("redirect", "redirect", "do not run the call; the model receives your guidance "
             "instead and re-plans"),
            ("resolve", "resolve", "answer an \"outcome unknown\" or a \"cannot run\" "
             "question")):
        c = ap.add_parser(name, help=what + (" (several ids: each decided on its own, "
                                             "one refusal stopping no other)"
                                             if name in ("approve", "deny") else ""))
        if name in ("approve", "deny"):
            c.add_argument("id", nargs="+", help="approval ids (or unique prefixes of 6+)")
        else:
            c.add_argument("id", help=APPROVAL_ID)
        c.add_argument("--as", dest="as_user", required=True, metavar="USER",
                       help="the Slack user id you act as (checked against the policy)")
        c.add_argument("--no-resume", action="store_true",
                       help="record the decision only; leave resuming to `approvald serve`")
        if name != "resolve":
            c.add_argument("--digest", metavar="PREFIX",
                           help="decide only if the arguments are still the ones with this "
                                "digest (as `approvals show` printed it)")
        if name == "deny":
            c.add_argument("--reason", required=True, help="why (the model receives it)")
        elif name == "approve":
            c.add_argument("--reason", help="why (recorded in the audit log)")
            cli_standing.add_grant_options(c)
        elif name == "redirect":
            c.add_argument("--guidance", required=True, metavar="TEXT",
                           help="what the agent should do instead (the model receives it)")
        elif name == "edit":
            c.add_argument("--args", required=True, help="the new arguments as a JSON object")
            c.add_argument("--reason", help="why (recorded in the audit log)")
        elif name == "resolve":
            c.add_argument("--outcome", required=True,
                           choices=["retry", "mark_done", "abort", "replan"],
                           help="outcome unknown: retry (run the call once more), mark_done "
                                "(it happened) or abort (it did not, and is not to be "
                                "retried); cannot run (an approved call the deployed agent "
                                "cannot run): replan (the model reads why and re-plans) or "
                                "abort (the run ends)")
            c.add_argument("--reason", help="why (recorded in the audit log)")
        else:
            c.add_argument("--reason", help="why (recorded in the audit log)")
        c.set_defaults(fn=decide_command(verdict))

    ap.add_parser("sweep", help="expire, escalate and remind now (what serve does on a "
                  "schedule)").set_defaults(fn=cmd_approvals_sweep)

    add_token_commands(sub, operator=operator, json_help=JSON)
    add_deploy_check(sub, with_engine=with_engine, json_help=JSON)
    add_mcp_commands(sub)

    au = sub.add_parser("audit", help="verify and export the audit log").add_subparsers(
        dest="sub", required=True, metavar="COMMAND")
    av = au.add_parser("verify", help="check the chain (with APPROVALD_AUDIT_KEY) and print "
                       "its head")
    av.add_argument("--expect", metavar="SEQ:HASH",
                    help="a head recorded earlier: prove nothing up to it changed or was cut")
    av.set_defaults(fn=cmd_audit_verify)
    ex = au.add_parser("export", help="every transition with the exact arguments")
    ex.add_argument("--run", metavar="RUN_ID",
                    help="only the entries of this run (its id or a unique prefix of one)")
    ex.add_argument("--since", help="ISO date or date-time (UTC if no zone)")
    ex.add_argument("--format", choices=["jsonl", "csv"], default="jsonl",
                    help="JSON lines (exact values, the default) or CSV")
    ex.add_argument("--output", "-o", metavar="FILE", help="write to a file instead of stdout")
    ex.set_defaults(fn=cmd_audit_export)

    ob = sub.add_parser("outbox", help="see and re-drive deliveries to Slack").add_subparsers(
        dest="sub", required=True, metavar="COMMAND")
    ol = ob.add_parser("list", help="rows not yet delivered (pending and dead), newest last")
    which = ol.add_mutually_exclusive_group()
    which.add_argument("--dead", action="store_true", help="only rows that were given up")
    which.add_argument("--all", action="store_true", help="every status, delivered too")
    ol.add_argument("--limit", type=count, default=50, metavar="N",
                    help="show the newest N rows (default 50)")
    ol.add_argument("--json", action="store_true", help=JSON)
    ol.set_defaults(fn=cmd_outbox_list)
    orr = ob.add_parser("retry", help="put a dead row back to work now, with a fresh "
                        "give-up window (a waiting row: try it now)")
    orr.add_argument("id", nargs="?", type=int, help="the outbox row's number (as `outbox "
                     "list` shows it)")
    orr.add_argument("--all", action="store_true", help="every dead row")
    orr.set_defaults(fn=cmd_outbox_retry)

    sub.add_parser(
        "serve", help="run the service: Slack app, scheduler, worker, outbox",
        description="Run the scheduler, the resume worker and the outbox drain, then the Slack "
        "face (it connects in the background while Slack is unreachable). SIGTERM or SIGINT "
        "stops it: in-flight runs get APPROVALD_SHUTDOWN_GRACE seconds to reach a step "
        "boundary, then what is left is cut off (exit 0); a second signal exits at once "
        "(130 after SIGINT, 143 after SIGTERM). Exit 2: a missing setting, or a token Slack "
        "refuses.").set_defaults(fn=cmd_serve)
    sb = sub.add_parser(
        "sandbox", help="the whole product locally: Slack in your browser, serve, the demos",
        description="Run a local Slack workspace (its Web API emulator and a page that shows "
        "it: the approvals channel, threads, App Home, modals, with a user switcher and a "
        "form to start demo runs) and `serve` pointed at it, in one process, on the "
        "database APPROVALD_DATABASE_URL names. The workspace is kept beside a SQLite "
        "database, so stopping and starting again resumes what was waiting. SIGTERM or "
        "SIGINT stops it.")
    sb.add_argument("--host", default="127.0.0.1",
                    help="the address the page and the emulator listen on (default "
                         "127.0.0.1); they answer to 127.0.0.1, localhost, [::1] or the IP "
                         "address a request reached, never to another DNS name")
    sb.add_argument("--port", type=port, default=8300,
                    help="the port of the page and the emulator's Web API (default 8300)")
    sb.add_argument("--slack-only", action="store_true",
                    help="run only the Slack Web API and Socket Mode emulator (tokens "
                         "xoxb-test and xapp-test), for an `approvald serve` started apart")
    sb.set_defaults(fn=cmd_sandbox)

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
    return p


class ClosedPipeSafe:
    """A text stream that goes quiet once its reader has gone (``| head -1``): the command
    finishes what it is doing (a decision, a run) and exits as it would have, its
    remaining output dropped, instead of failing with BrokenPipeError."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.gone = False

    def write(self, text: str) -> int:
        if not self.gone:
            try:
                return int(self.stream.write(text))
            except BrokenPipeError:
                self._drop()
        return len(text)

    def flush(self) -> None:
        if not self.gone:
            try:
                self.stream.flush()
            except BrokenPipeError:
                self._drop()

    def _drop(self) -> None:
        self.gone = True
        # what is still buffered (flushed again at exit) goes nowhere, silently
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, self.stream.fileno())
        finally:
            os.close(devnull)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; every error a user can meet is one line on stderr and an exit code."""
    stdout, stderr = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = ClosedPipeSafe(stdout), ClosedPipeSafe(stderr)
    try:
        return _main(argv)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        sys.stdout, sys.stderr = stdout, stderr


def _main(argv: Sequence[str] | None) -> int:
    try:
        args = build_parser().parse_args(argv)
        settings = load_settings()
        check_environment(settings)
        level = settings.log_level if args.cmd == "serve" or settings.log_level == "DEBUG" \
            else "WARNING"
        logging.basicConfig(level=level,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                            stream=sys.stderr)
        for noisy in ("alembic", "apscheduler"):  # their INFO lines are not ours to show
            logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))
        if args.cmd != "serve" and level != "DEBUG":
            # every other command prints the outcome of each run it advances: once is enough
            logging.getLogger("approvald.outcomes").setLevel(logging.CRITICAL)
        code: int = asyncio.run(args.fn(settings, args))
    except UsageError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    except (DecisionRefused, StandingRefused) as exc:
        print(f"approvald: refused: {exc}", file=sys.stderr)
        return 4
    except ApprovaldError as exc:
        print(f"approvald: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except OSError as exc:
        if exc.errno is None:
            return _internal_error(exc)
        # the system refused something (a port in use, a file that cannot be written):
        # the environment, not a bug
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"approvald: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        return _internal_error(exc)
    return code


def _internal_error(exc: Exception) -> int:
    """A bug, not a user mistake: say so in one line, log the rest (exit 70)."""
    logging.getLogger("approvald").debug("internal error", exc_info=True)
    first = (str(exc).strip().splitlines() or [""])[0]
    print(f"approvald: internal error: {type(exc).__name__}: {first} "
          "(set APPROVALD_LOG_LEVEL=DEBUG for the traceback)", file=sys.stderr)
    return 70


if __name__ == "__main__":
    sys.exit(main())
