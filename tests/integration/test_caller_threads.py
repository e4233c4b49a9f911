"""Run threads of callers' requests (issue 45 item 8): every auto call a hook, the MCP
gateway or an HTTP API token made posted a run thread in the ops channel (two auto ``ls``
calls made three messages). A caller's request posts nothing but its card, when a person
is asked; the operator may ask for the threads of asked requests
(``APPROVALD_CALLER_THREADS=asked``); a policy's answer never posts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from approvald.bot.api.service import webhook_keys
from approvald.bot.claude_code import ClaudeCodeHook, HookEvent
from approvald.bot.config import Settings
from approvald.runtime.runs.external import NewRequest

from tests.helpers import Rows, create_token
from tests.integration.slack_harness import CHANNEL, OPS, Harness, harness

POLICY = """
[tools."hook:claude-code/Read"]
policy = "auto"

[tools."hook:claude-code/Bash"]
approvers = ["U_ALICE"]
ttl = "30m"

[tools."api:ci-bot/status"]
policy = "auto"

[tools."api:ci-bot/deploy"]
approvers = ["U_ALICE"]
ttl = "30m"
"""


def event(tool: str, tool_input: dict[str, Any], use: str) -> HookEvent:
    return HookEvent.parse(json.dumps({
        "hook_event_name": "PreToolUse", "session_id": "s-1", "cwd": "/home/dana/shop",
        "tool_name": tool, "tool_input": tool_input, "tool_use_id": use}))


async def posted(h: Harness, channel: str) -> list[str]:
    """What the follower posts in ``channel`` once every thread had its turns."""
    slack = h.service.slack
    assert slack is not None
    slack.threads.interval = 0.0  # no pacing between posts here
    for _ in range(6):
        await slack.threads.sync_once()
    return [str(m.get("text")) for m in h.emulator.messages(channel)]


async def calls(h: Harness) -> str:
    """Two auto calls of the hook, one auto request of an API token, and one asked call of
    the hook; returns that request's approval id once its card is posted."""
    engine = h.engine
    for use in ("toolu_1", "toolu_2"):
        out = await ClaudeCodeHook(engine, event("Read", {"file_path": "README.md"}, use),
                                   requested_by="U_DANA").pre_tool_use(wait=5)
        assert out["hookSpecificOutput"]["permissionDecision"] == "allow"
    keys = webhook_keys(h.service.settings)
    assert keys is not None
    made = await create_token(engine, keys, "ci-bot",
                              created_by="test", via="test", tools="status,deploy")
    doc, _ = await engine.open_request(made.record, NewRequest(
        tool="status", args={}, requested_by="U_DANA"))
    assert doc["status"] == "approved"
    await ClaudeCodeHook(engine, event("Bash", {"command": "make release"}, "toolu_3"),
                         requested_by="U_DANA").pre_tool_use(wait=0)
    [a] = await Rows.of(engine).requests(status="pending")
    await h.service.drain.drain_once()  # serve's outbox drain posts the card
    await h.card(a.id)
    return str(a.id)


async def test_a_callers_request_posts_its_card_and_nothing_else(sqlite_url: str,
                                                                  tmp_path: Path) -> None:
    (tmp_path / "policy.toml").write_text(POLICY)
    async with harness(sqlite_url, tmp_path, background=False,
                       APPROVALD_POLICY_FILE=str(tmp_path / "policy.toml")) as h:
        await calls(h)
        assert await posted(h, OPS) == []
        [card] = await posted(h, CHANNEL)
        assert "needs approval to run Bash" in card


async def test_the_operator_may_ask_for_the_threads_of_asked_requests(
        sqlite_url: str, tmp_path: Path) -> None:
    (tmp_path / "policy.toml").write_text(POLICY)
    async with harness(sqlite_url, tmp_path, background=False,
                       APPROVALD_POLICY_FILE=str(tmp_path / "policy.toml"),
                       APPROVALD_CALLER_THREADS="asked") as h:
        approval_id = await calls(h)
        a = await h.approval(approval_id)
        # the asked request's parent (the policy's answers none), and a reply telling
        # whom it asked, until when, with a link to its card (issue 52)
        parent, asked = await posted(h, OPS)
        assert "Asked <@U_ALICE> to approve `Bash`" in asked and "|Open the request>" in asked
        assert "Claude Code" in parent, parent
        thread = await Rows.of(h.engine).thread(a.run_id)
        assert thread is not None and thread.ts is not None


def test_the_setting_takes_off_or_asked_only() -> None:
    with pytest.raises(ValueError, match="APPROVALD_CALLER_THREADS"):
        Settings(APPROVALD_CALLER_THREADS="all")
