"""The Claude Code tier's fixtures: per module, one fake Messages API and one ``serve`` (the
in-process service on a SQLite file, wired to the Slack emulator over real HTTP); per test,
a Claude Code in a project and home of its own whose hooks reach that database.

The tier runs on SQLite: what it tests is Claude Code's side of the hook (what it sends,
what it does with each answer); the same hook on PostgreSQL is tested without Claude Code
in tests/integration/test_claude_code_*.py, and a stalled PostgreSQL here
(test_fail_closed.py)."""

from __future__ import annotations

import json
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import pytest_asyncio
from approvald.bot.api.service import webhook_keys

from tests.claude_code.claude import ClaudeCode, claude_code
from tests.claude_code.fake_anthropic import FakeAnthropic
from tests.helpers import Rows, create_token
from tests.integration.slack_harness import Harness, harness, wait_for

POLICY = """
[tools."hook:claude-code/Bash"]
approvers = ["U_ALICE", "U_DANA"]  # Dana is an approver, but not of her own calls
ttl = "30m"

[[tools."hook:claude-code/Bash".rules]]
when = 'args.command.startsWith("echo auto")'
policy = "auto"

[[tools."hook:claude-code/Bash".rules]]
when = 'args.command.contains("git push")'
policy = "forbidden"
reason = "pushes go through CI"

[tools."hook:claude-code/Write"]
approvers = ["U_ALICE"]
ttl = "30m"

[tools."hook:claude-code/mcp__marker__record"]
approvers = ["U_ALICE"]
ttl = "30m"
"""


@pytest.fixture(scope="module")
def installed() -> str:
    """The pinned Claude Code (skips, or fails under APPROVALD_REQUIRE_CLAUDE_CODE=1)."""
    return claude_code()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def fake(installed: str) -> AsyncIterator[FakeAnthropic]:
    api = FakeAnthropic()
    await api.start()
    yield api
    await api.stop()


@pytest.fixture(scope="module")
def policy_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("policy") / "policy.toml"
    path.write_text(POLICY)
    return path


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def serve(installed: str, tmp_path_factory: pytest.TempPathFactory,
                sqlite_template: Path, policy_file: Path) -> AsyncIterator[Harness]:
    """One ``serve`` for the module's tests (each test finds its own requests by what they
    ask: see :func:`request_for`)."""
    root = tmp_path_factory.mktemp("serve")
    db = root / "approvald.db"
    shutil.copy(sqlite_template, db)
    async with harness(f"sqlite+aiosqlite:///{db}", root, background=False,
                       APPROVALD_POLICY_FILE=str(policy_file)) as h:
        yield h


def hook_env(db_url: str, policy_file: Path) -> dict[str, str]:
    """What the command hook needs from Claude Code's environment: approvald's settings."""
    return {"APPROVALD_DATABASE_URL": db_url, "APPROVALD_POLICY_FILE": str(policy_file),
            "APPROVALD_LOG_LEVEL": "WARNING"}


@asynccontextmanager
async def session(fake: FakeAnthropic, root: Path,
                  env: dict[str, str] | None = None) -> AsyncIterator[ClaudeCode]:
    """Claude Code in ``root``; afterwards no run is left behind, and the fake saw no
    unknown request and no main-conversation request it had no turn for."""
    fake.reset()
    claude = ClaudeCode(root, fake, env=dict(env or {}))
    try:
        yield claude
    finally:
        await claude.close()
    assert not fake.unknown, [(r.method, r.path) for r in fake.unknown]
    assert not fake.unscripted, "Claude Code asked the model more than the test scripted"


@pytest_asyncio.fixture(loop_scope="module")
async def claude(fake: FakeAnthropic, serve: Harness, policy_file: Path,
                 tmp_path: Path) -> AsyncIterator[ClaudeCode]:
    """Claude Code in this test's project, its command hook on serve's database."""
    env = hook_env(serve.service.settings.database_url, policy_file)
    async with session(fake, tmp_path, env) as claude:
        yield claude


@pytest_asyncio.fixture(loop_scope="module")
async def lone_claude(fake: FakeAnthropic, tmp_path: Path) -> AsyncIterator[ClaudeCode]:
    """Claude Code for a test that needs no serve: its ``env`` (the hook's settings) is the
    test's to fill."""
    async with session(fake, tmp_path) as claude:
        yield claude


async def request_for(h: Harness, needle: str, *, within: float = 60) -> str:
    """The run id of the pending request whose arguments mention ``needle`` (the tests of a
    module share one serve: each finds its own request by its unique marker path)."""
    async def found() -> str | None:
        rows = await Rows.of(h.engine).requests(status="pending")
        for a in rows:
            if needle in json.dumps(a.effective_args()):
                return str(a.run_id)
        return None
    rid: str = await wait_for(found, within=within, what=f"a pending request for {needle}")
    return rid


async def hook_token(h: Harness, name: str, user: str = "U_DANA") -> str:
    """A bearer token for Claude Code's HTTP hook, made for ``user`` (as ``approvald tokens
    create NAME --face hook:claude-code --requested-by USER`` makes it)."""
    keys = webhook_keys(h.service.settings)
    assert keys is not None
    made = await create_token(h.engine, keys, name,
                              created_by="test", via="test", face="hook:claude-code",
                              requested_by=user)
    return made.token


def serve_url(h: Harness) -> str:
    """Where serve's listener (/v1, /slack/events) is."""
    assert h.service.slack is not None
    return f"http://127.0.0.1:{h.service.slack.port}"
