"""The real Claude Code CLI, run offline as the tier's tests run it.

:func:`claude_code` finds the pinned ``@anthropic-ai/claude-code`` (``package.json`` beside
this file, installed by ``npm ci --prefix tests/claude_code``; CI's ``.ci/run`` does it and
sets ``APPROVALD_REQUIRE_CLAUDE_CODE=1``, which makes its absence a failure instead of a
skip). :class:`ClaudeCode` runs it in print mode (``-p``, ``--output-format stream-json``)
in a project directory of its own with a temporary ``HOME``, its model played by
:class:`~tests.claude_code.fake_anthropic.FakeAnthropic` and every kind of traffic but the
model's turned off. :func:`install_hook` puts approvald's hook in the project's
``.claude/settings.json`` the way a user installs it.

Whether Claude Code ran a call is read from a side effect (a file the command creates),
never from what Claude Code says.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from tests.claude_code.fake_anthropic import FakeAnthropic, loads
from tests.helpers import APPROVALD

HERE = Path(__file__).resolve().parent
BIN = HERE / "node_modules" / ".bin" / "claude"
PINNED = json.loads((HERE / "package.json").read_text())["dependencies"][
    "@anthropic-ai/claude-code"]
REQUIRE = "APPROVALD_REQUIRE_CLAUDE_CODE"
MCP_MARKER = HERE / "mcp_marker.mjs"
# Claude Code's side requests (a title, a summary) go to its small model: a name of its own,
# so the fake tells them from the main conversation
SMALL_MODEL = "claude-haiku-4-5-20251001"
# documented switches: no telemetry, error reports, auto-update or other traffic than the
# model's (CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC implies the other three; all are set so a
# release that splits them stays quiet)
OFFLINE = {"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1",
           "DISABLE_AUTOUPDATER": "1", "DISABLE_ERROR_REPORTING": "1",
           "DISABLE_BUG_COMMAND": "1", "CLAUDE_CODE_DISABLE_TERMINAL_TITLE": "1"}
# Claude Code's words when a hook failed or outlived its timeout and "onFailure": "block"
# blocked the call for it. (A hook's own deny reaches the model as "PreToolUse:Bash hook
# error: <the hook's reason>": it is this phrase that tells the two apart.)
HOOK_FAILED = 'blocking because onFailure is "block"'
RUN_WITHIN = 180.0  # seconds: a run's hooks wait at most about a minute


@cache
def _installed() -> str | None:
    """Why the pinned Claude Code cannot run here, or None when it can."""
    if not BIN.exists():
        return (f"Claude Code is not installed (npm ci --prefix tests/claude_code installs "
                f"@anthropic-ai/claude-code {PINNED})")
    try:
        done = subprocess.run([str(BIN), "--version"], capture_output=True, text=True,
                              timeout=60, check=False)
    except OSError as exc:
        return f"Claude Code at {BIN} does not start: {exc}"
    if done.returncode != 0 or not done.stdout.startswith(PINNED):
        return (f"Claude Code at {BIN} is not the pinned {PINNED} (npm ci --prefix "
                f"tests/claude_code): it said {(done.stdout + done.stderr).strip()[:200]!r}")
    return None


def claude_code() -> str:
    """The pinned Claude Code's executable; without it the test is skipped saying how to
    install it, or failed under ``APPROVALD_REQUIRE_CLAUDE_CODE=1``."""
    why = _installed()
    if why is not None:
        if os.environ.get(REQUIRE) == "1":
            pytest.fail(f"{REQUIRE}=1 but {why}")
        pytest.skip(why)
    return str(BIN)


# -- the hook, installed --------------------------------------------------------------------

EVENTS = ("PreToolUse", "PostToolUse", "PostToolUseFailure")


# what ``approvald hook install`` wrote, by what it was given: (its arguments, the settings
# file before it, the environment but pytest's name of the running test) -> the settings
# file after it (see install_hook)
_INSTALLED: dict[tuple[tuple[str, ...], str | None, tuple[tuple[str, str], ...]], str] = {}


def install_hook(project: Path, *, requested_by: str | None = "U_DANA", wait: float = 30,
                 http: str | None = None, serve: str | None = None) -> dict[str, Any]:
    """approvald's hook in ``project/.claude/settings.json``, installed the way a user
    installs it: ``approvald hook install claude-code --project`` (this installation's
    ``approvald`` by its absolute path, ``"onFailure": "block"`` on every hook, for
    PreToolUse, PostToolUse and PostToolUseFailure, a timeout that fits ``wait``); with
    ``http``, the HTTP form against that serve, its bearer token read from
    ``APPROVALD_HOOK_TOKEN``; with ``serve``, the command hook handing each event to that
    serve (``--serve``, the same token). Merged into the file's other settings; returns them.

    The one place the tests install the hook. What the command writes depends on its
    arguments, the file it merges into and its environment, not on the project's
    directory: given the same three again in this process, the file it wrote is written
    again rather than the command (a cold ``approvald``, about a second of CPU) run again."""
    args = [APPROVALD, "hook", "install", "claude-code", "--project", "--wait", f"{wait:g}"]
    if http is not None:
        args += ["--http", http]
    elif serve is not None:
        args += ["--serve", serve]
    elif requested_by:
        args += ["--requested-by", requested_by]
    project.mkdir(parents=True, exist_ok=True)
    settings_file = project / ".claude" / "settings.json"
    before = settings_file.read_text() if settings_file.exists() else None
    key = (tuple(args), before, tuple(sorted((k, v) for k, v in os.environ.items()
                                             if k != "PYTEST_CURRENT_TEST")))
    if key in _INSTALLED:
        settings_file.parent.mkdir(exist_ok=True)
        settings_file.write_text(_INSTALLED[key])
    else:
        done = subprocess.run(args, cwd=project, capture_output=True, text=True, timeout=60,
                              check=False)
        assert done.returncode == 0, (done.stdout, done.stderr)
        if [p.name for p in settings_file.parent.iterdir()] == [settings_file.name]:
            _INSTALLED[key] = settings_file.read_text()  # (nothing else written: kept)
    settings: dict[str, Any] = json.loads(settings_file.read_text())
    return settings


def nested(levels: int) -> dict[str, Any]:
    """A JSON object nested ``levels`` deep (2 KB of brackets for 1,000: what any free-form
    argument of an MCP tool takes)."""
    value: dict[str, Any] = {"leaf": True}
    for _ in range(levels):
        value = {"a": value}
    return value


# -- running it -----------------------------------------------------------------------------

@dataclass
class Outcome:
    """One finished run of Claude Code."""

    returncode: int
    events: list[dict[str, Any]]  # stream-json, one object a line
    stderr: str

    @property
    def result(self) -> dict[str, Any]:
        """The final ``result`` event (what the session ended with)."""
        found = [e for e in self.events if e.get("type") == "result"]
        assert found, f"Claude Code ended without a result (exit {self.returncode}): " \
                      f"{self.stderr[-2000:]}"
        return found[-1]

    def check(self) -> Outcome:
        """This outcome, once it is a clean exit with a result that is not an error."""
        assert self.returncode == 0, (self.returncode, self.stderr[-2000:])
        assert not self.result.get("is_error"), self.result
        return self


def path_without_approvald() -> str:
    """PATH with every directory that holds an ``approvald`` left out (a virtualenv's
    ``bin``, as Claude Code started from a desktop launcher or another shell sees it)."""
    dirs = [d for d in os.environ.get("PATH", "/usr/bin:/bin").split(os.pathsep)
            if d and not (Path(d) / "approvald").exists()]
    return os.pathsep.join(dirs)


@dataclass
class ClaudeCode:
    """Claude Code in a project directory of its own (``root/project``) with a home of its
    own (``root/home``), talking to ``fake``; ``env`` is what the hook it starts needs
    (approvald's settings)."""

    root: Path
    fake: FakeAnthropic = field(repr=False)
    env: dict[str, str] = field(default_factory=dict, repr=False)
    running: list[asyncio.subprocess.Process] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self.project.mkdir(parents=True, exist_ok=True)
        self.home.mkdir(parents=True, exist_ok=True)

    @property
    def project(self) -> Path:
        return self.root / "project"

    @property
    def home(self) -> Path:
        return self.root / "home"

    def marker(self, name: str) -> Path:
        """A file in the project that a command creates: it exists only if the call ran."""
        return self.project / name

    def install(self, **kw: Any) -> dict[str, Any]:
        """:func:`install_hook` in this project."""
        return install_hook(self.project, **kw)

    def environment(self, path: str | None = None, **extra: str) -> dict[str, str]:
        """What Claude Code is started with: a clean environment (nothing of the test
        runner's but PATH and where temporary files go), the fake's address, the offline
        switches, and ``env``."""
        base = {"PATH": path if path is not None else os.environ.get("PATH", "/usr/bin:/bin"),
                "HOME": str(self.home), "LANG": "C.UTF-8",
                "TMPDIR": os.environ.get("TMPDIR", "/tmp"),
                "ANTHROPIC_BASE_URL": self.fake.url, "ANTHROPIC_API_KEY": "sk-ant-test-fake",
                "ANTHROPIC_DEFAULT_HAIKU_MODEL": SMALL_MODEL,
                "ANTHROPIC_SMALL_FAST_MODEL": SMALL_MODEL, **OFFLINE}
        return {**base, **self.env, **extra}

    async def run(self, prompt: str = "Do the task.", *,
                  allowed: tuple[str, ...] = ("Bash", "Write", "Edit"),
                  mcp: bool = False, path: str | None = None, within: float = RUN_WITHIN,
                  **env: str) -> Outcome:
        """One ``claude -p`` session to its end. ``allowed`` are the tools Claude Code's own
        permission rules allow without asking (``--allowedTools``, as a team that trusts
        the hook sets it): so a call the hook fails to stop runs, and a test shows it.
        ``mcp`` adds the ``marker`` MCP server (tool ``mcp__marker__record``)."""
        if mcp:
            allowed = (*allowed, "mcp__marker__record")
        args = [claude_code(), "-p", prompt, "--model", self.fake.model,
                "--output-format", "stream-json", "--verbose",
                "--allowedTools", ",".join(allowed)]
        if mcp:
            node = shutil.which("node")
            assert node, "node is not on PATH (the marker MCP server needs it)"
            config = {"mcpServers": {"marker": {"command": node, "args": [str(MCP_MARKER)]}}}
            args += ["--mcp-config", json.dumps(config), "--strict-mcp-config"]
        proc = await asyncio.create_subprocess_exec(
            *args, cwd=self.project, env=self.environment(path, **env),
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)
        self.running.append(proc)
        try:
            out, err = await asyncio.wait_for(proc.communicate(), within)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            self.running.remove(proc)
        events = [loads(line.encode()) for line in out.decode().splitlines() if line.strip()]
        assert proc.returncode is not None
        return Outcome(proc.returncode, events, err.decode(errors="replace"))

    async def close(self) -> None:
        """Kill any run a failed test left behind."""
        for proc in list(self.running):
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
