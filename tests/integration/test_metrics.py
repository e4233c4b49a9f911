"""``/healthz``, ``/readyz`` and ``/metrics`` (issue 14): scraped over HTTP from a running
service and parsed with prometheus-client's own parser. ``/metrics`` is on a listener of
its own (issue 36), not on the one Slack and API callers reach."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp
from approvald.bot.config import Settings
from approvald.bot.serve import Service
from approvald.runtime.approvals.decide import Actor
from approvald.runtime.kernel.clock import ManualClock
from approvald.runtime.kernel.errors import ApprovaldError
from approvald.store import migrate
from approvald.store.db import Database
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import Rows


def scrape(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


async def get(port: int, path: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http, \
            http.get(f"http://127.0.0.1:{port}{path}") as r:
        body = await (r.text() if path == "/metrics" else r.json())
        return r.status, body


async def test_health_readiness_and_metrics_without_slack(db_url: str, tmp_path: Path,
                                                          monkeypatch) -> None:
    db = Database(db_url)
    settings = Settings(APPROVALD_DATABASE_URL=db_url, APPROVALD_PORT="0",
                        APPROVALD_HOST="127.0.0.1", APPROVALD_POLL_INTERVAL="600",
                        APPROVALD_DEMO_LEDGER=str(tmp_path / "ledger.jsonl"))
    service = Service(settings, db)
    try:
        await service.start()
        port, metrics = service.ops_port, service.metrics_port
        assert port and metrics and metrics != port
        assert await get(port, "/healthz") == (200, {"ok": True, "slack": "off"})
        status, body = await get(port, "/readyz")
        assert (status, body["schema"]) == (200, migrate.HEAD)
        async with aiohttp.ClientSession() as http, \
                http.get(f"http://127.0.0.1:{port}/metrics") as r:
            assert r.status == 404  # not where Slack and API callers reach
        assert service.metrics_url == f"http://127.0.0.1:{metrics}/metrics"
        assert service.metrics_url in service.describe()

        engine = service.engine
        paused = await engine.run("demo-refund", "Refund order A-9", requested_by="U_DANA")
        status, text = await get(metrics, "/metrics")
        m = scrape(text)
        assert m[("approvald_pending_approvals", ())] == 1
        assert m[("approvald_runs", (("status", "awaiting_approval"),))] == 1
        assert m[("approvald_outbox_backlog", ())] >= 0
        assert m[("approvald_lease_takeovers_total", ())] == 0
        try:  # the requester may not approve: a refusal is counted with its reason
            await engine.decide(paused.approval_ids[0], actor=Actor("U_DANA", "cli"),
                                verdict="approve")
        except ApprovaldError:
            pass
        await engine.decide(paused.approval_ids[0], actor=Actor("U_ALICE", "cli"),
                            verdict="approve")
        deadline = time.monotonic() + 20
        while True:  # the worker resumes the decided run and reaches the refund
            m = scrape((await get(metrics, "/metrics"))[1])
            if m.get(("approvald_click_to_tool_start_seconds_count", ())) == 1:
                break
            assert time.monotonic() < deadline, "the decided run did not reach its call"
            await asyncio.sleep(0.05)
        assert m[("approvald_decisions_total", (("outcome", "approved"),))] == 1
        assert m[("approvald_decisions_total", (("outcome", "refused:self_approval"),))] == 1
        assert m[("approvald_decision_seconds_count", ())] == 2
        assert m[("approvald_pending_approvals", ())] == 0

        # not ready: a schema this code does not expect, or a database that does not answer
        monkeypatch.setattr(migrate, "HEAD", "9999")
        status, body = await get(port, "/readyz")
        assert status == 503 and "approvald db upgrade" in body["database"]
        # ... or a newer one than it knows (a rollout migrated it): the fix is a new replica
        monkeypatch.setattr(migrate, "HEAD", "0000")
        status, body = await get(port, "/readyz")
        assert status == 503 and "newer approvald" in body["database"]

        async def down(_db: Database) -> str:
            raise ConnectionRefusedError("connection refused")
        monkeypatch.setattr(migrate, "current_revision", down)
        status, body = await get(port, "/readyz")
        assert status == 503 and body["database"] == "database unreachable: connection refused"
        assert (await get(port, "/healthz"))[0] == 200  # still alive, only not ready
    finally:
        await service.stop(grace=5)
        await db.close()


async def test_lease_takeovers_are_counted(db_url: str, tmp_path: Path) -> None:
    clock = ManualClock()
    db = Database(db_url, server_time=False)  # leases by the injected clock, to lapse them
    settings = Settings(APPROVALD_DATABASE_URL=db_url, APPROVALD_PORT="0",
                        APPROVALD_HOST="127.0.0.1", APPROVALD_POLL_INTERVAL="600",
                        APPROVALD_DEMO_LEDGER=str(tmp_path / "ledger.jsonl"))
    service = Service(settings, db, clock=clock)
    try:
        await service.start(background=False)  # the worker is driven by hand
        metrics = service.metrics_port
        assert metrics
        engine = service.engine
        runs = [await engine.start_run("demo-steps", "2", requested_by="U_DANA")
                for _ in range(3)]
        now = clock.now()
        async def vanished(tx):  # type: ignore[no-untyped-def]
            for run_id in runs[:2]:
                assert await tx.runs.acquire_lease(run_id, owner="host-gone:1:aa", now=now,
                                                   until=now + timedelta(seconds=30))

        # a worker on another host took two, then vanished
        await Rows(db).in_one_write(vanished)
        # the third was free: advancing it takes no lease over
        assert (await engine.advance(runs[2])).status == "completed"
        assert scrape((await get(metrics, "/metrics"))[1])[
            ("approvald_lease_takeovers_total", ())] == 0
        clock.advance(31)  # their leases lapse
        # one is advanced directly (a click, the CLI), the other found by the worker's poll
        assert (await engine.advance(runs[0])).status == "completed"
        assert await service.worker.poll_once() == 1
        m = scrape((await get(metrics, "/metrics"))[1])
        assert m[("approvald_lease_takeovers_total", ())] == 2
    finally:
        await service.stop(grace=5)
        await db.close()
