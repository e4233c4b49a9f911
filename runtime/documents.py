"""The read models the HTTP API, the web review queue, the mails and the callers' faces
draw from (issue 47: one front door): each one read transaction, returned frozen.

A face never opens the database: what it shows (a queue page, a mail, a progress line, a
scrape's gauges) is a pure function of one of these. The Slack face's views (the card, an
approver's list and Home, a run's thread) are :mod:`runtime.views`'s.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import Any

from approvald.runtime.record.outbox_kinds import REQUEST_MAIL, mail_group
from approvald.runtime.runs.external import CALL_ID
from approvald.store.db import Database
from approvald.store.records import ApprovalRecord, ExecutionRecord, RunRecord


@dataclass(frozen=True)
class RequestThread:
    """A request and the mail that asked its approvers (once delivered): what a mail in its
    thread (an outcome, a reminder, an edit) is drawn from."""

    approval: ApprovalRecord | None  # None: no such request
    # the delivered mail's to, subject, message_id (empty: it was never mailed to anyone)
    sent: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True)
class Figures:
    """How much is waiting, and since when (a scrape's gauges)."""

    runs: Mapping[str, int]  # by status
    pending_approvals: int
    oldest_pending_at: datetime | None
    outbox_pending: int
    oldest_outbox_at: datetime | None
    outbox_dead: int


@dataclass(frozen=True)
class RunFile:
    """A run as the store holds it: its row, its requests and its calls' executions."""

    run: RunRecord | None  # None: no such run
    approvals: tuple[ApprovalRecord, ...] = ()
    executions: tuple[ExecutionRecord, ...] = ()  # in the store's order


class Documents:
    """The read models of the faces other than Slack's (see the module docstring)."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def request(self, approval_id: str) -> ApprovalRecord | None:
        """Request ``approval_id`` (an exact id) as it stands; None when there is none."""
        async with self._db.read() as tx:
            return await tx.approvals.get(approval_id)

    async def request_thread(self, approval_id: str) -> RequestThread:
        """Request ``approval_id`` (an exact id) and what its delivered request mail said."""
        async with self._db.read() as tx:
            a = await tx.approvals.get(approval_id)
            first = [r for r in await tx.outbox.in_group(mail_group(approval_id),
                                                         kind=REQUEST_MAIL)
                     if r.status == "delivered"]
        sent: dict[str, Any] = json.loads(first[0].result or "{}") if first else {}
        return RequestThread(a, MappingProxyType(sent))

    async def review_candidates(self, *, limit: int) -> tuple[ApprovalRecord, ...]:
        """The pending requests someone may be asked to decide (the web queue's candidates,
        before the same check as a click picks those of one approver)."""
        async with self._db.read() as tx:
            return tuple(await tx.approvals.pending_for_actor_candidates(limit=limit))

    async def figures(self) -> Figures:
        """How much is waiting, and since when."""
        async with self._db.read() as tx:
            s = await tx.stats.snapshot()
        return Figures(MappingProxyType(dict(s.runs)), s.pending_approvals, s.oldest_pending_at,
                       s.outbox_pending, s.oldest_outbox_at, s.outbox_dead)

    async def run_file(self, run_id: str) -> RunFile:
        """Run ``run_id`` (an exact id), its requests and its executions, read together."""
        async with self._db.read() as tx:
            run = await tx.runs.get(run_id)
            if run is None:
                return RunFile(None)
            approvals = await tx.approvals.for_run(run_id)
            executions = await tx.executions.for_run(run_id)
        return RunFile(run, tuple(approvals), tuple(executions.values()))

    # -- what the callers' faces ask about their requests (runtime.callers) ---------------
    async def request_made(self, token_id: str, key: str) -> bool:
        """Whether credential ``token_id`` made a request under idempotency key ``key``."""
        async with self._db.read() as tx:
            return await tx.external.by_key(token_id, key) is not None

    async def request_started(self, request_id: str) -> bool:
        """Whether external request ``request_id``'s call has its start recorded."""
        async with self._db.read() as tx:
            return await tx.executions.get(request_id, CALL_ID) is not None

    async def run_status(self, run_id: str) -> str | None:
        """Run ``run_id``'s status (None: no such run, or pruned)."""
        async with self._db.read() as tx:
            run = await tx.runs.get(run_id)
        return run.status if run is not None else None

    async def started_by(self, owner: str) -> str | None:
        """The run whose call ``owner`` (a ledger owner) recorded the start of, if any."""
        async with self._db.read() as tx:
            return await tx.executions.started_by(owner)
