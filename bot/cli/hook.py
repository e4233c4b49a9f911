"""``approvald hook``: Claude Code's command hook (``hook claude-code``; the contract is
:mod:`approvald.bot.hooks.contract`, the decision :mod:`approvald.bot.hooks.claude_code`),
and its place in Claude Code's settings (``hook install claude-code``, ``hook check
claude-code``: :mod:`approvald.bot.hooks.settings_file`).

The hook runs for every tool call, so this module imports only what building its parser
needs. The hook's process starts its clock and its watchdog first, then reads the event
(bytes, decoded as UTF-8 whatever the locale says), then either hands it to a running
``serve`` (``--serve URL``: the standard library only, milliseconds) or decides here
(importing the engine and opening the database). Whatever happens, it answers within
``--wait`` plus the margin: the decision, or a deny saying why; never an allow it did
not decide, never an exit status Claude Code reads as "go ahead".
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TYPE_CHECKING

from approvald.bot.cli.argtypes import Subparsers, UsageError, seconds, slack_user
from approvald.bot.hooks.contract import (
    DEFAULT_WAIT,
    HTTP_MARGIN,
    MARGIN,
    PRE,
    HookEvent,
    fail_closed,
)
from approvald.bot.hooks.process import Answer, read_event

if TYPE_CHECKING:
    from approvald.bot.config import Settings

# an event after the call that could not be recorded: a line on stderr, and this status
# (Claude Code shows it; the call has run already)
NOT_RECORDED = 1


def register(sub: Subparsers) -> None:
    """Add ``hook claude-code``, ``hook install`` and ``hook check``."""
    hk = sub.add_parser("hook", help="permission hooks of coding assistants").add_subparsers(
        dest="sub", required=True, metavar="COMMAND")
    cc = hk.add_parser(
        "claude-code", help="Claude Code's PreToolUse/PostToolUse command hook: reads the "
        "event on stdin; for PreToolUse prints allow or deny (the operator's policy for "
        "hook:claude-code/TOOL, and a person's decision where it asks); fails closed, "
        f"within --wait + {MARGIN:g} seconds whatever happens")
    who = cc.add_mutually_exclusive_group()
    who.add_argument("--requested-by", metavar="USER",
                     help="the Slack user the calls are made for (U…): they may not approve "
                          "their own calls; without it, the one APPROVALD_SLACK_USERS maps "
                          "the local user to")
    who.add_argument("--serve", metavar="URL",
                     help="hand the event to the approvald serve at URL (its /v1 listener) "
                          "instead of opening the database here: milliseconds instead of a "
                          "second; the token in $APPROVALD_HOOK_TOKEN (made with --face "
                          "hook:claude-code) names who the calls are for; serve not "
                          "answering is a deny")
    cc.add_argument("--wait", type=seconds, default=DEFAULT_WAIT, metavar="SECONDS",
                    help="how long PreToolUse waits for a decision before it denies, saying "
                         f"the request is waiting (default {DEFAULT_WAIT:g}); the hook "
                         f"answers within it plus {MARGIN:g} s, so give the hook a timeout "
                         "above that in Claude Code's settings (hook install does)")
    cc.set_defaults(standalone=claude_code)

    inst = hk.add_parser(
        "install", help="write approvald's hooks into Claude Code's settings (or merge them "
        "into what is there): PreToolUse, PostToolUse and PostToolUseFailure, each with the "
        "absolute path of this installation's approvald (or serve's URL), a timeout that "
        "fits --wait, and onFailure block; prints what it wrote")
    inst.add_argument("assistant", choices=["claude-code"], metavar="claude-code",
                      help="the assistant (claude-code)")
    _where(inst, "write")
    how = inst.add_mutually_exclusive_group()
    how.add_argument("--http", metavar="URL",
                     help="HTTP hooks calling the approvald serve at URL (its /v1 listener) "
                          "with the token in $APPROVALD_HOOK_TOKEN, instead of the command")
    how.add_argument("--serve", metavar="URL",
                     help="command hooks that hand each event to the approvald serve at URL "
                          "(hook claude-code --serve), instead of opening the database")
    how.add_argument("--requested-by", metavar="USER",
                     help="the command hook's --requested-by (a shared project file leaves "
                          "it out: APPROVALD_SLACK_USERS maps each local user)")
    inst.add_argument("--wait", type=seconds, default=DEFAULT_WAIT, metavar="SECONDS",
                      help=f"the PreToolUse hook's wait (default {DEFAULT_WAIT:g}); its "
                           f"timeout is the wait plus {MARGIN:g} s, plus room to start")
    inst.set_defaults(standalone=install)

    chk = hk.add_parser(
        "check", help="say what is wrong with approvald's hooks in Claude Code's settings (the "
        "user's and this project's): a command not found or not executable, no onFailure "
        "block, a timeout the wait does not fit in, an event without the hook, an HTTP "
        "hook without its token; exit 1 if anything is")
    chk.add_argument("assistant", choices=["claude-code"], metavar="claude-code",
                     help="the assistant (claude-code)")
    _where(chk, "check")
    chk.set_defaults(standalone=check)


def _where(p: argparse.ArgumentParser, verb: str) -> None:
    files = p.add_mutually_exclusive_group()
    files.add_argument("--project", dest="scope", action="store_const", const="project",
                       help=f"{verb} this project's .claude/settings.json"
                            + (" (the default)" if verb == "write" else
                               " and .claude/settings.local.json"))
    if verb == "write":
        files.add_argument("--local", dest="scope", action="store_const", const="local",
                           help="write this project's .claude/settings.local.json (yours, "
                                "not committed)")
    files.add_argument("--user", dest="scope", action="store_const", const="user",
                       help=f"{verb} your own ~/.claude/settings.json")


def install(a: argparse.Namespace) -> int:
    """``hook install claude-code``: merge approvald's hooks into the settings file."""
    from approvald.bot.hooks import settings_file as sf

    if a.requested_by:
        slack_user("--requested-by", a.requested_by)
    path = {"user": sf.user_file(), "local": sf.project_files()[1]}.get(
        a.scope or "", sf.project_files()[0])
    hooks = sf.Hooks(wait=a.wait, requested_by=a.requested_by, serve=a.serve, http=a.http)
    if a.http or a.serve:
        from approvald.bot.hooks.handoff import HandoffFailed, Serve

        try:
            Serve.parse(a.http or a.serve, token="-")
        except HandoffFailed as exc:
            raise UsageError(str(exc).replace("--serve", "--http" if a.http else "--serve")
                             ) from None
    try:
        before = sf.load(path)
        after = sf.merge(before, hooks)
        if after == before:
            print(f"approvald: {path} has approvald's hooks already; nothing changed")
            return 0
        sf.write(path, after)
    except sf.SettingsError as exc:
        raise UsageError(f"approvald: {exc}") from None
    print(f"approvald: wrote approvald's hooks into {path}:")
    print(json.dumps(hooks.all(), indent=2, ensure_ascii=False))
    if a.http or a.serve:
        print(f"Set {sf.TOKEN_VARIABLE} in the environment Claude Code runs in (a token made "
              "with `approvald tokens create NAME --face hook:claude-code --requested-by "
              "U…`).")
    return 0


def check(a: argparse.Namespace) -> int:
    """``hook check claude-code``: what is wrong with the installed hooks (exit 1 if any)."""
    from approvald.bot.hooks import settings_file as sf

    paths = {"user": [sf.user_file()], "project": list(sf.project_files())}.get(
        a.scope or "", [sf.user_file(), *sf.project_files()])
    try:
        files = [(path, sf.load(path)) for path in paths if path.exists()]
    except sf.SettingsError as exc:
        print(f"approvald: {exc}", file=sys.stderr)
        return 1
    print("approvald: Claude Code's settings read: "
          + (", ".join(str(p) for p, _ in files) or f"none ({', '.join(map(str, paths))})"))
    findings = sf.check(files)
    for f in findings:
        print(f"{'problem' if f.problem else 'ok'}: {f.text}")
    return 1 if any(f.problem for f in findings) else 0


def claude_code(a: argparse.Namespace) -> int:
    """The hook's process (see the module docstring); its exit status."""
    started = time.monotonic()
    answer = Answer(deadline=started + a.wait + MARGIN, fallback=json.dumps(fail_closed(
        f"no decision within {a.wait + MARGIN:g} s (--wait {a.wait:g} + {MARGIN:g}); is the "
        "database (or serve) answering?")))
    answer.watch(own_process=getattr(a, "own_process", False))
    kind = PRE  # until the event says otherwise: an event it cannot read is denied
    try:
        raw = read_event()
        event = HookEvent.read(raw)
        kind = event.event
        if kind != PRE:  # nothing to decide: record what ran, in the margin's time
            answer.otherwise("approvald: the call's result was not recorded: no answer "
                             f"within {MARGIN:g} s", code=NOT_RECORDED, to_stderr=True)
            answer.sooner(started + MARGIN)
        if a.serve:
            return _hand_to_serve(a, raw, event, answer, started)
        return _decide_here(a, event, answer, started)
    except BaseException as exc:  # fail closed: whatever went wrong is a deny
        import logging

        logging.getLogger("approvald.hook").debug("the hook could not decide", exc_info=True)
        return _undecided(answer, kind, str(exc) or type(exc).__name__)


def _undecided(answer: Answer, kind: str, why: str) -> int:
    """Say that the event was not decided (a deny) or not recorded; the exit status."""
    if kind == PRE:
        answer.give(json.dumps(fail_closed(why)))
        return 0
    if answer.give(f"approvald: the call's result was not recorded: {why}",
                   stream=sys.stderr, code=NOT_RECORDED):
        return NOT_RECORDED
    return 0  # it was, before what failed after


def _hand_to_serve(a: argparse.Namespace, raw: bytes, event: HookEvent, answer: Answer,
                   started: float) -> int:
    from approvald.bot.hooks.handoff import Serve  # only on this path

    serve = Serve.parse(a.serve)
    # serve answers within the wait it is given plus its own margin: it is given what is
    # left of the hook's wait, and not answering by then (a second more) is a deny
    wait = max(0.0, started + a.wait - time.monotonic())
    deadline = min(answer.deadline - 0.5, time.monotonic() + wait + HTTP_MARGIN + 1.0)
    said = serve.post(raw, kind=event.event, wait=wait, deadline=deadline)
    answer.give(json.dumps(said) if said is not None else "")
    return 0


def _decide_here(a: argparse.Namespace, event: HookEvent, answer: Answer,
                 started: float) -> int:
    import asyncio  # the decision path's imports: only on it

    from approvald.bot.config import load_settings
    from approvald.bot.wiring import check_environment

    settings = load_settings()
    check_environment(settings)
    requested_by = requester(settings, a.requested_by)

    async def run() -> int:
        work = asyncio.ensure_future(_decide(settings, a, event, requested_by, answer,
                                             started))
        # a little before the watchdog, so that the deny comes from here
        done, _ = await asyncio.wait({work}, timeout=answer.deadline - time.monotonic() - 0.5)
        if done:
            return work.result()
        # stuck where a cancellation does not reach (a statement waiting in the database
        # driver's thread): answer now; the watchdog ends the process if tidying up hangs
        work.cancel()
        budget = f"--wait {a.wait:g} + {MARGIN:g}" if event.event == PRE else "its margin"
        return _undecided(answer, event.event, f"no answer within "
                          f"{answer.deadline - started:g} s ({budget}); is the database "
                          "answering?")

    return asyncio.run(run())


async def _decide(settings: Settings, a: argparse.Namespace, event: HookEvent,
                  requested_by: str, answer: Answer, started: float) -> int:
    from approvald.bot.cli.common import with_engine
    from approvald.bot.hooks.claude_code import ClaudeCodeHook
    from approvald.runtime.engine import Engine

    pre = event.event == PRE

    async def decide(engine: Engine) -> int:
        hook = ClaudeCodeHook(engine, event, requested_by=requested_by,
                              slack=settings.slack_configured)
        if pre:
            waited = time.monotonic() - started
            answer.give(json.dumps(await hook.pre_tool_use(wait=max(0.0, a.wait - waited))))
        else:
            await hook.post_tool_use()
            answer.give("")
        return 0

    return await with_engine(settings, decide, acts=pre)


def requester(s: Settings, given: str | None) -> str:
    """``--requested-by``, else the Slack user APPROVALD_SLACK_USERS maps the local user
    to; neither: refused (the hook then denies, saying so)."""
    import getpass

    if given:
        return slack_user("--requested-by", given)
    local = getpass.getuser()
    found = s.slack_user_of(local)
    if found is None:
        raise UsageError(f"no Slack user for the local user {local!r}: give --requested-by "
                         f"U…, or map it in APPROVALD_SLACK_USERS ({local}=U…)")
    return found
