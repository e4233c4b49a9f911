"""Deciding an approval: one outcome, on exactly the arguments the approver saw, in time.

A decision is one transaction that locks the run row, then the approval row, and checks
everything against that fresh row: a live button for these exact arguments (the token
binds the digest the card showed), still pending, not past ``expires_at``, an authorised
actor who has not voted on these arguments yet. The status change itself is a
compare-and-set on status, expiry and the effective digest, so clicks, CLI commands, the
expiry sweep and other replicas race to exactly one winner.

A repeat of a decision by the person who made it (the same verdict on the arguments that
were decided: a second click, a command run again after a crash) is no mistake and no new
decision: it changes nothing, is audited ``repeated``, and comes back as a
:class:`Decision` whose ``repeated`` is set, so every face says the decision stands. Anyone
else's attempt on a decided request, or another verdict, is refused.

A refused attempt changes nothing (its transaction rolls back) except the audit log,
which records it with its reason code in a transaction of its own; when the reason is
that the request has expired, that transaction applies the expiry too, whatever the
sweep has or has not done. The decision commits before anything else happens; resuming
the run is the caller's next, separate step.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from approvald.runtime.kernel import binding, prefix
from approvald.runtime.kernel.canonical import call_digest, compact_json
from approvald.runtime.kernel.clock import Clock
from approvald.runtime.kernel.errors import DecisionRefused, InvalidArguments, NotFound, Refusal
from approvald.runtime.kernel.failpoints import failpoint
from approvald.runtime.kernel.handoff import LeasedRuns
from approvald.runtime.kernel.ids import TokenSigner, lease_id
from approvald.runtime.kernel.limits import PayloadCap
from approvald.runtime.kernel.signals import Signals
from approvald.runtime.kernel.vocabulary import outcome_details, outcome_of, word
from approvald.runtime.policies.directory import Directory, DirectoryError, is_approver
from approvald.runtime.policies.policy import ApprovalPolicy, CallPolicy, PolicyFile
from approvald.runtime.policies.sensitive import Masking, unmask_edit
from approvald.runtime.policies.tools import Tool
from approvald.runtime.record.audit import AuditTrail
from approvald.runtime.record.outbox_kinds import (
    CardUpdate,
    closed_rows,
    queue,
    queue_closed,
    tell_edited,
)
from approvald.runtime.record.shown import of_request
from approvald.runtime.requests.expiry import Expiry, SweepResult
from approvald.runtime.requests.gate import Gate
from approvald.runtime.requests.packet import (
    card_posted,
    edit_changes,
    edited_packet,
    impact_of,
    masked_packet,
    sensitive_paths,
)
from approvald.store.db import Database, is_store_failure
from approvald.store.records import ApprovalRecord, RunRecord
from approvald.store.repos import Tx
from approvald.store.repos.approvals import Closing
from approvald.store.repos.runs import Woken

log = logging.getLogger("approvald.decide")

Verdict = Literal["approve", "deny", "edit", "redirect", "retry", "mark_done", "abort",
                  "replan"]
TOOL_VERDICTS = ("approve", "deny", "edit", "redirect")
QUESTION_VERDICTS = ("retry", "mark_done", "abort")
# an approved call the deployed release cannot run: the model re-plans, or the run ends
CANNOT_RUN_VERDICTS = ("replan", "abort")
VERDICTS_OF = {"tool_call": TOOL_VERDICTS, "outcome_unknown": QUESTION_VERDICTS,
               "cannot_run": CANNOT_RUN_VERDICTS}
# the verdicts that end a tool-call request at once, whatever the quorum: one no (or one
# "not this, do that instead") outweighs any number of yeses
FINAL_VERDICTS = {"deny": "denied", "redirect": "redirected"}
MAX_REASON = 2000  # a reason, or a redirect's guidance


@dataclass(frozen=True)
class Actor:
    """Who decides: a Slack user id from a signed payload, or an operator at the CLI.

    ``via`` records the channel of authority: ``slack``, or ``cli:<os user>``.
    """

    id: str
    via: str
    # the person's name as the face knew it at the time (Slack's signed payload says it),
    # and the batch the decision was one of: recorded beside the id in its audit entry
    name: str | None = None
    batch: str | None = None

    def marks(self) -> dict[str, str]:
        """What an audit entry of this actor's act records beside the id."""
        out = {"actor_name": self.name} if self.name else {}
        if self.batch:
            out["batch"] = self.batch
        return out


@dataclass(frozen=True)
class Decision:
    """The committed result of one decision attempt.

    ``outcome``: approved | denied | redirected | voted | edited (a proposal waiting for
    others) | retry | mark_done | abort | replan. ``discarded``: approvers whose votes were
    on the arguments an edit replaced, and who must vote again for them to count.
    ``repeated``: this was its decider deciding it the same way again; nothing changed
    (``approval`` is the request as decided before, ``outcome`` that decision).
    """

    approval: ApprovalRecord
    outcome: str
    approvals: int
    quorum: int
    run_ready: bool
    discarded: tuple[str, ...] = ()
    # the lease id the run was leased under in the same transaction (the engine has a
    # worker that takes decided runs: it advances the run under it, with no claim of its own)
    claim: str | None = None
    repeated: bool = False
    # the run's row as the decision leased it under ``claim`` (runtime.kernel.handoff)
    run: RunRecord | None = None

    @property
    def final(self) -> bool:
        """Whether this attempt ended the request (a repeat ended nothing: it was over)."""
        return self.outcome not in ("voted", "edited") and not self.repeated

    @property
    def edited(self) -> bool:
        """Whether the request was approved with arguments an approver edited."""
        return self.outcome == "approved" and self.approval.edited_args is not None


@dataclass
class _Attempt:
    """One decision attempt, as checked before its transaction."""

    actor: Actor
    verdict: str
    reason: str | None
    token: str | None
    expect_digest: str | None
    edited: dict[str, Any] | None = None
    # the tool's impact hook on ``edited``, worked out here where the tool is known
    edited_impact: str | None = None
    refusal: DecisionRefused | None = None  # found before the transaction (kept for order)
    trace: str | None = None  # the deciding span's traceparent (Tracer.traceparent)

    def traced(self) -> dict[str, str]:
        """What a deciding transition stores of the trace (nothing when tracing is off)."""
        return {} if self.trace is None else {"decision_trace": self.trace}


def _json_object(raw: str) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except (TypeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _refuse(a: ApprovalRecord, code: Refusal, message: str, **fields: Any) -> DecisionRefused:
    # who decided it and who may: the faces word a refusal from these fields, naming
    # people their own way, rather than repeat ``message`` (raw ids, for logs and the CLI)
    return DecisionRefused(message, reason=code, status=a.status, approval_id=a.id,
                           run_id=a.run_id, decided_by=a.decided_by,
                           outcome=outcome_of(a).value,
                           approvers=list(a.approvers_value()), **fields)


# what a verdict leaves a request as: a repeat of it by its decider changes nothing
RESULTING = {"approve": "approved", "edit": "approved", "deny": "denied",
             "redirect": "redirected", "retry": "approved", "mark_done": "approved",
             "abort": "denied", "replan": "approved"}


def not_pending_message(a: ApprovalRecord) -> str:
    if a.status == "superseded":
        return f"approval {a.id} was escalated and replaced by a newer request"
    if a.status == "expired":
        return f"approval {a.id} expired at {a.expires_at.isoformat()}"
    who = f" by {a.decided_by}" if a.decided_by else ""
    when = f" at {a.decided_at.isoformat()}" if a.decided_at else ""
    return f"approval {a.id} is already {word(a).words}{who}{when}"


def _names(at: _Attempt, digest: str) -> bool:
    """Whether the arguments ``at`` is bound to (``expect_digest``: a binding as a card, a
    page or ``approvals show`` showed it, or a prefix of one) are those with ``digest``.
    The operator's command line, which reads the database anyway, may still give a plain
    digest (or a prefix) as versions before bindings printed it; no other face may, so
    that nobody can try candidates for a masked value against a request."""
    return binding.matches(at.expect_digest or "", digest,
                           plain=at.actor.via.startswith("cli"))


class _LookUpFirst(Exception):
    """A decision that locked its request first finds it must look the actor up in a
    group (which may be slow) before any lock: it rolls back and starts over."""


def _needs_lookup(approvers: Sequence[str], actor: Actor) -> bool:
    """Whether deciding a request with these ``approvers`` as ``actor`` may ask the
    directory (a group's members): the actor is not one of them, and a group is."""
    from approvald.runtime.policies.policy import is_group

    return bool(approvers) and actor.id not in approvers \
        and any(is_group(g) for g in approvers)


def counted(a: ApprovalRecord, voters: Sequence[str], digest: str | None = None) -> list[str]:
    """Those of ``voters`` (approvers of ``digest``, by default the arguments that will
    run) who count towards ``a``'s quorum. Four eyes on a proposal: with
    ``edits = "propose"`` its author's vote on the proposed arguments (one cast before
    they proposed them again, say) never counts."""
    digest = digest or a.effective_digest
    if a.edited_by and a.edited_digest == digest \
            and ApprovalPolicy.from_snapshot(a.policy).edits == "propose":
        return [v for v in voters if v != a.edited_by]
    return list(voters)


_Woke = tuple[bool, str | None, RunRecord | None]


def _woke(woken: Woken | None, owner: str | None) -> _Woke:
    """(woken, the lease id it was leased under, the run's row as leased)."""
    if woken is None:
        return False, None, None
    if not woken.leased:
        return True, None, None
    return True, owner, woken.run


class Decider:
    """Records decisions, each one transaction (see the module docstring). The caller's
    front door is :class:`runtime.approvals.decisions.Decisions`, which traces, measures and tells
    the process about each one."""

    def __init__(self, db: Database, clock: Clock, audit: AuditTrail, directory: Directory,
                 tool_for: Callable[[ApprovalRecord], Awaitable[Tool]],
                 policy: Callable[[], PolicyFile], cap: PayloadCap, gate: Gate,
                 expiry: Expiry, signals: Signals, *, owner: str, lease_ttl: timedelta,
                 signer: TokenSigner | None = None, require_tokens: bool = False,
                 traceparent: Callable[[], str | None] = lambda: None,
                 leased: LeasedRuns | None = None) -> None:
        self.db = db
        # the rows of runs this decider leased, handed to this process's runner
        self.leased = leased or LeasedRuns()
        self.clock = clock
        self.audit = audit
        self.directory = directory
        self.tool_for = tool_for  # the tool an edit is validated against
        self.policy = policy  # the policy file in force (an edit stays in its band)
        self.cap = cap
        self.gate = gate
        self.expiry = expiry
        self.signals = signals
        self.owner = owner
        self.lease_ttl = lease_ttl  # a decision that makes a run ready leases it (see _claim)
        self.signer = signer
        self.require_tokens = require_tokens
        # the current span as a W3C traceparent (Tracer.traceparent), stored with a request
        # this decides: the span the front door of a decision opened around it
        self.traceparent = traceparent

    async def get(self, approval_id: str) -> ApprovalRecord:
        """A request by id or unambiguous id prefix (see :func:`runtime.kernel.prefix.resolve`)."""
        async with self.db.read() as tx:
            return await prefix.resolve("approval", approval_id, tx.approvals.get,
                                        tx.approvals.find, field="approval_id")

    async def authorize(self, a: ApprovalRecord, actor: Actor,
                        approvers: list[str] | None = None) -> None:
        """Raise :class:`DecisionRefused` unless ``actor`` may decide ``a`` under its snapshot.
        ``approvers``: ``a``'s, when the caller has parsed them already."""
        policy = ApprovalPolicy.from_snapshot(a.policy)
        if actor.id == a.requested_by and not policy.allow_self_approval:
            raise _refuse(a, Refusal.SELF_APPROVAL,
                          f"{actor.id} started this run and may not approve its calls")
        if approvers is None:
            approvers = a.approvers_value()
        try:
            if await is_approver(self.directory, approvers, actor.id):
                return
        except DirectoryError as exc:
            raise _refuse(a, Refusal.DIRECTORY_UNAVAILABLE, str(exc)) from None
        raise _refuse(a, Refusal.NOT_AUTHORIZED,
                      f"{actor.id} is not an approver for this request "
                      f"(approvers: {', '.join(approvers)})")

    def check_open(self, a: ApprovalRecord, token: str | None, *,
                   now: datetime | None = None) -> None:
        """Refuse a stale or foreign button, a closed request, or one past its expiry.

        Decisions run this on the row they locked; opening a modal runs it as a preflight.
        """
        self.check_token(a, token)
        self.check_pending(a, now=now)

    def check_token(self, a: ApprovalRecord, token: str | None) -> None:
        """Refuse a stale or foreign button (a decision's first check: it outranks all)."""
        if token is not None or self.require_tokens:
            signer = self.signer
            check = "bad" if token is None or signer is None else signer.check(
                a.id, a.token_nonce, token, digest=a.effective_digest, original=a.digest)
            if check == "stale":
                raise _refuse(a, Refusal.STALE_CARD,
                              "the arguments were edited after this card was drawn; the card "
                              "now shows the new ones: review them and decide again")
            if check != "ok":
                raise _refuse(a, Refusal.BAD_TOKEN, "this button does not belong to a live request")

    def check_pending(self, a: ApprovalRecord, *, now: datetime | None = None) -> None:
        """Refuse a closed request, or one past its expiry."""
        if a.status != "pending":
            raise _refuse(a, Refusal.NOT_PENDING, not_pending_message(a))
        if (now or self.clock.now()) >= a.expires_at:
            raise _refuse(a, Refusal.EXPIRED,
                          f"approval {a.id} expired at {a.expires_at.isoformat()}; "
                          "a decision after that does not count")

    async def decide(self, approval_id: str, *, actor: Actor, verdict: Verdict,
                     reason: str | None = None, args: Any = None, token: str | None = None,
                     expect_digest: str | None = None) -> Decision:
        """Record one decision; on refusal, record only the refusal and raise it.

        ``reason``: why (required for a denial); for a redirect, the guidance the model
        receives instead of the call's result (required). ``expect_digest`` (a prefix is
        enough): decide only if the arguments are still the ones with this digest (a card's
        token carries it; the CLI takes ``--digest``). The deciding span's W3C
        traceparent is stored with a request this decides.
        """
        at = _Attempt(actor=actor, verdict=verdict, reason=(reason or "").strip() or None,
                      token=token, expect_digest=expect_digest, trace=self.traceparent())
        locked: list[ApprovalRecord] = []
        if verdict != "edit":  # (an edit's arguments are validated before any lock)

            async def at_once(tx: Tx) -> Decision:
                # the request read as it is locked, not before (issue 50): its checks need
                # nothing slow unless the actor could only be an approver through a group
                a = await tx.approvals.lock_in_run(approval_id, None)
                # parsed once: the lookup's question and the authorization read them
                approvers = None if a is None else a.approvers_value()
                if a is None or approvers is None or _needs_lookup(approvers, actor):
                    raise _LookUpFirst
                locked[:] = [a]
                at.refusal = None
                try:
                    await self._precheck(a, at, args, approvers)
                except DecisionRefused as exc:
                    at.refusal = exc
                return await self._decide_locked(tx, a, at)

            try:
                decision = await self.db.transact(at_once,
                                                  what=f"decision on approval {approval_id}")
            except _LookUpFirst:
                pass  # rolled back: the request is read first, its approvers looked up
            except DecisionRefused as refusal:
                await self._record_refusal(locked[0], at, refusal)
                raise
            else:
                return self._committed(decision)
        a0 = await self.get(approval_id)
        at.refusal = None
        try:
            await self._precheck(a0, at, args)
        except DecisionRefused as exc:
            at.refusal = exc

        async def attempt(tx: Tx) -> Decision:
            return await self._decide_in(tx, a0, at)

        try:
            decision = await self.db.transact(attempt, what=f"decision on approval {a0.id}")
        except DecisionRefused as refusal:
            await self._record_refusal(a0, at, refusal)
            raise
        return self._committed(decision)

    def _committed(self, decision: Decision) -> Decision:
        if decision.claim is not None and decision.run is not None:  # committed: hand it on
            self.leased.put(decision.claim, decision.run)
        failpoint("after_decision")
        return decision

    # -- before the transaction: nothing here reads state that can change ---------------
    async def _precheck(self, a: ApprovalRecord, at: _Attempt, args: Any,
                        approvers: list[str] | None = None) -> None:
        allowed = VERDICTS_OF.get(a.kind, QUESTION_VERDICTS)
        if at.verdict not in allowed:
            raise _refuse(a, Refusal.WRONG_KIND,
                          f"{at.verdict!r} does not answer a {a.kind} request "
                          f"(use one of: {', '.join(allowed)})")
        if at.verdict == "redirect":
            if not at.reason:
                raise _refuse(a, Refusal.GUIDANCE_REQUIRED,
                              "a redirect needs guidance: what the agent should do instead")
            if len(at.reason) > MAX_REASON:
                raise _refuse(a, Refusal.GUIDANCE_TOO_LONG,
                              f"guidance is at most {MAX_REASON} characters")
        if at.verdict in ("deny", "abort") and not at.reason:
            raise _refuse(a, Refusal.REASON_REQUIRED, "a denial needs a reason")
        if at.reason and len(at.reason) > MAX_REASON:
            raise _refuse(a, Refusal.REASON_TOO_LONG,
                          f"a reason is at most {MAX_REASON} characters")
        if at.verdict == "edit":
            at.edited, at.edited_impact = await self._validate_edit(a, args)
        # who may decide is fixed per request (an escalation is a new request), so the
        # directory lookup, which may be slow, happens before any lock is taken
        await self.authorize(a, at.actor, approvers)

    async def read_edit(self, a: ApprovalRecord, args: Any) -> dict[str, Any]:
        """An approver's edit of ``a`` as it will run: every face shows sensitive values
        masked (issue 34), so one given back as shown keeps its real value and one typed
        over is what was typed; then validated by the tool (``InvalidArguments``)."""
        unmasked = unmask_edit(args, a.effective_args(), sensitive_paths(a))
        return (await self.tool_for(a)).validate(unmasked)

    async def _validate_edit(self, a: ApprovalRecord,
                             args: Any) -> tuple[dict[str, Any], str | None]:
        """The edited arguments as the tool validates them, and their impact."""
        try:
            tool = await self.tool_for(a)
        except NotFound as exc:
            raise _refuse(a, Refusal.INVALID_ARGUMENTS, str(exc)) from None
        try:
            edited = await self.read_edit(a, args)
            self.cap.check(compact_json(edited), what="edited arguments")
        except InvalidArguments as exc:
            raise _refuse(a, Refusal.INVALID_ARGUMENTS, str(exc), errors=exc.errors) from None
        except Exception as exc:  # PayloadTooLarge
            raise _refuse(a, Refusal.INVALID_ARGUMENTS, str(exc)) from None
        rules = self.policy()
        self._same_rules(a, tool.name,
                         rules.for_call(tool.name, tool.policy, tool.approval,
                                        a.effective_args()),
                         rules.for_call(tool.name, tool.policy, tool.approval, edited))
        return edited, impact_of(tool, edited)

    @staticmethod
    def _same_rules(a: ApprovalRecord, tool: str, before: CallPolicy,
                    after: CallPolicy) -> None:
        """An edit stays under the rule its call is under: an approver cannot edit a call
        into a band that needs fewer approvals (or none), nor into a forbidden one. The
        policy's rules of today are evaluated on the arguments as they stand and as edited,
        and must choose the same rule (or, both, none: a change to the tool's own policy
        since the request leaves the stored request to decide, as for any decision)."""
        if (before.rule, before.kind) == (after.rule, after.kind):
            return
        where = f"policy rule {after.approval.rule}" if after.approval.rule \
            else f"{tool}'s own policy"
        was = f"policy rule {before.approval.rule}" if before.approval.rule \
            else f"{tool}'s own policy"
        if after.kind == "forbidden":
            why = f"the edited arguments are forbidden ({after.reason})"
        elif after.kind != "approve_before":
            why = f"the edited arguments fall under {where}, which runs them with no " \
                  f"approval ({after.kind})"
        else:
            why = f"the edited arguments fall under {where}, not under {was} as the " \
                  "request's do"
        raise _refuse(a, Refusal.RULE_CHANGED, f"{why}; an edit cannot move a call to other "
                      "rules: deny it and let the agent ask for the call it needs")

    # -- the transaction ------------------------------------------------------------------
    async def _decide_in(self, tx: Tx, a0: ApprovalRecord, at: _Attempt) -> Decision:
        # the one lock order: run, approval, audit head (the first two in one statement)
        a = await tx.approvals.lock_in_run(a0.id, a0.run_id)
        assert a is not None  # approvals are never deleted
        return await self._decide_locked(tx, a, at)

    async def _decide_locked(self, tx: Tx, a: ApprovalRecord, at: _Attempt) -> Decision:
        now = self.clock.now()
        self.audit.knows(a.id, a.policy)  # its entries mask its call unread (issue 50)
        self.check_token(a, at.token)  # a stale button outranks everything else
        if self._repeats(a, at):
            return await self._repeat(tx, a, at, now)
        self.check_pending(a, now=now)
        if at.refusal is not None:
            raise at.refusal
        if at.expect_digest and not _names(at, a.effective_digest):
            await self._stale_digest(tx, a, at)
        if a.kind == "tool_call":
            return await self._decide_call(tx, a, at, now)
        return await self._answer_question(tx, a, at, now)

    @staticmethod
    def _repeats(a: ApprovalRecord, at: _Attempt) -> bool:
        """Whether ``at`` is the decision ``a`` already records, by the one who made it:
        the same verdict, on the arguments that were decided (a ``--digest`` naming them,
        an edit to exactly them)."""
        if a.status == "pending" or at.refusal is not None or a.decided_by != at.actor.id \
                or a.decided_via == "standing" or RESULTING.get(at.verdict) != a.status:
            return False
        if a.kind != "tool_call":
            return a.verdict == at.verdict
        if at.expect_digest and not _names(at, a.effective_digest):
            return False
        return at.edited is None or call_digest(a.tool, at.edited) == a.effective_digest

    async def _repeat(self, tx: Tx, a: ApprovalRecord, at: _Attempt,
                      now: datetime) -> Decision:
        """A decision made again by its decider: audited as such, nothing else changes."""
        self.audit.record(tx, at=now, action="repeated", actor=at.actor.id, via=at.actor.via,
                          run_id=a.run_id, approval_id=a.id, digest=a.effective_digest,
                          details={"verdict": at.verdict, "tool": a.tool, "status": a.status,
                                   "decided_at": a.decided_at.isoformat()
                                   if a.decided_at else None, **at.actor.marks()})
        outcome = a.status if a.kind == "tool_call" else (a.verdict or a.status)
        return Decision(a, outcome, a.approve_count, a.quorum, False, repeated=True)

    async def _stale_digest(self, tx: Tx, a: ApprovalRecord, at: _Attempt) -> None:
        """Refuse a decision bound to other arguments than the current ones: arguments the
        request had before an edit (its original ones, or those someone voted on), or, for
        a digest no version of them had (a typo), an error of its own."""
        known = {a.digest, a.edited_digest, *(v.digest for v in await tx.approvals.votes(a.id))}
        if any(d and _names(at, d) for d in known):
            raise _refuse(a, Refusal.STALE_CARD,
                          f"the arguments of approval {a.id} changed (digest now "
                          f"{binding.short(a.effective_digest)}): review them and decide "
                          "again")
        raise _refuse(a, Refusal.UNKNOWN_DIGEST,
                      f"no version of the arguments of approval {a.id} has a digest starting "
                      f"with {(at.expect_digest or '')[:64]} (they have "
                      f"{binding.short(a.effective_digest)} now): copy it from "
                      "`approvals show`")

    async def _decide_call(self, tx: Tx, a: ApprovalRecord, at: _Attempt,
                           now: datetime) -> Decision:
        actor, verdict = at.actor, at.verdict
        policy = ApprovalPolicy.from_snapshot(a.policy)
        digest = a.effective_digest
        discarded: tuple[str, ...] = ()
        if at.edited is not None:
            new = call_digest(a.tool, at.edited)
            if new == digest and policy.edits == "propose":
                raise _refuse(a, Refusal.UNCHANGED, "the edited arguments are the current ones")
            if new != digest:
                earlier = await tx.approvals.approvers_on(a.id, digest)
                # the request's words stay as asked; the edit's impact goes beside them
                packet = masked_packet(
                    edited_packet(_json_object(a.packet), asked_digest=a.digest,
                                  digest=new, impact=at.edited_impact),
                    Masking.of_call(policy.sensitive, at.edited) | of_request(a))
                if not await tx.approvals.set_edit(
                        a.id, edited_args=compact_json(at.edited), edited_digest=new,
                        edited_by=actor.id, edited_at=now, expect_digest=digest,
                        packet=compact_json(packet)):
                    raise _refuse(a, Refusal.NOT_PENDING, not_pending_message(a))
                discarded = tuple(v for v in earlier if v != actor.id)
                self.audit.record(
                    tx, at=now, action="edited", actor=actor.id, via=actor.via,
                    run_id=a.run_id, approval_id=a.id, digest=new,
                    details={"tool": a.tool, "args": at.edited, "mode": policy.edits,
                             "previous_args": a.effective_args(), "previous_digest": digest,
                             "original_args": a.args_value(), "original_digest": a.digest,
                             "impact": at.edited_impact,
                             "discarded_votes": list(discarded), "reason": at.reason,
                             **actor.marks(), **card_posted(a)})
                # whatever face it came through: a mailed request's thread is told
                await tell_edited(
                    tx, a, changed=lambda: edit_changes(a, a.effective_args(), at.edited),
                    digest=new, by=actor.id, via=actor.via, mode=policy.edits,
                    discarded=discarded, now=now)
                digest = new
                if policy.edits == "propose":  # someone other than the editor decides
                    fresh = await self._card(tx, a.id)
                    return Decision(fresh, "edited", 0, a.quorum, False, discarded)
        vote = verdict if verdict in FINAL_VERDICTS else "approve"
        if vote == "approve" and at.edited is None and policy.edits == "propose" \
                and a.edited_by == actor.id and a.edited_digest == digest:
            raise _refuse(a, Refusal.OWN_EDIT,
                          f"{actor.id} proposed these arguments; someone else must approve them")
        at_once = vote in FINAL_VERDICTS or (a.quorum == 1 and bool(counted(a, [actor.id],
                                                                             digest)))
        if at.edited is None and at_once:
            # the vote and the decision it makes, one statement where the database can
            # (issue 50): the request changes only if the vote was new
            # (issue 50) and, in the same statement, what a close sets off: the card's
            # update, the mail thread's follow-up, the run woken and leased
            status = FINAL_VERDICTS.get(vote, "approved")
            row, follow, having, statuses = closed_rows(CardUpdate(a.id), a.id)
            owner = lease_id(self.owner) if self.signals.takes_decided else None
            voted, done, woken = await tx.approvals.vote_and_close(
                approval_id=a.id, actor=actor.id, vote=vote, digest=digest, via=actor.via,
                at=now, to=status, closing=Closing(
                    run_id=a.run_id, card=row, follow=follow, having=having,
                    statuses=statuses, kind="tool_call",
                    lease=None if owner is None else (owner, now + self.lease_ttl)),
                decided_at=now, decided_by=actor.id, decided_via=actor.via, verdict=verdict,
                reason=at.reason, **({"approve_count": 1} if vote == "approve" else {}),
                **at.traced())
            if not voted:
                raise _refuse(a, Refusal.ALREADY_VOTED,
                              f"{actor.id} already voted on these arguments of approval {a.id}")
            if done is None:
                raise _refuse(a, Refusal.NOT_PENDING, not_pending_message(a))
            return await self._decided(tx, a, at, done, status, digest, [actor.id],
                                       discarded, now, woken=_woke(woken, owner))
        if not await tx.approvals.add_vote(approval_id=a.id, actor=actor.id, verdict=vote,
                                           digest=digest, via=actor.via, at=now):
            if at.edited is None:
                raise _refuse(a, Refusal.ALREADY_VOTED,
                              f"{actor.id} already voted on these arguments of approval {a.id}")
            # an edit back to arguments this editor had approved: that vote stands
        if vote in FINAL_VERDICTS:
            # a redirect ends the request like a denial; its guidance is kept where a
            # denial's reason is, and the model reads it in place of the call's result
            status = FINAL_VERDICTS[vote]
            done = await tx.approvals.transition(
                a.id, to=status, digest=digest, before=now, decided_at=now,
                decided_by=actor.id, decided_via=actor.via, verdict=vote, reason=at.reason,
                **at.traced())
            if done is None:
                raise _refuse(a, Refusal.NOT_PENDING, not_pending_message(a))
            return await self._decided(tx, a, at, done, status, digest, [], discarded, now)
        voters = [actor.id] if a.quorum == 1 else await tx.approvals.approvers_on(a.id, digest)
        voters = counted(a, voters, digest)
        if len(voters) < a.quorum:
            await tx.approvals.set_count(a.id, len(voters))
            self.audit.record(tx, at=now, action="voted", actor=actor.id, via=actor.via,
                                run_id=a.run_id, approval_id=a.id, digest=digest,
                                details={"tool": a.tool, "args": at.edited or a.effective_args(),
                                         "approvals": len(voters), "quorum": a.quorum,
                                         "voters": voters, **actor.marks(),
                                         **card_posted(a)})
            fresh = await self._card(tx, a.id)
            return Decision(fresh, "voted", len(voters), a.quorum, False, discarded)
        done = await tx.approvals.transition(
            a.id, to="approved", digest=digest, before=now, decided_at=now,
            decided_by=actor.id, decided_via=actor.via, verdict=verdict, reason=at.reason,
            approve_count=len(voters), **at.traced())
        if done is None:
            raise _refuse(a, Refusal.NOT_PENDING, not_pending_message(a))
        return await self._decided(tx, a, at, done, "approved", digest, voters, discarded,
                                   now)

    async def _decided(self, tx: Tx, a: ApprovalRecord, at: _Attempt, done: ApprovalRecord,
                       status: str, digest: str, voters: list[str],
                       discarded: tuple[str, ...], now: datetime,
                       woken: _Woke | None = None) -> Decision:
        """A request decided (``done``, as the transition left it): its audit entry, its
        card's update, its run woken (``woken``: both done already, by the statement that
        decided it, and what its wake came to)."""
        actor = at.actor
        if status == "approved":
            self.audit.record(tx, at=now, action="approved", actor=actor.id, via=actor.via,
                              run_id=a.run_id, approval_id=a.id, digest=digest,
                              details={"tool": a.tool, "args": done.effective_args(),
                                       "approvers": voters, "quorum": a.quorum,
                                       "edited": done.edited_args is not None,
                                       **({"reason": at.reason} if at.reason else {}),
                                       **outcome_details(done),
                                       **actor.marks(), **card_posted(done)})
            ready, claim, run = woken or await self._run_ready(tx, done)
            return Decision(done, "approved", len(voters), a.quorum, ready, discarded, claim,
                            run=run)
        said = "guidance" if status == "redirected" else "reason"
        self.audit.record(tx, at=now, action=status, actor=actor.id, via=actor.via,
                          run_id=a.run_id, approval_id=a.id, digest=digest,
                          details={"tool": a.tool, "args": done.effective_args(),
                                   said: at.reason, **outcome_details(done),
                                   **actor.marks(), **card_posted(done)})
        ready, claim, run = woken or await self._run_ready(tx, done)
        return Decision(done, status, done.approve_count, done.quorum, ready, discarded,
                        claim, run=run)

    async def _answer_question(self, tx: Tx, a: ApprovalRecord, at: _Attempt,
                               now: datetime) -> Decision:
        actor, verdict, reason = at.actor, at.verdict, at.reason
        to = "denied" if verdict == "abort" else "approved"
        done = await tx.approvals.transition(
            a.id, to=to, before=now, decided_at=now, decided_by=actor.id,
            decided_via=actor.via, verdict=verdict, reason=reason, **at.traced())
        if done is None:
            raise _refuse(a, Refusal.NOT_PENDING, not_pending_message(a))
        await tx.approvals.add_vote(approval_id=a.id, actor=actor.id, verdict=verdict,
                                    digest=a.digest, via=actor.via, at=now)
        action = "cannot_run_resolved" if a.kind == "cannot_run" else "outcome_resolved"
        self.audit.record(tx, at=now, action=action, actor=actor.id,
                            via=actor.via, run_id=a.run_id, approval_id=a.id, digest=a.digest,
                            details={"tool": a.tool, "args": a.args_value(), "verdict": verdict,
                                     "reason": reason, **outcome_details(done),
                                     **actor.marks()})
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
            await self.gate.cancel_pending(tx, a.run_id, actor=actor.id, via=actor.via,
                                             reason=reason)
            self.audit.record(tx, at=now, action="cancelled", actor=actor.id, via=actor.via,
                                run_id=a.run_id, approval_id=a.id, digest=a.digest,
                                details={"reason": reason})
            return Decision(done, verdict, 0, 1, False)
        ready, claim, run = await self._wake(tx, a.run_id, kind=a.kind,
                                             from_status="needs_attention")
        return Decision(done, verdict, 1, 1, ready, claim=claim, run=run)

    async def _run_ready(self, tx: Tx, a: ApprovalRecord
                         ) -> tuple[bool, str | None, RunRecord | None]:
        """Card update, and wake the run when its last pending request is decided."""
        await self._update_card(tx, a)
        return await self._wake(tx, a.run_id, kind="tool_call")

    async def _wake(self, tx: Tx, run_id: str, *, kind: str,
                    from_status: str = "awaiting_approval"
                    ) -> tuple[bool, str | None, RunRecord | None]:
        """Set the run ``running`` if nothing of ``kind`` is pending any more: (woken, the
        lease id it was leased under, if this engine's worker takes decided runs, and the
        run's row as leased). The lease rides in the decision's own statement: the
        resumed run needs no claim, nor a read of its row (runtime.kernel.handoff)."""
        now = self.clock.now()
        owner = lease_id(self.owner) if self.signals.takes_decided else None
        woken = await tx.runs.wake_if_idle(
            run_id, kind=kind, now=now, from_status=from_status,
            lease=None if owner is None else (owner, now + self.lease_ttl))
        return _woke(woken, owner)

    async def _card(self, tx: Tx, approval_id: str) -> ApprovalRecord:
        """Queue a card update and return the row as it now stands."""
        fresh = await tx.approvals.get(approval_id)
        assert fresh is not None
        await self._update_card(tx, fresh)
        return fresh

    async def _update_card(self, tx: Tx, a: ApprovalRecord) -> None:
        """Redraw ``a``'s card; once it is closed, its mail thread is told too."""
        now = self.clock.now()
        if a.status != "pending" and a.kind == "tool_call":
            await queue_closed(tx, CardUpdate(a.id), a.id, now)
        else:
            await queue(tx, CardUpdate(a.id), group_key=a.id, now=now)

    # -- a refusal: the audit entry, and an overdue request settled on the way ----------
    async def _record_refusal(self, a0: ApprovalRecord, at: _Attempt,
                              refusal: DecisionRefused) -> None:
        settle = True

        async def record(tx: Tx) -> SweepResult:
            now = self.clock.now()
            a = await tx.approvals.lock_in_run(a0.id, a0.run_id)
            assert a is not None
            settled = SweepResult()
            if settle and a.status == "pending" and now >= a.expires_at:
                settled = await self.expiry.settle_overdue(tx, [a.id], now=now)
            self.audit.record(
                tx, at=now, action="refused", actor=at.actor.id, via=at.actor.via,
                run_id=a.run_id, approval_id=a.id, digest=a.effective_digest,
                details={"reason": refusal.reason, "verdict": at.verdict, "tool": a.tool,
                         "status": a.status, "message": str(refusal)[:500],
                         **at.actor.marks()})
            return settled

        try:
            # an expiry applied on the way (a refusal alone: a decision made none)
            side = await self.db.transact(record, what=f"refusal on approval {a0.id}")
        except Exception as exc:
            if is_store_failure(exc):
                raise
            # the request's own expiry cannot be worked out (a stored ladder that overflows,
            # say): the refusal is recorded all the same, and the sweep, which isolates
            # such a request, settles it
            log.error("approval %s: its expiry could not be applied with the refusal (%s); "
                      "the sweep settles it", a0.id, exc)
            settle = False
            side = await self.db.transact(record, what=f"refusal on approval {a0.id}")
            await self.expiry.sweep(only=[a0.id])  # (it tells what it settled)
        self.expiry.announce(side)
