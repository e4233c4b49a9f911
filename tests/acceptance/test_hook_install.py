"""``approvald hook install claude-code`` and ``approvald hook check claude-code`` (issue
45, item 4): the hooks are written with this installation's absolute path, so Claude Code
finds them without the virtualenv on its PATH, with ``"onFailure": "block"`` on each, for
every event, merged into the settings already there; and ``check`` names what is wrong
with a configuration (the one the docs used to show among them)."""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import APPROVALD, Cli

EVENTS = ("PreToolUse", "PostToolUse", "PostToolUseFailure")
# what docs/how-to/claude-code.md showed before: `approvald` found on PATH (127 in a
# virtualenv), no onFailure, --wait 50 in a 60 s timeout, no PostToolUseFailure timeout
OLD_DOCS = {"hooks": {
    "PreToolUse": [{"matcher": "*", "hooks": [{"type": "command", "timeout": 60,
                    "command": "approvald hook claude-code --requested-by U_DANA --wait 50"}]}],
    "PostToolUse": [{"matcher": "*", "hooks": [{"type": "command",
                     "command": "approvald hook claude-code --requested-by U_DANA"}]}]}}
MINE = {"permissions": {"allow": ["Bash(git status)"]}, "env": {"FOO": "bar"},
        "hooks": {"PreToolUse": [{"matcher": "Bash", "hooks": [
                      {"type": "command", "command": "~/bin/lint-shell"}]}],
                  "Stop": [{"hooks": [{"type": "command", "command": "say done"}]}]}}


def ok(cli: Cli, *args: str, **env: str) -> str:
    done = cli(*args, **env)
    assert done.returncode == 0, (done.stdout, done.stderr)
    return done.stdout


def settings(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))  # type: ignore[no-any-return]


def ours(doc: dict[str, Any], event: str) -> list[dict[str, Any]]:
    return [h for g in doc["hooks"][event] for h in g["hooks"]
            if "claude-code" in h.get("command", h.get("url", ""))]


def test_install_merges_into_the_projects_settings_and_twice_changes_nothing(
        cli: Cli) -> None:
    path = cli.workdir / ".claude" / "settings.json"
    path.parent.mkdir()
    mine = json.loads(json.dumps(MINE))
    mine["hooks"]["PreToolUse"].append(OLD_DOCS["hooks"]["PreToolUse"][0])
    path.write_text(json.dumps(mine), encoding="utf-8")

    said = cli.ok("hook", "install", "claude-code", "--requested-by", "U_DANA")
    assert str(path) in said and '"onFailure": "block"' in said
    doc = settings(path)
    # the user's settings and hooks are as they were
    assert doc["permissions"] == MINE["permissions"] and doc["env"] == MINE["env"]
    assert doc["hooks"]["Stop"] == MINE["hooks"]["Stop"]
    assert doc["hooks"]["PreToolUse"][0] == MINE["hooks"]["PreToolUse"][0]
    for event in EVENTS:
        [hook] = ours(doc, event)
        words = shlex.split(hook["command"])
        assert os.path.isabs(words[0]) and hook["onFailure"] == "block", hook
        assert words[words.index("hook"):words.index("hook") + 4] == [
            "hook", "claude-code", "--requested-by", "U_DANA"]
    [pre] = ours(doc, "PreToolUse")
    assert pre["command"].endswith("--wait 45") and pre["timeout"] == 60
    # the old relative hook was replaced where it stood, not added to
    assert len(doc["hooks"]["PreToolUse"]) == 2

    before = path.read_bytes()
    assert "nothing changed" in cli.ok("hook", "install", "claude-code", "--requested-by",
                                       "U_DANA")
    assert path.read_bytes() == before


def test_install_http_hooks_in_the_users_settings(cli: Cli, tmp_path: Path) -> None:
    home = tmp_path / "home"
    ok(cli, "hook", "install", "claude-code", "--user", "--http",
       "https://approvald.internal.example", "--wait", "20", HOME=str(home))
    doc = settings(home / ".claude" / "settings.json")
    for event in EVENTS:
        [hook] = ours(doc, event)
        assert hook["type"] == "http" and hook["onFailure"] == "block"
        assert hook["headers"] == {"Authorization": "Bearer $APPROVALD_HOOK_TOKEN"}
        assert hook["allowedEnvVars"] == ["APPROVALD_HOOK_TOKEN"]
    [pre] = ours(doc, "PreToolUse")
    assert pre["url"] == "https://approvald.internal.example/v1/hooks/claude-code?wait=20"
    assert pre["timeout"] == 35
    assert not (cli.workdir / ".claude").exists()
    ok(cli, "hook", "install", "claude-code", "--local", HOME=str(home))
    assert [p.name for p in (cli.workdir / ".claude").iterdir()] == ["settings.local.json"]
    bad = cli("hook", "install", "claude-code", "--http", "ftp://x", HOME=str(home))
    assert bad.returncode == 2 and "--http" in bad.stderr


def test_check_names_what_is_wrong(cli: Cli, tmp_path: Path) -> None:
    path = cli.workdir / ".claude" / "settings.json"
    path.parent.mkdir()
    path.write_text(json.dumps(OLD_DOCS), encoding="utf-8")
    home = {"HOME": str(tmp_path / "home")}
    done = cli("hook", "check", "claude-code", **home)
    assert done.returncode == 1
    problems = [line for line in done.stdout.splitlines() if line.startswith("problem:")]
    text = "\n".join(problems)
    for said in ("'approvald' is not an absolute path", 'no "onFailure": "block"',
                 '"timeout": 60 leaves no room', "PostToolUseFailure: no approvald hook"):
        assert said in text, (said, text)

    # an HTTP hook whose token is not set, and a command that is not executable
    (tmp_path / "home" / ".claude").mkdir(parents=True)
    (tmp_path / "home" / ".claude" / "settings.json").write_text(json.dumps({"hooks": {
        "PreToolUse": [{"matcher": "*", "hooks": [{
            "type": "http", "url": "http://127.0.0.1:1/v1/hooks/claude-code?wait=5",
            "headers": {"Authorization": "Bearer $APPROVALD_HOOK_TOKEN"},
            "allowedEnvVars": ["APPROVALD_HOOK_TOKEN"], "timeout": 30,
            "onFailure": "block"}]}]}}), encoding="utf-8")
    script = tmp_path / "approvald"
    script.write_text("#!/bin/sh\n")
    path.write_text(json.dumps({"hooks": {"PostToolUse": [{"matcher": "*", "hooks": [{
        "type": "command", "command": f"{script} hook claude-code", "timeout": 20,
        "onFailure": "block"}]}]}}), encoding="utf-8")
    done = cli("hook", "check", "claude-code", **home)
    assert done.returncode == 1
    assert "$APPROVALD_HOOK_TOKEN is not set" in done.stdout
    assert f"{script} is not executable" in done.stdout

    # installed: nothing to say but ok
    path.unlink()
    ok(cli, "hook", "install", "claude-code", "--requested-by", "U_DANA", **home)
    (tmp_path / "home" / ".claude" / "settings.json").unlink()
    done = cli("hook", "check", "claude-code", **home)
    assert done.returncode == 0, done.stdout
    assert [line.split(":")[0] for line in done.stdout.splitlines()[1:]] == ["ok"] * 3


@pytest.mark.slow  # Claude Code's side: a shell without the virtualenv runs the hook
def test_claude_code_finds_the_installed_hook_without_the_virtualenv_on_path(
        cli: Cli) -> None:
    """The documented ``approvald hook claude-code`` was ``approvald: not found`` (exit
    127) for a Claude Code whose PATH does not hold the virtualenv's bin, and the call
    ran; installed, the hook is found by its absolute path and answers."""
    (cli.workdir / "policy.toml").write_text(
        '[tools."hook:claude-code/Bash"]\npolicy = "auto"\n', encoding="utf-8")
    env = {**cli.env(APPROVALD_POLICY_FILE=str(cli.workdir / "policy.toml")),
           "PATH": "/usr/bin:/bin"}
    done = subprocess.run([APPROVALD, "hook", "install", "claude-code", "--requested-by",
                           "U_DANA"], env=env, cwd=cli.workdir, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    [pre] = ours(settings(cli.workdir / ".claude" / "settings.json"), "PreToolUse")
    event = {"hook_event_name": "PreToolUse", "session_id": "s-1", "cwd": str(cli.workdir),
             "tool_name": "Bash", "tool_input": {"command": "ls"}, "tool_use_id": "toolu_1"}
    # as Claude Code runs a command hook: the line through a shell, the event on stdin
    ran = subprocess.run(["/bin/sh", "-c", pre["command"]], input=json.dumps(event),
                         env=env, cwd=cli.workdir, capture_output=True, text=True,
                         timeout=pre["timeout"], check=False)
    assert ran.returncode == 0, ran.stderr
    said = json.loads(ran.stdout)["hookSpecificOutput"]
    assert said["permissionDecision"] == "allow", said
    # the old line, through the same shell: not found, which Claude Code lets through
    old = OLD_DOCS["hooks"]["PreToolUse"][0]["hooks"][0]["command"]
    ran = subprocess.run(["/bin/sh", "-c", old], input=json.dumps(event), env=env,
                         cwd=cli.workdir, capture_output=True, text=True, timeout=60,
                         check=False)
    assert ran.returncode == 127
    checked = subprocess.run([APPROVALD, "hook", "check", "claude-code", "--project"],
                             env=env, cwd=cli.workdir, capture_output=True, text=True,
                             timeout=60, check=False)
    assert checked.returncode == 0, checked.stdout
    assert os.stat(shlex.split(pre["command"])[0]).st_mode & stat.S_IXUSR
