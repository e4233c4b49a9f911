"""``approvald hook``: the arguments of Claude Code's command hook (``hook claude-code``)
and of its place in Claude Code's settings (``hook install claude-code``, ``hook check
claude-code``); the commands themselves are :mod:`approvald.bot.hooks.command`'s (started
through :mod:`approvald.bot.launch`). And the
hook's kill switch (``hook disable|enable|status claude-code``). The hook runs for every
tool call: this module imports only what building its parser needs.
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from approvald.bot import claude_code_contract as contract
from approvald.bot import launch
from approvald.bot.cli.argtypes import Subparsers, seconds
from approvald.runtime import switches

DEFAULT_WAIT, MARGIN = contract.DEFAULT_WAIT, contract.MARGIN

if TYPE_CHECKING:
    from approvald.bot.config import Settings
    from approvald.runtime import Engine
    from approvald.store.repos.external import SwitchRecord


def register(sub: Subparsers) -> None:
    """Add ``hook claude-code``, ``hook install``, ``hook check`` and the kill switch
    (``hook disable``, ``hook enable``, ``hook status``)."""
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
    register_switch(hk)


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
    return launch.claude_code_hook(wait=a.wait, serve=a.serve, requested_by=a.requested_by,
                                   own_process=getattr(a, "own_process", False),
                                   with_engine=_with_engine)


def install(a: argparse.Namespace) -> int:
    return launch.install_claude_code_hook(scope=a.scope, wait=a.wait,
                                           requested_by=a.requested_by, serve=a.serve,
                                           http=a.http)


def check(a: argparse.Namespace) -> int:
    return launch.check_claude_code_hook(scope=a.scope)


async def _with_engine(settings: Settings, fn: Callable[[Engine], Awaitable[int]],
                       acts: bool) -> int:
    """The command line's engine, for a hook that decides in its own process (imported
    then: the hook that hands its events to serve never needs it)."""
    from approvald.bot.cli.common import with_engine

    return await with_engine(settings, fn, acts=acts)


# -- the kill switch ----------------------------------------------------------------------
ASSISTANTS = {"claude-code": switches.HOOK}  # the coding assistants' hooks with a switch
ASSISTANT = "the coding assistant whose hook it is: claude-code"


def register_switch(hk: Subparsers) -> None:
    """Add ``hook disable``, ``hook enable`` and ``hook status``: the kill switch, by form
    (:mod:`approvald.runtime.record.switches`)."""
    for verb, fn, what in (
            ("disable", cmd_disable, "switch the hook off: every call through it is denied, "
                                     "saying so, until it is switched on again (audited)"),
            ("enable", cmd_enable, "switch the hook on again (audited)")):
        p = hk.add_parser(verb, help=what)
        p.add_argument("assistant", choices=sorted(ASSISTANTS), help=ASSISTANT)
        forms = p.add_mutually_exclusive_group()
        forms.add_argument("--command", dest="forms", action="store_const",
                           const=["command"], help="only " + switches.COVERS["command"])
        forms.add_argument("--http", dest="forms", action="store_const", const=["http"],
                           help="only " + switches.COVERS["http"] + " (one person's "
                                "token: `approvald tokens revoke NAME`)")
        forms.add_argument("--all", dest="forms", action="store_const",
                           const=list(switches.FORMS), help="both (the default)")
        if verb == "disable":
            p.add_argument("--reason", help="why (told to Claude Code with each denial, "
                                            "and audited)")
        p.set_defaults(fn=fn, forms=None)
    st = hk.add_parser("status", help="which forms of the hook are switched off, by whom "
                                      "and why, and what each covers")
    st.add_argument("assistant", choices=sorted(ASSISTANTS), help=ASSISTANT)
    st.set_defaults(fn=cmd_status)


def _forms(a: argparse.Namespace) -> list[str]:
    return list(a.forms or switches.FORMS)


async def cmd_disable(s: Settings, a: argparse.Namespace) -> int:
    from approvald.bot.cli.common import operator, with_engine

    async def run(e: Engine) -> int:
        await e.switch_off(ASSISTANTS[a.assistant], _forms(a), by=operator(), via="cli",
                           reason=a.reason)
        return await _show(e, a.assistant)

    return await with_engine(s, run)


async def cmd_enable(s: Settings, a: argparse.Namespace) -> int:
    from approvald.bot.cli.common import operator, with_engine

    async def run(e: Engine) -> int:
        await e.switch_on(ASSISTANTS[a.assistant], _forms(a), by=operator(), via="cli")
        return await _show(e, a.assistant)

    return await with_engine(s, run)


async def cmd_status(s: Settings, a: argparse.Namespace) -> int:
    from approvald.bot.cli.common import with_engine

    return await with_engine(s, lambda e: _show(e, a.assistant))


async def _show(e: Engine, assistant: str) -> int:
    state = await e.face_switches(ASSISTANTS[assistant])
    for form, off in state.items():
        print(f"{form:<8} {_state(off)}\n         covers {switches.COVERS[form]}")
    if any(state.values()):
        print(f"A form that is off denies every call, saying so; `approvald hook enable "
              f"{assistant} [--command|--http]` switches it on again.")
    return 0


def _state(off: SwitchRecord | None) -> str:
    if off is None:
        return "on"
    return (f"OFF since {off.off_at:%Y-%m-%d %H:%M} UTC, by {off.off_by}"
            + (f": {off.reason}" if off.reason else ""))
