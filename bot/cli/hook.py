"""``approvald hook claude-code``: Claude Code's PreToolUse/PostToolUse command hook
(the contract: :mod:`approvald.bot.hooks.claude_code`)."""

from __future__ import annotations

import argparse
import getpass
import json
import logging
import sys

from approvald.bot.cli import hook_switch
from approvald.bot.cli.common import Subparsers, UsageError, seconds, slack_user, with_engine
from approvald.bot.config import Settings
from approvald.bot.hooks.claude_code import (
    DEFAULT_WAIT,
    PRE,
    ClaudeCodeHook,
    HookEvent,
    fail_closed,
)
from approvald.runtime.engine import Engine

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
    hook_switch.register(hk)  # hook disable|enable|status: the kill switch


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
