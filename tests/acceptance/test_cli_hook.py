"""``approvald hook claude-code`` as Claude Code runs it: a process fed the event on stdin,
whose stdout is the decision (exit 0), deciding through the operator's policy file; and
failing closed when it cannot decide."""

from __future__ import annotations

import getpass
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import Cli, not_in_a_running_loop, run_subprocess, warm_approvald

# each test starts approvald hook as a process of its own, as Claude Code does (forked from
# the warm approvald, tests/zygote.py: the same command, its imports done once)
pytestmark = pytest.mark.slow

POLICY = """
[tools."hook:claude-code/Read"]
policy = "auto"

[tools."hook:claude-code/Bash"]
approvers = ["U_ALICE"]
ttl = "30m"

[[tools."hook:claude-code/Bash".rules]]
when = 'args.command.startsWith("git push")'
policy = "forbidden"
reason = "pushes go through CI"
"""


def claude(cli: Cli, tool: str, tool_input: dict[str, Any], *, name: str = "PreToolUse",
           use: str = "toolu_01", response: Any = None, who: tuple[str, ...] = (
               "--requested-by", "U_DANA"), **env: str) -> tuple[int, Any, str]:
    """Run the hook as Claude Code does: (exit code, stdout's JSON or None, stderr)."""
    not_in_a_running_loop(("hook", "claude-code"))
    ev = _event(cli, tool, tool_input, name=name, use=use, response=response)
    done = subprocess.run([warm_approvald(), "hook", "claude-code", *who,
                           "--wait", "0"], input=json.dumps(ev), env=cli.env(**env),
                          cwd=cli.workdir, text=True, capture_output=True, timeout=60,
                          check=False)
    return done.returncode, json.loads(done.stdout) if done.stdout.strip() else None, done.stderr


async def aclaude(cli: Cli, tool: str, tool_input: dict[str, Any], *,
                  name: str = "PreToolUse", use: str = "toolu_01", response: Any = None,
                  who: tuple[str, ...] = ("--requested-by", "U_DANA"),
                  **env: str) -> tuple[int, Any, str]:
    """:func:`claude` awaited: the calling loop (a ``serve`` on it) runs on meanwhile."""
    ev = _event(cli, tool, tool_input, name=name, use=use, response=response)
    done = await run_subprocess([warm_approvald(), "hook", "claude-code", *who, "--wait", "0"],
                                env=cli.env(**env), cwd=cli.workdir, input=json.dumps(ev))
    return done.returncode, json.loads(done.stdout) if done.stdout.strip() else None, done.stderr


def _event(cli: Cli, tool: str, tool_input: dict[str, Any], *, name: str, use: str,
           response: Any) -> dict[str, Any]:
    return {"hook_event_name": name, "session_id": "s-1", "cwd": str(cli.workdir),
            "transcript_path": "/tmp/t.jsonl", "tool_name": tool, "tool_input": tool_input,
            "tool_use_id": use, "tool_response": response}


def decision(out: Any) -> tuple[str, str]:
    h = out["hookSpecificOutput"]
    return h["permissionDecision"], h["permissionDecisionReason"]


@pytest.fixture
def policy(cli: Cli) -> dict[str, str]:
    path = cli.workdir / "policy.toml"
    path.write_text(POLICY)
    return {"APPROVALD_POLICY_FILE": str(path)}


def test_auto_forbidden_and_a_pending_call_approved_from_another_shell(
        cli: Cli, policy: dict[str, str]) -> None:
    code, out, _ = claude(cli, "Read", {"file_path": "/etc/hosts"}, **policy)
    assert code == 0 and decision(out)[0] == "allow"
    code, out, _ = claude(cli, "Bash", {"command": "git push -f"}, **policy)
    assert code == 0 and decision(out)[0] == "deny" and "pushes go through CI" in decision(out)[1]
    # asks: still pending at its budget (--wait 0), it denies naming the request
    code, out, _ = claude(cli, "Bash", {"command": "make release"}, **policy)
    verdict, why = decision(out)
    [approval] = cli.json("approvals", "list", "--json")
    assert code == 0 and verdict == "deny" and "waiting for approval: request" in why
    assert f"approvald approvals approve {approval['id']} --as U…" in why, why
    cli.ok("approvals", "approve", approval["id"], "--as", "U_ALICE")
    # the same call again joins it, now approved: allowed; what ran is its execution
    code, out, _ = claude(cli, "Bash", {"command": "make release"}, use="toolu_02", **policy)
    assert code == 0 and decision(out)[0] == "allow", out
    code, out, err = claude(cli, "Bash", {"command": "make release"}, name="PostToolUse",
                            use="toolu_02", response={"stdout": "ok"}, **policy)
    assert (code, out, err) == (0, None, "")
    exported = [json.loads(x) for x in cli.ok("audit", "export").splitlines()]
    executed = [e for e in exported if e["action"] == "executed"]
    # (the Read was allowed, and its start recorded; no PostToolUse reported it here)
    assert [(e["args"], e["details"]["result"]) for e in executed] == [
        ({"command": "make release"}, {"stdout": "ok"})]


def test_it_fails_closed(cli: Cli, tmp_path: Path, policy: dict[str, str]) -> None:
    unreachable = {**policy, "APPROVALD_DATABASE_URL":
                   f"sqlite+aiosqlite:///{tmp_path}/no-such-dir/a.db"}
    code, out, _ = claude(cli, "Bash", {"command": "ls"}, **unreachable)
    verdict, why = decision(out)
    assert code == 0 and verdict == "deny" and "could not decide this call" in why
    done = subprocess.run([warm_approvald(), "hook", "claude-code", "--requested-by", "U_DANA"],
                          input="{not json", env=cli.env(**policy), cwd=cli.workdir,
                          text=True, capture_output=True, timeout=60, check=False)
    assert done.returncode == 0
    verdict, why = decision(json.loads(done.stdout))
    assert verdict == "deny" and "not JSON" in why
    # settings it cannot use: a deny naming the variable (exit 0; any status but 0 or 2
    # would let the call go ahead)
    code, out, _ = claude(cli, "Bash", {"command": "ls"}, APPROVALD_PORT="eighty", **policy)
    verdict, why = decision(out)
    assert code == 0 and verdict == "deny" and "APPROVALD_PORT" in why


def test_a_shared_settings_file_names_nobody_the_local_user_is_mapped(
        cli: Cli, policy: dict[str, str]) -> None:
    """Issue 39: a project's .claude/settings.json, shared by the team, runs the hook
    without --requested-by; APPROVALD_SLACK_USERS says who each local user is."""
    me = getpass.getuser()
    code, out, _ = claude(cli, "Bash", {"command": "make release"}, who=(), **policy)
    verdict, why = decision(out)
    assert code == 0 and verdict == "deny" and "APPROVALD_SLACK_USERS" in why and me in why
    assert cli.json("approvals", "list", "--json") == []
    mapped = {**policy, "APPROVALD_SLACK_USERS": f"someone=U_BOB,{me}=u_dana"}
    code, out, _ = claude(cli, "Bash", {"command": "make release"}, who=(), **mapped)
    assert code == 0 and decision(out)[0] == "deny"  # waiting, asked for Dana
    [approval] = cli.json("approvals", "list", "--json")
    assert approval["requested_by"] == "U_DANA"
    code, out, _ = claude(cli, "Bash", {"command": "ls"}, who=(),
                          **{**policy, "APPROVALD_SLACK_USERS": "dana"})
    assert code == 0 and decision(out)[0] == "deny" and "APPROVALD_SLACK_USERS" in decision(out)[1]
