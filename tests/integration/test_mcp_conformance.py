"""The official MCP conformance suite (``@modelcontextprotocol/conformance``, pinned with Node
22 and the suite's reference server in tests/mcp_conformance/) run against the suite's own
reference server directly, as the baseline, and through ``serve``'s MCP gateway in front of
it: every server scenario that passes directly passes through the gateway, but the few a
stateless gateway cannot serve (``CANNOT``, each with its reason, as the docs say).

The suite's client sends no ``Authorization`` header, and the gateway answers nothing without
a bearer token made for it: a small forwarding proxy in this test adds the token of a client
of the gateway and passes everything else through unchanged (``Host`` and ``Origin``
included, which the DNS-rebinding scenario sends on purpose).

Installed by ``.ci/run`` (``npm ci --prefix tests/mcp_conformance``); without the npm
packages the test is skipped, except where ``APPROVALD_REQUIRE_CONFORMANCE=1`` (CI) makes
their absence a failure.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from approvald.bot.api.service import webhook_keys

from tests.helpers import create_token, free_port
from tests.integration.slack_harness import harness

pytestmark = pytest.mark.slow

SUITE = Path(__file__).resolve().parents[1] / "mcp_conformance"
BIN = SUITE / "node_modules" / ".bin"
REQUIRED = os.environ.get("APPROVALD_REQUIRE_CONFORMANCE") == "1"

# what a stateless gateway cannot serve, by scenario or by scenario:check
# (docs/how-to/mcp-gateway.md says the same): every other check that passes directly must
# pass through the gateway
CANNOT = {
    "server-sse-polling":
        "resuming a closed stream with Last-Event-ID needs the session's event store",
    "resources-subscribe":
        "a 2025-11-25 subscription delivers its updates on the session's GET stream",
    "resources-unsubscribe": "the same: a subscription belongs to a 2025-11-25 session",
    # not a stateless gateway's limits, but what this one does on purpose or is given
    "tasks-lifecycle:tasks-sync-tool-call":
        "calls a tool the server does not list: the gateway forwards no call of a tool it "
        "cannot name to its operator, and answers -32602 (the specification's error for an "
        "unknown tool) where the reference server answers with a tool error",
    "tasks-capability-negotiation:sep-2663-server-rejects-undeclared-client":
        "the same: a call of a tool the reference server does not list",
    "tasks-dispatch-and-envelope:tasks-immediate-result-shortcut":
        "the same: a call of a tool the reference server does not list",
    "server-stateless:sep-2575-http-server-no-independent-requests-on-stream":
        "the reference server answers test_streaming_elicitation with two JSON messages in "
        "one application/json body, which the gateway's MCP client (the mcp SDK) refuses "
        "as invalid JSON (-32700); the suite's own client reads past it",
}



def _installed() -> None:
    missing = [p for p in (BIN / "conformance", BIN / "tsx", BIN / "node") if not p.exists()]
    if missing:
        reason = ("the MCP conformance suite is not installed: npm ci --prefix "
                  "tests/mcp_conformance")
        if REQUIRED:
            pytest.fail(f"{reason} (APPROVALD_REQUIRE_CONFORMANCE=1)")
        pytest.skip(reason)


def _env() -> dict[str, str]:
    # the pinned Node 22 first: the suite and its server need it, the machine may have older
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}


@asynccontextmanager
async def reference_server() -> AsyncIterator[str]:
    """The suite's reference server (everything-server.ts), on a port of its own."""
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        str(BIN / "tsx"), str(SUITE / "everything-server.ts"), cwd=str(SUITE),
        env={**_env(), "PORT": str(port)}, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT)
    try:
        assert proc.stdout is not None
        seen = b""
        while b"running on" not in seen:
            line = await asyncio.wait_for(proc.stdout.readline(), 60)
            assert line, f"the reference server stopped: {seen.decode()}"
            seen += line
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        if proc.returncode is None:
            proc.terminate()
            await proc.wait()


async def run_suite(url: str, out: Path, *args: str) -> dict[str, bool]:
    """Each check's verdict, as ``scenario:check-id`` (a check that recurs in a scenario
    fails if any of its occurrences fails; INFO and WARNING are not failures)."""
    proc = await asyncio.create_subprocess_exec(
        str(BIN / "conformance"), "server", "--url", url, "-o", str(out), *args,
        env=_env(), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    output, _ = await asyncio.wait_for(proc.communicate(), 400)
    assert proc.returncode is not None, output.decode()[-3000:]
    return verdicts_in(out)


def verdicts_in(out: Path) -> dict[str, bool]:
    verdicts: dict[str, bool] = {}
    for checks in out.glob("server-*/checks.json"):
        # server-<scenario>-<timestamp>, the timestamp an ISO time with dashes
        scenario = re.sub(r"-\d{4}-\d\d-\d\dT[\d-]+Z$", "",
                          checks.parent.name.removeprefix("server-"))
        for check in json.loads(checks.read_text()):
            key = f"{scenario}:{check['id']}"
            verdicts[key] = verdicts.get(key, True) and check["status"] != "FAILURE"
    assert verdicts, f"no checks in {out}"
    return verdicts


def excused(key: str) -> bool:
    scenario = key.partition(":")[0]
    return scenario in CANNOT or key in CANNOT


@asynccontextmanager
async def bearer_proxy(target: str, bearer: str) -> AsyncIterator[str]:
    """Forwards every request to ``target`` with ``Authorization: Bearer`` added, streaming
    the answer back as it comes (server-sent events included)."""
    session = aiohttp.ClientSession(auto_decompress=False)

    async def forward(request: web.Request) -> web.StreamResponse:
        headers = {k: v for k, v in request.headers.items()
                   if k.lower() not in ("content-length", "transfer-encoding")}
        headers["Authorization"] = f"Bearer {bearer}"
        async with session.request(request.method, target, headers=headers,
                                   data=await request.read()) as upstream:
            resp = web.StreamResponse(status=upstream.status, headers={
                k: v for k, v in upstream.headers.items()
                if k.lower() not in ("content-length", "transfer-encoding",
                                     "content-encoding")})
            await resp.prepare(request)
            try:
                async for chunk in upstream.content.iter_any():
                    await resp.write(chunk)
                await resp.write_eof()
            except (ConnectionError, aiohttp.ClientError):
                pass  # the suite hung up (as its SSE scenarios do): so does the proxy
            return resp

    app = web.Application()
    app.router.add_route("*", "/mcp", forward)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        await runner.cleanup()
        await session.close()


POLICY = """
[tools."mcp:ref/*"]    # the suite's scenarios expect answers, not approval requests
policy = "auto"
"""


async def test_every_scenario_passing_directly_passes_through_the_gateway(
        sqlite_url: str, tmp_path: Path) -> None:
    _installed()
    async with reference_server() as direct:
        baseline = await run_suite(direct, tmp_path / "direct", "--suite", "all")
        (tmp_path / "policy.toml").write_text(POLICY)
        (tmp_path / "gateways.toml").write_text(
            f'[gateways.ref]\nurl = "{direct}"\n'
            'allowed_hosts = ["127.0.0.1:*", "localhost:*"]\n'
            'allowed_origins = ["http://127.0.0.1:*", "http://localhost:*"]\nwait = 5\n')
        async with harness(sqlite_url, tmp_path, background=False,
                           APPROVALD_POLICY_FILE=str(tmp_path / "policy.toml"),
                           APPROVALD_MCP_GATEWAYS_FILE=str(tmp_path / "gateways.toml")) as h:
            keys = webhook_keys(h.service.settings)
            assert keys is not None
            made = await create_token(h.engine, keys, "conformance", created_by="test", via="test",
                                      face="mcp:ref", requested_by="U_DANA")
            assert h.service.slack is not None
            gateway = f"http://127.0.0.1:{h.service.slack.port}/mcp/ref"
            async with bearer_proxy(gateway, made.token) as proxied:
                through = await run_suite(proxied, tmp_path / "gateway", "--suite", "all")
    passing = {key for key, ok in baseline.items() if ok}
    lost = sorted(key for key in passing if not excused(key) and not through.get(key))
    report: dict[str, Any] = {
        "checks passing directly": len(passing),
        "of them through the gateway": sum(1 for key in passing if through.get(key)),
        "scenarios": len({key.partition(":")[0] for key in baseline}), "lost": lost}
    print(json.dumps(report, indent=1))
    assert not lost, report
    # a check listed as impossible that passes after all is listed for no reason
    listed = [key for key in passing if excused(key) and through.get(key)
              and not key.endswith(":wire-schema-valid")]
    assert not [k for k in CANNOT if ":" in k and k in listed], listed
    assert [s for s in CANNOT if ":" not in s and not any(
        k.startswith(f"{s}:") and not through.get(k) for k in passing)] == [], \
        "CANNOT lists a scenario whose every check passes through the gateway"
