"""``approvald approvals list|show|approve|deny|edit|redirect|resolve|sweep``: approval
requests seen and decided from the command line."""

from __future__ import annotations

import argparse
import copy
import json
import sys
from typing import Any, cast

from approvald.bot import documents
from approvald.bot.cli import standing
from approvald.bot.cli.common import (
    APPROVAL_ID,
    JSON,
    Handler,
    Subparsers,
    UsageError,
    acting_as,
    count,
    describe,
    exit_code,
    follow,
    iso,
    out,
    slack_user,
    with_engine,
)
from approvald.bot.config import Settings
from approvald.runtime import (
    MAX_DEPTH,
    REQUEST_OUTCOMES,
    Decision,
    Engine,
    OutcomeName,
    TooDeep,
    Verdict,
    binding,
    deadline,
    id_help,
    outcome_of,
    outcome_words,
    parse_caller_json,
    shown_args,
)
from approvald.store.records import ApprovalRecord

DECISIONS = (
    ("approve", "approve a request as a Slack user"),
    ("deny", "deny a request; the model receives the reason"),
    ("edit", "replace a request's arguments (an approval too, unless the policy says edits = "
     "\"propose\")"),
    ("redirect", "do not run the call; the model receives your guidance instead and re-plans"),
    ("resolve", "answer an \"outcome unknown\" or a \"cannot run\" question"),
)


def register(sub: Subparsers) -> None:
    """Add ``approvals`` and its subcommands."""
    ap = sub.add_parser("approvals", help="list and decide approval requests").add_subparsers(
        dest="sub", required=True, metavar="COMMAND")
    al = ap.add_parser("list", help="pending (or all) approval requests, oldest first")
    al.add_argument("--status", default="pending", metavar="OUTCOME",
                    choices=[n.value for n in REQUEST_OUTCOMES],
                    help="only requests with this outcome, named as every view and the "
                         "audit log name it (default pending; "
                         + ", ".join(n.value for n in REQUEST_OUTCOMES[1:]) + ")")
    al.add_argument("--all", action="store_true", help="every status")
    al.add_argument("--run", metavar="RUN_ID",
                    help=id_help("only the requests of this run: its id"))
    al.add_argument("--limit", type=count, default=100, metavar="N",
                    help="show the oldest N (default 100); stderr says when more are left out")
    al.add_argument("--json", action="store_true", help=JSON)
    al.add_argument("--ids", action="store_true", help="print only ids, oldest first")
    al.set_defaults(fn=cmd_list)
    ash = ap.add_parser("show", help="one request: exact arguments, digest, editor, packet, "
                        "votes")
    ash.add_argument("id", help=APPROVAL_ID)
    ash.add_argument("--json", action="store_true", help=JSON)
    ash.set_defaults(fn=cmd_show)
    for verdict, what in DECISIONS:
        c = ap.add_parser(verdict, help=what + (" (several ids: each decided on its own, "
                                                "one refusal stopping no other)"
                                                if verdict in ("approve", "deny") else ""))
        if verdict in ("approve", "deny"):
            c.add_argument("id", nargs="+", help=id_help("approval request ids, each"))
        else:
            c.add_argument("id", help=APPROVAL_ID)
        c.add_argument("--as", dest="as_user", required=True, metavar="USER",
                       help="the Slack user id you act as (checked against the policy)")
        c.add_argument("--no-resume", action="store_true",
                       help="record the decision only; leave resuming to `approvald serve`")
        if verdict != "resolve":
            c.add_argument("--digest", metavar="PREFIX",
                           help="decide only if the arguments are still the ones with this "
                                "digest (as `approvals show` printed it)")
        if verdict == "deny":
            c.add_argument("--reason", required=True, help="why (the model receives it)")
        elif verdict == "approve":
            c.add_argument("--reason", help="why (recorded in the audit log)")
            standing.add_grant_options(c)
        elif verdict == "redirect":
            c.add_argument("--guidance", required=True, metavar="TEXT",
                           help="what the agent should do instead (the model receives it)")
        elif verdict == "edit":
            given = c.add_mutually_exclusive_group(required=True)
            given.add_argument("--args", help="ALL the new arguments, as a JSON object: it "
                               "replaces the arguments whole (one left out is not kept); to "
                               "change some fields only, use --set")
            given.add_argument("--set", action="append", metavar="FIELD=VALUE",
                               help="change one argument and keep the others (repeat for "
                                    "more; FIELD may be a dotted path into an object; VALUE "
                                    "is read as JSON, else taken as a string: --set "
                                    "amount_cents=2000 --set 'note=second charge only'); "
                                    "the edit is bound to the arguments it was made on")
            c.add_argument("--reason", help="why (recorded in the audit log)")
        else:
            c.add_argument("--outcome", required=True,
                           choices=["retry", "mark_done", "abort", "replan"],
                           help="outcome unknown: retry (run the call once more), mark_done "
                                "(it happened) or abort (it did not, and is not to be "
                                "retried); cannot run (an approved call the deployed agent "
                                "cannot run): replan (the model reads why and re-plans) or "
                                "abort (the run ends)")
            c.add_argument("--reason", help="why (recorded in the audit log)")
        c.set_defaults(fn=decide_command(verdict))

    ap.add_parser("sweep", help="expire, escalate and remind now (what serve does on a "
                  "schedule)").set_defaults(fn=cmd_sweep)


async def cmd_list(s: Settings, a: argparse.Namespace) -> int:
    async def go(engine: Engine) -> int:
        status = None if a.all else OutcomeName(a.status)
        run_id = None if a.run is None else (await engine.resolve_run(a.run)).id
        rows, total = await engine.oldest_approvals(outcome=status, run_id=run_id,
                                                    limit=a.limit)
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
            print(list_line(r))
        return 0
    return await with_engine(s, go)


def list_line(r: ApprovalRecord) -> str:
    """A request as a line of ``approvals list``: its outcome's name, its deadline."""
    return (f"{r.id}  {outcome_of(r).value:<10} {r.tool:<20} run {r.run_id[:12]}  "
            f"expires {expiry(r)}  {json.dumps(shown_args(r), ensure_ascii=False)[:80]}")


def expiry(a: ApprovalRecord) -> str:
    """A request's deadline as ``list`` and ``show`` print it: ``-`` for a question, which
    has none."""
    when = deadline(a)
    return "-" if when is None else when.strftime("%Y-%m-%d %H:%M:%S")


async def cmd_show(s: Settings, a: argparse.Namespace) -> int:
    async def go(engine: Engine) -> int:
        r = await engine.approval(a.id)
        doc = documents.approval_document(r)
        # a vote counts only for the arguments it was cast on
        doc["votes"] = [{"actor": v.actor, "verdict": v.verdict, "via": v.via,
                         "at": v.at.isoformat(), "digest": binding.shown(v.digest),
                         "counts": v.digest == r.effective_digest}
                        for v in await engine.votes(r.id)]
        # the row against the audit chain: a forged decider is never shown as the record
        doc["disagrees_with_audit_log"] = await engine.approval_check(r.id)
        if a.json:
            out(doc)
            return 0
        shown = {**doc, "expires_at": expiry(r)}
        for key in ("id", "run_id", "kind", "tool", "outcome", "approvers", "quorum",
                    "approvals", "requested_by", "requested_at", "expires_at", "decided_by",
                    "verdict", "reason", "digest"):
            print(f"{key:>13}: {shown[key]}")
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
        for d in doc["disagrees_with_audit_log"]:
            print(f"{'WARNING':>13}: this row disagrees with the audit log: {d}")
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


def decide_command(verdict: str) -> Handler:
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
            actor = acting_as(as_user)
            return await with_engine(s, lambda engine: standing.grant(engine, a, actor),
                                     acts=True)

        async def go(engine: Engine) -> int:
            args = None
            expect = getattr(a, "digest", None)
            if verdict == "edit" and a.set:
                # the fields changed on the arguments as they stand now (shown masked: a
                # sensitive value left alone keeps its real value, as decide reads an
                # edit), bound to them: a concurrent edit makes this one refused, not merged
                current = await engine.approval(a.id)
                args = with_fields(shown_args(current), a.set)
                expect = expect or binding.shown(current.effective_digest)
            elif verdict == "edit":
                try:
                    args = parse_caller_json(a.args, max_depth=MAX_DEPTH)
                except TooDeep as exc:
                    raise UsageError(f"--args is {exc}") from None
                except ValueError as exc:
                    raise UsageError(f"--args is not valid JSON: {exc}") from None
                # (`approvals show` printed sensitive values masked: one given back as
                # printed keeps its real value, as decide reads an edit)
            v = cast(Verdict, a.outcome if verdict == "resolve" else verdict)
            actor = acting_as(as_user)
            # a redirect's guidance travels where a denial's reason does
            reason = a.guidance if verdict == "redirect" else getattr(a, "reason", None)
            decision = await engine.decide(a.id, actor=actor, verdict=v, reason=reason,
                                           args=args, expect_digest=expect)
            rec = decision.approval
            print(decided_line(decision, as_user))
            if decision.repeated:
                # the same decision was already made (say the process died right after
                # committing it): it stands, and the run may still need resuming
                if a.no_resume:
                    return 0
                outcome = await follow(engine, await engine.advance(rec.run_id),
                                       patience=60.0)
                print(describe(outcome))
                return exit_code(outcome)
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


def with_fields(args: dict[str, Any], assignments: list[str]) -> dict[str, Any]:
    """``args`` with each ``FIELD=VALUE`` of ``--set`` applied (a dotted FIELD reaches into
    objects; VALUE is JSON, else a string); the tool's schema checks the whole later."""
    out = copy.deepcopy(args)
    for item in assignments:
        field, sep, raw = item.partition("=")
        path = field.strip().split(".")
        if not sep or not all(path):
            raise UsageError(f"--set {item!r}: expected FIELD=VALUE (FIELD an argument's "
                             "name, or a dotted path into an object)")
        try:
            value: Any = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        here = out
        for i, key in enumerate(path[:-1]):
            nxt = here.get(key)
            if not isinstance(nxt, dict):
                raise UsageError(f"--set {item!r}: {'.'.join(path[:i + 1])} is not an object "
                                 "in the request's arguments")
            here = nxt
        here[path[-1]] = value
    return out


async def decide_batch(engine: Engine, a: argparse.Namespace, as_user: str,
                       verdict: str) -> int:
    """``approvals approve ID ID…``: each request decided on its own (its own checks and
    compare-and-set), a line for each, then the runs they made ready resumed. Exit 0 when
    every one was decided as asked, 4 when any was refused (the others stand)."""
    from approvald.runtime import Target

    try:
        outcomes = await engine.decide_each([Target(i) for i in a.id],
                                            actor=acting_as(as_user),
                                            verdict="approve" if verdict == "approve"
                                            else "deny",
                                            reason=getattr(a, "reason", None))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    ready: list[str] = []
    for o in outcomes:
        if o.decision is None:
            print(f"approval {o.approval_id}: refused ({o.code}): {o.refused}")
            continue
        d = o.decision
        print(decided_line(d, as_user))
        if d.run_ready and d.approval.run_id not in ready:
            ready.append(d.approval.run_id)
    done = sum(o.ok for o in outcomes)
    print(f"{done} of {len(outcomes)} decided; {len(outcomes) - done} refused")
    if not a.no_resume:
        for run_id in ready:
            print(describe(await engine.advance(run_id)))
    return 0 if done == len(outcomes) else 4


def decided_line(d: Decision, as_user: str) -> str:
    """The line that tells what a decision by ``as_user`` came to, as the audit log
    records it (a repeat, a vote, a proposal, an approval with edits)."""
    rec = d.approval
    if d.repeated:
        return (f"approval {rec.id}: already {outcome_words(rec).words} by {rec.decided_by} at "
                f"{iso(rec.decided_at)}; the decision stands (recorded as repeated)")
    if d.outcome == "voted":
        return (f"approval {rec.id}: {d.approvals} of {d.quorum} approvals on arguments "
                f"{binding.short(rec.effective_digest)}")
    if d.outcome == "edited":
        return (f"approval {rec.id}: arguments replaced by {as_user} (now "
                f"{binding.short(rec.effective_digest)}); someone else must approve them")
    return f"approval {rec.id}: {outcome_words(rec).words} by {as_user}"


async def cmd_sweep(s: Settings, a: argparse.Namespace) -> int:
    async def go(engine: Engine) -> int:
        result = await engine.sweep()
        print(f"{len(result.expired)} expired, {len(result.escalated)} escalated, "
              f"{len(result.reminded)} reminders queued")
        for run_id in sorted(result.runs_ready):
            print(describe(await engine.advance(run_id)))
        return 0
    return await with_engine(s, go, acts=True)
