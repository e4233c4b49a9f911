"""``serve`` whose database goes away just as it starts: once its listeners are bound it
stays up whatever the database does, answers ``/healthz``, says on ``/readyz`` why it is not
ready, and recovers when the database is back.

``/healthz`` answers from the moment the listeners are bound, before the expiry schedule is
read: a database that refused serve's credentials in that moment (a loaded CI machine, a
password rotated during a deploy) stopped ``serve`` with an internal error, so the port
that had just answered refused connections (tests/acceptance/test_serve_ops.py failed so
once). Here the outage is made at that very point, not left to load: a proxy in front of
PostgreSQL is cut as soon as the listeners are bound."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest
from approvald.bot.config import Settings
from approvald.bot.serve import Service
from approvald.runtime import Engine
from approvald.store.db import Database
from sqlalchemy.engine import make_url

from tests.conftest import PG_ADMIN_URL
from tests.helpers import Proxy
from tests.integration.slack_harness import harness, wait_for


async def get(url: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http, http.get(url) as r:
        return r.status, await r.json()


async def through_a_proxy(db_url: str) -> tuple[Proxy, str]:
    """A proxy in front of the test's PostgreSQL server (started), and ``db_url`` through it."""
    server = make_url(PG_ADMIN_URL)
    proxy = Proxy(server.host or "127.0.0.1", server.port or 5432)
    await proxy.start()
    return proxy, make_url(db_url).set(host="127.0.0.1", port=proxy.port).render_as_string(
        hide_password=False)


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_a_database_gone_as_serve_starts_leaves_it_serving_and_it_recovers(
        db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    proxy, url = await through_a_proxy(db_url)
    settings = Settings(APPROVALD_DATABASE_URL=url, APPROVALD_HOST="127.0.0.1",
                        APPROVALD_PORT="0", APPROVALD_POLL_INTERVAL="0.05",
                        APPROVALD_SWEEP_INTERVAL="0.1", APPROVALD_METRICS_ADDR="off",
                        APPROVALD_DEMO_LEDGER=str(tmp_path / "ledger.jsonl"))
    db = Database(url)
    service = Service(settings, db)
    # a request waiting for its approvers: the schedule serve reads as it starts has its job
    paused = await service.engine.run("demo-refund", "Refund order A-7", requested_by="U_DANA")
    [approval_id] = paused.approval_ids
    listen = service._start_ops_listener

    async def listen_then_lose_the_database() -> None:
        await listen()
        await proxy.cut()  # /healthz answers from here on: the database goes away now

    monkeypatch.setattr(service, "_start_ops_listener", listen_then_lose_the_database)
    try:
        await service.start()
        base = f"http://127.0.0.1:{service.ops_port}"
        assert (await get(f"{base}/healthz"))[0] == 200
        assert await get(f"{base}/readyz") == (
            503, {"ok": False, "database": "database unreachable: connection refused"})
        assert "pending approvals not scheduled yet" in service.describe()
        await proxy.start()  # the database is back, on the same address

        async def ready() -> bool:
            return (await get(f"{base}/readyz"))[0] == 200
        await wait_for(ready, within=20, what="/readyz to be ready again")

        def scheduled() -> bool:
            return service.scheduler.scheduler.get_job(f"approval:{approval_id}") is not None
        await wait_for(scheduled, within=20, what="the sweep to schedule the request's expiry")
        assert (await get(f"{base}/healthz"))[0] == 200
    finally:
        await service.stop(grace=5)
        await db.close()
        await proxy.cut()


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_a_database_gone_as_the_audit_head_is_read_leaves_serve_serving(
        db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # with Slack and an audit channel, serve posts the head it started on, once its
    # listener answers /healthz: the database going away just then must not stop it
    proxy, url = await through_a_proxy(db_url)
    queue_head = Engine.queue_audit_head

    async def lose_the_database_first(engine: Engine) -> bool:
        await proxy.cut()
        return await queue_head(engine)

    monkeypatch.setattr(Engine, "queue_audit_head", lose_the_database_first)
    try:
        async with harness(url, tmp_path, APPROVALD_AUDIT_CHANNEL="C_AUDIT") as h:
            monkeypatch.undo()
            assert h.service.slack is not None
            base = f"http://127.0.0.1:{h.service.slack.port}"
            assert (await get(f"{base}/healthz"))[0] == 200
            assert (await get(f"{base}/readyz"))[1]["database"] == \
                "database unreachable: connection refused"
            assert h.service.scheduler.scheduler.get_job("audit-head") is not None
            await proxy.start()  # back: the next interval's head is posted

            async def ready() -> bool:
                return (await get(f"{base}/readyz"))[0] == 200
            await wait_for(ready, within=20, what="/readyz to be ready again")
            await h.service.post_audit_head()
            await wait_for(lambda: any("Audit log head" in m.get("text", "")
                                       for m in h.emulator.messages("C_AUDIT")),
                           what="the head in the audit channel")
    finally:
        await proxy.cut()
