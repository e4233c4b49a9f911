"""``approvald standing list|show|grant|revoke`` and ``approvals approve ID --standing 30m``:
standing approvals from the command line (see :mod:`runtime.approvals.standing`)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

from approvald.bot.cli.common import (
    Handler,
    Subparsers,
    UsageError,
    acting_as,
    describe,
    exit_code,
    slack_user,
    with_engine,
)
from approvald.bot.config import Settings
from approvald.runtime import Actor, Engine, Scope, binding, id_help, parse_duration, scope_for
from approvald.store.repos.standing import StandingRecord

STANDING_ID = id_help("its id")


def register(sub: Subparsers) -> None:
    """Add ``standing list|show|grant|revoke``."""
    st = sub.add_parser("standing", help="standing approvals: calls like an approved one run "
                        "without a card for a while").add_subparsers(
        dest="sub", required=True, metavar="COMMAND")
    ls = st.add_parser("list", help="live standing approvals (--all: every one)")
    ls.add_argument("--all", action="store_true", help="revoked and expired ones too")
    ls.add_argument("--json", action="store_true", help="a JSON array")
    ls.set_defaults(fn=cmd_list)
    show = st.add_parser("show", help="one standing approval")
    show.add_argument("id", help=STANDING_ID)
    show.add_argument("--json", action="store_true", help="a JSON document")
    show.set_defaults(fn=cmd_show)
    for name, fn, what in (("grant", do_grant, "add your grant (a quorum tool needs more than "
                            "one before it covers anything)"),
                           ("revoke", do_revoke, "revoke now: the next matching call asks")):
        c = st.add_parser(name, help=what)
        c.add_argument("id", help=STANDING_ID)
        c.add_argument("--as", dest="as_user", required=True, metavar="USER",
                       help="the Slack user id you act as")
        if name == "revoke":
            c.add_argument("--reason", help="why (recorded in the audit log)")
        c.set_defaults(fn=acting(fn))


def add_grant_options(c: argparse.ArgumentParser) -> None:
    """``approvals approve``'s options for granting a standing approval as it approves."""
    c.add_argument("--standing", metavar="DURATION",
                   help="also let calls like this one run without a card for DURATION "
                        "(15m..8h, at most the tool's max_standing)")
    c.add_argument("--scope", choices=["exact", "fields", "condition"], default="exact",
                   help="with --standing: which calls: this exact call (default), the same "
                        "values for --fields, or a CEL --when condition")
    c.add_argument("--fields", metavar="A,B", help="--scope fields: the arguments to match")
    c.add_argument("--when", metavar="EXPR", help="--scope condition: a CEL condition over "
                   "args, e.g. \"args.amount_cents <= 5000\"")


def document(s: StandingRecord, now: datetime) -> dict[str, Any]:
    """The stable ``--json`` form of a standing approval."""
    scope = Scope.model_validate_json(s.scope)
    return {"id": s.id, "tool": s.tool, "state": s.state(now), "scope": scope.describe(),
            "scope_detail": binding.shown_details(
                scope.model_dump(mode="json", exclude_defaults=True)),
            "rule": s.rule, "approvers": s.approvers_value(), "quorum": s.quorum,
            "grants": s.grants_value(), "granted_on": s.granted_on, "uses": s.uses,
            "created_at": s.created_at.isoformat(), "expires_at": s.expires_at.isoformat(),
            "revoked_at": s.revoked_at.isoformat() if s.revoked_at else None,
            "revoked_by": s.revoked_by}


def line(s: StandingRecord, now: datetime) -> str:
    scope = Scope.model_validate_json(s.scope).describe()
    return (f"{s.id}  {s.tool}  {s.state(now)}  until {s.expires_at.isoformat()}  "
            f"grants {len(s.grants_value())}/{s.quorum} ({', '.join(s.grants_value())})  "
            f"uses {s.uses}  {scope}")


async def grant(engine: Engine, a: argparse.Namespace, actor: Actor) -> int:
    """``approvals approve ID --as U --standing 30m [--scope …]``."""
    try:
        window = parse_duration(a.standing)
    except ValueError as exc:
        raise UsageError(f"--standing: {exc}") from None
    request = await engine.approval(a.id)
    fields = [f.strip() for f in (a.fields or "").split(",") if f.strip()]
    try:
        scope = scope_for(request, a.scope, fields=fields, when=a.when)
    except ValueError as exc:
        raise UsageError(f"--scope {a.scope}: {exc}") from None
    standing, decision = await engine.grant_standing(request.id, actor=actor, window=window,
                                                     scope=scope)
    print(f"approval {request.id}: {decision.outcome} by {actor.id}")
    print(f"standing approval {standing.id}: {standing.status} "
          f"({len(standing.grants_value())} of {standing.quorum} grants) until "
          f"{standing.expires_at.isoformat()}: {scope.describe()}")
    if decision.run_ready and not a.no_resume:
        outcome = await engine.advance(request.run_id)
        print(describe(outcome))
        return exit_code(outcome)
    return 0


async def cmd_list(s: Settings, a: argparse.Namespace) -> int:
    async def go(engine: Engine) -> int:
        rows = await engine.standing_grants(live_only=not a.all)
        now = engine.now()
        if a.json:
            print(json.dumps([document(r, now) for r in rows], indent=2))
        else:
            for r in rows:
                print(line(r, now))
        return 0
    return await with_engine(s, go)


async def cmd_show(s: Settings, a: argparse.Namespace) -> int:
    async def go(engine: Engine) -> int:
        doc = document(await engine.standing_grant(a.id), engine.now())
        if a.json:
            print(json.dumps(doc, indent=2))
        else:
            for key, value in doc.items():
                print(f"{key:>12}: {value}")
        return 0
    return await with_engine(s, go)


def acting(fn: Callable[[Engine, argparse.Namespace, Actor], Awaitable[int]]) -> Handler:
    """A command done as the Slack user ``--as`` names."""
    async def cmd(s: Settings, a: argparse.Namespace) -> int:
        actor = acting_as(slack_user("--as", a.as_user))
        return await with_engine(s, lambda engine: fn(engine, a, actor), acts=True)
    return cmd


async def do_grant(engine: Engine, a: argparse.Namespace, actor: Actor) -> int:
    s = await engine.add_standing_grant(a.id, actor=actor)
    print(f"standing approval {s.id}: {s.status} ({len(s.grants_value())} of "
          f"{s.quorum} grants)")
    return 0


async def do_revoke(engine: Engine, a: argparse.Namespace, actor: Actor) -> int:
    s = await engine.revoke_standing(a.id, actor=actor, reason=a.reason)
    print(f"standing approval {s.id}: revoked by {s.revoked_by} after {s.uses} uses")
    return 0
