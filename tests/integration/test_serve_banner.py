"""``serve`` says where it listens, what it serves there and in which mode, and where a
request can be decided (issue 33 item 6). In-process: :class:`bot.serve.Service` builds the
same banner ``serve`` prints (``approvald: `` before each line)."""

from __future__ import annotations

from pathlib import Path

from approvald.bot.config import Settings
from approvald.bot.serve import Service
from approvald.store.db import Database

from tests.integration.slack_harness import harness


def settings(db_url: str, tmp_path: Path, **extra: str) -> Settings:
    return Settings(APPROVALD_DATABASE_URL=db_url, APPROVALD_HOST="127.0.0.1",
                    APPROVALD_POLL_INTERVAL="600", APPROVALD_METRICS_ADDR="127.0.0.1:0",
                    APPROVALD_DEMO_LEDGER=str(tmp_path / "ledger.jsonl"), **extra)


async def banner(db_url: str, s: Settings) -> tuple[Service, str]:
    db = Database(db_url)
    service = Service(s, db)
    try:
        await service.start()
        return service, service.describe()
    finally:
        await service.stop()
        await db.close()


async def test_without_slack_it_says_so_and_where_requests_are_decided(db_url, tmp_path):
    service, text = await banner(db_url, settings(db_url, tmp_path, APPROVALD_PORT="0"))
    base = f"http://127.0.0.1:{service.ops_port}"
    assert text.startswith("serving on ")
    assert f"{base}/v1" in text and f"{base}/healthz" in text and f"{base}/readyz" in text
    assert "Slack is not configured" in text
    assert "approvald approvals approve" in text
    # the HTTP API asks and waits: it decides nothing, so it is not offered as a place to
    # decide (issue 45 item 9)
    assert "decided with `approvald approvals approve|deny|edit ID`\n" in text
    assert f"{service.metrics_url}" in text
    assert "/slack/events" not in text


async def test_without_a_port_it_says_nothing_listens_for_http(db_url, tmp_path):
    service, text = await banner(db_url, settings(db_url, tmp_path))
    assert service.ops_port is None
    assert "no HTTP listener" in text and "APPROVALD_PORT" in text and "/v1" in text


async def test_with_slack_over_http_it_names_the_events_url(sqlite_url, tmp_path):
    async with harness(sqlite_url, tmp_path) as h:
        assert h.service.slack is not None
        text = h.service.describe()
        base = f"http://127.0.0.1:{h.service.slack.port}"
        assert f"{base}/slack/events" in text and f"{base}/v1" in text
        assert "Slack over HTTP" in text
        assert "Slack is not configured" not in text
