"""The real Claude Code CLI gated over HTTP: its hooks are ``type: http`` against serve's
``POST /v1/hooks/claude-code``, with a bearer token scoped to that face read from the
environment (issue 45). Decided in Slack like the command hook's; and when serve cannot
answer (gone, or failing on what it was sent), Claude Code never runs the call."""

from __future__ import annotations

import asyncio
import json
import socket
import uuid
from typing import Any

import pytest

from tests.claude_code.claude import HOOK_FAILED, ClaudeCode, nested
from tests.claude_code.conftest import hook_token, request_for, serve_url
from tests.claude_code.fake_anthropic import say, tool_use
from tests.integration.adapter_helpers import approve_in_slack, card_of, deny_in_slack
from tests.integration.slack_harness import Harness

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]



def bash(command: str) -> dict[str, str]:
    return {"command": command, "description": "the test's command"}


async def http_claude(claude: ClaudeCode, serve: Harness, **install: Any) -> None:
    """This test's Claude Code with the HTTP hook installed and a token of its own."""
    name = f"laptop-{uuid.uuid4().hex[:8]}"
    claude.env["APPROVALD_HOOK_TOKEN"] = await hook_token(serve, name)
    claude.install(http=serve_url(serve), **install)


async def test_decided_in_slack_over_http(claude: ClaudeCode, serve: Harness) -> None:
    log, forbidden = claude.marker("auto.log"), claude.marker("forbidden")
    approved, denied = claude.marker("approved"), claude.marker("denied")
    await http_claude(claude, serve)
    claude.fake.script(
        tool_use("Bash", bash(f"echo auto >> {log}"), id="toolu_auto"),
        tool_use("Bash", bash(f"git push || touch {forbidden}"), id="toolu_forbidden"),
        tool_use("Bash", bash(f"touch {approved}"), id="toolu_approved"),
        tool_use("Bash", bash(f"touch {denied}"), id="toolu_denied"),
        say("done"))
    run = asyncio.create_task(claude.run())
    rid = await request_for(serve, str(approved))
    card = json.dumps(await serve.card((await card_of(serve, rid)).id))
    assert f"touch {approved}" in card and "U_DANA" in card
    await approve_in_slack(serve, rid)
    rid = await request_for(serve, str(denied))
    await deny_in_slack(serve, rid, "not on a Friday")
    (await run).check()
    fake = claude.fake
    assert log.read_text() == "auto\n"
    assert not forbidden.exists()
    assert "pushes go through CI" in fake.tool_result_text("toolu_forbidden")
    assert approved.exists()
    assert not denied.exists()
    assert "not on a Friday" in fake.tool_result_text("toolu_denied")


async def test_a_deeply_nested_input_is_denied_by_approvald(
        claude: ClaudeCode, serve: Harness) -> None:
    marker = claude.marker("deep")
    await http_claude(claude, serve, wait=5)
    # a free-form MCP argument takes any JSON: 2 KB of brackets
    claude.fake.script(tool_use("mcp__marker__record",
                                {"marker": str(marker), "payload": nested(1000)}),
                       say("ok"))
    (await claude.run(mcp=True)).check()
    assert not marker.exists()
    said = claude.fake.tool_result_text()
    # denied by approvald's answer, not by Claude Code giving up on a failed hook
    assert HOOK_FAILED not in said and "approvald" in said, said


async def test_a_huge_write_is_denied_by_approvald(claude: ClaudeCode, serve: Harness) -> None:
    written = claude.marker("huge.txt")
    await http_claude(claude, serve, wait=5)
    claude.fake.script(tool_use("Write", {"file_path": str(written),
                                          "content": "x" * 1_100_000}),
                       say("ok"))
    (await claude.run()).check()
    assert not written.exists()
    said = claude.fake.tool_result_text()
    assert HOOK_FAILED not in said and "approvald" in said, said


def closed_port() -> int:
    """A loopback port nothing listens on (serve stopped)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_serve_stopped_the_call_never_runs(claude: ClaudeCode) -> None:
    marker = claude.marker("unreachable")
    claude.env["APPROVALD_HOOK_TOKEN"] = "apd_whatever"
    claude.install(http=f"http://127.0.0.1:{closed_port()}")
    claude.fake.script(tool_use("Bash", bash(f"touch {marker}")), say("ok"))
    (await claude.run()).check()
    # the hook is installed with onFailure "block": the call is blocked, not run
    assert not marker.exists()
    assert HOOK_FAILED in claude.fake.tool_result_text()



async def test_the_command_hook_handing_to_a_stopped_serve_denies(claude: ClaudeCode) -> None:
    """The command hook's fast path (``--serve``): serve not there is approvald's deny,
    in time, not a failed hook."""
    marker = claude.marker("handed-off")
    claude.env["APPROVALD_HOOK_TOKEN"] = "apd_whatever"
    claude.install(serve=f"http://127.0.0.1:{closed_port()}", wait=2)
    claude.fake.script(tool_use("Bash", bash(f"touch {marker}")), say("ok"))
    (await claude.run()).check()
    assert not marker.exists()
    said = claude.fake.tool_result_text()
    assert HOOK_FAILED not in said and "connection refused" in said, said


async def test_the_command_hook_handing_to_serve(claude: ClaudeCode, serve: Harness) -> None:
    """``--serve``: serve decides what the command hook hands it, as it decides its own
    HTTP hook's calls."""
    log, forbidden = claude.marker("handoff.log"), claude.marker("handoff-forbidden")
    claude.env["APPROVALD_HOOK_TOKEN"] = await hook_token(
        serve, f"laptop-{uuid.uuid4().hex[:8]}")
    claude.install(serve=serve_url(serve))
    claude.fake.script(
        tool_use("Bash", bash(f"echo auto >> {log}"), id="toolu_auto"),
        tool_use("Bash", bash(f"git push || touch {forbidden}"), id="toolu_forbidden"),
        say("done"))
    (await claude.run()).check()
    assert log.read_text() == "auto\n" and not forbidden.exists()
    assert "pushes go through CI" in claude.fake.tool_result_text("toolu_forbidden")
