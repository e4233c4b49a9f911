"""The schema: one set of tables for SQLite and PostgreSQL.

JSON payloads are stored as compact text (not a JSON column type) so the bytes written
per step are the bytes we chose, identical on both dialects. Every time is UTC-aware.
"""

from __future__ import annotations

from datetime import datetime

from approvald.store.types import SealedText, UTCDateTime
from sqlalchemy import (
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    SmallInteger,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class Run(Base):
    """One agent run: its status, step counter, lease, and final answer."""

    __tablename__ = "runs"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    agent: Mapped[str] = mapped_column(String(100))
    status: Mapped[str] = mapped_column(String(20))
    step: Mapped[int] = mapped_column(Integer, default=0)
    next_seq: Mapped[int] = mapped_column(Integer, default=0)
    task: Mapped[str] = mapped_column(SealedText("runs.task"))
    requested_by: Mapped[str] = mapped_column(String(200))
    instructions_version: Mapped[str] = mapped_column(String(64))
    result: Mapped[str | None] = mapped_column(SealedText("runs.result"))
    error: Mapped[str | None] = mapped_column(SealedText("runs.error"))
    # the model reply of the step in progress, journaled with the step's first side
    # effect so a retried step replays the same calls instead of asking the model again
    inflight: Mapped[str | None] = mapped_column(SealedText("runs.inflight"))
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    # who asked for the cancel and why, kept until the worker honours it at a step boundary
    cancel_requested_by: Mapped[str | None] = mapped_column(String(200))
    cancel_reason: Mapped[str | None] = mapped_column(Text)
    lease_owner: Mapped[str | None] = mapped_column(String(200))
    lease_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # a run that waits (a rate limit, an outage, a backoff after an error) is still
    # ``running``: nobody advances it before wait_until, and wait_reason says why
    wait_until: Mapped[datetime | None] = mapped_column(UTCDateTime())
    wait_reason: Mapped[str | None] = mapped_column(SealedText("runs.wait_reason"))
    failures: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())
    # the agent release the run started on (``Agent.version``); null: one started before
    # releases were recorded, whose release is its instructions_version
    agent_version: Mapped[str | None] = mapped_column(String(64))

    # runs by when they last changed: the run-thread follower's poll reads those updated
    # since it began, not the whole history (0026)
    __table_args__ = (Index(None, "status", "updated_at"), Index(None, "updated_at", "agent"))


class RunEvent(Base):
    """Append-only transcript of a run, one message per row, each with its schema version."""

    __tablename__ = "run_events"
    # SQLite: clustered on (run_id, seq), the key stored once (migration 0007)
    __table_args__ = ({"sqlite_with_rowid": False},)

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    step: Mapped[int] = mapped_column(Integer)
    v: Mapped[int] = mapped_column(SmallInteger)
    body: Mapped[str] = mapped_column(SealedText("run_events.body"))


class ToolExecution(Base):
    """The execution ledger: intent before a tool runs, result after, one row per call.

    The primary key (run_id, call_id) *is* the idempotency key.
    """

    __tablename__ = "tool_executions"

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"), primary_key=True)
    call_id: Mapped[str] = mapped_column(String(100), primary_key=True)
    step: Mapped[int] = mapped_column(Integer)
    tool: Mapped[str] = mapped_column(Text)  # resource:URI is as long as its URI (0021)
    args_digest: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16))  # started|succeeded|failed|unknown
    result: Mapped[str | None] = mapped_column(SealedText("tool_executions.result"))
    error_class: Mapped[str | None] = mapped_column(String(200))
    error: Mapped[str | None] = mapped_column(SealedText("tool_executions.error"))
    attempts: Mapped[int] = mapped_column(Integer, default=1)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    latency_ms: Mapped[float | None] = mapped_column(Float)
    # the lease id of the worker running the current attempt, and when it was last heard
    # from (its lease renewals): whether an attempt may still be running is decided on these
    owner: Mapped[str | None] = mapped_column(String(200))
    heard_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # JSON list of the argument paths the call's policy declared sensitive, resolved once
    # when the call was made (requested or not), so that whatever shows the call later
    # masks them; null: none (or a call recorded before 0015)
    sensitive: Mapped[str | None] = mapped_column(Text)


class Approval(Base):
    """A request for a human decision about one exact call (or an unknown outcome)."""

    __tablename__ = "approvals"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"))
    call_id: Mapped[str] = mapped_column(String(100))
    kind: Mapped[str] = mapped_column(String(20))  # tool_call | outcome_unknown
    tool: Mapped[str] = mapped_column(Text)  # resource:URI is as long as its URI (0021)
    args: Mapped[str] = mapped_column(SealedText("approvals.args"))
    digest: Mapped[str] = mapped_column(String(64))
    edited_args: Mapped[str | None] = mapped_column(SealedText("approvals.edited_args"))
    edited_digest: Mapped[str | None] = mapped_column(String(64))
    edited_by: Mapped[str | None] = mapped_column(String(200))  # who made the current edit
    edited_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    status: Mapped[str] = mapped_column(String(16))
    rung: Mapped[int] = mapped_column(SmallInteger, default=0)
    supersedes: Mapped[str | None] = mapped_column(String(32))
    approvers: Mapped[str] = mapped_column(Text)  # JSON list for this rung
    quorum: Mapped[int] = mapped_column(SmallInteger, default=1)
    approve_count: Mapped[int] = mapped_column(SmallInteger, default=0)
    policy: Mapped[str] = mapped_column(Text)  # JSON snapshot
    packet: Mapped[str] = mapped_column(SealedText("approvals.packet"))  # JSON decision packet
    requested_by: Mapped[str] = mapped_column(String(200))
    token_nonce: Mapped[str] = mapped_column(String(64))
    requested_at: Mapped[datetime] = mapped_column(UTCDateTime())
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime())
    reminders_sent: Mapped[int] = mapped_column(SmallInteger, default=0)
    next_reminder_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    decided_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    decided_by: Mapped[str | None] = mapped_column(String(200))
    decided_via: Mapped[str | None] = mapped_column(String(200))
    verdict: Mapped[str | None] = mapped_column(String(20))
    reason: Mapped[str | None] = mapped_column(SealedText("approvals.reason"))
    channel: Mapped[str | None] = mapped_column(String(40))
    message_ts: Mapped[str | None] = mapped_column(String(40))
    # the W3C traceparent of the span that recorded the decision, when tracing was on:
    # whichever process resumes the run links its step to it (runtime/record/tracing.py)
    decision_trace: Mapped[str | None] = mapped_column(String(200))
    # the identity of the tool the call was asked about (runtime/policies/tools.py): its version and
    # a digest of its argument schema; null for a caller's request and older rows
    tool_version: Mapped[str | None] = mapped_column(String(64))
    tool_schema: Mapped[str | None] = mapped_column(String(64))

    __table_args__ = (
        Index(None, "status", "expires_at"),
        Index(None, "status", "next_reminder_at"),
        Index(None, "run_id", "call_id"),
        # the newest and the oldest requests, of a status or of all (migration 0023)
        Index(None, "requested_at", "id"),
        Index(None, "status", "requested_at", "id"),
    )


class ApprovalVote(Base):
    """One person's vote on one version of an approval's arguments.

    The key makes a person count once per digest: a vote is about the exact arguments it
    was cast on, so an edit does not carry earlier votes over, and does not stop their
    authors from voting again on the new arguments.
    """

    __tablename__ = "approval_votes"

    approval_id: Mapped[str] = mapped_column(ForeignKey("approvals.id"), primary_key=True)
    actor: Mapped[str] = mapped_column(String(200), primary_key=True)
    digest: Mapped[str] = mapped_column(String(64), primary_key=True)
    verdict: Mapped[str] = mapped_column(String(20))
    via: Mapped[str] = mapped_column(String(200))
    at: Mapped[datetime] = mapped_column(UTCDateTime())


class Outbox(Base):
    """Messages to the outside world, written in the same transaction as the state they describe."""

    __tablename__ = "outbox"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    kind: Mapped[str] = mapped_column(String(40))
    group_key: Mapped[str] = mapped_column(String(64))  # delivered in id order per group
    # a notice or a webhook may quote a call's arguments
    payload: Mapped[str] = mapped_column(SealedText("outbox.payload"))
    status: Mapped[str] = mapped_column(String(16))  # pending|delivered|dead
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    not_before: Mapped[datetime] = mapped_column(UTCDateTime())
    claimed_by: Mapped[str | None] = mapped_column(String(200))
    claimed_until: Mapped[datetime | None] = mapped_column(UTCDateTime())
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    delivered_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    last_error: Mapped[str | None] = mapped_column(SealedText("outbox.last_error"))
    result: Mapped[str | None] = mapped_column(Text)
    # delivery gives up by time, not by count: waiting for a busy Slack is not a failure
    give_up_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    waits: Mapped[int] = mapped_column(Integer, default=0, server_default="0")

    __table_args__ = (Index(None, "status", "group_key", "id"),)


class AuditEntry(Base):
    """Append-only, hash-chained record of every approval transition."""

    __tablename__ = "audit_log"

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    at: Mapped[datetime] = mapped_column(UTCDateTime())
    action: Mapped[str] = mapped_column(String(40))
    actor: Mapped[str] = mapped_column(String(200))
    via: Mapped[str] = mapped_column(String(200))
    run_id: Mapped[str | None] = mapped_column(String(32), index=True)
    approval_id: Mapped[str | None] = mapped_column(String(32))
    digest: Mapped[str | None] = mapped_column(String(64))
    # masked when recorded (runtime/record/audit.py), so written in clear: the chain verifies
    # without the data key; entries written sealed before that still open with it
    details: Mapped[str] = mapped_column(SealedText("audit_log.details"))
    # fingerprint of the key the entry's MAC was made with ("" for an unkeyed SHA-256)
    key_id: Mapped[str] = mapped_column(String(16), default="", server_default="")
    prev_hash: Mapped[str] = mapped_column(String(64))
    hash: Mapped[str] = mapped_column(String(64))


class AuditHead(Base):
    """The chain's tip. Appends lock this one row, so concurrent writers cannot fork the chain."""

    __tablename__ = "audit_head"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    seq: Mapped[int] = mapped_column(Integer)
    hash: Mapped[str] = mapped_column(String(64))
    # the time of the entry it names (None: no entry yet), moved with it
    at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class AuditCheckpoint(Base):
    """How far the chain was last verified with the key: the entry (``seq``, its MAC
    ``hash``) a full verify passed through, MAC'd with the key ``key_id`` (``mac``), so a
    writer without the key cannot move it past an entry they changed."""

    __tablename__ = "audit_checkpoint"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    seq: Mapped[int] = mapped_column(Integer)
    hash: Mapped[str] = mapped_column(String(64))
    key_id: Mapped[str] = mapped_column(String(16))
    unkeyed_until: Mapped[int] = mapped_column(Integer)
    mac: Mapped[str] = mapped_column(String(64))


class AuditFold(Base):
    """How far the requests on the record are kept folded (``audit_requests``): through
    entry ``through``, ``folded`` entries in all, MAC'd with the key ``key_id`` (``mac``),
    so that a writer without the key cannot pass off a summary table cut short or rolled
    back (see :mod:`runtime.record.history_fold`)."""

    __tablename__ = "audit_fold"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    through: Mapped[int] = mapped_column(Integer)
    folded: Mapped[int] = mapped_column(Integer)
    unkeyed_until: Mapped[int] = mapped_column(Integer)
    key_id: Mapped[str] = mapped_column(String(16))
    mac: Mapped[str] = mapped_column(String(64))


class AuditRequest(Base):
    """One request on the record, folded from its audit entries (issue 51): ``seq`` its first
    entry's, ``folded`` how many of its entries changed it, ``state`` the fold (as masked
    as the entries it comes from), MAC'd with the audit key ``key_id`` (``mac``)."""

    __tablename__ = "audit_requests"

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    folded: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(SealedText("audit_requests.state"))
    key_id: Mapped[str] = mapped_column(String(16))
    mac: Mapped[str] = mapped_column(String(64))


FINAL_STATUSES = ("completed", "failed", "cancelled")  # a run in one never moves again
THREAD_UNSETTLED = ("ts IS NULL OR posted_status NOT IN ("
                    + ", ".join(f"'{s}'" for s in FINAL_STATUSES) + ")")


class RunThread(Base):
    """Where a run's ops thread lives in chat, and how far it has been told (bot-owned).

    A replica claims a thread's work (compare-and-set on ``claimed_by``/``claimed_until``)
    before posting; ``ts`` is empty until the parent message is known to exist.
    """

    __tablename__ = "run_threads"

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"), primary_key=True)
    channel: Mapped[str] = mapped_column(String(40))
    ts: Mapped[str | None] = mapped_column(String(40))
    posted_seq: Mapped[int] = mapped_column(Integer, default=0)  # events before it are posted
    posted_status: Mapped[str] = mapped_column(String(20))  # the status the parent shows
    claimed_by: Mapped[str | None] = mapped_column(String(200))
    claimed_until: Mapped[datetime | None] = mapped_column(UTCDateTime())
    next_attempt_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    failures: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    reposts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # audit entries of the run up to this seq are told in the thread (0020)
    told_audit: Mapped[int] = mapped_column(Integer, default=0, server_default="0")

    # the threads that may still be behind: unposted, or not yet told a final status. A
    # thread told its run's final status was told every event and that status; a final
    # run never moves again (store.repos.threads), so its thread is settled for good (0026)
    __table_args__ = (Index("ix_run_threads_unsettled", "run_id",
                            sqlite_where=text(THREAD_UNSETTLED),
                            postgresql_where=text(THREAD_UNSETTLED)),)


class Limit(Base):
    """A shared limit across processes: a token bucket (model calls per minute) or the
    row whose lock serialises a concurrency check (runs advancing at once per agent)."""

    __tablename__ = "limits"

    key: Mapped[str] = mapped_column(String(120), primary_key=True)
    tokens: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())


class ApiToken(Base):
    """A bearer token of the HTTP API. Only the SHA-256 of the token is stored: it is shown
    once, when created; a leaked database does not let anyone call the API."""

    __tablename__ = "api_tokens"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(60), unique=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    webhook_url: Mapped[str | None] = mapped_column(Text)  # where its decisions are POSTed
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    created_by: Mapped[str] = mapped_column(String(200))
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    revoked_by: Mapped[str | None] = mapped_column(String(200))
    # JSON list of the tool names or globs it may ask about; null: made before scopes (any)
    tools: Mapped[str | None] = mapped_column(Text)
    # the one face it may call (``hook:claude-code``, ``mcp:NAME``); null: the /v1 API
    face: Mapped[str | None] = mapped_column(String(100))
    # who a face token's calls are made for (a Slack user): never taken from its caller
    requested_by: Mapped[str | None] = mapped_column(String(200))


class ExternalRequest(Base):
    """An approval request made over the HTTP API for a call its caller runs itself.

    Its id is its run's: a run of agent ``external:<token name>`` that no worker advances
    (see ``runtime.runs.external``), so its approvals, expiry, cards, audit entries and
    execution ledger row are those of any run.
    """

    __tablename__ = "external_requests"

    id: Mapped[str] = mapped_column(ForeignKey("runs.id"), primary_key=True)
    token_id: Mapped[str] = mapped_column(ForeignKey("api_tokens.id"))
    idempotency_key: Mapped[str | None] = mapped_column(String(200))
    fingerprint: Mapped[str] = mapped_column(String(64))  # of the request as created
    tool: Mapped[str] = mapped_column(Text)  # resource:URI is as long as its URI (0021)
    args: Mapped[str] = mapped_column(SealedText("external_requests.args"))
    digest: Mapped[str] = mapped_column(String(64))
    policy_name: Mapped[str | None] = mapped_column(Text)
    kind: Mapped[str] = mapped_column(String(20))  # auto, approve_before or forbidden
    reason: Mapped[str | None] = mapped_column(Text)  # why a forbidden call is refused
    # JSON list of the argument paths its policy declared sensitive (as on the ledger)
    sensitive: Mapped[str | None] = mapped_column(Text)
    webhook_url: Mapped[str | None] = mapped_column(Text)
    decided_approval: Mapped[str | None] = mapped_column(String(32))  # last decision told
    result_digest: Mapped[str | None] = mapped_column(String(64))  # of the caller's report
    reported_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    # when a call of the face was first told that the request ended without its call
    # running (denied, expired...): the same call made after that is asked about again
    answered_at: Mapped[datetime | None] = mapped_column(UTCDateTime())

    __table_args__ = (UniqueConstraint("token_id", "idempotency_key"),)


class FaceSwitch(Base):
    """A face (or one form of it) the operator switched off: while its row exists, the
    face lets nothing through. Switching it on again deletes the row; both are audited."""

    __tablename__ = "face_switches"

    face: Mapped[str] = mapped_column(String(100), primary_key=True)  # hook:claude-code
    form: Mapped[str] = mapped_column(String(20), primary_key=True)  # command, http
    off_at: Mapped[datetime] = mapped_column(UTCDateTime())
    off_by: Mapped[str] = mapped_column(String(200))
    reason: Mapped[str | None] = mapped_column(Text)


class StandingApproval(Base):
    """"Approve this and calls like it for a while": a scoped, bounded, revocable approval
    granted on a request, that lets matching later calls of one tool run without a card.

    It covers a call only within its window, while ``status`` is ``active`` (enough
    distinct grants for the quorum of the requests it covers), under the same policy band
    (``rule``, ``approvers``, ``quorum``) as the request it was granted on, and while every
    granter is still one of the approvers. Each use is a compare-and-set on this row (a
    revocation that committed first stops it) and leaves an approved request naming it.
    """

    __tablename__ = "standing_approvals"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    tool: Mapped[str] = mapped_column(Text)  # resource:URI is as long as its URI (0021)
    # JSON: {"kind": exact|fields|condition, ...}
    scope: Mapped[str] = mapped_column(SealedText("standing_approvals.scope"))
    rule: Mapped[str | None] = mapped_column(Text)  # the policy rule label of its band
    approvers: Mapped[str] = mapped_column(Text)  # JSON list, as on the request
    quorum: Mapped[int] = mapped_column(SmallInteger)
    allow_self_approval: Mapped[bool] = mapped_column(Boolean, default=False)
    grants: Mapped[str] = mapped_column(Text)  # JSON list of the users who granted it
    status: Mapped[str] = mapped_column(String(16))  # proposed | active | revoked
    granted_on: Mapped[str] = mapped_column(String(32))  # the approval it was proposed on
    uses: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime())
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    revoked_by: Mapped[str | None] = mapped_column(String(200))
    # the source and tool it covers (agent:NAME/TOOL, api:TOKEN/TOOL, ...) and the digest
    # of the resolved policy it was granted under; null (made before 0010): covers nothing
    subject: Mapped[str | None] = mapped_column(Text)
    policy_digest: Mapped[str | None] = mapped_column(String(64))

    __table_args__ = (Index("ix_standing_approvals_tool_status", "tool", "status"),
                      Index("ix_standing_approvals_subject_status", "subject", "status"))


class PolicyInForce(Base):
    """The policy file the last process to start loaded (one row): a process that loads a
    different one records the change in the audit log, so an auditor can tell which policy
    governed each decision."""

    __tablename__ = "policy_in_force"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    digest: Mapped[str] = mapped_column(String(64))
    source: Mapped[str] = mapped_column(Text)
    loaded_at: Mapped[datetime] = mapped_column(UTCDateTime())


class AdapterPause(Base):
    """A framework agent (LangGraph, Pydantic AI, OpenAI Agents SDK) paused on approvald
    requests: what the framework needs to resume, kept beside the requests it waits for.

    Each gated call is an ordinary external request (``external_requests``); this row ties
    the calls of one pause together with the framework's own state (a message history, a
    serialised run state, or the reference to a LangGraph checkpoint), so any process can
    resume it once every request is decided. ``key`` is unique per framework: a re-run of
    the step that paused finds this row instead of making a second one.
    """

    __tablename__ = "adapter_pauses"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    framework: Mapped[str] = mapped_column(String(32))
    key: Mapped[str] = mapped_column(String(200))
    requested_by: Mapped[str] = mapped_column(String(200))
    # the framework's state, JSON (it holds the calls' arguments)
    state: Mapped[str] = mapped_column(SealedText("adapter_pauses.state"))
    # JSON {"task": ..., "calls": [{call_id, tool, args}]}: the calls' exact arguments
    requests: Mapped[str] = mapped_column(SealedText("adapter_pauses.requests"))
    status: Mapped[str] = mapped_column(String(16))  # paused | resumed
    # JSON: what the resume came to
    outcome: Mapped[str | None] = mapped_column(SealedText("adapter_pauses.outcome"))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    resumed_at: Mapped[datetime | None] = mapped_column(UTCDateTime())

    __table_args__ = (UniqueConstraint("framework", "key"),
                      Index("ix_adapter_pauses_status", "status"))


class WebLink(Base):
    """A single-use sign-in link mailed to an approver (the web review queue). Only the
    SHA-256 of its token is stored; ``used_at`` is set once, by compare-and-set."""

    __tablename__ = "web_links"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    user_id: Mapped[str] = mapped_column(String(200), index=True)
    email: Mapped[str] = mapped_column(String(320))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    # pruned once expired (runtime/record/retention.py)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)
    used_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class WebSession(Base):
    """A browser signed in to the web review queue; only the SHA-256 of its id is stored."""

    __tablename__ = "web_sessions"

    id_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    user_id: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class WebSlackState(Base):
    """A sign-in with Slack completed: the SHA-256 of its ``state`` and of the browser
    cookie it was bound to. Written only when Slack signed the browser in (the insert is
    the compare-and-set that uses the state once); a sign-in begun writes nothing."""

    __tablename__ = "web_slack_states"

    id_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    browser_hash: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)
    used_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class WebRefusalCount(Base):
    """Refusals of the web review queue to someone it does not know, counted per minute,
    source and reason until the minute is folded into one audit entry (per minute and
    source) and the rows deleted: anonymous requests add to a count, not to the chain."""

    __tablename__ = "web_refusal_counts"

    minute: Mapped[datetime] = mapped_column(UTCDateTime(), primary_key=True)
    source: Mapped[str] = mapped_column(String(64), primary_key=True)
    reason: Mapped[str] = mapped_column(String(40), primary_key=True)
    count: Mapped[int] = mapped_column(Integer)


class DeploymentKey(Base):
    """A key a deployment generated for itself, once, where the operator gave none
    (``binding``: what keys the bindings shown outside the database, see
    ``runtime/kernel/binding.py``). Every process on the database reads the same one."""

    __tablename__ = "deployment_keys"

    name: Mapped[str] = mapped_column(String(40), primary_key=True)
    secret: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
