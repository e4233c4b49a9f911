"""The Slack face's reconnect delays: doubling, capped, spread so replicas do not align."""

from __future__ import annotations

import random

from approvald.bot.slack.app import BACKOFF_BASE, BACKOFF_MAX, backoff


def test_backoff_doubles_up_to_its_cap_within_the_upper_half() -> None:
    random.seed(9)
    for failures in range(1, 40):
        ceiling = min(BACKOFF_MAX, BACKOFF_BASE * 2 ** (failures - 1))
        for _ in range(50):
            assert ceiling / 2 <= backoff(failures) <= ceiling
    assert max(backoff(1000) for _ in range(100)) <= BACKOFF_MAX


def test_backoff_is_spread() -> None:
    random.seed(9)
    assert len({round(backoff(5), 3) for _ in range(20)}) > 10
