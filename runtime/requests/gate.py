"""Opening approval requests: persist first, deliver later.

Everything here runs inside the caller's transaction (the step's checkpoint), so the run's
events, the approval row with the exact arguments, the outbox row that will post the card
and the audit entry commit together or not at all. Nothing is sent from here.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from approvald.runtime.kernel.canonical import call_digest, compact_json
from approvald.runtime.kernel.clock import Clock
from approvald.runtime.kernel.ids import new_id, new_nonce
from approvald.runtime.kernel.vocabulary import outcome_details
from approvald.runtime.policies.intake import Source, snapshot_digest
from approvald.runtime.policies.policy import ApprovalPolicy, PolicyFile, Shadow
from approvald.runtime.policies.sensitive import Masking
from approvald.runtime.policies.tools import Tool, ToolIdentity
from approvald.runtime.record.audit import AuditTrail
from approvald.runtime.record.outbox_kinds import (
    CARD_POST,
    CardPost,
    CardUpdate,
    RequestMail,
    mail_group,
    mailed,
    queue,
    tell_mailed,
)
from approvald.runtime.record.state import AssistantMessage, ToolCall, ToolMessage
from approvald.runtime.requests.packet import impact_of, masked_packet
from approvald.store.records import ApprovalRecord, ExecutionRecord, RunRecord
from approvald.store.repos import Tx

# the words of a request's packet its card shows, recorded in its ``requested`` entry
CARD_WORDS = ("doing", "code", "evidence", "impact", "why", "description")

# an outcome question has no deadline: silence must not resolve it either way
QUESTION_TTL = timedelta(days=3650)
EVIDENCE_ITEMS = 3
EVIDENCE_CHARS = 400


@dataclass(frozen=True)
class GateRequest:
    """A gated call the step wants to run: the exact, validated arguments and the policy."""

    call: ToolCall
    tool: Tool
    args: dict[str, Any]
    policy: ApprovalPolicy
    shadow: tuple[Shadow, ...] = ()  # what shadow rules would have decided: recorded


def build_packet(transcript: Sequence[Any], call: ToolCall, tool: Tool, args: dict[str, Any],
                 policy: ApprovalPolicy, run: RunRecord) -> dict[str, Any]:
    """The decision packet shown to approvers: what, why, on what evidence, with what impact."""
    doing: str | None = None
    evidence: list[dict[str, Any]] = []
    for msg in transcript:
        if isinstance(msg, AssistantMessage) and any(c.id == call.id for c in msg.tool_calls):
            doing = msg.content
    results = [m for m in transcript if isinstance(m, ToolMessage) and m.call_id != call.id]
    for m in results[::-1]:
        content = m.content
        if isinstance(content, dict) and content.get("status") in (
                "error", "denied", "redirected", "expired", "forbidden", "invalid_arguments"):
            continue
        text = compact_json(content)
        if len(text) > EVIDENCE_CHARS:
            text = text[:EVIDENCE_CHARS] + "…"
        evidence.append({"tool": m.name, "call_id": m.call_id, "result": text})
        if len(evidence) == EVIDENCE_ITEMS:
            break
    return {
        "agent": run.agent,
        "task": run.task[:500],
        "requested_by": run.requested_by,
        "doing": doing or f"The agent wants to call {tool.name}.",
        "evidence": evidence[::-1],
        "impact": impact_of(tool, args),
        "risk": policy.risk,
        "why": policy.why or f"{tool.name} is a {tool.permission} tool that needs approval.",
        "description": tool.description,
    }


def shadow_details(shadow: Sequence[Shadow]) -> dict[str, Any]:
    """What a call's audit entry records of the shadow rules that hold for it (nothing
    when none does: an entry of a file without shadows is as it always was)."""
    return {"shadow": [s.record() for s in shadow]} if shadow else {}


@dataclass(frozen=True)
class Where:
    """Where a pending request can be decided now, as the database knows it (not as the
    settings of whichever process asks do: a hook's process is not the deployment).

    ``card``: ``posted`` (``channel`` and ``ts`` say where), ``queued`` (its outbox row
    waits for a ``serve`` to post it), ``given_up`` (Slack never took it), ``logged`` (a
    ``serve`` without Slack took it) or ``none``. ``mailed``: it was mailed to its
    approvers, who decide it in the web review queue. The command line decides it always.
    """

    approval_id: str
    card: str
    channel: str | None = None
    ts: str | None = None
    mailed: bool = False


async def where(tx: Tx, a: ApprovalRecord) -> Where:
    """Where ``a`` can be decided now (see :class:`Where`)."""
    was_mailed = bool(await mailed(tx, [a.id], given_up=False))
    if a.channel and a.message_ts:
        return Where(a.id, "posted", a.channel, a.message_ts, was_mailed)
    rows = await tx.outbox.in_group(a.id, kind=CARD_POST)
    card = "none"
    if rows:
        last = rows[-1]
        card = {"pending": "queued", "dead": "given_up"}.get(last.status, "logged")
    return Where(a.id, card, mailed=was_mailed)


def first_reminder(policy: ApprovalPolicy, requested_at: datetime, ttl: timedelta,
                   sent: int = 0) -> datetime | None:
    """When reminder number ``sent`` is due, or None when all have gone out."""
    if sent >= len(policy.reminders):
        return None
    return requested_at + ttl * policy.reminders[sent]


class Gate:
    """Writes requests (in the caller's transaction): the approval row with the exact
    arguments, the outbox row that will post its card, and its audit entry."""

    def __init__(self, clock: Clock, audit: AuditTrail,
                 policy: Callable[[], PolicyFile]) -> None:
        self.clock = clock
        self.audit = audit
        self.policy = policy  # the policy file in force

    async def open_requests(self, tx: Tx, run: RunRecord, transcript: Sequence[Any], step: int,
                            gates: Sequence[GateRequest]) -> list[str]:
        """Insert one pending approval (+ outbox row + audit entry) per gated call."""
        ids = []
        for g in gates:
            packet = build_packet(transcript, g.call, g.tool, g.args, g.policy, run)
            ids.append(await self.insert_approval(
                tx, run=run, call_id=g.call.id, kind="tool_call", tool=g.tool.name,
                args=g.args, policy=g.policy, rung=0, packet=packet,
                identity=g.tool.identity(), shadow=g.shadow))
        return ids

    async def insert_approval(self, tx: Tx, *, run: RunRecord | None, call_id: str, kind: str,
                              tool: str, args: dict[str, Any], policy: ApprovalPolicy, rung: int,
                              packet: dict[str, Any], supersedes: ApprovalRecord | None = None,
                              ttl: timedelta | None = None, card: bool = True,
                              mail: bool = False, identity: ToolIdentity | None = None,
                              shadow: Sequence[Shadow] = ()) -> str:
        """Insert one pending request with its card's outbox row (and its mail's, when its
        policy names the email channel or ``mail`` says so: an escalation of a request
        that was mailed) and its audit entry. ``identity``: the tool's the call is asked
        about (an agent's: approvald runs it), which the approval binds. ``shadow``: what
        the shadow rules that hold for the call would have decided, recorded in its entry."""
        now = self.clock.now()
        approvers, rung_ttl, quorum = policy.rung(rung)
        ttl = ttl or rung_ttl
        approval_id = new_id()
        digest = call_digest(tool, args)
        source = Source.of_run(str(packet.get("agent") or (run.agent if run else "")))
        # recorded masked: whoever wrote its words (an agent, a caller, a face quoting the
        # call, as the Claude Code hook does), a declared value in them is never shown
        packet = masked_packet(packet, Masking.of_call(policy.sensitive, args))
        snapshot = policy.snapshot()
        run_id = run.id if run else supersedes.run_id if supersedes else ""
        requested_by = (run.requested_by if run else
                        supersedes.requested_by if supersedes else "")
        await tx.approvals.insert(
            id=approval_id, run_id=run_id, call_id=call_id, kind=kind, tool=tool,
            args=compact_json(args), digest=digest, status="pending", rung=rung,
            supersedes=supersedes.id if supersedes else None,
            approvers=compact_json(approvers), quorum=quorum, approve_count=0,
            policy=compact_json(snapshot), packet=compact_json(packet),
            requested_by=requested_by, token_nonce=new_nonce(), requested_at=now,
            expires_at=now + ttl, reminders_sent=0,
            next_reminder_at=first_reminder(policy, now, ttl if kind == "tool_call"
                                            else policy.ttl),
            tool_version=identity.version if identity is not None else None,
            tool_schema=identity.schema if identity is not None else None,
        )
        if card:  # (a request a standing approval approves as it is made has no card)
            await queue(tx, CardPost(approval_id), group_key=approval_id, now=now)
            if (mail or "email" in policy.channels) and kind == "tool_call":
                # (given up at its expiry: pointless after)
                await queue(tx, RequestMail(approval_id), group_key=mail_group(approval_id),
                            now=now, give_up_at=now + ttl)
        # the source, the policy name it was resolved under and the digests of that policy
        # and of the file in force: an auditor can tell under which rules each request ran
        self.audit.record(
            tx, at=now, action="requested", actor=f"agent:{packet.get('agent', '')}",
            via=source.via, run_id=run_id, approval_id=approval_id, digest=digest,
            details={"kind": kind, "tool": tool, "args": args, "call_id": call_id,
                     "requested_by": requested_by, "task": packet.get("task"),
                     "approvers": approvers, "quorum": quorum,
                     "rung": rung, "expires_at": (now + ttl).isoformat(), "risk": policy.risk,
                     "edits": policy.edits, "supersedes": supersedes.id if supersedes else None,
                     "source": source.subject(tool), "policy": source.policy_name(tool),
                     "policy_digest": snapshot_digest(snapshot),
                     "policy_file": self.policy().digest,
                     **({"rule": policy.rule} if policy.rule else {}),
                     # what the card shows (its words as recorded: masked above, and by
                     # the chain's funnel again) and what silence does
                     "card": {k: packet[k] for k in CARD_WORDS if packet.get(k)},
                     "on_expire": policy.on_expire, "escalate": snapshot.get("escalate"),
                     "reminders": snapshot.get("reminders"),
                     **shadow_details(shadow)},
        )
        return approval_id

    async def open_question(self, tx: Tx, run: RunRecord, call: ToolCall, tool: Tool,
                            rec: ExecutionRecord, args: dict[str, Any],
                            reconcile: str = "the tool has no reconcile hook") -> str:
        """Ask a human whether a call whose outcome is unknown took effect, with what they
        need to find out: which attempt, when it started and was last heard from, the
        idempotency key to look up, the exact arguments and what reconcile said. Their
        answer ("retry") sanctions exactly this attempt's successor, no other."""
        _, policy = self.policy().effective(tool.name, tool.policy, tool.approval)
        heard = rec.heard_at or rec.started_at
        packet: dict[str, Any] = {
            "agent": run.agent, "task": run.task[:500], "requested_by": run.requested_by,
            "doing": (f"{tool.name} started (attempt {rec.attempts}, "
                      f"{rec.started_at.isoformat()}) but its result was never recorded: "
                      f"its worker was last heard from at {heard.isoformat()}. "
                      "Did it take effect?"),
            "evidence": [], "impact": None, "risk": policy.risk,
            "why": f"{tool.name} is not idempotent, so it is never re-run without a human.",
            "description": tool.description, "idempotency_key": rec.idempotency_key,
            "attempt": rec.attempts, "started_at": rec.started_at.isoformat(),
            "heard_at": heard.isoformat(), "worker": rec.owner, "reconcile": reconcile,
        }
        approval_id = await self.insert_approval(
            tx, run=run, call_id=call.id, kind="outcome_unknown", tool=tool.name,
            args=args, policy=policy, rung=0, packet=packet, ttl=QUESTION_TTL)
        self.audit.record(
            tx, at=self.clock.now(), action="outcome_unknown", actor="system:runtime",
            via="runtime", run_id=run.id, approval_id=approval_id, digest=rec.args_digest,
            details={"tool": tool.name, "call_id": call.id, "args": args,
                     "idempotency_key": rec.idempotency_key, "attempts": rec.attempts,
                     "started_at": rec.started_at.isoformat(),
                     "heard_at": heard.isoformat(), "reconcile": reconcile})
        return approval_id

    async def open_cannot_run(self, tx: Tx, run: RunRecord, call: ToolCall,
                              approval: ApprovalRecord, reason: str) -> str:
        """An approved call the deployed release cannot run: it is not executed. Ask a
        person what now (``replan``: the model reads ``{status: not_executed, reason}``
        and re-plans, asking again for anything gated; ``abort``: the run ends), record
        ``not_executed`` with the reason, and redraw the approved request's card. The
        question goes to the request's approvers, under its stored policy, and has no
        deadline (silence must not decide it)."""
        now = self.clock.now()
        args = approval.effective_args()
        policy = ApprovalPolicy.from_snapshot(approval.policy)
        packet: dict[str, Any] = {
            "agent": run.agent, "task": run.task[:500], "requested_by": run.requested_by,
            "doing": (f"{call.name} was approved (approval {approval.id}) but was not "
                      f"executed: {reason}. Hand the model the error to re-plan, or abort "
                      "the run?"),
            "evidence": [], "impact": None, "risk": policy.risk,
            "why": "the agent was redeployed after the call was requested; approved work "
                   "is never dropped silently",
            "description": "", "reason": reason, "approval_id": approval.id,
        }
        question_id = await self.insert_approval(
            tx, run=run, call_id=call.id, kind="cannot_run", tool=call.name, args=args,
            policy=policy, rung=0, packet=packet, ttl=QUESTION_TTL)
        self.audit.record(
            tx, at=now, action="not_executed", actor="system:runtime", via="runtime",
            run_id=run.id, approval_id=approval.id, digest=approval.effective_digest,
            details={"tool": call.name, "call_id": call.id, "args": args, "reason": reason,
                     "question": question_id})
        # the approved request's card says the call was not run, and why
        said = json.loads(approval.packet) if approval.packet else {}
        said = said if isinstance(said, dict) else {}
        await tx.approvals.set_packet(approval.id, compact_json(
            {**said, "not_executed": reason, "cannot_run_question": question_id}))
        await queue(tx, CardUpdate(approval.id), group_key=approval.id, now=now)
        return question_id

    async def cancel_pending(self, tx: Tx, run_id: str, *, actor: str, via: str,
                             reason: str | None = None) -> None:
        """Close every pending approval of a cancelled run and update its cards (the
        caller holds the run's row lock)."""
        now = self.clock.now()
        cancelled = await tx.approvals.cancel_pending_for_run(run_id, now=now, by=actor,
                                                              reason=reason)
        await tell_mailed(tx, [a.id for a in cancelled if a.kind == "tool_call"], now)
        for a in cancelled:
            await queue(tx, CardUpdate(a.id), group_key=a.id, now=now)
            self.audit.record(tx, at=now, action="cancelled", actor=actor, via=via,
                                run_id=run_id, approval_id=a.id, digest=a.effective_digest,
                                details={"tool": a.tool, "args": a.effective_args(),
                                         "reason": reason, **outcome_details(a)})
