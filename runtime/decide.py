"""Deciding an approval: exactly one outcome, by compare-and-set, checked against the policy.

Clicks, CLI commands, expiry and other replicas all race through the same conditional
UPDATEs on ``approvals.status``; one wins, every other attempt is refused with a reason.
The decision commits first; resuming the run is the caller's next, separate step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from runtime import audit
from runtime.canonical import call_digest, compact_json
from runtime.directory import DirectoryError
from runtime.errors import DecisionRefused, InvalidArguments, NotFound
from runtime.failpoints import failpoint
from runtime.gate import CARD_UPDATE
from runtime.policy import ApprovalPolicy, is_group
from store.records import ApprovalRecord
from store.repos import Tx

if TYPE_CHECKING:
    from runtime.engine import Engine

Verdict = Literal["approve", "deny", "edit", "retry", "mark_done", "abort"]
TOOL_VERDICTS = ("approve", "deny", "edit")
QUESTION_VERDICTS = ("retry", "mark_done", "abort")
MAX_REASON = 2000


@dataclass(frozen=True)
class Actor:
    """Who decides: a Slack user id from a signed payload, or an operator at the CLI.

    ``via`` records the channel of authority: ``slack``, or ``cli:<os user>``.
    """

    id: str
    via: str


@dataclass(frozen=True)
class Decision:
    """The committed result of one decision attempt."""

    approval: ApprovalRecord
    outcome: str  # approved | denied | voted | retry | mark_done | abort
    approvals: int
    quorum: int
    run_ready: bool

    @property
    def final(self) -> bool:
        return self.outcome != "voted"


def _refuse(a: ApprovalRecord, code: str, message: str) -> DecisionRefused:
    return DecisionRefused(message, reason=code, status=a.status, approval_id=a.id,
                           run_id=a.run_id)


def not_pending_message(a: ApprovalRecord) -> str:
    if a.status == "superseded":
        return f"approval {a.id} was escalated and replaced by a newer request"
    if a.status == "expired":
        return f"approval {a.id} expired at {a.expires_at.isoformat()}"
    who = f" by {a.decided_by}" if a.decided_by else ""
    when = f" at {a.decided_at.isoformat()}" if a.decided_at else ""
    return f"approval {a.id} is already {a.status}{who}{when}"


class Decider:
    def __init__(self, engine: Engine) -> None:
        self.e = engine

    async def get(self, approval_id: str) -> ApprovalRecord:
        async with self.e.db.read() as tx:
            a = await tx.approvals.get(approval_id)
            if a is None and len(approval_id) >= 6:
                found = await tx.approvals.find(approval_id)
                a = found[0] if len(found) == 1 else None
        if a is None:
            raise NotFound(f"no approval {approval_id}", approval_id=approval_id)
        return a

    async def authorize(self, a: ApprovalRecord, actor: Actor) -> None:
        """Raise :class:`DecisionRefused` unless ``actor`` may decide ``a`` under its snapshot."""
        policy = ApprovalPolicy.from_snapshot(a.policy)
        if actor.id == a.requested_by and not policy.allow_self_approval:
            raise _refuse(a, "self_approval",
                          f"{actor.id} started this run and may not approve its calls")
        approvers = a.approvers_value()
        if not approvers or actor.id in approvers:
            return
        for group in (g for g in approvers if is_group(g)):
            try:
                members = await self.e.directory.members(group)
            except DirectoryError as exc:
                raise _refuse(a, "directory_unavailable",
                              f"cannot check membership of {group}: {exc}") from None
            if actor.id in members:
                return
        raise _refuse(a, "not_authorized",
                      f"{actor.id} is not an approver for this request "
                      f"(approvers: {', '.join(approvers)})")

    def check_open(self, a: ApprovalRecord, token: str | None) -> None:
        """Refuse a stale or foreign button, or a request that is no longer pending."""
        if token is not None or self.e.require_tokens:
            signer = self.e.signer
            if token is None or signer is None or not signer.verify(a.id, a.token_nonce, token):
                raise _refuse(a, "bad_token", "this button does not belong to a live request")
        if a.status != "pending":
            raise _refuse(a, "not_pending", not_pending_message(a))

    async def decide(self, approval_id: str, *, actor: Actor, verdict: Verdict,
                     reason: str | None = None, args: Any = None,
                     token: str | None = None) -> Decision:
        """Record one decision; raises :class:`DecisionRefused` and changes nothing on refusal."""
        a = await self.get(approval_id)
        allowed = TOOL_VERDICTS if a.kind == "tool_call" else QUESTION_VERDICTS
        if verdict not in allowed:
            self.check_open(a, token)  # a stale button outranks a wrong verdict
            raise _refuse(a, "wrong_kind",
                          f"{verdict!r} does not answer a {a.kind} request "
                          f"(use one of: {', '.join(allowed)})")
        self.check_open(a, token)
        reason = (reason or "").strip() or None
        if verdict in ("deny", "abort") and not reason:
            raise _refuse(a, "reason_required", "a denial needs a reason")
        if reason and len(reason) > MAX_REASON:
            raise _refuse(a, "reason_too_long", f"a reason is at most {MAX_REASON} characters")
        edited: dict[str, Any] | None = None
        if verdict == "edit":
            edited = await self._validate_edit(a, args)
        await self.authorize(a, actor)

        async with self.e.db.write(urgent=True) as tx:  # the clicker is waiting
            if a.kind == "tool_call":
                result = await self._decide_call(tx, a, actor, verdict, reason, edited)
            else:
                result = await self._answer_question(tx, a, actor, verdict, reason)
        failpoint("after_decision")
        return result

    async def _validate_edit(self, a: ApprovalRecord, args: Any) -> dict[str, Any]:
        tool = await self.e.tool_for(a)
        try:
            edited = tool.validate(args)
            self.e.check_payload(compact_json(edited), what="edited arguments")
        except InvalidArguments as exc:
            raise DecisionRefused(str(exc), reason="invalid_arguments", status=a.status,
                                  approval_id=a.id, run_id=a.run_id, errors=exc.errors) from None
        return edited

    async def _decide_call(self, tx: Tx, a: ApprovalRecord, actor: Actor, verdict: str,
                           reason: str | None, edited: dict[str, Any] | None) -> Decision:
        now = self.e.clock.now()
        digest = a.effective_digest
        if edited is not None:
            digest = call_digest(a.tool, edited)
            if not await tx.approvals.set_edit(a.id, edited_args=compact_json(edited),
                                               edited_digest=digest):
                raise await self._lost(tx, a)
            await audit.append(
                tx, at=now, action="edited", actor=actor.id, via=actor.via, run_id=a.run_id,
                approval_id=a.id, digest=digest,
                details={"tool": a.tool, "args": edited, "original_args": a.args_value(),
                         "original_digest": a.digest, "reason": reason})
        vote = "deny" if verdict == "deny" else "approve"
        if not await tx.approvals.add_vote(approval_id=a.id, actor=actor.id, verdict=vote,
                                           digest=digest, via=actor.via, at=now):
            raise _refuse(a, "already_voted", f"{actor.id} already voted on approval {a.id}")
        if vote == "deny":
            done = await tx.approvals.transition(
                a.id, to="denied", decided_at=now, decided_by=actor.id, decided_via=actor.via,
                verdict="deny", reason=reason)
            if done is None:
                raise await self._lost(tx, a)
            await audit.append(tx, at=now, action="denied", actor=actor.id, via=actor.via,
                               run_id=a.run_id, approval_id=a.id, digest=digest,
                               details={"tool": a.tool, "args": done.effective_args(),
                                        "reason": reason})
            ready = await self._run_ready(tx, done)
            return Decision(done, "denied", done.approve_count, done.quorum, ready)
        if a.quorum == 1:
            count = 1  # this vote decides; the compare-and-set below is the arbiter
        else:
            counted = await tx.approvals.count_approve(a.id, digest)
            if counted is None:
                raise await self._lost(tx, a)
            count = counted
        if count < a.quorum:
            await audit.append(tx, at=now, action="voted", actor=actor.id, via=actor.via,
                               run_id=a.run_id, approval_id=a.id, digest=digest,
                               details={"tool": a.tool, "args": edited or a.effective_args(),
                                        "approvals": count, "quorum": a.quorum})
            await self._update_card(tx, a)
            fresh = await tx.approvals.get(a.id)
            assert fresh is not None
            return Decision(fresh, "voted", count, a.quorum, False)
        done = await tx.approvals.transition(
            a.id, to="approved", decided_at=now, decided_by=actor.id, decided_via=actor.via,
            verdict=verdict, reason=reason, approve_count=count)
        if done is None:
            raise await self._lost(tx, a)
        voters = [actor.id] if a.quorum == 1 else [
            v.actor for v in await tx.approvals.votes(a.id)
            if v.verdict == "approve" and v.digest == digest]
        await audit.append(tx, at=now, action="approved", actor=actor.id, via=actor.via,
                           run_id=a.run_id, approval_id=a.id, digest=digest,
                           details={"tool": a.tool, "args": done.effective_args(),
                                    "approvers": voters, "quorum": a.quorum,
                                    "edited": done.edited_args is not None})
        ready = await self._run_ready(tx, done)
        return Decision(done, "approved", count, a.quorum, ready)

    async def _answer_question(self, tx: Tx, a: ApprovalRecord, actor: Actor, verdict: str,
                               reason: str | None) -> Decision:
        now = self.e.clock.now()
        to = "denied" if verdict == "abort" else "approved"
        done = await tx.approvals.transition(
            a.id, to=to, decided_at=now, decided_by=actor.id, decided_via=actor.via,
            verdict=verdict, reason=reason)
        if done is None:
            raise await self._lost(tx, a)
        await tx.approvals.add_vote(approval_id=a.id, actor=actor.id, verdict=verdict,
                                    digest=a.digest, via=actor.via, at=now)
        await audit.append(tx, at=now, action="outcome_resolved", actor=actor.id, via=actor.via,
                           run_id=a.run_id, approval_id=a.id, digest=a.digest,
                           details={"tool": a.tool, "args": a.args_value(), "verdict": verdict,
                                    "reason": reason})
        if verdict == "mark_done":
            await tx.executions.record_result(
                run_id=a.run_id, call_id=a.call_id, status="succeeded",
                result=compact_json({"status": "done", "confirmed_by": actor.id,
                                     "note": reason}),
                error_class=None, error=None, now=now, latency_ms=None)
        await self._update_card(tx, a)
        if verdict == "abort":
            await tx.runs.update(a.run_id, expect_status=["needs_attention"], status="cancelled",
                                 error=f"aborted by {actor.id}: {reason}", updated_at=now)
            await self.e.gate.cancel_pending(tx, a.run_id, actor=actor.id, via=actor.via)
            await audit.append(tx, at=now, action="cancelled", actor=actor.id, via=actor.via,
                               run_id=a.run_id, approval_id=a.id, digest=a.digest,
                               details={"reason": reason})
            return Decision(done, verdict, 0, 1, False)
        ready = await tx.runs.wake_if_idle(a.run_id, kind="outcome_unknown", now=now,
                                           from_status="needs_attention")
        return Decision(done, verdict, 1, 1, ready)

    async def _run_ready(self, tx: Tx, a: ApprovalRecord) -> bool:
        """Card update, and wake the run when its last pending request is decided."""
        await self._update_card(tx, a)
        return await tx.runs.wake_if_idle(a.run_id, kind="tool_call", now=self.e.clock.now())

    async def _update_card(self, tx: Tx, a: ApprovalRecord) -> None:
        await tx.outbox.add(kind=CARD_UPDATE, group_key=a.id,
                            payload=compact_json({"approval_id": a.id}), now=self.e.clock.now())

    async def _lost(self, tx: Tx, a: ApprovalRecord) -> DecisionRefused:
        """The compare-and-set lost: report what won."""
        now_rec = await tx.approvals.get(a.id)
        return _refuse(now_rec or a, "not_pending", not_pending_message(now_rec or a))

