"""``approvald serve``, ``sandbox`` and ``mcp-proxy``: the long-running processes (built
and run by :mod:`bot.serve` and :mod:`bot.launch`).

The ``mcp`` SDK is imported only when ``mcp-proxy`` runs, so ``approvald`` without the
``mcp`` extra still works (and that command says what to install).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from approvald.bot.cli.common import Subparsers, UsageError, port
from approvald.bot.config import Settings
from approvald.runtime import ApprovaldError, InvalidIdentity, normalize_user_id

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable


def register(sub: Subparsers) -> None:
    """Add ``serve``, ``sandbox`` and ``mcp-proxy``."""
    sub.add_parser(
        "serve", help="run the service: Slack app, scheduler, worker, outbox",
        description="Run the scheduler, the resume worker and the outbox drain, then the Slack "
        "face (it connects in the background while Slack is unreachable). SIGTERM or SIGINT "
        "stops it: in-flight runs get APPROVALD_SHUTDOWN_GRACE seconds to reach a step "
        "boundary, then what is left is cut off (exit 0); a second signal exits at once "
        "(130 after SIGINT, 143 after SIGTERM). Exit 2: a missing setting, or a token Slack "
        "refuses. It runs on uvloop where it is installed (APPROVALD_EVENT_LOOP)."
    ).set_defaults(fn=cmd_serve, loop_factory=serve_loop)

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

    mp = sub.add_parser(
        "mcp-proxy", help="serve an MCP server's tools over stdio, each call gated by the "
        "policy file",
        description="Start the MCP server COMMAND ARGS... and serve its tools to the MCP "
        "client on stdin/stdout. Each tools/call is gated by APPROVALD_POLICY_FILE (the "
        "tool's [tools.NAME] entry and its rules): auto calls pass through, forbidden ones "
        "are a tool error with the reason, and approve_before calls wait for a decision in "
        "Slack (posted by `approvald serve` on the same database), then run with the "
        "approved arguments. Every call is recorded and audited as a request of agent "
        "external:mcp.NAME.")
    mp.add_argument("--name", required=True,
                    help="the gateway's name (a-z, 0-9, '.', '_', '-'): its requests are "
                         "made as agent external:mcp.NAME, and `approvald tokens revoke "
                         "mcp.NAME` switches it off")
    mp.add_argument("--requested-by", metavar="USER",
                    help="the Slack user id of the person the MCP client acts for (shown on "
                         "cards; they may not approve their own calls); default mcp:NAME")
    mp.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND ARGS",
                    help="the MCP server to launch (stdio), after --")
    mp.set_defaults(fn=cmd_mcp_proxy)


def serve_loop(s: Settings) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """What makes ``serve``'s event loop (None: asyncio's own): APPROVALD_EVENT_LOOP."""
    from approvald.bot.serve import event_loop

    return event_loop(s.event_loop)[1]


async def cmd_serve(s: Settings, a: argparse.Namespace) -> int:
    from approvald.bot.serve import serve

    return await serve(s)


async def cmd_sandbox(s: Settings, a: argparse.Namespace) -> int:
    from approvald.bot import launch

    if a.slack_only:
        try:
            await launch.slack_only_sandbox(host=a.host, port=a.port)
        except OSError as exc:
            raise UsageError(f"approvald sandbox: cannot listen on {a.host}:{a.port}: "
                             f"{exc.strerror or exc}") from None
        return 0
    return await launch.sandbox(s, host=a.host, port=a.port)


async def cmd_mcp_proxy(s: Settings, a: argparse.Namespace) -> int:
    from approvald.bot import launch

    command = list(a.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise ApprovaldError("mcp-proxy: name the MCP server to launch after --, e.g. "
                             "approvald mcp-proxy --name files -- npx server-filesystem /tmp")
    requested_by = f"mcp:{a.name}"
    if a.requested_by:
        try:
            requested_by = normalize_user_id(a.requested_by)
        except InvalidIdentity as exc:
            raise ApprovaldError(f"--requested-by: {exc}") from None
    return await launch.mcp_proxy(s, name=a.name, requested_by=requested_by, command=command)
