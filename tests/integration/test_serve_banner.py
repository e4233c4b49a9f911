"""``serve`` says where it listens, what it serves there and in which mode, and where a
request can be decided (issue 33 item 6). In-process: :class:`bot.serve.Service` builds the
same banner ``serve`` prints (``approvald: `` before each line)."""

from __future__ import annotations

from pathlib import Path

from approvald.bot.config import Settings
from approvald.bot.serve import Service
from approvald.store.db import Database

from tests.integration.slack_harness import harness
from tests.integration.web_helpers import web_harness


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
    mode = next(line for line in text.splitlines() if line.startswith("mode: "))
    # the HTTP API decides nothing (issue 45 item 9): the mode line does not send people there
    assert mode.endswith("decided with `approvald approvals approve|deny|edit ID`"), mode
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


async def test_the_mode_line_names_the_review_queue_where_it_is_served(sqlite_url, tmp_path):
    """Issue 48 item 6: the mode line listed the CLI and not the /review queue the banner
    printed two lines later."""
    async with web_harness(sqlite_url, tmp_path) as (h, url):
        text = h.service.describe()
        mode = next(line for line in text.splitlines() if line.startswith("mode: "))
        assert f"on the web review queue ({url}/review)" in mode, mode
        assert mode.endswith("in Slack, on the web review queue "
                             f"({url}/review) and with `approvald approvals approve|deny|edit "
                             "ID`"), mode
        assert f"review: {url}/review" in text
