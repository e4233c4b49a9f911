"""The suite waits no real time that a test double could answer at once (tests/conftest.py):
a wait a test sits through is wall time on every run and every worker."""

from __future__ import annotations

from slack_sdk.http_retry.builtin_async_handlers import (
    AsyncConnectionErrorRetryHandler,
    async_default_handlers,
)
from slack_sdk.web.async_client import AsyncWebClient


def test_slack_sdk_s_default_retry_of_a_refused_connection_waits_nothing() -> None:
    """The product's Slack clients keep slack_sdk's default retry handlers: a test that
    takes the emulator down sat through 0.5-1.5 s of backoff at each try of a card."""
    handlers = [*AsyncWebClient().retry_handlers, *async_default_handlers(),
                AsyncConnectionErrorRetryHandler()]
    assert handlers
    for handler in handlers:
        assert [handler.interval_calculator.calculate_sleep_duration(n)
                for n in range(4)] == [0.0] * 4
