"""The faces that run as processes of their own, as the command line starts them.

``bot/cli/`` parses arguments and hands over here, as ``approvald serve`` hands over to
:mod:`bot.serve`: the command line is a face like the others, and no face imports another
(they meet in the runtime, and are put together only at the top of ``bot/``). Each face is
imported when its command runs, and so is everything else this module uses: ``approvald
hook claude-code`` runs for every tool call and loads nothing it does not need (importing
this costs nothing), and ``approvald`` works without the ``mcp`` extra (``mcp-proxy`` says
what to install).
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from approvald.bot.config import Settings
    from approvald.bot.hooks.command import WithEngine


# -- the sandbox ----------------------------------------------------------------------------

async def slack_only_sandbox(*, host: str, port: int) -> None:
    """The Slack emulator alone (``approvald sandbox --slack-only``), until stopped."""
    from approvald.bot.sandbox.server import run_forever

    await run_forever(host=host, port=port)


async def sandbox(s: Settings, *, host: str, port: int) -> int:
    """The sandbox workspace: an emulated Slack with approvald serving it."""
    from approvald.bot.sandbox.workspace import run_sandbox

    return await run_sandbox(s, host=host, port=port)


# -- the MCP gateway ------------------------------------------------------------------------

async def mcp_proxy(s: Settings, *, name: str, requested_by: str, command: list[str]) -> int:
    """``approvald mcp-proxy``: the gateway in front of the MCP server ``command`` launches,
    over stdio, until its client goes away."""
    from approvald.bot.install import install_command
    from approvald.bot.wiring import build_engine, open_database
    from approvald.runtime import ConfigError
    from approvald.store.wakeups import Wakeups

    try:
        from approvald.bot.mcp.gateway import Gateway
        from approvald.bot.mcp.proxy import Proxy
    except ImportError as exc:
        raise ConfigError(f"mcp-proxy needs the MCP SDK: {install_command('mcp')} "
                          f"({exc})") from None
    db = await open_database(s)
    engine = build_engine(s, db)
    await engine.note_policy()

    # on PostgreSQL, serve hears of new requests, and this process of decisions, at once
    # (on SQLite both sides poll)
    def woken(kind: str, key: str) -> None:
        if kind == "decided" and key:
            engine.wake_request(key)

    wakeups = Wakeups(db, origin=engine.process, on_signal=woken)
    engine.on_opened(lambda approval_id: wakeups.publish("opened", approval_id))
    engine.on_outbox(lambda: wakeups.publish("outbox"))
    try:
        await wakeups.start()
        gateway = Gateway(engine, name=name, requested_by=requested_by,
                          server=shlex.join(command))
        await Proxy(gateway, command).serve()
    finally:
        await wakeups.close()
        await db.close()
    return 0


# -- Claude Code's command hook -------------------------------------------------------------

def claude_code_hook(*, wait: float, serve: str | None, requested_by: str | None,
                     own_process: bool, with_engine: WithEngine) -> int:
    """``approvald hook claude-code``: the hook's process; its exit status."""
    from approvald.bot.hooks import command

    return command.claude_code(wait=wait, serve=serve, requested_by=requested_by,
                               own_process=own_process, with_engine=with_engine)


def install_claude_code_hook(*, scope: str | None, wait: float, requested_by: str | None,
                             serve: str | None, http: str | None) -> int:
    """``approvald hook install claude-code``."""
    from approvald.bot.hooks import command

    return command.install(scope=scope, wait=wait, requested_by=requested_by, serve=serve,
                           http=http)


def check_claude_code_hook(*, scope: str | None) -> int:
    """``approvald hook check claude-code``."""
    from approvald.bot.hooks import command

    return command.check(scope=scope)
