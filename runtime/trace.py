"""A run's timeline, for people and machines (``approvald trace``).

Everything comes from what the store already keeps: the run row, its transcript events
(each fresh model reply carries :class:`~runtime.record.state.ModelStep`), the execution ledger
(start, finish, latency, error class, attempts), the approval requests with their votes,
and the run's audit entries (every transition, with who and when). Nothing is recorded
for the trace's sake beyond the model step.

Entries are ordered by when they started; an entry whose time the store does not know
(a denied call never ran; a model reply written before schema version 3 has no arrival
time) takes the time of what came just before it in the transcript, flagged ``estimated``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Literal

from approvald.runtime.kernel import binding
from approvald.runtime.kernel.canonical import compact_json
from approvald.runtime.kernel.vocabulary import outcome_of, policy_outcome, word
from approvald.runtime.policies.sensitive import Masking
from approvald.runtime.record.audit_check import disagreements_of
from approvald.runtime.record.shown import RunMasking, of_run, read_run
from approvald.runtime.record.state import (
    FINAL_STATUSES,
    AssistantMessage,
    ToolMessage,
    UserMessage,
)
from approvald.store.db import Database
from approvald.store.records import (
    ApprovalRecord,
    AuditRecord,
    ExecutionRecord,
    RunRecord,
    VoteRecord,
)
from pydantic import BaseModel, ConfigDict

SUMMARY_CHARS = 200  # a tool result or an audit detail is cut to this in a trace
Lane = Literal["model", "tools", "humans", "run"]


class _Doc(BaseModel):
    model_config = ConfigDict(frozen=True)


class Vote(_Doc):
    actor: str
    verdict: str
    digest: str  # the binding of the arguments it was cast on (runtime/kernel/binding.py)
    via: str
    at: datetime
    counts: bool  # cast on the digest the request has now (invariant 3)


class Entry(_Doc):
    """One thing on the timeline. ``start``/``end`` bound a bar (``end`` None: a point,
    or still going); ``lane`` says who was busy: the model, a tool, or humans."""

    kind: Literal["model_step", "tool_call", "approval", "transition"]
    lane: Lane
    start: datetime
    end: datetime | None = None
    estimated: bool = False  # the store does not know this time; see the module docstring
    title: str
    step: int | None = None
    # model_step
    model: str | None = None
    instructions_version: str | None = None
    latency_ms: float | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    cost_usd: float | None = None
    content: str | None = None
    calls: list[str] | None = None  # the tool calls the reply asked for, by name
    # tool_call
    call_id: str | None = None
    tool: str | None = None
    arguments: dict[str, Any] | None = None
    status: str | None = None
    # what became of it, named as every view names it (runtime.kernel.vocabulary): a request's
    # outcome, or, for a call nobody was asked about, the policy that ran it
    outcome: str | None = None
    result_summary: str | None = None
    error_class: str | None = None
    error: str | None = None
    attempts: int | None = None
    idempotency_key: str | None = None
    # approval
    approval_id: str | None = None
    approval_kind: str | None = None
    requested_by: str | None = None
    approvers: list[str] | None = None
    decided_by: str | None = None
    decided_via: str | None = None
    decided_at: datetime | None = None
    digest: str | None = None  # bindings (runtime/kernel/binding.py), never plain digests
    effective_digest: str | None = None
    edited_by: str | None = None
    reason: str | None = None
    wait_ms: float | None = None
    pending: bool | None = None
    votes: list[Vote] | None = None
    # how the request's row and votes say otherwise than its audit entries (a row changed
    # behind the chain's back: see runtime.record.audit_check); None when they agree
    disagrees: list[str] | None = None
    # transition
    action: str | None = None
    actor: str | None = None
    via: str | None = None
    details: dict[str, Any] | None = None


class Totals(_Doc):
    model_steps: int
    model_ms: float
    input_tokens: int | None
    output_tokens: int | None
    cost_usd: float | None
    tool_calls: int
    tool_ms: float
    approvals: int
    human_wait_ms: float


class Trace(_Doc):
    """A run's timeline: ``entries`` ordered by start (``to_document`` for JSON)."""

    run_id: str
    agent: str
    status: str
    task: str
    requested_by: str
    instructions_version: str
    created_at: datetime
    updated_at: datetime
    result: str | None
    error: str | None
    started_at: datetime
    ended_at: datetime
    totals: Totals
    entries: list[Entry]

    def to_document(self) -> dict[str, Any]:
        """The trace as JSON-ready data (times ISO-8601 UTC; unknown values omitted)."""
        doc = self.model_dump(mode="json")
        doc["entries"] = [{k: v for k, v in e.items() if v is not None}
                          for e in doc["entries"]]
        return doc


def summarize(value: Any, limit: int = SUMMARY_CHARS) -> str:
    """A JSON value as one line of at most ``limit`` characters (cut ones end in ``…``)."""
    text = value if isinstance(value, str) else compact_json(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _ms(start: datetime, end: datetime) -> float:
    return round((end - start).total_seconds() * 1000.0, 3)


async def load_trace(db: Database, run_id: str, *, now: datetime) -> Trace:
    """The timeline of run ``run_id`` (an exact id); a pending wait is measured to ``now``."""
    async with db.read() as tx:
        r = await read_run(tx, run_id)
        votes = {a.id: await tx.approvals.votes(a.id) for a in r.approvals}
        audit = await tx.audit.query(run_id=run_id)
        disagree = {a.id: await disagreements_of(tx, a.id) for a in r.approvals}
    return build_trace(r.run, r.messages, r.executions, r.approvals, votes, audit, now=now,
                       masking=r.masking(), disagree=disagree)


def build_trace(run: RunRecord,
                messages: Sequence[UserMessage | AssistantMessage | ToolMessage],
                executions: dict[str, ExecutionRecord], approvals: Sequence[ApprovalRecord],
                votes: dict[str, list[VoteRecord]], audit: Sequence[AuditRecord], *,
                now: datetime, masking: RunMasking | None = None,
                disagree: Mapping[str, list[str]] | None = None) -> Trace:
    """The timeline from what the store holds for one run (pure: no I/O). Everything in
    it is masked by ``masking`` (the run's calls' declared paths and values, and the
    detectors; by default worked out from the transcript, requests and ledger given)."""
    shown = masking or of_run(messages, approvals, executions)
    entries: list[Entry] = []
    results = {m.call_id: m for m in messages if isinstance(m, ToolMessage)}
    by_call: dict[str, list[ApprovalRecord]] = {}
    for a in approvals:
        by_call.setdefault(a.call_id, []).append(a)
    # how the policy answered each call nobody was asked about, as its execution's audit
    # entry records it (auto, notify_after)
    answered = {str(d.get("idempotency_key")): str(d.get("answer"))
                for r in audit if r.action == "executed" and r.approval_id is None
                for d in [json.loads(r.details) if r.details else {}]}
    last = run.created_at  # the latest time known so far, walking the transcript
    step = 0
    for m in messages:
        if not isinstance(m, AssistantMessage):
            continue
        step += 1
        entry = _model_step(m, step, last, run.instructions_version, shown.run)
        entries.append(entry)
        last = entry.end or entry.start
        for call in m.tool_calls:
            rec = executions.get(call.id)
            asked = by_call.get(call.id, [])
            tool_entry = _tool_call(run, call.id, call.name, call.arguments, step, rec,
                                    results.get(call.id), asked, last, shown,
                                    answered.get(f"{run.id}:{call.id}"))
            entries.append(tool_entry)
            last = max(last, tool_entry.end or tool_entry.start)
    # at one instant (a frozen test clock, a fast step) the run's start comes first, then
    # the transcript in its own order, then what the audit log and the requests say
    others = [*_transitions(run, audit, shown.run),
              *(_approval(a, votes.get(a.id, []), now, shown, (disagree or {}).get(a.id))
                for a in approvals)]
    keyed = [(e.start, 1, i, e) for i, e in enumerate(entries)]
    keyed += [(e.start, 0 if e.action == "started" else 2, i, e) for i, e in enumerate(others)]
    entries = [e for *_, e in sorted(keyed, key=lambda k: k[:3])]
    return Trace(
        run_id=run.id, agent=run.agent, status=run.status, task=shown.run.text(run.task),
        requested_by=run.requested_by, instructions_version=run.instructions_version,
        created_at=run.created_at, updated_at=run.updated_at,
        result=_masked(shown.run, run.result), error=_masked(shown.run, run.error),
        started_at=min([run.created_at, *(e.start for e in entries)]),
        ended_at=max([run.updated_at, *(e.end or e.start for e in entries)]),
        totals=_totals(entries), entries=entries,
    )


def _model_step(m: AssistantMessage, step: int, last: datetime, run_version: str,
                shown: Masking) -> Entry:
    names = [c.name for c in m.tool_calls]
    title = f"model step {step}: " + (f"asks for {', '.join(names)}" if names
                                      else "final answer")
    meta = m.meta
    if meta is None:  # written before model steps were recorded
        return Entry(kind="model_step", lane="model", start=last, estimated=True, title=title,
                     step=step, content=_masked(shown, m.content), calls=names)
    # the call began when the reply arrived, less its latency, and not before what it
    # answers (clocks of different processes may disagree by that much)
    start = min(meta.at, max(meta.at - timedelta(milliseconds=meta.latency_ms), last))
    return Entry(kind="model_step", lane="model", start=start, end=meta.at,
                 title=title, step=step, model=meta.model,
                 instructions_version=meta.instructions_version or run_version,
                 latency_ms=meta.latency_ms,
                 input_tokens=meta.input_tokens, output_tokens=meta.output_tokens,
                 cost_usd=meta.cost_usd, content=_masked(shown, m.content), calls=names)


def _tool_call(run: RunRecord, call_id: str, name: str, args: dict[str, Any], step: int,
               rec: ExecutionRecord | None, result: ToolMessage | None,
               asked: list[ApprovalRecord], last: datetime, shown: RunMasking,
               answer: str | None = None) -> Entry:
    approval = asked[-1] if asked else None  # the last rung decides what ran
    if approval is not None and approval.kind == "tool_call":
        args = approval.effective_args()
    outcome: Any = result.content if result is not None else (
        rec.result_value() if rec is not None else None)
    if rec is not None:
        status = rec.status
    elif isinstance(outcome, dict) and isinstance(outcome.get("status"), str):
        # denied, redirected, expired, forbidden, invalid_arguments: the call did not run
        status = str(outcome["status"])
    elif approval is not None and approval.status == "pending":
        status = "awaiting_approval"
    else:
        status = "not_run" if result is not None else "pending"
    named: str | None = None
    if approval is not None:
        named = outcome_of(approval).value
    elif status == "forbidden":
        named = policy_outcome("forbidden").value
    elif answer in ("auto", "notify_after"):
        named = policy_outcome(answer).value
    if rec is not None:
        start, end, estimated = rec.started_at, rec.finished_at, False
    elif approval is not None:  # it did not run: it ends where the request did
        start = approval.decided_at or approval.requested_at
        end, estimated = None, False
    else:
        start, end, estimated = last, None, True
    return Entry(
        kind="tool_call", lane="tools", start=start, end=end, estimated=estimated,
        title=f"{name} ({status})", step=step, call_id=call_id, tool=name,
        arguments=shown.call(call_id).args(args), status=status, outcome=named,
        result_summary=summarize(shown.call(call_id).data(outcome))
        if outcome is not None else None,
        error_class=rec.error_class if rec else None,
        error=_masked(shown.run, rec.error) if rec else None,
        latency_ms=rec.latency_ms if rec else None, attempts=rec.attempts if rec else None,
        idempotency_key=f"{run.id}:{call_id}",
        approval_id=approval.id if approval else None,
    )


def _approval(a: ApprovalRecord, votes: list[VoteRecord], now: datetime,
              shown: RunMasking, disagrees: list[str] | None = None) -> Entry:
    pending = a.status == "pending"
    end = a.decided_at if a.decided_at is not None else (now if pending else None)
    who = f" by {a.decided_by}" if a.decided_by else ""
    what = {"outcome_unknown": "question: outcome unknown of ",
            "cannot_run": "question: cannot run "}.get(a.kind, "")
    return Entry(
        kind="approval", lane="humans", start=a.requested_at, end=end,
        title=f"{what}{a.tool}: {word(a).words}{who}", call_id=a.call_id, tool=a.tool,
        arguments=shown.call(a.call_id).args(a.args_value()), status=a.status,
        outcome=outcome_of(a).value,
        approval_id=a.id, approval_kind=a.kind,
        requested_by=a.requested_by, approvers=a.approvers_value(),
        decided_by=a.decided_by, decided_via=a.decided_via, decided_at=a.decided_at,
        digest=binding.shown(a.digest), effective_digest=binding.shown(a.effective_digest),
        edited_by=a.edited_by,
        reason=_masked(shown.run, a.reason),
        wait_ms=_ms(a.requested_at, end) if end is not None else None,
        pending=pending,
        votes=[Vote(actor=v.actor, verdict=v.verdict, digest=binding.shown(v.digest), via=v.via,
                    at=v.at,
                    counts=v.digest == a.effective_digest) for v in votes],
        disagrees=disagrees or None,
    )


def _masked(shown: Masking, text: str | None) -> str | None:
    return None if text is None else shown.text(text)


def _transitions(run: RunRecord, audit: Sequence[AuditRecord], shown: Masking) -> list[Entry]:
    out = [Entry(kind="transition", lane="run", start=run.created_at,
                 title=f"run started by {run.requested_by}",
                 action="started", actor=run.requested_by, via="runtime")]
    for r in audit:
        # (recorded masked; entries written before that are masked here)
        details = binding.shown_details(
            shown.details(json.loads(r.details) if r.details else {}))
        about = details.get("tool")
        title = f"{r.action}" + (f" {about}" if isinstance(about, str) else "") + \
            (f" by {r.actor}" if not r.actor.startswith(("system:", "agent:")) else "")
        out.append(Entry(kind="transition", lane="run", start=r.at, title=title,
                         action=r.action, actor=r.actor, via=r.via, approval_id=r.approval_id,
                         digest=binding.shown_opt(r.digest),
                         details={k: (summarize(v) if isinstance(v, dict | list | str)
                                      else v) for k, v in details.items()}))
    audited = {r.action for r in audit}
    if run.status in FINAL_STATUSES and run.status not in audited:  # completed, say
        out.append(Entry(kind="transition", lane="run", start=run.updated_at,
                         title=f"run {run.status}", action=run.status, actor="system:runtime",
                         via="runtime"))
    return out


def _totals(entries: list[Entry]) -> Totals:
    steps = [e for e in entries if e.kind == "model_step"]
    calls = [e for e in entries if e.kind == "tool_call"]
    asks = [e for e in entries if e.kind == "approval"]

    def total(values: list[int | None]) -> int | None:
        known = [v for v in values if v is not None]
        return sum(known) if known else None

    costs = [e.cost_usd for e in steps if e.cost_usd is not None]
    return Totals(
        model_steps=len(steps), model_ms=round(sum(e.latency_ms or 0.0 for e in steps), 3),
        input_tokens=total([e.input_tokens for e in steps]),
        output_tokens=total([e.output_tokens for e in steps]),
        cost_usd=round(sum(costs), 6) if costs else None,
        tool_calls=len(calls), tool_ms=round(sum(e.latency_ms or 0.0 for e in calls), 3),
        approvals=len(asks), human_wait_ms=round(sum(e.wait_ms or 0.0 for e in asks), 3),
    )
