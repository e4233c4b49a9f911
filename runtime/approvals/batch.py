"""Deciding several requests at once (the App Home's "Approve selected", ``approvals
approve ID…``) without weakening any one decision.

There is no batch transaction: each request is decided by its own call to
:meth:`runtime.approvals.decisions.Decisions.decide`, so each gets its own authorisation check,
its own compare-and-set on status, expiry and digest, and its own audit entry, exactly as a
click on its card would. One refused request (decided elsewhere a moment before, expired, not
this approver's, its arguments edited since the list was drawn) changes nothing else: the others
are decided all the same, and the outcome says which and why."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from approvald.runtime.approvals.decide import Actor, Decision
from approvald.runtime.approvals.decisions import Decisions
from approvald.runtime.kernel.errors import DecisionRefused, NotFound
from approvald.runtime.kernel.ids import new_id

MAX_BATCH = 100  # requests one batch may decide
BatchVerdict = Literal["approve", "deny"]


@dataclass(frozen=True)
class Target:
    """One request to decide; ``token``: the one its list entry was drawn with (bound to
    the arguments shown), or None where no list was drawn (the CLI names ids)."""

    approval_id: str
    token: str | None = None


@dataclass(frozen=True)
class Outcome:
    """What became of one request of a batch: its decision, or why it was refused."""

    approval_id: str
    decision: Decision | None = None
    refused: str | None = None  # the refusal's message
    code: str | None = None  # the refusal's reason code (DecisionRefused.reason)

    @property
    def ok(self) -> bool:
        return self.decision is not None


async def decide_each(decisions: Decisions, targets: Sequence[Target], *, actor: Actor,
                      verdict: BatchVerdict, reason: str | None = None) -> list[Outcome]:
    """Decide every target in order (a repeated id once), each on its own; never raises
    for one request's refusal. ValueError for a batch that is empty or too large, or a
    denial without a reason, before anything is decided."""
    if not targets:
        raise ValueError("no requests selected")
    if len(targets) > MAX_BATCH:
        raise ValueError(f"at most {MAX_BATCH} requests at once ({len(targets)} selected)")
    if verdict == "deny" and not (reason or "").strip():
        raise ValueError("a denial needs a reason (one reason for every selected request)")
    seen: set[str] = set()
    out: list[Outcome] = []
    # one id the batch's audit entries share: an auditor tells they were one act
    actor = replace(actor, batch=actor.batch or new_id())
    for t in targets:
        if t.approval_id in seen:
            continue
        seen.add(t.approval_id)
        try:
            decision = await decisions.decide(t.approval_id, actor=actor, verdict=verdict,
                                           reason=reason, token=t.token)
        except DecisionRefused as exc:
            out.append(Outcome(t.approval_id, refused=str(exc), code=exc.reason))
        except NotFound as exc:
            out.append(Outcome(t.approval_id, refused=str(exc), code="unknown_approval"))
        else:
            out.append(Outcome(t.approval_id, decision=decision))
    return out
