"""``approvald hook claude-code --serve URL`` (issue 45, item 5): the command hook hands
the event to a running serve over HTTP instead of opening the database, and prints serve's
answer; serve stopped, hanging, or refusing the token is a deny, never an allow. A process
per event, as Claude Code starts it, against serve's listener in this process."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from approvald.bot.claude_code_contract import HTTP_MARGIN

from tests.helpers import Cli, silent_server, start_approvald
from tests.integration.adapter_helpers import approve_in_slack, audit_actions, pending_request
from tests.integration.slack_harness import Harness, harness
from tests.integration.test_claude_code_http import POLICY, hook_token

# each event is a process of its own, as Claude Code starts it
pytestmark = pytest.mark.slow


class Claude:
    """Claude Code's side: the command hook, handing its events to serve."""

    def __init__(self, tmp_path: Path, url: str, token: str) -> None:
        # nothing of approvald's settings: the hook needs serve's URL and its token only
        self.env = {**{k: v for k, v in Cli("sqlite://", tmp_path).env().items()
                       if not k.startswith("APPROVALD_")}, "APPROVALD_HOOK_TOKEN": token}
        self.url, self.workdir = url, tmp_path

    async def event(self, tool: str, tool_input: dict[str, Any], *, use: str,
                    name: str = "PreToolUse", wait: float = 20, **extra: Any
                    ) -> tuple[int, Any, str]:
        ev = {"hook_event_name": name, "session_id": "s-handoff", "cwd": "/home/dana/shop",
              "tool_name": tool, "tool_input": tool_input, "tool_use_id": use, **extra}
        proc = await start_approvald(
            "hook", "claude-code", "--serve", self.url, "--wait", str(wait),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=self.env, cwd=self.workdir)
        out, err = await asyncio.wait_for(proc.communicate(json.dumps(ev).encode()), 90)
        assert proc.returncode is not None
        return proc.returncode, json.loads(out) if out.strip() else None, err.decode()

    async def pre(self, tool: str, tool_input: dict[str, Any], *, use: str,
                  wait: float = 20) -> tuple[str, str]:
        code, out, err = await self.event(tool, tool_input, use=use, wait=wait)
        assert code == 0, err
        said = out["hookSpecificOutput"]
        return said["permissionDecision"], said["permissionDecisionReason"]


def url_of(h: Harness) -> str:
    assert h.service.slack is not None
    return f"http://127.0.0.1:{h.service.slack.port}"


async def test_serve_decides_what_the_command_hook_hands_it(
        sqlite_url: str, tmp_path: Path) -> None:
    (tmp_path / "policy.toml").write_text(POLICY)
    async with harness(sqlite_url, tmp_path, background=False,
                       APPROVALD_POLICY_FILE=str(tmp_path / "policy.toml")) as h:
        claude = Claude(tmp_path, url_of(h), await hook_token(h))
        assert (await claude.pre("Bash", {"command": "git status"}, use="t1"))[0] == "allow"
        verdict, why = await claude.pre("Bash", {"command": "git push origin main"}, use="t2")
        assert verdict == "deny" and "pushes go through CI" in why
        # a person decides: the hook waits on serve, and hears the approval
        asked = asyncio.create_task(claude.pre("Bash", {"command": "make deploy"}, use="t3"))
        rid = await pending_request(h)
        await approve_in_slack(h, rid)
        verdict, why = await asked
        assert verdict == "allow" and "approved by U_ALICE" in why
        code, out, err = await claude.event("Bash", {"command": "make deploy"}, use="t3",
                                            name="PostToolUse",
                                            tool_response={"stdout": "deployed"})
        assert (code, out, err) == (0, None, "")
        [executed] = [e for e in await audit_actions(h, rid) if e["action"] == "executed"]
        assert executed["details"]["result"] == {"stdout": "deployed"}

        # a token serve does not know: a deny naming the 401, never an allow
        claude.env["APPROVALD_HOOK_TOKEN"] = "apd_" + "x" * 43
        verdict, why = await claude.pre("Bash", {"command": "git status"}, use="t4")
        assert verdict == "deny" and "answered 401" in why
        del claude.env["APPROVALD_HOOK_TOKEN"]
        verdict, why = await claude.pre("Bash", {"command": "git status"}, use="t5")
        assert verdict == "deny" and "APPROVALD_HOOK_TOKEN is not set" in why


async def test_serve_stopped_or_hanging_is_a_deny_in_time(tmp_path: Path) -> None:
    claude = Claude(tmp_path, "http://127.0.0.1:1", "apd_" + "y" * 43)
    verdict, why = await claude.pre("Bash", {"command": "ls"}, use="t1")
    assert verdict == "deny" and "connection refused" in why
    code, out, err = await claude.event("Bash", {"command": "ls"}, use="t1",
                                        name="PostToolUse", tool_response={})
    assert code == 1 and out is None and "not recorded" in err and "connection refused" in err
    with silent_server() as port:
        claude.url = f"http://127.0.0.1:{port}"
        started = time.monotonic()
        verdict, why = await claude.pre("Bash", {"command": "ls"}, use="t2", wait=1)
        took = time.monotonic() - started
    assert verdict == "deny" and "did not answer: no answer in time" in why
    # serve answers within the wait it is given plus its margin: the hook stops waiting
    # for it a second after that (plus what starting a process costs on a busy machine)
    assert took < 1 + HTTP_MARGIN + 1 + 3, f"answered after {took:.1f} s"
