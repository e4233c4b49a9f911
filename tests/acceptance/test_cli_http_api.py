"""The HTTP API as an operator runs it: ``approvald tokens``, ``approvald serve`` (no Slack:
the API is on the health listener), a caller over HTTP, decisions and inspection with
the CLI, and a stop that ends a long poll in flight."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.acceptance.test_slack_serve import free_port, run_cli, start_serve
from tests.helpers import make_cli

# each test here starts approvald (or a browser) as a process of its own
pytestmark = pytest.mark.slow

POLICY = '[tools."api:*/deploy"]\napprovers = ["U_ALICE"]\n'
SECRET = "approvald-test-secret-0123456789"


async def call(http: aiohttp.ClientSession, method: str, url: str, token: str,
               body: Any = None) -> tuple[int, Any]:
    async with http.request(method, url, json=body,
                            headers={"Authorization": f"Bearer {token}"}) as resp:
        return resp.status, await resp.json()


async def test_an_operator_runs_the_api_and_decides_from_the_cli(sqlite_url: str,
                                                                  tmp_path: Path) -> None:
    (tmp_path / "policy.toml").write_text(POLICY)
    cli = make_cli(sqlite_url, tmp_path, in_process=True)
    cli.env_extra.update(APPROVALD_SECRET=SECRET,
                         APPROVALD_POLICY_FILE=str(tmp_path / "policy.toml"))
    made = json.loads(await run_cli(cli, "tokens", "create", "ci", "--tools", "deploy", "--json"))
    port = free_port()
    serve = await start_serve(cli, port)
    api = f"http://127.0.0.1:{port}/v1/requests"
    try:
        async with aiohttp.ClientSession() as http:
            status, doc = await call(http, "POST", api, made["token"],
                                     {"tool": "deploy", "args": {"service": "api"},
                                      "requested_by": "U_DANA"})
            assert status == 201 and doc["status"] == "pending"
            assert doc["approval_id"] in (await run_cli(cli, "approvals", "list", "--ids"))
            opened = json.loads(await run_cli(cli, "runs", "show", doc["id"], "--json"))
            assert (opened["agent"], opened["status"]) == ("external:ci", "external")
            assert "deploy" in await run_cli(cli, "trace", doc["id"])
            shown = json.loads(await run_cli(cli, "approvals", "show", doc["approval_id"],
                                             "--json"))
            assert shown["args"] == {"service": "api"} and shown["run_id"] == doc["id"]
            out = await run_cli(cli, "approvals", "approve", doc["approval_id"],
                                "--as", "U_ALICE")
            assert "approved by U_ALICE" in out
            status, done = await call(http, "GET", f"{api}/{doc['id']}/decision?wait=10",
                                      made["token"])
            assert done["status"] == "approved" and done["decision"]["decided_via"] != "slack"
            status, _ = await call(http, "POST", f"{api}/{doc['id']}/result", made["token"],
                                   {"status": "succeeded",
                                    "args_digest": done["effective_digest"]})
            assert status == 201
            runs = json.loads(await run_cli(cli, "runs", "list", "--json"))
            [run] = [r for r in runs if r["id"] == doc["id"]]
            assert (run["agent"], run["status"]) == ("external:ci", "completed")
            await run_cli(cli, "runs", "show", doc["id"])
            assert "executed" in await run_cli(cli, "trace", doc["id"])

            # a stop answers a long poll in flight at once, with the request as it stands
            status, other = await call(http, "POST", api, made["token"],
                                       {"tool": "deploy", "args": {"service": "web"}})
            polling = asyncio.ensure_future(call(http, "GET",
                                                 f"{api}/{other['id']}/decision?wait=60",
                                                 made["token"]))
            await asyncio.sleep(0.3)
            started = time.monotonic()
            serve.send_signal(signal.SIGTERM)
            status, still = await asyncio.wait_for(polling, 15)
            assert status == 200 and still["status"] == "pending"
            assert await asyncio.wait_for(serve.wait(), 30) == 0
            assert time.monotonic() - started < 10
        await run_cli(cli, "tokens", "revoke", "ci")
        listed = json.loads(await run_cli(cli, "tokens", "list", "--json"))
        assert listed[0]["revoked_by"].startswith("cli:")
    finally:
        if serve.returncode is None:
            serve.kill()
            await serve.wait()


HOOK_POLICY = """
[tools."hook:claude-code/Bash"]
approvers = ["U_ALICE"]

[[tools."hook:claude-code/Bash".rules]]
when = 'args.command.startsWith("git status")'
policy = "auto"
"""


async def test_a_token_made_for_the_claude_code_hook_calls_it_over_http(
        sqlite_url: str, tmp_path: Path) -> None:
    """Issue 39: `tokens create --face hook:claude-code --requested-by U…`, then Claude
    Code's HTTP hook against `serve`: the policy's answer, and a call that waits is asked
    for the token's person; a wrong combination of flags is refused, changing nothing."""
    (tmp_path / "policy.toml").write_text(HOOK_POLICY)
    cli = make_cli(sqlite_url, tmp_path, in_process=True)
    cli.env_extra.update(APPROVALD_SECRET=SECRET,
                         APPROVALD_POLICY_FILE=str(tmp_path / "policy.toml"))
    for bad in (["--face", "hook:claude-code"],  # no person
                ["--face", "hook:claude-code", "--requested-by", "U_DANA", "--tools", "*"],
                ["--tools", "*", "--requested-by", "U_DANA"]):
        done = await cli.acall("tokens", "create", "x", *bad)
        assert done.returncode != 0 and "approvald:" in done.stderr, (bad, done.stderr)
    made = json.loads(await run_cli(cli, "tokens", "create", "dana-laptop", "--face",
                                    "hook:claude-code", "--requested-by", "u_dana", "--json"))
    assert (made["face"], made["requested_by"], made["webhook_secret"]) == \
        ("hook:claude-code", "U_DANA", None)
    assert "hook:claude-code for U_DANA" in await run_cli(cli, "tokens", "list")
    port = free_port()
    serve = await start_serve(cli, port)
    url = f"http://127.0.0.1:{port}/v1/hooks/claude-code"
    event = {"hook_event_name": "PreToolUse", "session_id": "s-1", "cwd": str(tmp_path),
             "tool_name": "Bash", "tool_use_id": "toolu_01"}
    try:
        async with aiohttp.ClientSession() as http:
            status, doc = await call(http, "POST", url, made["token"],
                                     {**event, "tool_input": {"command": "git status"}})
            assert status == 200
            assert doc["hookSpecificOutput"]["permissionDecision"] == "allow", doc
            status, doc = await call(http, "POST", url + "?wait=0", made["token"],
                                     {**event, "tool_input": {"command": "make deploy"}})
            out = doc["hookSpecificOutput"]
            assert status == 200 and out["permissionDecision"] == "deny"
            assert "waiting for approval" in out["permissionDecisionReason"]
        [pending] = json.loads(await run_cli(cli, "approvals", "list", "--json"))
        assert (pending["tool"], pending["requested_by"]) == ("Bash", "U_DANA")
    finally:
        if serve.returncode is None:
            serve.kill()
            await serve.wait()
