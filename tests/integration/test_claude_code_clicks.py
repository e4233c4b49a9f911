"""``approvald hook claude-code`` run as Claude Code runs it (a process fed the event on
stdin), decided by signed Slack clicks and modal submissions on the cards an in-process
``serve`` posts from the same database (issue 39): Bash, Write, Edit and an MCP tool."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import Cli, Rows, start_approvald
from tests.integration.adapter_helpers import (
    approve_in_slack,
    audit_actions,
    card_of,
    deny_in_slack,
    edit_in_slack,
    pending_request,
)
from tests.integration.slack_harness import harness

# each hook is a process of its own, as Claude Code starts it
pytestmark = pytest.mark.slow

POLICY = """
[tools."hook:claude-code/Bash"]
approvers = ["U_ALICE"]
ttl = "30m"

[tools."hook:claude-code/Write"]
approvers = ["U_ALICE"]
ttl = "30m"

[tools."hook:claude-code/Edit"]
approvers = ["U_ALICE"]
ttl = "30m"

[tools."hook:claude-code/mcp__*"]
approvers = ["U_ALICE"]
ttl = "30m"
"""
SESSION = "5f1c0e2a-7d3b-4c1e-9a8f-2b6d4e0c9a71"
CWD = "/home/dana/shop"


class Claude:
    """Claude Code's side: starts the hook for each event, reads its answer."""

    def __init__(self, db_url: str, tmp_path: Path) -> None:
        (tmp_path / "policy.toml").write_text(POLICY)
        self.env = {**Cli(db_url, tmp_path).env(),
                    "APPROVALD_POLICY_FILE": str(tmp_path / "policy.toml"),
                    "APPROVALD_CLOCK_FILE": ""}
        self.workdir = tmp_path

    async def event(self, tool: str, tool_input: dict[str, Any], *, use: str,
                    name: str = "PreToolUse", wait: float = 30, **extra: Any) -> Any:
        ev = {"hook_event_name": name, "session_id": SESSION, "cwd": CWD,
              "transcript_path": "/tmp/t.jsonl", "permission_mode": "default",
              "tool_name": tool, "tool_input": tool_input, "tool_use_id": use, **extra}
        proc = await start_approvald(
            "hook", "claude-code", "--requested-by", "U_DANA", "--wait", str(wait),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=self.env, cwd=self.workdir)
        out, err = await asyncio.wait_for(proc.communicate(json.dumps(ev).encode()), 90)
        assert proc.returncode == 0, err.decode()
        return json.loads(out) if out.strip() else None

    async def pre(self, tool: str, tool_input: dict[str, Any], *, use: str,
                  wait: float = 30) -> tuple[str, str, dict[str, Any] | None]:
        out = (await self.event(tool, tool_input, use=use, wait=wait))["hookSpecificOutput"]
        return out["permissionDecision"], out["permissionDecisionReason"], \
            out.get("updatedInput")




async def test_the_hooks_calls_are_decided_in_slack(db_url: str, tmp_path: Path) -> None:
    claude = Claude(db_url, tmp_path)
    async with harness(db_url, tmp_path, background=False,
                       APPROVALD_POLICY_FILE=str(tmp_path / "policy.toml")) as h:
        # Bash, approved by a signed click -> allow; the card shows what a reviewer needs
        bash = {"command": "terraform apply -auto-approve", "description": "apply infra"}
        asked = asyncio.create_task(claude.pre("Bash", bash, use="toolu_b"))
        rid = await pending_request(h)
        card = json.dumps(await h.card((await card_of(h, rid)).id))
        for shown in ("terraform apply -auto-approve", CWD, SESSION, "U_DANA"):
            assert shown in card, shown
        await approve_in_slack(h, rid)
        verdict, why, updated = await asked
        assert (verdict, updated) == ("allow", None) and "approved by U_ALICE" in why
        assert await claude.event("Bash", bash, use="toolu_b", name="PostToolUse",
                                  tool_response={"stdout": "Apply complete!"}) is None

        # Edit, edited by the approver -> allow with updatedInput
        edit = {"file_path": f"{CWD}/config.py", "old_string": "DEBUG = False",
                "new_string": "DEBUG = True"}
        asked = asyncio.create_task(claude.pre("Edit", edit, use="toolu_e"))
        edited = await pending_request(h)
        assert "DEBUG = True" in json.dumps(await h.card((await card_of(h, edited)).id))
        fixed = {**edit, "new_string": "DEBUG = False  # keep it off in prod"}
        await edit_in_slack(h, edited, fixed)
        verdict, _, updated = await asked
        assert (verdict, updated) == ("allow", fixed)

        # an MCP tool, denied with a reason -> deny carrying it
        issue = {"repo": "shop/api", "title": "Rotate the production keys"}
        asked = asyncio.create_task(claude.pre("mcp__github__create_issue", issue,
                                               use="toolu_m"))
        denied = await pending_request(h)
        await deny_in_slack(h, denied, "file it in the security tracker")
        verdict, why, _ = await asked
        assert verdict == "deny" and "file it in the security tracker" in why

        # Write: past its budget it is denied naming the request; made again, it joins it
        write = {"file_path": f"{CWD}/.env.production", "content": "STRIPE_MODE=live\n"}
        verdict, why, _ = await claude.pre("Write", write, use="toolu_w1", wait=0)
        waiting = await pending_request(h)
        assert verdict == "deny" and waiting in why and "same call again" in why
        asked = asyncio.create_task(claude.pre("Write", write, use="toolu_w2"))
        await approve_in_slack(h, waiting)
        assert (await asked)[0] == "allow"
        assert len([a for a in await Rows.of(h.engine).requests() if a.tool == "Write"]) == 1

        # the audit log: each decision, with the session and the exact tool_input
        trail = await audit_actions(h, rid)
        [requested] = [e for e in trail if e["action"] == "requested"]
        assert requested["details"]["args"] == bash and SESSION in requested["details"]["task"]
        [executed] = [e for e in trail if e["action"] == "executed"]
        assert executed["details"]["result"] == {"stdout": "Apply complete!"}
        assert [e["details"]["args"] for e in await audit_actions(h, edited)
                if e["action"] == "approved"] == [fixed]
        assert any(e["action"] == "denied" and e["actor"] == "U_ALICE"
                   for e in await audit_actions(h, denied))
