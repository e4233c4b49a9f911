"""Headless delivery: when no Slack app is configured, outbox rows become log lines.

Lets ``approvald serve`` run the scheduler, worker and outbox without Slack (CLI-only
deployments, tests); decisions then come from ``approvald approvals ...``.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from approvald.runtime.sensitive import mask_args
from approvald.store.records import OutboxRecord

log = logging.getLogger("approvald.delivery")


class LogDeliverer:
    def __init__(self) -> None:
        self.delivered: list[OutboxRecord] = []

    async def deliver(self, row: OutboxRecord) -> dict[str, Any] | None:
        # a notice's payload carries the call's arguments: logs see them masked
        payload = mask_args(json.loads(row.payload))
        log.info("%s %s", row.kind, " ".join(f"{k}={v}" for k, v in payload.items()))
        self.delivered.append(row)
        return {"logged": True}
