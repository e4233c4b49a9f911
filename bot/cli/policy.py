"""``approvald policy replay|check`` and ``approvald insights``: a policy change checked
against the record before it is made, and what the record says about who is asked.

Both read the audit chain after it verifies (exit 5 if it does not). ``policy replay`` and
``policy check --against-history`` exit 8 when a call a person denied, redirected or edited
would now run without asking. Arguments are shown masked, as the audit log records them.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from approvald.bot.cli.common import JSON, Subparsers, UsageError, with_engine
from approvald.bot.config import Settings
from approvald.runtime import (
    CHANGES,
    MIN_REQUESTS,
    ChainBroken,
    Change,
    ConfigError,
    Engine,
    History,
    Insights,
    PolicyFile,
    Registry,
    Replay,
    format_duration,
    load_policy_file,
    parse_duration,
)

ENV = "APPROVALD_POLICY_FILE"
SHOWN = 50  # changed requests a summary lists (--json: all of them)
OUTCOMES = ("approved", "edited", "denied", "redirected", "expired", "cancelled",
            "standing", "pending", "ran", "forbidden")
CHANGE_LABEL = {"runs_unasked": "runs without asking", "forbidden": "forbidden",
                "asks": "asks a person", "approvers": "other approvers or quorum",
                "unchanged": "unchanged"}
SINCE = ("how far back the record is read: a duration such as 30d, 12h (default 30d), or "
         "'all'")


FULL = ("verify the whole audit chain first, not only the entries after the last verified "
        "checkpoint (as `audit verify` does)")


def register(sub: Subparsers) -> None:
    """Add ``policy replay|check`` and ``insights``."""
    po = sub.add_parser("policy", help="check a new policy file against the record of "
                        "requests").add_subparsers(dest="sub", required=True,
                                                   metavar="COMMAND")
    rp = po.add_parser("replay", help="decide every request of the window again under a new "
                       "policy file, beside what happened (exit 8 if a call a person denied "
                       "or edited would run without asking)")
    rp.add_argument("file", metavar="NEW.toml", help="the policy file to try")
    rp.add_argument("--since", default="30d", help=SINCE)
    rp.add_argument("--full", action="store_true", help=FULL)
    rp.add_argument("--json", action="store_true", help=JSON + "; one per changed request")
    rp.set_defaults(fn=cmd_replay)
    ck = po.add_parser("check", help="load a policy file as serve would; with "
                       "--against-history, exit 8 if a call a person denied or edited would "
                       "run without asking under it")
    ck.add_argument("file", metavar="NEW.toml", help="the policy file to check")
    ck.add_argument("--against-history", action="store_true",
                    help="replay the record of requests under it (as policy replay does)")
    ck.add_argument("--since", default="30d", help=SINCE)
    ck.add_argument("--full", action="store_true", help=FULL)
    ck.set_defaults(fn=cmd_check)
    ins = sub.add_parser("insights", help="per tool and per rule: requests, answers, time to "
                         "decision, who decides; shadow rules' records; suggested rules")
    ins.add_argument("--since", default="30d", help=SINCE)
    ins.add_argument("--full", action="store_true", help=FULL)
    ins.add_argument("--min-requests", type=int, default=MIN_REQUESTS,
                     help="requests a suggestion needs behind it")
    ins.add_argument("--json", action="store_true", help=JSON)
    ins.set_defaults(fn=cmd_insights)


def since_of(text: str) -> timedelta | None:
    """``--since``: a duration back from now, or None for the whole record."""
    if text.strip().lower() == "all":
        return None
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise UsageError(f"--since: {exc}") from None


def window_of(since: timedelta | None) -> str:
    if since is None:
        return "the whole record"
    days = since / timedelta(days=1)
    return f"{days:g} days" if days.is_integer() else format_duration(since)


def load_new(s: Settings, engine: Engine, path: str) -> PolicyFile:
    """The new file, refused (exit 2) as ``serve`` would refuse it with these agents."""
    try:
        new = load_policy_file(path, max_ttl=s.max_ttl_value())
        Registry(engine.agent_releases(), new)  # the start-up checks of each agent's tools
    except ConfigError as exc:  # (the new file, not the one APPROVALD_POLICY_FILE names)
        raise ConfigError(str(exc).replace(f"{ENV}: ", "the new policy file: ", 1)) from None
    return new


async def _history(s: Settings, engine: Engine, since: timedelta | None,
                   full: bool) -> History | None:
    try:
        history = await engine.history(since=since, keys=s.audit_keys(),
                                       unkeyed_until=s.audit_unkeyed_until, full=full)
    except ChainBroken as exc:
        for p in exc.problems:
            print(f"audit log BROKEN: {p}")
        return None
    for p in history.problems:  # caught, and not used: the figures come from the entries
        print(f"audit log WARNING: {p}", file=sys.stderr)
    return history


async def cmd_replay(s: Settings, a: argparse.Namespace) -> int:
    since = since_of(a.since)

    async def go(engine: Engine) -> int:
        new = load_new(s, engine, a.file)
        history = await _history(s, engine, since, a.full)
        if history is None:
            return 5
        result = engine.replay_policy(history, new)
        if a.json:
            for c in result.changes:
                print(json.dumps(change_document(c), ensure_ascii=False))
        else:
            print_replay(a.file, history, result, window_of(since), listed=SHOWN)
        return 8 if result.dangerous else 0
    return await with_engine(s, go)


async def cmd_check(s: Settings, a: argparse.Namespace) -> int:
    since = since_of(a.since)

    async def go(engine: Engine) -> int:
        new = load_new(s, engine, a.file)
        print(f"{a.file}: loads (policy digest {new.digest[:16]}…)")
        if not a.against_history:
            return 0
        history = await _history(s, engine, since, a.full)
        if history is None:
            return 5
        result = engine.replay_policy(history, new)
        print_replay(a.file, history, result, window_of(since), listed=0)
        return 8 if result.dangerous else 0
    return await with_engine(s, go)


async def cmd_insights(s: Settings, a: argparse.Namespace) -> int:
    since = since_of(a.since)
    if a.min_requests < 1:
        raise UsageError("--min-requests: at least 1")

    async def go(engine: Engine) -> int:
        history = await _history(s, engine, since, a.full)
        if history is None:
            return 5
        found = engine.insights(history, window=window_of(since), min_requests=a.min_requests)
        if a.json:
            print(json.dumps(insights_document(found), indent=2, ensure_ascii=False))
        else:
            print_insights(found)
        return 0
    return await with_engine(s, go)


# -- what is printed ----------------------------------------------------------------------

def insights_document(found: Insights) -> dict[str, Any]:
    """What ``insights --json`` prints: the window, then each tool's and each rule's
    figures, the shadow rules' records and the suggestions (snippets, never applied)."""
    return {
        "window": found.window,
        "requests": found.requests,
        "tools": [t.document() for t in found.tools],
        "rules": [r.document() for r in found.rules],
        "shadow": [s.document() for s in found.shadows],
        "suggestions": [s.document() for s in found.suggestions],
    }


def change_document(c: Change) -> dict[str, Any]:
    """One changed request, as ``policy replay --json`` prints it (a line each): what
    happened (``then``, ``outcome``, who decided and why) and what the new file would do
    (``now``); ``dangerous``: it would run without asking, and a person had denied,
    redirected or edited it. Its arguments and words are shown masked, as recorded,
    through the one masking funnel."""
    r, now = c.request, c.now
    shown = r.masking()
    approvers, _, quorum = now.approval.rung(0)
    asks = now.kind == "approve_before"
    return {
        "request": r.key,
        "at": r.at.isoformat(),
        "tool": r.tool,
        "policy": r.policy_name,
        "source": r.source.subject(r.tool) if r.source.name else r.tool,
        "args": shown.data(r.shown),
        "change": c.change,
        "dangerous": c.dangerous,
        "then": {"policy": r.answer, "approvers": r.approvers if r.asked else [],
                 "quorum": r.quorum if r.asked else None, "rule": r.rule},
        "outcome": r.outcome,
        "edited": r.edited,
        "decided_by": r.decided_by,
        "reason": shown.data(r.reason),
        "now": {"policy": now.kind, "approvers": approvers if asks else [],
                "quorum": quorum if asks else None,
                "rule": now.approval.rule if now.rule is not None else None,
                "reason": shown.data(now.reason)},
        "shadow": [s.record() for s in now.shadow],
        "decided_on_masked_args": not r.opened,
    }


def table(head: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows, strict=False)]
    return ["  ".join(str(x).ljust(w) if i == 0 else str(x).rjust(w)
                      for i, (x, w) in enumerate(zip(row, widths, strict=True))).rstrip()
            for row in (head, *rows)]


def print_replay(path: str, history: History, result: Replay, window: str, *,
                 listed: int) -> None:
    seq, digest = history.head
    print(f"replayed {path} over {result.requests} requests of {window} (audit log verified: "
          f"{history.entries} entries, head {seq}:{digest[:16]}…)")
    outcomes = [o for o in OUTCOMES if any(k[1] == o for k in result.table)]
    rows = []
    for change in (*CHANGES, "unchanged"):
        counts = [result.table[(change, o)] for o in outcomes]
        rows.append([CHANGE_LABEL[change], *counts, sum(counts)])
    for line in table(["under the new file", *outcomes, "total"], rows):
        print("  " + line)
    if result.masked_only:
        print(f"  ({result.masked_only} calls run at once were decided on their masked "
              "arguments: the record holds no other copy)")
    for where, (matched, settled, agreed) in sorted(result.shadow.items()):
        rate = f"{agreed / settled:.0%}" if settled else "n/a"
        print(f"  shadow {where}: held for {matched}, people agreed on {agreed} of {settled} "
              f"({rate})")
    danger = result.dangerous
    if danger:
        print(f"DANGER: {len(danger)} calls a person denied or edited would run without "
              "asking:")
        for c in danger:
            print("  " + describe(c))
    else:
        print("OK: no call a person denied or edited would run without asking")
    others = [c for c in result.changes if not c.dangerous][:listed]
    if others:
        print(f"changed ({len(others)} of {len(result.changes) - len(danger)} shown):")
        for c in others:
            print("  " + describe(c))


def describe(c: Change) -> str:
    """One changed request in a line (its arguments masked, as recorded)."""
    doc = change_document(c)
    then = doc["then"]["policy"] if doc["then"]["policy"] != "approve_before" else \
        f"asked {', '.join(doc['then']['approvers']) or 'anyone'}"
    now = doc["now"]
    now_text = now["policy"] if now["policy"] != "approve_before" else \
        f"asks {', '.join(now['approvers']) or 'anyone'} (quorum {now['quorum']})"
    by = f" by {doc['decided_by']}" if doc["decided_by"] else ""
    why = f" ({doc['reason']})" if doc["reason"] else ""
    rule = f" [{now['rule']}]" if now["rule"] else ""
    args = json.dumps(doc["args"], ensure_ascii=False)
    return (f"{doc['at'][:19]} {doc['request'][:12]} {doc['policy']} {args}: {then}, "
            f"{doc['outcome']}{by}{why} -> {now_text}{rule}")


def _seconds(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.0f}s" if x < 90 else f"{x / 60:.1f}m" if x < 5400 else f"{x / 3600:.1f}h"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def print_insights(found: Insights) -> None:
    print(f"{found.requests} requests in {found.window}")
    for title, stats in (("per tool", found.tools), ("per rule", found.rules)):
        if not stats:
            continue
        print(f"\n{title}:")
        rows = []
        for st in stats:
            d = st.document()
            rows.append([st.name, st.requests, st.asked, _pct(d["approve_rate"]),
                         _pct(d["edit_rate"]), _pct(d["deny_rate"]), _pct(d["expire_rate"]),
                         _seconds(d["median_seconds"]), _seconds(d["p90_seconds"])])
        for line in table(["name", "requests", "asked", "approve", "edit", "deny", "expire",
                           "median", "p90"], rows):
            print("  " + line)
        for st in stats:
            d = st.document()
            if d["top_denial_reasons"]:
                reasons = "; ".join(f"{r['reason']} ({r['count']})"
                                    for r in d["top_denial_reasons"])
                print(f"  {st.name}: denied for: {reasons}")
            if d["deciders"]:
                print(f"  {st.name}: decided by " + ", ".join(
                    f"{k} ({n})" for k, n in d["deciders"].items()))
            if d["asked_of"]:
                print(f"  {st.name}: asked of " + ", ".join(
                    f"{k} ({n})" for k, n in d["asked_of"].items()))
    if found.shadows:
        print("\nshadow rules (recorded, never enforced):")
        for sh in found.shadows:
            d = sh.document()
            would = ", ".join(f"{k} {n}" for k, n in d["would"].items())
            print(f"  {sh.where} ({sh.when or 'the entry'}): held for {sh.matched} "
                  f"(would: {would}); people agreed on {sh.agreed} of {sh.settled} "
                  f"({_pct(d['agreement'])})")
    if found.suggestions:
        print("\nsuggestions (paste into the policy file to apply; nothing is applied):")
        for sg in found.suggestions:
            print(f"  {sg.text}")
            for line in sg.snippet.splitlines():
                print(f"      {line}")
