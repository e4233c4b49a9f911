"""``approvald hook claude-code`` answers within its budget whatever the database, the
input or the locale does (issue 45, items 1 and 3): a deny naming why, on stdout, exit 0.
Claude Code runs the call when a command hook outlives its ``timeout`` or exits with a
status other than 0 or 2, so each case here is a process started as Claude Code starts it,
and its wall time is the point: it must be within ``--wait`` plus the hook's margin."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from approvald.bot.claude_code_contract import MARGIN

from tests.helpers import APPROVALD, Cli, silent_server

# each case is a process of its own, and a stalled one takes its whole budget
pytestmark = pytest.mark.slow

WAIT = 1.0  # for the stalls: what the budget is made of
# where nothing stalls, a wait long enough that a busy machine's start-up never uses it up
# (these answer at once: the budget is not what they test)
ROOMY = 30.0
SLACK = 3.0  # what starting a Python process costs on a busy machine, before the hook's
# own clock starts

POLICY = """
[tools."hook:claude-code/Bash"]
policy = "auto"

[[tools."hook:claude-code/Bash".rules]]
when = 'args.command == "echo café Ás"'
policy = "forbidden"
reason = "not that one"
"""


def event(command: str = "ls", **extra: Any) -> dict[str, Any]:
    return {"hook_event_name": "PreToolUse", "session_id": "s-budget", "cwd": "/tmp",
            "tool_name": "Bash", "tool_input": {"command": command},
            "tool_use_id": "toolu_01", **extra}


def run_hook(cli: Cli, stdin: bytes, *, wait: float = ROOMY, **env: str
             ) -> tuple[int, Any, str, float]:
    """The hook as Claude Code starts it: (exit code, stdout's JSON, stderr, seconds)."""
    started = time.monotonic()
    within = wait + MARGIN + SLACK + 30
    try:
        done = subprocess.run(
            [APPROVALD, "hook", "claude-code", "--requested-by", "U_DANA", "--wait", str(wait)],
            input=stdin, env=cli.env(**env), cwd=cli.workdir, capture_output=True,
            timeout=within, check=False)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the hook did not answer within {within:g} s") from None
    took = time.monotonic() - started
    out = done.stdout.decode("ascii")  # the answer is ASCII whatever the locale
    return done.returncode, json.loads(out) if out.strip() else None, \
        done.stderr.decode(errors="replace"), took


def verdict(out: Any) -> tuple[str, str]:
    said = out["hookSpecificOutput"]
    assert said["hookEventName"] == "PreToolUse"
    return said["permissionDecision"], said["permissionDecisionReason"]


@pytest.fixture
def policy(cli: Cli) -> dict[str, str]:
    path = cli.workdir / "policy.toml"
    path.write_text(POLICY, encoding="utf-8")
    return {"APPROVALD_POLICY_FILE": str(path)}


@contextmanager
def locked_sqlite(path: Path) -> Iterator[None]:
    """Another process holds the SQLite file under ``BEGIN EXCLUSIVE`` until the block
    ends."""
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sqlite3, sys\n"
         "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
         "c.execute('BEGIN EXCLUSIVE')\n"
         "print('locked', flush=True)\n"
         "sys.stdin.read()\n", str(path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        yield
    finally:
        assert holder.stdin is not None and holder.stdout is not None
        holder.stdin.close()
        holder.wait(30)
        holder.stdout.close()


def test_a_stalled_postgresql_is_a_deny_within_the_budget(
        cli: Cli, policy: dict[str, str]) -> None:
    with silent_server() as port:
        code, out, err, took = run_hook(
            cli, json.dumps(event()).encode(), wait=WAIT, **policy,
            APPROVALD_DATABASE_URL=f"postgresql+asyncpg://approvald@127.0.0.1:{port}/approvald")
    assert code == 0, err
    said, why = verdict(out)
    assert said == "deny" and "could not decide" in why, why
    assert took < WAIT + MARGIN + SLACK, f"answered after {took:.1f} s"


def test_a_locked_sqlite_file_is_a_deny_within_the_budget(
        cli: Cli, policy: dict[str, str]) -> None:
    # unlocked, the policy allows it: the lock is what denies it
    code, out, err, _ = run_hook(cli, json.dumps(event("ls -l")).encode(), **policy)
    assert code == 0 and verdict(out)[0] == "allow", (out, err)
    with locked_sqlite(Path(cli.db_url.removeprefix("sqlite+aiosqlite:///"))):
        code, out, err, took = run_hook(cli, json.dumps(event("ls -la")).encode(), wait=WAIT,
                                        **policy)
    assert code == 0, err
    said, why = verdict(out)
    assert said == "deny" and "could not decide" in why, why
    assert took < WAIT + MARGIN + SLACK, f"answered after {took:.1f} s"


@pytest.mark.parametrize("env", [
    {"PYTHONIOENCODING": "cp1252"},
    {"PYTHONIOENCODING": "cp1252", "LC_ALL": "C"},
    {"PYTHONIOENCODING": "ascii"},
    {"LC_ALL": "C", "LANG": "C"},
], ids=["cp1252", "cp1252-C", "ascii", "C-locale"])
def test_stdin_is_utf8_whatever_the_locale_says(
        cli: Cli, policy: dict[str, str], env: dict[str, str]) -> None:
    """Claude Code sends UTF-8; a locale that says otherwise neither crashes the hook
    (exit 70 lets the call run) nor changes the command it decides on (``café`` read as
    cp1252 is ``cafÃ©``, which the forbidding rule would not match)."""
    raw = json.dumps(event("echo café Ás"), ensure_ascii=False).encode("utf-8")
    code, out, err, _ = run_hook(cli, raw, **policy, **env)
    assert code == 0, err
    assert verdict(out) == ("deny", verdict(out)[1]) and "not that one" in verdict(out)[1]


@pytest.mark.parametrize("stdin, why", [
    (b'{"hook_event_name": "PreToolUse", "tool_input": {"command": "\xff\xfe"}}',
     "not UTF-8"),
    (b"", "not JSON"),
    (json.dumps(event(tool_input=None)).encode()[:40], "not JSON"),
    (json.dumps(event("x" * 4_500_000)).encode(), "larger than"),
    (('{"a":' + "[" * 1000 + "1" + "]" * 1000 + "}").encode(), "deeper than"),
    (json.dumps(event()).replace('{"command": "ls"}', '{"a":' * 900 + "1" + "}" * 900)
     .encode(), "deeper than"),
], ids=["not-utf8", "empty", "cut-short", "huge", "1000-deep", "900-deep-input"])
def test_input_it_cannot_decide_is_a_deny(
        cli: Cli, policy: dict[str, str], stdin: bytes, why: str) -> None:
    for env in ({}, {"PYTHONIOENCODING": "cp1252"}):
        code, out, err, took = run_hook(cli, stdin, **policy, **env)
        assert code == 0, err
        said, reason = verdict(out)
        assert said == "deny" and why in reason, reason
        assert took < ROOMY, f"answered after {took:.1f} s"
