"""Headless delivery: when no Slack app is configured, outbox rows become log lines.

Lets ``approvald serve`` run the scheduler, worker and outbox without Slack (CLI-only
deployments, tests); decisions then come from ``approvald approvals ...``.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from approvald.runtime import (
    CARD_POST,
    CARD_UPDATE,
    DEAD_REPORT,
    HEAD_POST,
    NOTICE,
    REMINDER,
    RUN_WAITING,
    Masking,
)
from approvald.store.records import OutboxRecord

log = logging.getLogger("approvald.delivery")

# the outbox kinds the Slack face delivers (and, without Slack, this log in its place)
SLACK_KINDS = frozenset({CARD_POST, CARD_UPDATE, REMINDER, NOTICE, RUN_WAITING, HEAD_POST,
                         DEAD_REPORT})


class LogDeliverer:
    """The Slack face's rows as log lines, when no Slack app is configured."""

    kinds = SLACK_KINDS

    def __init__(self) -> None:
        self.delivered: list[OutboxRecord] = []

    async def deliver(self, row: OutboxRecord) -> dict[str, Any] | None:
        # a notice's payload carries the call's arguments (and their declared paths):
        # logs see them masked, as every face does
        raw = json.loads(row.payload)
        paths = raw.get("sensitive") if isinstance(raw.get("sensitive"), list) else []
        payload = Masking([str(p) for p in paths]).details(raw)
        log.info("%s %s", row.kind, " ".join(f"{k}={v}" for k, v in payload.items()))
        self.delivered.append(row)
        return {"logged": True}
