"""``approvald hook``: the arguments of Claude Code's command hook (``hook claude-code``)
and of its place in Claude Code's settings (``hook install claude-code``, ``hook check
claude-code``); the commands themselves are :mod:`approvald.bot.hooks.command`'s. The hook
runs for every tool call: this module imports only what building its parser needs.
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from approvald.bot.cli.argtypes import Subparsers, seconds
from approvald.bot.hooks import command

DEFAULT_WAIT, MARGIN = command.DEFAULT_WAIT, command.MARGIN

if TYPE_CHECKING:
    from approvald.bot.config import Settings
    from approvald.runtime.engine import Engine


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


def claude_code(a: argparse.Namespace) -> int:
    return command.claude_code(wait=a.wait, serve=a.serve, requested_by=a.requested_by,
                               own_process=getattr(a, "own_process", False),
                               with_engine=_with_engine)


def install(a: argparse.Namespace) -> int:
    return command.install(scope=a.scope, wait=a.wait, requested_by=a.requested_by,
                           serve=a.serve, http=a.http)


def check(a: argparse.Namespace) -> int:
    return command.check(scope=a.scope)


async def _with_engine(settings: Settings, fn: Callable[[Engine], Awaitable[int]],
                       acts: bool) -> int:
    """The command line's engine, for a hook that decides in its own process (imported
    then: the hook that hands its events to serve never needs it)."""
    from approvald.bot.cli.common import with_engine

    return await with_engine(settings, fn, acts=acts)
