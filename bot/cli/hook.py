"""``approvald hook claude-code``: Claude Code's PreToolUse/PostToolUse command hook
(the contract: :mod:`approvald.bot.hooks.claude_code`); ``approvald hook disable|enable|
status claude-code``: its kill switch."""

from __future__ import annotations

import argparse
import getpass
import json
import logging
import sys

from approvald.bot.cli.common import (
    Subparsers,
    UsageError,
    operator,
    seconds,
    slack_user,
    with_engine,
)
from approvald.bot.config import Settings
from approvald.bot.hooks.claude_code import (
    DEFAULT_WAIT,
    PRE,
    ClaudeCodeHook,
    HookEvent,
    fail_closed,
)
from approvald.runtime import switches
from approvald.runtime.engine import Engine
from approvald.store.repos.external import SwitchRecord

log = logging.getLogger("approvald.hook")


def register(sub: Subparsers) -> None:
    """Add ``hook claude-code``."""
    hk = sub.add_parser("hook", help="permission hooks of coding assistants").add_subparsers(
        dest="sub", required=True, metavar="ASSISTANT")
    cc = hk.add_parser(
        "claude-code", help="Claude Code's PreToolUse/PostToolUse command hook: reads the "
        "event on stdin; for PreToolUse prints allow or deny (the operator's policy for "
        "hook:claude-code/TOOL, and a person's decision where it asks); fails closed")
    cc.add_argument("--requested-by", metavar="USER",
                    help="the Slack user the calls are made for (U…): they may not approve "
                         "their own calls; without it, the one APPROVALD_SLACK_USERS maps the "
                         "local user to")
    cc.add_argument("--wait", type=seconds, default=DEFAULT_WAIT, metavar="SECONDS",
                    help="how long PreToolUse waits for a decision before it denies, saying "
                         f"the request is waiting (default {DEFAULT_WAIT:g}; keep it under "
                         "the hook's timeout in Claude Code's settings, 60 s by default)")
    cc.set_defaults(fn=cmd_claude_code)
    register_switch(hk)


def requester(s: Settings, given: str | None) -> str:
    """``--requested-by``, else the Slack user APPROVALD_SLACK_USERS maps the local user
    to; neither: refused (the hook then denies, saying so)."""
    if given:
        return slack_user("--requested-by", given)
    local = getpass.getuser()
    found = s.slack_user_of(local)
    if found is None:
        raise UsageError(f"no Slack user for the local user {local!r}: give --requested-by "
                         f"U…, or map it in APPROVALD_SLACK_USERS ({local}=U…)")
    return found


async def cmd_claude_code(s: Settings, a: argparse.Namespace) -> int:
    text = sys.stdin.read()
    pre = True
    try:
        event = HookEvent.parse(text)
        pre = event.event == PRE
        requested_by = requester(s, a.requested_by)

        async def decide(engine: Engine) -> int:
            hook = ClaudeCodeHook(engine, event, requested_by=requested_by)
            if pre:
                print(json.dumps(await hook.pre_tool_use(wait=a.wait)))
            else:
                await hook.post_tool_use()
            return 0

        return await with_engine(s, decide, acts=pre)
    except Exception as exc:  # fail closed: whatever went wrong is a deny, never an allow
        log.debug("the hook could not decide", exc_info=True)
        if pre:
            print(json.dumps(fail_closed(f"{type(exc).__name__}: {exc}"
                                         if not str(exc) else str(exc))))
            return 0
        print(f"approvald: the call's result was not recorded: {exc}", file=sys.stderr)
        return 1


# -- the kill switch ----------------------------------------------------------------------
ASSISTANTS = {"claude-code": switches.HOOK}  # the coding assistants' hooks with a switch
ASSISTANT = "the coding assistant whose hook it is: claude-code"


def register_switch(hk: Subparsers) -> None:
    """Add ``hook disable``, ``hook enable`` and ``hook status``: the kill switch, by form
    (:mod:`approvald.runtime.switches`)."""
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
    async def run(e: Engine) -> int:
        await e.switch_off(ASSISTANTS[a.assistant], _forms(a), by=operator(), via="cli",
                           reason=a.reason)
        return await _show(e, a.assistant)

    return await with_engine(s, run)


async def cmd_enable(s: Settings, a: argparse.Namespace) -> int:
    async def run(e: Engine) -> int:
        await e.switch_on(ASSISTANTS[a.assistant], _forms(a), by=operator(), via="cli")
        return await _show(e, a.assistant)

    return await with_engine(s, run)


async def cmd_status(s: Settings, a: argparse.Namespace) -> int:
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
