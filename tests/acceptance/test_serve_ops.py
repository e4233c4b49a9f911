"""What ``approvald serve`` shows on its listeners (issue 36, defect 11): ``/readyz`` says
what failed in words an operator can act on, never the database's host, port, user or
name; ``/metrics`` is on a listener of its own (``APPROVALD_METRICS_ADDR``), not on the
one Slack and API callers reach."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.acceptance.test_slack_serve import free_port, setup, start_serve, stop_all, telling
from tests.conftest import PG_ADMIN_URL, _pg_admin
from tests.helpers import Proxy, make_cli
from tests.integration.slack_harness import wait_for

# each test here starts approvald (or a browser) as a process of its own
pytestmark = pytest.mark.slow


async def get(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as http, http.get(url) as r:
        return r.status, await r.text()


def serve_log(workdir: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in sorted(workdir.glob("serve-*.log")))


async def test_metrics_are_served_on_their_own_listener(sqlite_url: str, tmp_path: Path) -> None:
    emulator, cli = await setup(tmp_path, sqlite_url)
    port, metrics = free_port(), free_port()
    serve = await start_serve(cli, port, APPROVALD_METRICS_ADDR=f"127.0.0.1:{metrics}")
    try:
        # the Slack-facing listener: events, health, readiness; no business counts
        assert (await get(f"http://127.0.0.1:{port}/healthz"))[0] == 200
        assert (await get(f"http://127.0.0.1:{port}/readyz"))[0] == 200
        assert (await get(f"http://127.0.0.1:{port}/metrics"))[0] == 404
        status, text = await get(f"http://127.0.0.1:{metrics}/metrics")
        assert status == 200 and "approvald_pending_approvals 0.0" in text
        assert "approvald_decisions_total" in text or "approvald_decisions" in text
        assert (await get(f"http://127.0.0.1:{metrics}/healthz"))[0] == 404  # only metrics
        await wait_for(lambda: f"metrics: http://127.0.0.1:{metrics}/metrics"
                       in serve_log(tmp_path), what="serve to say where metrics are")
    finally:
        await stop_all([serve], emulator)


async def test_a_metrics_address_in_use_stops_serve_naming_the_variable(
        sqlite_url: str, tmp_path: Path) -> None:
    cli = make_cli(sqlite_url, tmp_path)
    taken = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    try:
        port = taken.sockets[0].getsockname()[1]
        done = await asyncio.to_thread(cli, "serve", timeout=30,
                                       APPROVALD_METRICS_ADDR=f"127.0.0.1:{port}")
        assert done.returncode == 2
        assert f"APPROVALD_METRICS_ADDR: cannot listen on 127.0.0.1:{port}" in done.stderr
        bad = await asyncio.to_thread(cli, "serve", timeout=30, APPROVALD_METRICS_ADDR="9464")
        assert bad.returncode == 2 and "APPROVALD_METRICS_ADDR" in bad.stderr
    finally:
        taken.close()
        await taken.wait_closed()


async def test_readyz_says_what_failed_without_the_database_details(
        pg_url: str | None, tmp_path: Path) -> None:
    if pg_url is None:
        pytest.skip("PostgreSQL is not available")
    tag = uuid.uuid4().hex[:8]
    role, name = f"readyz_role_{tag}", f"readyz_db_{tag}"
    await _pg_admin(f'CREATE ROLE "{role}" LOGIN')
    await _pg_admin(f'CREATE DATABASE "{name}" OWNER "{role}"')
    server = PG_ADMIN_URL.rsplit("@", 1)[1].rsplit("/", 1)[0]  # host:port
    host, _, pg_port = server.partition(":")
    proxy = Proxy(host, int(pg_port or 5432))
    await proxy.start()
    url = f"postgresql+asyncpg://{role}@127.0.0.1:{proxy.port}/{name}"
    cli = make_cli(url, tmp_path)
    port = free_port()
    serve = await start_serve(cli, port, APPROVALD_SHUTDOWN_GRACE="5")
    secrets = (role, name, "127.0.0.1", str(proxy.port), "postgresql", "asyncpg")

    async def readyz() -> tuple[int, dict[str, Any]]:
        async with aiohttp.ClientSession() as http, \
                http.get(f"http://127.0.0.1:{port}/readyz") as r:
            body = await r.text()
            for s in secrets:
                assert s not in body, f"/readyz shows {s!r}: {body}"
            return r.status, await r.json()

    async def says(words: str) -> bool:
        status, body = await readyz()
        return status == 503 and body["database"] == words

    try:
        # a failure says what became of serve: its exit status and its log
        async with telling(serve):
            assert (await readyz())[0] == 200
            # the credentials stop working (a rotated password, a disabled user)
            await _pg_admin(f'ALTER ROLE "{role}" NOLOGIN')
            await _pg_admin("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                            f"WHERE usename = '{role}'")
            await wait_for(lambda: says("database rejected the credentials (the user may not "
                                        "log in, or pg_hba.conf refuses this host)"),
                           within=20, what="/readyz to say the credentials were rejected")
            await _pg_admin(f'ALTER ROLE "{role}" LOGIN')

            async def ready() -> bool:
                return (await readyz())[0] == 200
            await wait_for(ready, within=20, what="/readyz to be ready again")
            # the database stops answering
            await proxy.cut()
            await wait_for(lambda: says("database unreachable: connection refused"), within=20,
                           what="/readyz to say the database is unreachable")
            # the details are for the operator, in the log
            logged = serve_log(tmp_path)
            assert "not ready: database rejected the credentials" in logged and role in logged
            assert "not ready: database unreachable: connection refused" in logged
    finally:
        serve.terminate()
        await serve.wait()
        with contextlib.suppress(Exception):
            await proxy.cut()
        await _pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await _pg_admin(f'DROP ROLE IF EXISTS "{role}"')
