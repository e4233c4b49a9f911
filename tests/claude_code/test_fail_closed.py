"""The places where Claude Code's command hook could let a call through (issue 45, "It
fails open"), each made to happen under the real Claude Code CLI: a database that accepts
connections but never answers, a locked SQLite file, a non-UTF-8 pipe, and approvald not on
Claude Code's PATH. In each, the call never runs, and it is approvald that says no, in time,
with its reason: not Claude Code giving up on a hook that failed or outlived its timeout
(which ``"onFailure": "block"`` turns into a block, but only in the releases that honour it,
and only where it was installed)."""

from __future__ import annotations

import asyncio
import json
import shutil
import sqlite3
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from tests.claude_code.claude import HOOK_FAILED, ClaudeCode, nested, path_without_approvald
from tests.claude_code.conftest import hook_env
from tests.claude_code.fake_anthropic import say, tool_use
from tests.helpers import APPROVALD

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

# the hook's budget: it answers within WAIT plus its margin (10 s), inside the timeout
# `hook install` gives Claude Code for it (WAIT plus 15 s); one that did not would be cut
# off by the timeout, and blocked by "onFailure": "block", not denied by approvald
WAIT = 2


def forbidden_push(marker: Path, note: str = "") -> dict[str, str]:
    """A call the policy forbids (it pushes), whose side effect would be ``marker``."""
    return {"command": f"git push origin main || touch {marker}{note}",
            "description": "push"}


async def denied_by_approvald(claude: ClaudeCode, marker: str, **run: Any) -> str:
    """Run the session; the call must not have run (no file ``marker`` in the project), and
    its result must be approvald's answer (returned), not Claude Code's note of a failed
    hook."""
    (await claude.run(**run)).check()
    assert not claude.marker(marker).exists(), "Claude Code ran the call"
    said = claude.fake.tool_result_text()
    assert HOOK_FAILED not in said and "approvald" in said, said
    return said


def hooked(claude: ClaudeCode, db_url: str, policy_file: Path) -> None:
    """The command hook installed with a short budget, on database ``db_url``."""
    claude.env.update(hook_env(db_url, policy_file))
    claude.install(wait=WAIT)


@pytest.fixture
def database(tmp_path: Path, sqlite_template: Path) -> Path:
    path = tmp_path / "approvald.db"
    shutil.copy(sqlite_template, path)
    return path


@pytest_asyncio.fixture(loop_scope="module")
async def stalled_server() -> AsyncIterator[int]:
    """A port that accepts connections and never says a word (a stalled PostgreSQL)."""
    held: list[asyncio.StreamWriter] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        await reader.read()  # until the client gives up

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    yield int(server.sockets[0].getsockname()[1])
    for writer in held:
        writer.close()
    server.close()
    await server.wait_closed()


@pytest.fixture
def locked(database: Path) -> Iterator[Path]:
    """``database`` with a write transaction open on it that never ends (another process
    stuck mid-write)."""
    conn = sqlite3.connect(database, isolation_level=None)
    conn.execute("BEGIN EXCLUSIVE")
    try:
        yield database
    finally:
        conn.execute("ROLLBACK")
        conn.close()


async def test_a_stalled_postgresql(lone_claude: ClaudeCode, stalled_server: int,
                                    policy_file: Path) -> None:
    marker = lone_claude.marker("stalled-pg")
    url = f"postgresql+asyncpg://postgres@127.0.0.1:{stalled_server}/approvald"
    hooked(lone_claude, url, policy_file)
    lone_claude.fake.script(tool_use("Bash", forbidden_push(marker)), say("ok"))
    await denied_by_approvald(lone_claude, marker.name)


async def test_a_locked_sqlite_file(lone_claude: ClaudeCode, locked: Path,
                                    policy_file: Path) -> None:
    marker = lone_claude.marker("locked-sqlite")
    hooked(lone_claude, f"sqlite+aiosqlite:///{locked}", policy_file)
    # a call that asks (it would be written down): the write waits on the lock
    lone_claude.fake.script(tool_use("Bash", {"command": f"touch {marker}",
                                              "description": "touch"}), say("ok"))
    await denied_by_approvald(lone_claude, marker.name)


async def test_a_cp1252_pipe_and_a_non_ascii_input(lone_claude: ClaudeCode, database: Path,
                                                   policy_file: Path) -> None:
    marker = lone_claude.marker("cp1252")
    hooked(lone_claude, f"sqlite+aiosqlite:///{database}", policy_file)
    # "Á" is C3 81 in UTF-8, and 0x81 is no character in cp1252
    lone_claude.fake.script(tool_use("Bash", forbidden_push(marker, "  # Ádám's build")),
                            say("ok"))
    said = await denied_by_approvald(lone_claude, marker.name, PYTHONIOENCODING="cp1252")
    assert "pushes go through CI" in said


async def test_approvald_not_on_claude_codes_path(lone_claude: ClaudeCode, database: Path,
                                                  policy_file: Path) -> None:
    """A virtualenv's ``approvald`` is not on the PATH Claude Code runs hooks with: the
    installed hook names it by its absolute path, and it decides."""
    marker = lone_claude.marker("not-on-path")
    hooked(lone_claude, f"sqlite+aiosqlite:///{database}", policy_file)
    lone_claude.fake.script(tool_use("Bash", forbidden_push(marker)), say("ok"))
    said = await denied_by_approvald(lone_claude, marker.name, path=path_without_approvald())
    assert "pushes go through CI" in said


@pytest.mark.parametrize("case", ["deep", "huge"])
async def test_a_deep_or_huge_input_through_the_command_hook(
        lone_claude: ClaudeCode, database: Path, policy_file: Path, case: str) -> None:
    """What serve answered 500 and 413 to over HTTP (test_http_hook.py), through the
    command hook: a tool input nested 1,000 levels deep (a free-form MCP argument), and a
    Write of over 1 MB."""
    marker = lone_claude.marker(case)
    hooked(lone_claude, f"sqlite+aiosqlite:///{database}", policy_file)
    if case == "deep":
        call = tool_use("mcp__marker__record", {"marker": str(marker), "payload": nested(1000)})
    else:
        call = tool_use("Write", {"file_path": str(marker), "content": "x" * 1_100_000})
    lone_claude.fake.script(call, say("ok"))
    await denied_by_approvald(lone_claude, marker.name, mcp=case == "deep")


async def test_without_on_failure_block_a_failed_hook_lets_the_call_run(
        lone_claude: ClaudeCode) -> None:
    """Why the installed hook carries ``"onFailure": "block"`` and names approvald by its
    absolute path (issue 45 item 4): the hook the how-to showed, ``approvald hook
    claude-code`` with approvald not on Claude Code's PATH, exits 127, and Claude Code,
    allowed the tools by its own rules, runs the calls unchecked. (And the tier sees a call
    that ran: the Bash command's file and the MCP tool's are there.)"""
    shell, tool = lone_claude.marker("ran-unchecked"), lone_claude.marker("mcp-ran")
    lone_claude.install()
    settings = lone_claude.project / ".claude" / "settings.json"
    written = json.loads(settings.read_text())
    for matchers in written["hooks"].values():
        for hook in matchers[0]["hooks"]:
            hook.pop("onFailure", None)
            hook["command"] = hook["command"].replace(APPROVALD, "approvald")
    settings.write_text(json.dumps(written))
    lone_claude.fake.script(
        tool_use("Bash", {"command": f"touch {shell}", "description": "touch"}),
        tool_use("mcp__marker__record", {"marker": str(tool), "payload": nested(1000)}),
        say("ok"))
    (await lone_claude.run(mcp=True, path=path_without_approvald())).check()
    assert shell.exists() and tool.exists()
