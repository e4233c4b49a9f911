"""The record of requests, read from the verified audit chain (issue 51).

What the policy replay and the insights read: every request recorded in a window, with
what the policy said then (asked, run at once, refused), who was asked, what became of it
(approved, edited, denied, expired, ...), who decided, when and why, and what each shadow
rule would have decided. Only the audit chain is read, after it verifies; a request whose
recorded arguments were masked has them opened from its sealed row (with the data key) so
that it is decided again on its real values, and is only ever shown masked, as recorded.

A request is one call as its source asked for it: a request for approval (its escalations
are the same request, asked of the next rung), a call the policy ran or refused at once
for a caller of another face (``requested`` with an ``answer``), or a call of an agent's
that the policy ran without asking (``executed`` with an ``answer``). An agent's call its
policy forbids is not on the audit record, so it is not here.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from approvald.runtime.kernel.errors import ApprovaldError
from approvald.runtime.policies.intake import EXTERNAL_AGENT, Source
from approvald.runtime.policies.masking import Masking
from approvald.runtime.record.audit import MASKED, AuditKey, verify
from approvald.runtime.record.audit_checkpoint import record_checkpoint
from approvald.store.db import Database
from approvald.store.records import AuditRecord

# the actions a request's record is made of (the rest of the chain is verified, not read)
ACTIONS = ("requested", "approved", "denied", "redirected", "edited", "expired",
           "escalated", "cancelled", "executed")
# what a person decided, in the words the replay and the insights use
PERSON = frozenset({"approved", "edited", "denied", "redirected"})
NOT_APPROVED = frozenset({"edited", "denied", "redirected"})  # a person changed or refused it
_PLAIN = Masking()  # (the detectors only)
# what is read of the entries up to the checkpoint: a request, what became of it (an
# entry of these with no approval changes no request), and a call run without asking
_READ = ("requested", "approved", "denied", "redirected", "edited", "expired", "cancelled")
_UNASKED = ("executed",)
SETTLED = frozenset({"approved", "edited", "denied", "redirected", "expired", "standing"})


class ChainBroken(ApprovaldError):
    """The audit chain does not verify: nothing is read from it."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("the audit log does not verify, so its record is not read: "
                         + "; ".join(problems))
        self.problems = list(problems)


@dataclass
class Request:
    """One request on the record (see the module docstring)."""

    key: str  # the first approval's id, or the run (and call) of a call run at once
    at: datetime
    tool: str  # as its source names it
    policy_name: str  # as the policy file knows it
    source: Source
    shown: dict[str, Any]  # its arguments as recorded: masked where sensitive
    args: dict[str, Any]  # its real arguments (opened where they were recorded masked)
    answer: str  # what the policy said then: approve_before, auto, notify_after, forbidden
    asked: bool
    approvers: list[str] = field(default_factory=list)
    quorum: int = 1
    rule: str | None = None
    outcome: str = "pending"  # approved, edited, denied, redirected, expired, cancelled,
    # standing (a standing approval let it run), ran, forbidden, pending
    edited: bool = False
    decided_by: str | None = None
    decided_at: datetime | None = None
    reason: str | None = None  # a denial's reason or a redirect's guidance, as recorded
    asked_of: list[str] = field(default_factory=list)  # every rung's approvers, in order
    shadow: list[dict[str, Any]] = field(default_factory=list)
    masked: bool = False  # some of its recorded values were masked
    opened: bool = True  # its real arguments were read (False: decided on the masked ones)
    # how it is kept folded (runtime.record.history_fold): its first entry's seq, how many
    # entries changed it, and the approvals of its later rungs
    seq: int = field(default=0, compare=False, repr=False)
    folded: int = field(default=0, compare=False, repr=False)
    rungs: list[str] = field(default_factory=list, compare=False, repr=False)

    @property
    def waited(self) -> float | None:
        """Seconds from the request to a person's decision (None: no person decided)."""
        if self.decided_at is None or self.outcome not in PERSON:
            return None
        return (self.decided_at - self.at).total_seconds()

    def masking(self) -> Masking:
        """What may be shown of it (the funnel, :mod:`runtime.policies.masking`): the values its
        record masked, masked wherever they occur in what is said about it."""
        keys = [k for k, v in self.args.items() if self.shown.get(k) != v]
        return Masking.of_call(keys, self.args) if keys else _PLAIN

    @property
    def person_said_no(self) -> bool:
        """A person denied, redirected or edited it: the call as asked was not theirs."""
        return self.outcome in NOT_APPROVED or self.edited


@dataclass
class History:
    """The requests of a window, in the order they were made, and the verified head."""

    requests: list[Request]
    since: datetime | None
    head: tuple[int, str]
    entries: int  # entries verified (the whole chain)
    # what the check of the kept fold caught (a summary edited, cut or rolled back): the
    # record was then folded from its entries instead (runtime.record.history_fold)
    problems: list[str] = field(default_factory=list)


async def read_history(db: Database, *, since: datetime | None, keys: Sequence[AuditKey] = (),
                       unkeyed_until: int = 0, full: bool = False) -> History:
    """The requests recorded since ``since``, read only once the chain verifies
    (:class:`ChainBroken` if it does not).

    With a key, the chain is verified from its verified-through checkpoint (see
    :mod:`runtime.record.audit_checkpoint`: the entries after it in full, the checkpointed entry
    and the count before it) and the entries up to it are read in batches, only those the
    record is made of; ``full`` (or no usable checkpoint) walks and verifies the whole
    chain (:func:`runtime.record.audit.verify`) and reads the record in the same walk. Either
    way the checkpoint then moves to the head verified.

    With a key and not ``full``, the requests are kept folded: the kept ones are checked
    and taken, and only the entries after them folded (:mod:`runtime.record.history_fold`);
    what a check caught is in :attr:`History.problems`, and the entries were folded
    instead."""
    if keys and not full:  # the requests kept folded, checked, and the entries after
        from approvald.runtime.record.history_fold import read_kept
        return await read_kept(db, since=since, keys=keys, unkeyed_until=unkeyed_until)
    builder = _Builder()
    wanted = frozenset(ACTIONS)

    def visit(e: AuditRecord) -> None:  # in the walk that verifies the chain
        if e.action in wanted and (since is None or e.at >= since):
            builder.add(e.seq, e.at, e.action, e.actor, e.run_id, e.approval_id, e.details)

    report = await verify(db, keys=keys, unkeyed_until=unkeyed_until, visit=visit)
    if not report.ok:
        raise ChainBroken(report.problems if report.problems else [str(report.cannot)])
    await record_checkpoint(db, report, keys, unkeyed_until)
    async with db.read(snapshot=True) as tx:
        for r in builder.sealed():
            await _open(tx, r)
    return History(builder.requests, since, report.head, report.entries)


async def _open(tx: Any, r: Request) -> None:
    """``r``'s real arguments, from the row that holds them sealed (its request, or a
    caller's request), where its record masked some."""
    if r.asked:
        a = await tx.approvals.get(r.key)
        if a is not None:
            r.args = a.args_value()
            return
    else:
        x = await tx.external.get(r.key.split(":", 1)[0])
        if x is not None:
            r.args = json.loads(x.args)
            return
    r.opened = False  # an agent's call run at once: its record is all there is


class _Builder:
    """Folds the entries of the window into requests, in one pass."""

    def __init__(self) -> None:
        self.requests: list[Request] = []
        self._by_approval: dict[str, Request] = {}
        # (subject, actor, tool) -> its source: one object for a source's requests
        self._sources: dict[tuple[str, str, str], Source] = {}
        # the requests an entry changed, by their first entry's seq (what to keep folded)
        self.changed: dict[int, Request] = {}

    def sealed(self) -> Iterable[Request]:
        return [r for r in self.requests if r.masked]

    def prime(self, requests: list[Request]) -> None:
        """Start from ``requests``, folded from the entries before (in seq order)."""
        self.requests = requests
        for r in requests:
            if r.asked:
                self._by_approval[r.key] = r
                for rung in r.rungs:
                    self._by_approval[rung] = r

    def add(self, seq: int, at: datetime, action: str, actor: str, run_id: str | None,
            approval_id: str | None, text: str) -> None:
        r = self._fold(seq, at, action, actor, run_id, approval_id, text)
        if r is not None:
            r.folded += 1
            self.changed[r.seq] = r

    def _fold(self, seq: int, at: datetime, action: str, actor: str, run_id: str | None,
              approval_id: str | None, text: str) -> Request | None:
        """Fold one entry in: the request it changed, if any."""
        if action == "requested":
            return self._requested(seq, at, actor, run_id, approval_id, json.loads(text))
        if action == "executed":
            if approval_id is None and actor == "system:runtime":
                return self._ran(seq, at, run_id, json.loads(text))
            return None
        r = self._by_approval.get(approval_id or "")
        if r is None:
            return None  # a question, or a request made before the window
        if action == "escalated":
            return None
        if action == "edited":
            r.edited = True
            return r
        if action == "approved" and via_standing(actor):
            r.outcome, r.decided_at = "standing", at
            return r
        if action in ("approved", "denied", "redirected"):
            details: dict[str, Any] = json.loads(text)  # (only what is read is decoded)
            r.outcome = "edited" if action == "approved" and (
                details.get("edited") or r.edited) else action
            r.decided_by, r.decided_at = actor, at
            said = details.get("guidance" if action == "redirected" else "reason")
            r.reason = said if isinstance(said, str) and said else None
            return r
        if action == "expired":
            r.outcome = "expired"
        elif action == "cancelled":
            r.outcome = "cancelled"
        else:
            return None
        return r

    def _requested(self, seq: int, at: datetime, actor: str, run_id: str | None,
                   approval_id: str | None, d: dict[str, Any]) -> Request | None:
        if d.get("kind", "tool_call") != "tool_call":
            return None  # a question about a call (its outcome, or a release that cannot
            # run it)
        approvers = [str(a) for a in d.get("approvers") or []]
        earlier = self._by_approval.get(str(d.get("supersedes") or ""))
        if earlier is not None and approval_id:  # the next rung of the same request
            self._by_approval[approval_id] = earlier
            earlier.rungs.append(approval_id)
            earlier.outcome = "pending"
            earlier.asked_of += approvers
            return earlier
        if d.get("supersedes"):
            return None  # the next rung of a request made before the window
        tool = str(d.get("tool", ""))
        known = (str(d.get("source") or ""), actor, tool)
        source = self._sources.get(known)
        if source is None:
            source = self._sources[known] = _source(d, actor, tool)
        shown = _args(d)
        answer = str(d.get("answer") or "approve_before")
        asked = approval_id is not None
        r = Request(
            key=approval_id or str(run_id or ""), at=at, tool=tool,
            policy_name=str(d.get("policy") or source.policy_name(tool)), source=source,
            shown=shown, args=shown, answer=answer if not asked else "approve_before",
            asked=asked, approvers=approvers, quorum=int(d.get("quorum") or 1),
            rule=d.get("rule"), asked_of=list(approvers),
            shadow=list(d.get("shadow") or []), masked=_masked(d), seq=seq)
        if not asked:
            r.outcome = "forbidden" if answer == "forbidden" else "ran"
        else:
            self._by_approval[approval_id or ""] = r
        self.requests.append(r)
        return r

    def _ran(self, seq: int, at: datetime, run_id: str | None,
             d: dict[str, Any]) -> Request | None:
        answer = d.get("answer")
        if answer not in ("auto", "notify_after"):
            return None  # (an approved call's execution: its request is on the record)
        tool = str(d.get("tool", ""))
        shown = _args(d)
        # an agent's call: its entry names the run, not the agent (found by the caller)
        key = str(d.get("idempotency_key") or run_id or "")
        r = Request(
            key=key, at=at, tool=tool, policy_name=tool, source=Source("agent", ""),
            shown=shown, args=shown, answer=str(answer), asked=False, outcome="ran",
            shadow=list(d.get("shadow") or []), masked=_masked(d), opened=not _masked(d),
            seq=seq)
        self.requests.append(r)
        return r


def _args(d: dict[str, Any]) -> dict[str, Any]:
    args = d.get("args")
    return args if isinstance(args, dict) else {}


def via_standing(actor: str) -> bool:
    return actor.startswith("standing:")


def _masked(d: dict[str, Any]) -> bool:
    m = d.get(MASKED)
    return isinstance(m, dict) and "args" in m


def _source(d: dict[str, Any], actor: str, tool: str) -> Source:
    """The source of a request: from its recorded subject (``api:deploy-bot/deploy``), else
    from its actor (``agent:NAME``)."""
    subject = str(d.get("source") or "")
    kind, _, rest = subject.partition(":")
    if kind and rest.endswith("/" + tool):
        name = rest[:-len(tool) - 1]
        if kind == "agent":
            return Source("agent", name)
        try:
            return Source.of_face(f"{kind}:{name}")
        except ApprovaldError:
            pass
    agent = actor.removeprefix("agent:")
    return Source.of_run(agent) if agent.startswith(EXTERNAL_AGENT) else Source("agent", agent)
