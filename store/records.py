"""Plain, typed rows handed out by the repositories (no ORM identity, no lazy loading)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from approvald.store.jsontext import loads


def paths_of(text: str | None) -> tuple[str, ...]:
    """A stored JSON list of argument paths (None or unreadable: none)."""
    if not text:
        return ()
    try:
        value = loads(text)
    except ValueError:
        return ()
    return tuple(p for p in value if isinstance(p, str)) if isinstance(value, list) else ()


@dataclass(frozen=True, slots=True)
class RunRecord:
    id: str
    agent: str
    status: str
    step: int
    next_seq: int
    task: str
    requested_by: str
    instructions_version: str
    result: str | None
    error: str | None
    inflight: str | None
    cancel_requested: bool
    cancel_requested_by: str | None
    cancel_reason: str | None
    lease_owner: str | None
    lease_expires_at: datetime | None
    wait_until: datetime | None
    wait_reason: str | None
    failures: int
    created_at: datetime
    updated_at: datetime
    agent_version: str | None = None  # the agent release the run started on (0011)


@dataclass(frozen=True, slots=True)
class EventRecord:
    run_id: str
    seq: int
    step: int
    v: int
    body: str


@dataclass(frozen=True, slots=True)
class ExecutionRecord:
    run_id: str
    call_id: str
    step: int
    tool: str
    args_digest: str
    status: str
    result: str | None
    error_class: str | None
    error: str | None
    attempts: int
    started_at: datetime
    finished_at: datetime | None
    latency_ms: float | None
    owner: str | None
    heard_at: datetime | None
    sensitive: str | None = None  # JSON list of its declared paths (0015)

    @property
    def idempotency_key(self) -> str:
        return f"{self.run_id}:{self.call_id}"

    def sensitive_paths(self) -> tuple[str, ...]:
        """The argument paths the call's policy declared sensitive when it was made."""
        return paths_of(self.sensitive)

    def result_value(self) -> Any:
        return None if self.result is None else loads(self.result)


@dataclass(frozen=True, slots=True)
class ApprovalRecord:
    id: str
    run_id: str
    call_id: str
    kind: str
    tool: str
    args: str
    digest: str
    edited_args: str | None
    edited_digest: str | None
    edited_by: str | None
    edited_at: datetime | None
    status: str
    rung: int
    supersedes: str | None
    approvers: str
    quorum: int
    approve_count: int
    policy: str
    packet: str
    requested_by: str
    token_nonce: str
    requested_at: datetime
    expires_at: datetime
    reminders_sent: int
    next_reminder_at: datetime | None
    decided_at: datetime | None
    decided_by: str | None
    decided_via: str | None
    verdict: str | None
    reason: str | None
    channel: str | None
    message_ts: str | None
    decision_trace: str | None = None  # see store.models.Approval
    tool_version: str | None = None  # the tool's identity when the call was asked about
    tool_schema: str | None = None

    def args_value(self) -> dict[str, Any]:
        value: dict[str, Any] = loads(self.args)
        return value

    def effective_args(self) -> dict[str, Any]:
        """The arguments that will run if approved: the edit if there is one."""
        value: dict[str, Any] = loads(self.edited_args or self.args)
        return value

    @property
    def effective_digest(self) -> str:
        return self.edited_digest or self.digest

    def approvers_value(self) -> list[str]:
        value: list[str] = loads(self.approvers)
        return value


@dataclass(frozen=True, slots=True)
class VoteRecord:
    approval_id: str
    actor: str
    verdict: str
    digest: str
    via: str
    at: datetime


@dataclass(frozen=True, slots=True)
class OutboxRecord:
    id: int
    kind: str
    group_key: str
    payload: str
    status: str
    attempts: int
    not_before: datetime
    claimed_by: str | None
    claimed_until: datetime | None
    created_at: datetime
    delivered_at: datetime | None
    last_error: str | None
    result: str | None
    give_up_at: datetime | None
    waits: int

    def payload_value(self) -> dict[str, Any]:
        value: dict[str, Any] = loads(self.payload)
        return value


@dataclass(frozen=True, slots=True)
class AuditRecord:
    seq: int
    at: datetime
    action: str
    actor: str
    via: str
    run_id: str | None
    approval_id: str | None
    digest: str | None
    details: str
    key_id: str
    prev_hash: str
    hash: str
