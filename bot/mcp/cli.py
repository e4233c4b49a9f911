"""``approvald mcp-proxy --name NAME -- COMMAND ARGS...``: the MCP gateway's command.

The ``mcp`` SDK is imported only when the command runs, so ``approvald`` without the
``approvald[mcp]`` extra still works (and this command says what to install).
"""

from __future__ import annotations

import argparse
import shlex

from approvald.bot.config import Settings
from approvald.bot.wiring import build_engine, open_database
from approvald.runtime.errors import ApprovaldError, ConfigError
from approvald.runtime.identity import InvalidIdentity, normalize_user_id
from approvald.store.wakeups import Wakeups


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``mcp-proxy`` to the ``approvald`` parser's subcommands."""
    p = sub.add_parser(
        "mcp-proxy", help="serve an MCP server's tools over stdio, each call gated by the "
        "policy file",
        description="Start the MCP server COMMAND ARGS... and serve its tools to the MCP "
        "client on stdin/stdout. Each tools/call is gated by APPROVALD_POLICY_FILE (the "
        "tool's [tools.NAME] entry and its rules): auto calls pass through, forbidden ones "
        "are a tool error with the reason, and approve_before calls wait for a decision in "
        "Slack (posted by `approvald serve` on the same database), then run with the "
        "approved arguments. Every call is recorded and audited as a request of agent "
        "external:mcp.NAME.")
    p.add_argument("--name", required=True,
                   help="the gateway's name (a-z, 0-9, '.', '_', '-'): its requests are "
                        "made as agent external:mcp.NAME, and `approvald tokens revoke "
                        "mcp.NAME` switches it off")
    p.add_argument("--requested-by", metavar="USER",
                   help="the Slack user id of the person the MCP client acts for (shown on "
                        "cards; they may not approve their own calls); default mcp:NAME")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND ARGS",
                   help="the MCP server to launch (stdio), after --")
    p.set_defaults(fn=mcp_proxy)


async def mcp_proxy(s: Settings, a: argparse.Namespace) -> int:
    command = list(a.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise ApprovaldError("mcp-proxy: name the MCP server to launch after --, e.g. "
                             "approvald mcp-proxy --name files -- npx server-filesystem /tmp")
    try:
        from approvald.bot.mcp.gateway import Gateway
        from approvald.bot.mcp.proxy import Proxy
    except ImportError as exc:
        raise ConfigError(f"mcp-proxy needs the MCP SDK: pip install 'approvald[mcp]' "
                          f"({exc})") from None
    requested_by = f"mcp:{a.name}"
    if a.requested_by:
        try:
            requested_by = normalize_user_id(a.requested_by)
        except InvalidIdentity as exc:
            raise ApprovaldError(f"--requested-by: {exc}") from None
    db = await open_database(s)
    engine = build_engine(s, db)
    await engine.note_policy()
    # on PostgreSQL, serve hears of new requests, and this process of decisions, at once
    # (on SQLite both sides poll)
    def woken(kind: str, key: str) -> None:
        if kind == "decided" and key:
            engine.external.wake(key)

    wakeups = Wakeups(db, origin=engine.owner, on_signal=woken)
    engine.on_opened(lambda approval_id: wakeups.publish("opened", approval_id))
    engine.on_outbox(lambda: wakeups.publish("outbox"))
    try:
        await wakeups.start()
        gateway = Gateway(engine, name=a.name, requested_by=requested_by,
                          server=shlex.join(command))
        await Proxy(gateway, command).serve()
    finally:
        await wakeups.close()
        await db.close()
    return 0
