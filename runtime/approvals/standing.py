"""Standing approvals: "approve this, and calls like it, for a while", without weakening
the gate.

A standing approval is granted on a pending request (granting it approves that request
too) and then lets later calls of the same tool run without a card while all of this
holds, checked for each call:

* its window (15 minutes to 8 hours, never past the tool policy's ``max_standing``;
  ``max_standing = "0"`` turns the feature off for a tool) has not passed, and nobody has
  revoked it;
* it was granted by as many distinct approvers as the requests it covers need (a quorum-2
  tool's standing approval needs two grants before it covers anything);
* the call comes from the same source and is of the same tool (its *subject*: an agent's
  ``issue_refund`` and an HTTP API token's ``issue_refund`` are two subjects, see
  :mod:`runtime.policies.intake`), and the operator's policy resolved for it is the one the request
  was granted under (equal digests of the resolved policy: a grant made in the default
  band never covers a call a rule sends to finance, nor one under a policy changed since,
  and a ``forbidden`` call is refused before any of this is asked);
* the call is within its scope: the exact call, the same values for chosen arguments, or
  a CEL condition on the arguments (the policy rules' evaluator);
* every granter is still one of the approvers (a user taken off the list, or out of the
  user group, no longer lends a grant), and the requester is not a granter unless the
  policy allows self-approval.

Each use is a compare-and-set on the standing approval's row (in the same transaction as
the approved request it leaves behind, so a revocation that committed first stops the
very next match), and the request and its audit entry name the standing approval.

The row is a convenience; the audit chain is the record. Every grant, further grant and
revocation is an audit entry that carries everything the row says (subject, scope, policy
digest, window, grants), and a use checks the row against those entries first: a row that
someone with write access to the database reactivated, widened or re-dated covers nothing
(the refusal is audited), and ``audit verify`` proves from the chain alone that every call
a standing approval let run was covered (:func:`check_uses`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from approvald.runtime.approvals.decide import Actor, Decision
from approvald.runtime.approvals.decisions import Decisions
from approvald.runtime.kernel import prefix
from approvald.runtime.kernel.canonical import compact_json
from approvald.runtime.kernel.clock import Clock
from approvald.runtime.kernel.errors import ApprovaldError
from approvald.runtime.kernel.ids import new_id
from approvald.runtime.kernel.signals import Signals
from approvald.runtime.kernel.urgency import Urgency
from approvald.runtime.kernel.vocabulary import STANDING_VIA, outcome_details
from approvald.runtime.policies.directory import Directory, DirectoryError, is_approver
from approvald.runtime.policies.intake import Source, policy_digest, snapshot_digest
from approvald.runtime.policies.policy import ApprovalPolicy, CallPolicy
from approvald.runtime.policies.scope import Scope
from approvald.runtime.policies.sensitive import mask_args
from approvald.runtime.policies.tools import ToolIdentity
from approvald.runtime.record.audit import AuditTrail, mac_matches
from approvald.runtime.record.outbox_kinds import CardUpdate, queue
from approvald.runtime.record.standing_chain import StandingState
from approvald.runtime.requests.gate import Gate
from approvald.store.db import Database
from approvald.store.records import ApprovalRecord, AuditRecord, RunRecord
from approvald.store.repos import Tx
from approvald.store.repos.standing import StandingRecord

log = logging.getLogger("approvald.standing")

MIN_WINDOW = timedelta(minutes=15)
MAX_WINDOW = timedelta(hours=8)
VIA = STANDING_VIA  # decided_via of a request a standing approval approved


class StandingRefusal(StrEnum):
    """Why a grant, a further grant or a revocation of a standing approval was refused."""

    WRONG_KIND = "wrong_kind"  # granted on something other than a tool call's request
    SCOPE = "scope"  # a scope that does not cover the request it is granted on
    OFF = "off"  # the tool's max_standing is "0"
    WINDOW = "window"  # outside 15 minutes .. min(8 hours, max_standing)
    NOT_LIVE = "not_live"  # revoked, or expired
    ALREADY_GRANTED = "already_granted"  # the same approver again
    FULLY_GRANTED = "fully_granted"  # it already has the grants its quorum needs
    NOT_AUTHORIZED = "not_authorized"  # not (or no longer) an approver of its band
    CHANGED = "changed"  # granted, revoked or expired meanwhile: look again


class StandingRefused(ApprovaldError):
    """A grant, a second grant or a revocation that was refused (:class:`StandingRefusal`)."""

    def __init__(self, message: str, *, reason: StandingRefusal, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.reason = reason


class StandingApprovals:
    """Grant, revoke and use standing approvals (the engine's ``grant_standing``,
    ``add_standing_grant``, ``revoke_standing`` and ``standing_grants``)."""

    def __init__(self, db: Database, clock: Clock, audit: AuditTrail, directory: Directory,
                 gate: Gate, decisions: Decisions, urgency: Urgency, signals: Signals) -> None:
        self.db = db
        self.clock = clock
        self.audit = audit
        self.directory = directory
        self.gate = gate
        self.decisions = decisions  # a grant approves the request it is granted on
        self.urgency = urgency
        self.signals = signals

    # -- granting -------------------------------------------------------------------------
    async def grant(self, approval_id: str, *, actor: Actor, window: timedelta,
                    scope: Scope, token: str | None = None) -> tuple[StandingRecord, Decision]:
        """Approve pending request ``approval_id`` as ``actor`` and propose a standing
        approval drawn from it; with a quorum of one it is active at once."""
        a = await self.decisions.get(approval_id)
        if a.kind != "tool_call":
            raise StandingRefused("a standing approval is granted on a tool call's request",
                                  reason=StandingRefusal.WRONG_KIND, approval_id=a.id)
        policy = ApprovalPolicy.from_snapshot(a.policy)
        try:
            self._check_window(a, policy, window)
            if not scope.covers(a.tool, a.effective_args()):
                raise StandingRefused("the scope does not cover the request it is granted on",
                                      reason=StandingRefusal.SCOPE, approval_id=a.id)
        except StandingRefused as exc:
            await self._refused(actor, "standing_grant", exc, approval=a)
            raise
        # the request is approved first, with every check a click gets; only then is the
        # standing approval written (a crash between leaves an approval and no standing one)
        decision = await self.decisions.decide(a.id, actor=actor, verdict="approve", token=token)
        now = self.clock.now()
        record: StandingRecord | None = None

        async def write(tx: Tx) -> StandingRecord:
            sid = new_id()
            run = await tx.runs.get(a.run_id)
            assert run is not None
            subject = Source.of_run(run.agent).subject(a.tool)
            digest = snapshot_digest(a.policy)
            scope_value = scope.model_dump(mode="json")
            await tx.standing.insert(
                id=sid, tool=a.tool, scope=compact_json(scope_value),
                rule=policy.rule, approvers=compact_json(a.approvers_value()),
                quorum=a.quorum, allow_self_approval=policy.allow_self_approval,
                grants=compact_json([actor.id]),
                status="active" if a.quorum <= 1 else "proposed", granted_on=a.id, uses=0,
                created_at=now, expires_at=now + window, subject=subject,
                policy_digest=digest)
            # everything the row says, so the chain alone can judge each of its uses
            self.audit.record(
                tx, at=now, action="standing_granted", actor=actor.id, via=actor.via,
                run_id=a.run_id, approval_id=a.id,
                details={"standing_approval": sid, "tool": a.tool, "subject": subject,
                         "scope": scope.describe(), "scope_value": scope_value,
                         "window": str(window), "expires_at": (now + window).isoformat(),
                         "grants": 1, "granted_by": [actor.id], "quorum": a.quorum,
                         "rule": policy.rule, "approvers": a.approvers_value(),
                         "policy_digest": digest, **actor.marks()})
            await self._redraw(tx, a.id, now)
            got = await tx.standing.get(sid)
            assert got is not None
            return got

        record = await self.db.transact(write, what=f"standing approval on {a.id}")
        self.signals.notify_outbox()
        return record, decision

    def _check_window(self, a: ApprovalRecord, policy: ApprovalPolicy,
                      window: timedelta) -> None:
        cap = policy.max_standing
        if cap <= timedelta(0):
            raise StandingRefused(f"standing approvals are turned off for {a.tool} "
                                  "(max_standing = \"0\")", reason=StandingRefusal.OFF,
                                  approval_id=a.id)
        if window < MIN_WINDOW or window > min(MAX_WINDOW, cap):
            raise StandingRefused(
                f"a standing approval of {a.tool} lasts {_span(MIN_WINDOW)} to "
                f"{_span(min(MAX_WINDOW, cap))} (asked: {_span(window)})",
                reason=StandingRefusal.WINDOW, approval_id=a.id)

    async def add_grant(self, standing_id: str, *, actor: Actor) -> StandingRecord:
        """A further approver's grant; enough of them and it is active. A refusal is
        audited, as a refused decision is."""
        s = await self.get(standing_id)
        try:
            return await self._add_grant(s, actor)
        except StandingRefused as exc:
            await self._refused(actor, "standing_grant", exc, standing=s)
            raise

    async def _add_grant(self, s: StandingRecord, actor: Actor) -> StandingRecord:
        now = self.clock.now()
        if s.state(now) not in ("proposed", "active"):
            raise StandingRefused(f"standing approval {s.id} is {s.state(now)}",
                                  reason=StandingRefusal.NOT_LIVE)
        if actor.id in s.grants_value():
            raise StandingRefused(f"{actor.id} already granted standing approval {s.id}",
                                  reason=StandingRefusal.ALREADY_GRANTED)
        if len(s.grants_value()) >= s.quorum:
            need = f"{s.quorum} grant{'s' if s.quorum != 1 else ''}"
            raise StandingRefused(f"standing approval {s.id} already has the {need} it needs",
                                  reason=StandingRefusal.FULLY_GRANTED)
        if not await self._may_decide(s, actor.id):
            raise StandingRefused(f"{actor.id} is not an approver of {s.tool} "
                                  f"(approvers: {', '.join(s.approvers_value()) or 'anyone'})",
                                  reason=StandingRefusal.NOT_AUTHORIZED)

        async def write(tx: Tx) -> StandingRecord:
            grants = [*s.grants_value(), actor.id]
            status = "active" if len(grants) >= s.quorum else "proposed"
            done = await tx.standing.add_grant(s.id, seen=s.grants, grants=compact_json(grants),
                                               status=status, now=now)
            if done is None:
                raise StandingRefused(f"standing approval {s.id} changed meanwhile (granted, "
                                      "revoked or expired): look at it again",
                                      reason=StandingRefusal.CHANGED)
            self.audit.record(
                tx, at=now, action="standing_granted", actor=actor.id, via=actor.via,
                run_id=await _run_of(tx, s), approval_id=s.granted_on,
                details={"standing_approval": s.id, "tool": s.tool, "grants": len(grants),
                         "granted_by": grants, "quorum": s.quorum, "status": status,
                         **actor.marks()})
            await self._redraw(tx, s.granted_on, now)
            return done

        done = await self.db.transact(write, what=f"grant of standing approval {s.id}")
        self.signals.notify_outbox()
        return done

    async def revoke(self, standing_id: str, *, actor: Actor,
                     reason: str | None = None) -> StandingRecord:
        """Revoke at once: the next match after this commits gets a card. A granter or any
        approver of the tool may revoke; a refusal is audited."""
        s = await self.get(standing_id)
        try:
            return await self._revoke(s, actor, reason)
        except StandingRefused as exc:
            await self._refused(actor, "standing_revoke", exc, standing=s)
            raise

    async def _revoke(self, s: StandingRecord, actor: Actor,
                      reason: str | None) -> StandingRecord:
        if not await self.may_revoke(s, actor.id):
            raise StandingRefused(f"{actor.id} neither granted standing approval {s.id} nor "
                                  f"approves {s.tool}", reason=StandingRefusal.NOT_AUTHORIZED)
        now = self.clock.now()

        async def write(tx: Tx) -> StandingRecord:
            done = await tx.standing.revoke(s.id, by=actor.id, now=now)
            if done is None:
                raise StandingRefused(f"standing approval {s.id} is already {s.status}",
                                      reason=StandingRefusal.NOT_LIVE)
            self.audit.record(tx, at=now, action="standing_revoked", actor=actor.id,
                                via=actor.via, run_id=await _run_of(tx, s),
                                approval_id=s.granted_on,
                                details={"standing_approval": s.id, "tool": s.tool,
                                         "uses": done.uses, "reason": reason,
                                         **actor.marks()})
            await self._redraw(tx, s.granted_on, now)
            return done

        with self.urgency.waits(self.urgency.now()):  # the revoker's request is held open
            done = await self.db.transact(write,
                                          what=f"revocation of standing approval {s.id}")
        self.signals.notify_outbox()
        return done

    async def _refused(self, actor: Actor, verdict: str, exc: StandingRefused, *,
                       standing: StandingRecord | None = None,
                       approval: ApprovalRecord | None = None) -> None:
        """An audit entry for a refused grant or revocation (who, what, why)."""
        now = self.clock.now()

        async def write(tx: Tx) -> None:
            self.audit.record(
                tx, at=now, action="refused", actor=actor.id, via=actor.via,
                run_id=approval.run_id if approval else None,
                approval_id=approval.id if approval else (standing.granted_on if standing
                                                           else None),
                details={"verdict": verdict, "reason": exc.reason,
                         "standing_approval": standing.id if standing else None,
                         "tool": standing.tool if standing else approval.tool if approval
                         else None, "message": str(exc)[:500], **actor.marks()})

        await self.db.transact(write, what=f"refused {verdict}")

    async def may_revoke(self, s: StandingRecord, user: str) -> bool:
        """May ``user`` revoke ``s``: one of its granters, or (still) one of its approvers."""
        return user in s.grants_value() or await self._may_decide(s, user)

    async def may_grant(self, s: StandingRecord, user: str) -> bool:
        """Would a further grant of ``s`` by ``user`` count (proposed, not yet granted by
        them, one of its approvers)? :meth:`add_grant` checks again."""
        return (s.status == "proposed" and user not in s.grants_value()
                and await self._may_decide(s, user))

    async def _redraw(self, tx: Tx, approval_id: str, now: datetime) -> None:
        """Queue an update of the card of the request a standing approval was granted on,
        which tells its grants and state (written with the change, so the card cannot miss
        it)."""
        await queue(tx, CardUpdate(approval_id), group_key=approval_id, now=now)

    async def get(self, standing_id: str) -> StandingRecord:
        """A standing approval by id or unambiguous id prefix
        (:func:`runtime.kernel.prefix.resolve`)."""
        async with self.db.read() as tx:
            return await prefix.resolve("standing approval", standing_id, tx.standing.get,
                                        tx.standing.find)

    async def listing(self, *, live_only: bool = True) -> list[StandingRecord]:
        async with self.db.read() as tx:
            return await tx.standing.listing(live_only=live_only, now=self.clock.now())

    # -- using ----------------------------------------------------------------------------
    async def candidate(self, source: Source, requested_by: str, tool: str,
                        args: Mapping[str, Any], chosen: CallPolicy) -> StandingRecord | None:
        """The oldest standing approval that covers this call of ``source``'s ``tool`` now,
        if any (read only; the use itself is the compare-and-set of :meth:`use`). Who must
        have granted it, and whether the requester may be among them, is the resolved
        policy's say, not the row's."""
        now = self.clock.now()
        subject = source.subject(tool)
        async with self.db.read() as tx:
            found = await tx.standing.active_for(subject, now)
        if not found:
            return None
        digest = policy_digest(chosen.approval)
        approvers, _, quorum = chosen.approval.rung(0)
        for s in found:
            if s.policy_digest != digest or s.quorum != quorum \
                    or sorted(s.approvers_value()) != sorted(approvers):
                # granted under another policy, or on a request of another rung (an
                # escalation's approvers never stand in for the first rung's)
                continue
            grants = s.grants_value()
            if len(set(grants)) < quorum:
                continue
            if requested_by in grants and not chosen.approval.allow_self_approval:
                continue
            if not Scope.model_validate_json(s.scope).covers(tool, args):
                continue
            if all([await self._may_decide(s, g) for g in grants]):
                return s
        return None

    async def use(self, tx: Tx, s: StandingRecord, *, run: RunRecord, call_id: str,
                  tool: str, args: dict[str, Any], policy: ApprovalPolicy,
                  packet: dict[str, Any],
                  identity: ToolIdentity | None = None) -> ApprovalRecord | None:
        """Inside the caller's transaction: count a use of ``s`` (compare-and-set) and leave
        an approved request for the call that names it; None if ``s`` is no longer as it
        was when it was found to cover the call (revoked, expired, or granted again: a
        grant added since, the requester's own say, was not part of that check), or if
        its row disagrees with the grants and revocations the audit chain records."""
        now = self.clock.now()
        chain = await self._chain_of(tx, s)
        tampered = await self.tampered(tx, s, chain)
        if tampered is not None:
            log.error("standing approval %s covers nothing: %s", s.id, tampered)
            self.audit.record(
                tx, at=now, action="refused", actor="system:standing", via=VIA,
                run_id=run.id, approval_id=s.granted_on,
                details={"verdict": "standing_use", "reason": "standing_tampered",
                         "standing_approval": s.id, "tool": tool, "call_id": call_id,
                         "message": tampered[:500]})
            return None
        used = await tx.standing.use(s.id, seen=s.grants, now=now)
        if used is None:
            return None
        grants = used.grants_value()
        approval_id = await self.gate.insert_approval(
            tx, run=run, call_id=call_id, kind="tool_call", tool=tool, args=args,
            policy=policy, rung=0, packet=packet, card=False, identity=identity)
        said = f"covered by standing approval {s.id} (granted by {', '.join(grants)})"
        done = await tx.approvals.transition(
            approval_id, to="approved", decided_at=now, decided_by=f"{VIA}:{s.id}",
            decided_via=VIA, verdict="approve", reason=said, approve_count=len(grants))
        assert done is not None
        self.audit.record(tx, at=now, action="approved", actor=f"{VIA}:{s.id}", via=VIA,
                            run_id=run.id, approval_id=approval_id, digest=done.digest,
                            details={"tool": tool, "args": args, "standing_approval": s.id,
                                     "granted_by": grants, "use": used.uses,
                                     "subject": Source.of_run(run.agent).subject(tool),
                                     "policy_digest": policy_digest(policy),
                                     "approvers": policy.rung(0)[0],
                                     "quorum": policy.rung(0)[2],
                                     "scope": _shown_scope(s, policy),
                                     **granter_names(chain, s.id, grants),
                                     **outcome_details(done)})
        return done

    async def _chain_of(self, tx: Tx, s: StandingRecord) -> list[AuditRecord]:
        """The audit entries of ``s``'s grants and revocation (with those of other standing
        approvals granted on the same request)."""
        run_id = await _run_of(tx, s)
        return [e for e in await tx.audit.query(run_id=run_id, approval_id=s.granted_on)
                if e.action in ("standing_granted", "standing_revoked")]

    async def tampered(self, tx: Tx, s: StandingRecord,
                       entries: list[AuditRecord] | None = None) -> str | None:
        """How ``s``'s row disagrees with what the audit chain records of it (its grant
        entries and any revocation, ``entries`` when they were read already), or None
        when it agrees."""
        if entries is None:
            entries = await self._chain_of(tx, s)
        key = self.audit.key
        for e in entries:
            if key is not None and e.key_id == key.id and not mac_matches(key, e):
                return f"audit entry {e.seq} about it does not match its MAC"
        state = StandingState()
        for e in entries:
            state.apply(e.action, json.loads(e.details), e.at, only=s.id)
        return state.disagrees(s)

    async def _may_decide(self, s: StandingRecord, user: str) -> bool:
        """Is ``user`` (still) one of ``s``'s approvers? A directory that cannot answer
        says no: a standing approval then covers nothing until it can."""
        try:
            return await is_approver(self.directory, s.approvers_value(), user)
        except DirectoryError:
            return False


def granter_names(entries: list[AuditRecord], sid: str, grants: list[str]) -> dict[str, Any]:
    """What a use's entry records of who its granters were (``granted_by_names``: each
    granter's name as their grant's entry recorded it, at the time of the grant), so an
    export tells who a user id was without a directory; {} when no grant recorded one."""
    names: dict[str, str] = {}
    for e in entries:
        details = json.loads(e.details)
        if e.action != "standing_granted" or e.actor not in grants or \
                details.get("standing_approval") != sid:
            continue
        name = details.get("actor_name")
        if isinstance(name, str) and name:
            names[e.actor] = name
    return {"granted_by_names": names} if names else {}


async def _run_of(tx: Tx, s: StandingRecord) -> str | None:
    """The run of the request ``s`` was granted on (its audit entries are that run's)."""
    a = await tx.approvals.get(s.granted_on)
    return a.run_id if a is not None else None


def _span(d: timedelta) -> str:
    minutes = int(d.total_seconds() // 60)
    return f"{minutes // 60}h{minutes % 60:02d}m" if minutes >= 60 else f"{minutes}m"


def scope_json(s: StandingRecord) -> dict[str, Any]:
    value: dict[str, Any] = json.loads(s.scope)
    return value


def _shown_scope(s: StandingRecord, policy: ApprovalPolicy) -> str:
    """``s``'s scope in words with the call's sensitive values masked (the audit entry of
    a use says it; its values are not under a path the audit masks by)."""
    scope = Scope.model_validate_json(s.scope)
    return scope.model_copy(update={"values": mask_args(scope.values,
                                                        policy.sensitive)}).describe()
