"""``POST /v1/hooks/claude-code``: Claude Code's HTTP hook on serve's listener, with a
bearer token scoped to that face whose calls are all made for one person, decided by
signed Slack clicks and modal submissions through the emulator (issue 39)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import re
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest
from approvald.bot import claude_code
from approvald.bot.api.service import webhook_keys

from tests.helpers import Rows, create_token, revoke_token
from tests.integration.adapter_helpers import (
    approve_in_slack,
    audit_actions,
    card_of,
    deny_in_slack,
    edit_in_slack,
    pending_request,
)
from tests.integration.slack_harness import Harness, harness

POLICY = """
[tools."hook:claude-code/Bash"]
approvers = ["U_ALICE"]
ttl = "30m"

[[tools."hook:claude-code/Bash".rules]]
when = 'args.command.startsWith("git status")'
policy = "auto"

[[tools."hook:claude-code/Bash".rules]]
when = 'args.command.startsWith("git push")'
policy = "forbidden"
reason = "pushes go through CI"

[tools."hook:claude-code/Write"]
approvers = ["U_ALICE"]
ttl = "30m"
"""
SESSION = "0b6c9a52-5c1e-4d3b-9d69-6f0c1f6a1e10"


def event(tool: str, tool_input: dict[str, Any], *, name: str = "PreToolUse",
          session: str = SESSION, use: str = "toolu_01", **extra: Any) -> dict[str, Any]:
    return {"hook_event_name": name, "session_id": session, "cwd": "/home/dana/shop",
            "tool_name": tool, "tool_input": tool_input, "tool_use_id": use,
            "transcript_path": "/tmp/t.jsonl", "permission_mode": "default", **extra}


async def token(h: Harness, name: str, **scope: Any) -> str:
    keys = webhook_keys(h.service.settings)
    assert keys is not None
    made = await create_token(h.engine, keys, name,
                              created_by="test", via="test", **scope)
    return made.token


async def hook_token(h: Harness, name: str = "dana-laptop", user: str = "U_DANA") -> str:
    return await token(h, name, face="hook:claude-code", requested_by=user)


class Hook:
    """Claude Code's side: POSTs an event as its HTTP hook does."""

    def __init__(self, h: Harness, session: aiohttp.ClientSession, bearer: str | None) -> None:
        assert h.service.slack is not None
        self.url = f"http://127.0.0.1:{h.service.slack.port}/v1/hooks/claude-code"
        self.session, self.bearer = session, bearer

    async def post(self, body: Any, *, wait: float | None = None,
                   raw: bytes | io.BytesIO | None = None) -> tuple[int, Any]:
        headers = {"Content-Type": "application/json"}
        if self.bearer:
            headers["Authorization"] = f"Bearer {self.bearer}"
        params = {} if wait is None else {"wait": str(wait)}
        data = raw if raw is not None else json.dumps(body).encode()
        async with self.session.post(self.url, data=data, headers=headers,
                                     params=params) as resp:
            text = await resp.text()
            return resp.status, json.loads(text) if text else None

    async def pre(self, tool: str, tool_input: dict[str, Any], *, wait: float = 20,
                  **kw: Any) -> tuple[str, str, dict[str, Any] | None]:
        status, doc = await self.post(event(tool, tool_input, **kw), wait=wait)
        assert status == 200, doc
        out = doc["hookSpecificOutput"]
        assert out["hookEventName"] == "PreToolUse"
        return out["permissionDecision"], out["permissionDecisionReason"], \
            out.get("updatedInput")




@pytest.fixture
def policy(tmp_path: Path) -> str:
    path = tmp_path / "policy.toml"
    path.write_text(POLICY)
    return str(path)


async def test_signed_slack_clicks_decide_the_hooks_calls(
        db_url: str, tmp_path: Path, policy: str) -> None:
    async with harness(db_url, tmp_path, background=False, APPROVALD_POLICY_FILE=policy) as h, \
            aiohttp.ClientSession() as s:
        hook = Hook(h, s, await hook_token(h))
        # auto and forbidden, at once
        assert (await hook.pre("Bash", {"command": "git status"}))[0] == "allow"
        verdict, why, _ = await hook.pre("Bash", {"command": "git push origin main"})
        assert verdict == "deny" and "pushes go through CI" in why

        # approve through a signed click -> allow
        deploy = {"command": "make deploy ENV=staging"}
        asked = asyncio.create_task(hook.pre("Bash", deploy, use="toolu_02"))
        rid = await pending_request(h)
        card = json.dumps(await h.card((await card_of(h, rid)).id))
        for shown in ("make deploy ENV=staging", "/home/dana/shop", SESSION, "dana-laptop",
                      "U_DANA"):
            assert shown in card, shown
        await approve_in_slack(h, rid)
        verdict, why, updated = await asked
        assert (verdict, updated) == ("allow", None) and "approved by U_ALICE" in why
        # what ran lands as the call's execution
        status, _ = await hook.post(event("Bash", deploy, name="PostToolUse", use="toolu_02",
                                          tool_response={"stdout": "deployed"}))
        assert status == 204

        # deny with a reason -> deny carrying it
        drop = {"command": "psql -c 'DROP TABLE orders'"}
        asked = asyncio.create_task(hook.pre("Bash", drop, use="toolu_03"))
        denied = await pending_request(h)
        await deny_in_slack(h, denied, "use a migration instead")
        verdict, why, _ = await asked
        assert verdict == "deny" and "use a migration instead" in why and "U_ALICE" in why

        # edit -> allow with updatedInput
        write = {"file_path": "/home/dana/shop/.env", "content": "DEBUG=1\n"}
        asked = asyncio.create_task(hook.pre("Write", write, use="toolu_04"))
        edited = await pending_request(h)
        fixed = {"file_path": "/home/dana/shop/.env", "content": "DEBUG=0\n"}
        await edit_in_slack(h, edited, fixed)
        verdict, _, updated = await asked
        assert (verdict, updated) == ("allow", fixed)

        # the audit log has the session and the exact tool_input of each
        trail = await audit_actions(h, rid)
        requested = next(e for e in trail if e["action"] == "requested")
        assert requested["details"]["args"] == deploy
        assert SESSION in json.dumps(requested["details"])
        executed = next(e for e in trail if e["action"] == "executed")
        assert executed["details"]["result"] == {"stdout": "deployed"}
        assert any(e["action"] == "denied" and e["details"].get("reason")
                   == "use a migration instead" for e in await audit_actions(h, denied))
        trail = await audit_actions(h, edited)
        [edit] = [e for e in trail if e["action"] == "edited"]
        assert (edit["details"]["original_args"], edit["details"]["args"]) == (write, fixed)
        [approved] = [e for e in trail if e["action"] == "approved"]
        assert approved["actor"] == "U_ALICE" and approved["details"]["args"] == fixed


async def test_the_budget_denies_naming_the_request_and_the_retry_joins_it(
        db_url: str, tmp_path: Path, policy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # what is said once ``wait`` (0 s) is spent, not how long the machine may take to
    # open the request: past the hook's HTTP_MARGIN (2 s, a wall-clock grace) a loaded
    # machine got "no decision within 2 s" instead (test_a_database_that_stalls_... is
    # the margin's own test)
    monkeypatch.setattr(claude_code, "HTTP_MARGIN", 60.0)
    async with harness(db_url, tmp_path, background=False, APPROVALD_POLICY_FILE=policy) as h, \
            aiohttp.ClientSession() as s:
        dana = Hook(h, s, await hook_token(h))
        rm = {"command": "rm -rf build/"}
        verdict, why, _ = await dana.pre("Bash", rm, wait=0)
        rid = await pending_request(h)
        assert verdict == "deny" and rid in why and "same call again" in why
        # the same call made again joins that request (one card); approved, it is allowed
        again = asyncio.create_task(dana.pre("Bash", rm, use="toolu_09"))
        await approve_in_slack(h, rid)
        assert (await again)[0] == "allow"
        assert len(await Rows.of(h.engine).requests()) == 1

        # another token's holder who knows the session id makes its own request: it never
        # joins Dana's, so it cannot learn or use her decisions
        mallory = Hook(h, s, await hook_token(h, "mallory-box", "U_MALLORY"))
        other = {"command": "rm -rf dist/"}
        await dana.pre("Bash", other, wait=0)
        await mallory.pre("Bash", other, wait=0)
        rows = await Rows.of(h.engine).requests(status="pending")
        assert sorted(a.requested_by for a in rows) == ["U_DANA", "U_MALLORY"]


async def test_a_token_calls_its_own_face_only_and_bad_input_is_refused(
        db_url: str, tmp_path: Path, policy: str) -> None:
    async with harness(db_url, tmp_path, background=False, APPROVALD_POLICY_FILE=policy) as h, \
            aiohttp.ClientSession() as s:
        bearer = await hook_token(h)
        api_token = await token(h, "deploy-bot", tools="*")
        ev = event("Bash", {"command": "ls"})
        assert (await Hook(h, s, None).post(ev))[0] == 401
        assert (await Hook(h, s, "apd_not-a-token").post(ev))[0] == 401
        status, doc = await Hook(h, s, api_token).post(ev)
        assert status == 403 and doc["error"]["code"] == "wrong_face"
        # the hook's token is not an API token
        base = Hook(h, s, bearer).url.removesuffix("/hooks/claude-code")
        async with s.post(f"{base}/requests", json={"tool": "deploy", "args": {}},
                          headers={"Authorization": f"Bearer {bearer}"}) as resp:
            assert resp.status == 403 and "Claude Code hook" in await resp.text()
        hook = Hook(h, s, bearer)
        assert "wait is a number of seconds" in deny_reason(*await hook.post(ev, wait=56))
        # once the token is known, what cannot be decided is a 200 deny (fail closed)
        for raw in (b"{not json", b"[]", json.dumps({**ev, "tool_input": "ls"}).encode()):
            status, doc = await hook.post(None, raw=raw)
            assert status == 200 and \
                doc["hookSpecificOutput"]["permissionDecision"] == "deny", doc
        # a revoked token stops at once
        await revoke_token(h.engine, "dana-laptop",
                           by="test", via="test")
        assert (await hook.post(ev))[0] == 401
        # nothing was asked by any of these
        assert await Rows.of(h.engine).requests() == []


async def test_the_requester_is_the_tokens_never_the_callers(
        db_url: str, tmp_path: Path, policy: str) -> None:
    async with harness(db_url, tmp_path, background=False, APPROVALD_POLICY_FILE=policy) as h, \
            aiohttp.ClientSession() as s:
        hook = Hook(h, s, await hook_token(h, "alice-laptop", "U_ALICE"))
        # a body naming someone else changes nothing: the token's person asks, and may not
        # approve their own call
        ev = event("Bash", {"command": "make release"}, requested_by="U_BOB",
                   user_id="U_BOB")
        status, _ = await hook.post(ev, wait=0)
        assert status == 200
        rid = await pending_request(h)
        [a] = await Rows.of(h.engine).approvals(rid)
        assert a.requested_by == "U_ALICE"


def deny_reason(status: int, doc: Any) -> str:
    """The reason of a 200 deny (and that it is one)."""
    assert status == 200, doc
    said = doc["hookSpecificOutput"]
    assert said["permissionDecision"] == "deny", said
    return str(said["permissionDecisionReason"])


def nested(depth: int) -> str:
    return '{"a":' * depth + "1" + "}" * depth


async def test_once_the_token_is_known_input_it_cannot_take_is_a_200_deny(
        db_url: str, tmp_path: Path, policy: str) -> None:
    """Issue 45, item 2: a tool input nested 1,000 levels deep (2 KB, which fits in any
    free-form MCP argument) was a 500, an event over 1 MB (a large Write) a 413: Claude Code
    runs the call on either unless the hook says ``onFailure: "block"``."""
    async with harness(db_url, tmp_path, background=False, APPROVALD_POLICY_FILE=policy) as h, \
            aiohttp.ClientSession() as s:
        hook = Hook(h, s, await hook_token(h))
        plain = json.dumps(event("Bash", {"command": "ls"}))
        for depth in (1000, 900, 100):  # past what JSON reads; past what approvald takes
            raw = plain.replace('{"command": "ls"}', nested(depth)).encode()
            why = deny_reason(*await hook.post(None, raw=raw))
            assert "deeper than" in why, why
        too_big = json.dumps(event("Write", {"file_path": "a", "content": "x" * 1_100_000}))
        why = deny_reason(*await hook.post(None, raw=io.BytesIO(too_big.encode())))
        assert "larger than" in why, why
        assert "not UTF-8" in deny_reason(*await hook.post(None, raw=b'{"a": "\xff"}'))
        assert await Rows.of(h.engine).requests() == []


@contextlib.asynccontextmanager
async def database_held(db_url: str) -> AsyncIterator[None]:
    """Another connection holds the database so that serve's next write waits: SQLite
    under ``BEGIN EXCLUSIVE``, PostgreSQL with the requests' table locked."""
    if db_url.startswith("sqlite"):
        held = sqlite3.connect(db_url.split("///", 1)[1], isolation_level=None)
        held.execute("BEGIN EXCLUSIVE")
        try:
            yield
        finally:
            held.execute("ROLLBACK")
            held.close()
        return
    conn = await asyncpg.connect(db_url.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        tx = conn.transaction()
        await tx.start()
        await conn.execute("LOCK TABLE external_requests IN ACCESS EXCLUSIVE MODE")
        try:
            yield
        finally:
            await tx.rollback()
    finally:
        await conn.close()


async def test_a_database_that_stalls_after_the_token_is_a_200_deny_in_time(
        db_url: str, tmp_path: Path, policy: str) -> None:
    """Issue 45, item 2: the database not answering was a 500 (SQLite, after its busy
    timeout) or no answer at all (PostgreSQL); now a 200 deny within ``wait`` plus the
    hook's margin."""
    async with harness(db_url, tmp_path, background=False, APPROVALD_POLICY_FILE=policy) as h, \
            aiohttp.ClientSession() as s:
        hook = Hook(h, s, await hook_token(h))
        async with database_held(db_url):
            answered = await asyncio.wait_for(
                hook.post(event("Bash", {"command": "git status"}), wait=0),
                claude_code.MARGIN + 5)
        assert "could not decide" in deny_reason(*answered)


PAGE = Path(__file__).resolve().parents[2] / "docs" / "how-to" / "claude-code.md"


@pytest.mark.slow  # starts bash and curl
async def test_the_guides_http_example_runs_as_written(
        sqlite_url: str, tmp_path: Path, policy: str) -> None:
    """docs/how-to/claude-code.md's curl example, run by bash against serve's listener."""
    text = PAGE.read_text(encoding="utf-8")
    found = re.search(r"<!-- run-by: tests/integration/test_claude_code_http.py -->\n"
                      r"```sh\n(.*?)```", text, re.DOTALL)
    assert found, "docs/how-to/claude-code.md lost its HTTP example"
    command = "\n".join(line for line in found.group(1).splitlines()
                        if not line.startswith("#"))
    async with harness(sqlite_url, tmp_path, background=False,
                       APPROVALD_POLICY_FILE=policy) as h:
        assert h.service.slack is not None
        proc = await asyncio.create_subprocess_exec(
            "bash", "-c", command, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "APPROVALD_URL": f"http://127.0.0.1:{h.service.slack.port}",
                 "APPROVALD_HOOK_TOKEN": await hook_token(h)})
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, err.decode()
        said = json.loads(out)["hookSpecificOutput"]
        assert said["permissionDecision"] == "deny"
        assert "pushes go through CI" in said["permissionDecisionReason"]
