"""The HTTP API example (docs/how-to/http-api.md, once the README's), as a reader pastes
it: its policy, then its curl commands against a running approvald (bash and curl, with the
variables it names set)."""

from __future__ import annotations

import asyncio
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from approvald.bot.config import Settings
from approvald.bot.serve import Service
from approvald.bot.wiring import open_database
from approvald.runtime.approvals.decide import Actor
from approvald.runtime.requests import api_tokens

from tests.helpers import parts

# each test here starts approvald (or a browser) as a process of its own
pytestmark = pytest.mark.slow

PAGE = Path(__file__).resolve().parents[2] / "docs" / "how-to" / "http-api.md"
SECRET = "approvald-test-secret-0123456789"


def example() -> tuple[str, list[str]]:
    """The page's policy file and its curl commands (each with its indented lines)."""
    section = PAGE.read_text(encoding="utf-8")
    toml = re.search(r"```toml\n(.*?)```", section, re.DOTALL)
    sh = re.search(r"<!-- run-by: tests/integration/test_readme_http_api.py -->\n```sh\n(.*?)```",
                   section, re.DOTALL)
    assert toml and sh, "docs/how-to/http-api.md lost its example"
    commands: list[str] = []
    for line in sh.group(1).splitlines():
        if line.startswith("curl "):
            commands.append(line)
        elif line.startswith(" ") and commands:
            commands[-1] += "\n" + line
    assert len(commands) == 3
    return toml.group(1), commands


async def curl(command: str, **env: str) -> Any:
    proc = await asyncio.create_subprocess_exec(
        "bash", "-c", command, env={**os.environ, **env},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    return json.loads(out)


async def test_the_readme_example_works(sqlite_url: str, tmp_path: Path) -> None:
    policy, (create, wait, report) = example()
    (tmp_path / "policy.toml").write_text(policy)
    settings = Settings(APPROVALD_DATABASE_URL=sqlite_url, APPROVALD_PORT=0,
                        APPROVALD_HOST="127.0.0.1", APPROVALD_SECRET=SECRET,
                        APPROVALD_POLICY_FILE=str(tmp_path / "policy.toml"))
    db = await open_database(settings, quiet=True)
    service = Service(settings, db)
    try:
        await service.start(background=False)
        made = await api_tokens.create(db, parts(service.engine).clock,
                                       api_tokens.WebhookKeys(SECRET), parts(service.engine).audit,
                                       "deploy-bot", created_by="test", via="test",
                                       tools="deploy")
        env = {"API": f"http://127.0.0.1:{service.ops_port}/v1", "TOKEN": made.token}
        asked = await curl(create, **env)
        assert asked["status"] == "pending" and asked["tool"] == "deploy"
        env["ID"] = asked["id"]
        waiting = asyncio.ensure_future(curl(wait, **env))
        await asyncio.sleep(0.3)
        assert not waiting.done()
        await service.engine.decide(asked["approval_id"], actor=Actor("U_ALICE", "cli:test"),
                                    verdict="approve")
        decided = await waiting
        assert decided["status"] == "approved"
        assert decided["decision"]["decided_by"] == "U_ALICE"
        env["DIGEST"] = decided["effective_digest"]
        reported = await curl(report, **env)
        assert reported["result"]["status"] == "succeeded"
        assert reported["result"]["result"] == {"deployed": "2.4.1"}
    finally:
        await service.stop()
        await db.close()
