"""``approvald deploy-check``: run before a release, with ``APPROVALD_AGENTS`` naming the
agents the new release loads, against the database the running release uses. Exit 1
when a waiting run has a call the new agents could not run (a CI pipeline stops the
release there), 0 otherwise; changes that do not break a call are listed either way."""

from __future__ import annotations

import argparse
import json

from approvald.bot.cli.common import JSON, Subparsers, with_engine
from approvald.bot.config import Settings
from approvald.runtime import DeployReport, Engine


def register(sub: Subparsers) -> None:
    """``deploy-check``."""
    dc = sub.add_parser(
        "deploy-check", help="list waiting calls the agents of a new release could not run "
        "(exit 1 if any)",
        description="Load the agents as the new release would (APPROVALD_AGENTS) and list "
        "every pending or approved-not-yet-run call of a run that has not ended that they "
        "could not run: the agent or the tool is gone, or the tool's schema no longer "
        "accepts the arguments. Calls that would run under a changed policy band or changed "
        "instructions are listed too, without failing the check. Exit 1 when any call would "
        "break, 0 otherwise.")
    dc.add_argument("--json", action="store_true", help=JSON)
    dc.set_defaults(fn=cmd_deploy_check)


async def cmd_deploy_check(s: Settings, a: argparse.Namespace) -> int:
    async def go(engine: Engine) -> int:
        report = await engine.deploy_check()
        print_report(report, as_json=a.json)
        return 0 if report.ok else 1
    return await with_engine(s, go)


def print_report(report: DeployReport, *, as_json: bool) -> None:
    if as_json:
        print(json.dumps(report.to_json(), indent=2, ensure_ascii=False))
        return
    for title, items in (("breaks", report.breaks), ("changes", report.changes)):
        for f in items:
            print(f"{title[:-1] if title == 'breaks' else 'change'}: run {f.run_id} "
                  f"({f.agent} v{f.version}) approval {f.approval_id} {f.status} "
                  f"`{f.tool}`: {f.reason}")
    verdict = ("OK: nothing waiting would break" if report.ok else
               f"{len(report.breaks)} waiting call(s) would break")
    print(f"{verdict} ({report.calls_checked} calls of {report.runs_checked} runs checked, "
          f"{len(report.changes)} changed)")
