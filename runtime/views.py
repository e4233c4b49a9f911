"""Read models for the faces: each one read from the database in one read, frozen.

A face draws what a person sees (a card, an approver's list, an App Home, a run's thread)
from one of these views, with pure functions of the view: it never reads the tables
itself. A view says what the database holds and what the engine works out from it (a
card's button token, who may decide what); how it looks is the face's.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from approvald.runtime.approvals.decide import Actor, Decider
from approvald.runtime.approvals.standing import StandingApprovals
from approvald.runtime.kernel.clock import Clock
from approvald.runtime.kernel.errors import DecisionRefused
from approvald.runtime.kernel.ids import TokenSigner, is_external
from approvald.runtime.policies.sensitive import sensitive_of_snapshot
from approvald.runtime.runs.agent import Registry
from approvald.runtime.threads import MAX_REPOSTS, Place, place
from approvald.store.db import Database
from approvald.store.records import (
    ApprovalRecord,
    AuditRecord,
    EventRecord,
    ExecutionRecord,
    RunRecord,
    VoteRecord,
)
from approvald.store.repos import Tx
from approvald.store.repos.external import ExternalRecord
from approvald.store.repos.standing import StandingRecord
from approvald.store.repos.threads import ThreadRecord

CANDIDATES = 500  # pending requests looked at for one viewer's lists
# what a card is drawn from, as read: the request, its votes, its thread, newer, older, grants
_CardParts = tuple[ApprovalRecord, tuple[VoteRecord, ...], tuple[str, str] | None,
                   ApprovalRecord | None, ApprovalRecord | None, tuple[StandingRecord, ...]]


@dataclass(frozen=True)
class CardView:
    """What a request's card shows, as the database holds it now."""

    approval: ApprovalRecord
    token: str | None  # its buttons' token (pending, with a signer), else None
    now: datetime
    votes: tuple[VoteRecord, ...]  # only a quorum card shows individual votes
    thread: tuple[str, str] | None  # the run thread's (channel, ts), once it has a parent
    newer: ApprovalRecord | None  # the request that superseded it (an escalation)
    older: ApprovalRecord | None  # the request it supersedes
    standing: tuple[StandingRecord, ...]  # standing approvals granted on it


@dataclass(frozen=True)
class StandingItem:
    """A live standing approval a viewer may revoke, and whether a grant of theirs counts."""

    standing: StandingRecord
    may_grant: bool
    sensitive: tuple[str, ...]  # the paths of the request it was granted on (masked)


@dataclass(frozen=True)
class HomeView:
    """An approver's App Home: what they may decide, what they decided, standing grants."""

    pending: tuple[tuple[ApprovalRecord, str], ...]  # oldest first, with button tokens
    recent: tuple[ApprovalRecord, ...]
    standing: tuple[StandingItem, ...]  # those needing their grant first, then newest
    now: datetime


@dataclass(frozen=True)
class TurnView:
    """What a run's thread tells in one turn: the run, and what happened since."""

    run: RunRecord | None
    approvals: tuple[ApprovalRecord, ...]
    events: tuple[EventRecord, ...]  # from the seq the thread has told up to
    entries: tuple[AuditRecord, ...]  # after the audit entry it has told up to
    executions: dict[str, ExecutionRecord]
    external: ExternalRecord | None


@dataclass(frozen=True)
class NoticeView:
    """A notify-after call's notice: where it goes and what it shows."""

    place: Place
    execution: ExecutionRecord | None
    args: Any
    sensitive: tuple[str, ...]


@dataclass(frozen=True)
class DeadView:
    """What a dead delivery's report names: its request, or its call, and its thread."""

    approval: ApprovalRecord | None
    thread: ThreadRecord | None
    execution: ExecutionRecord | None


class Views:
    """The read models the faces draw from (see the module)."""

    def __init__(self, db: Database, clock: Clock, registry: Registry, decider: Decider,
                 standing: StandingApprovals, signer: TokenSigner | None) -> None:
        self._db = db
        self._clock = clock
        self._registry = registry
        self._decider = decider
        self._standing = standing
        self._signer = signer

    def _token(self, a: ApprovalRecord) -> str | None:
        if self._signer is None:
            return None
        return self._signer.token(a.id, a.token_nonce, a.effective_digest)

    # -- requests ------------------------------------------------------------------------
    async def approval(self, approval_id: str) -> ApprovalRecord | None:
        """Request ``approval_id`` (an exact id) as it stands, or None."""
        async with self._db.read() as tx:
            return await tx.approvals.get(approval_id)

    async def approvals(self, approval_ids: Sequence[str]
                        ) -> dict[str, ApprovalRecord | None]:
        """Each of ``approval_ids`` (exact ids) as it stands (None: no such request)."""
        async with self._db.read() as tx:
            return {i: await tx.approvals.get(i) for i in approval_ids}

    async def card(self, approval_id: str) -> CardView | None:
        """Request ``approval_id``'s card as the database holds it now (None: no such
        request)."""
        async with self._db.read() as tx:
            found = await self._card(tx, approval_id)
        return None if found is None else self._card_view(found, self._clock.now())

    async def cards(self, approval_ids: Sequence[str]) -> dict[str, CardView | None]:
        """:meth:`card` of each of ``approval_ids``, in one read: the cards an outbox
        batch redraws (issue 50: a read each was most of a card's store work)."""
        async with self._db.read() as tx:
            found = {i: await self._card(tx, i) for i in approval_ids}
        now = self._clock.now()
        return {i: None if f is None else self._card_view(f, now) for i, f in found.items()}

    async def _card(self, tx: Tx, approval_id: str) -> _CardParts | None:
        # read each time: a thread still being started has no ts, a re-posted one
        # moves; with the request, in one statement (issue 50)
        row = await tx.approvals.card(approval_id)
        if row is None:
            return None
        a = row.approval
        votes = await tx.approvals.votes(a.id) if a.quorum > 1 else []
        newer = None
        if a.status == "superseded":
            newer = next((x for x in await tx.approvals.for_run(a.run_id)
                          if x.supersedes == a.id), None)
        older = await tx.approvals.get(a.supersedes) if a.supersedes else None
        # a standing approval granted on this request is told on its card
        standing = (await tx.standing.granted_on(a.id, tool=a.tool)
                    if row.has_standing and a.kind == "tool_call"
                    and a.decided_via != "standing" else [])
        return a, tuple(votes), row.thread, newer, older, tuple(standing)

    def _card_view(self, parts: _CardParts, now: datetime) -> CardView:
        a, votes, thread, newer, older, standing = parts
        return CardView(a, self._token(a) if a.status == "pending" else None, now, votes,
                        thread, newer, older, standing)

    # -- an approver's lists -------------------------------------------------------------
    async def _mine(self, pending: Sequence[ApprovalRecord],
                    actor: Actor) -> tuple[tuple[ApprovalRecord, str], ...]:
        out = []
        for a in pending:
            try:
                await self._decider.authorize(a, actor)
            except DecisionRefused:
                continue
            token = self._token(a)
            if token is not None:
                out.append((a, token))
        out.sort(key=lambda pair: (pair[0].requested_at, pair[0].id))
        return tuple(out)

    async def actionable(self, actor: Actor) -> tuple[tuple[ApprovalRecord, str], ...]:
        """Pending requests ``actor`` may decide, oldest first, with the tokens for their
        buttons and checkboxes (among the first :data:`CANDIDATES` to expire)."""
        async with self._db.read() as tx:
            pending = await tx.approvals.pending_for_actor_candidates(limit=CANDIDATES)
        return await self._mine(pending, actor)

    async def home(self, actor: Actor, *, recent: int) -> HomeView:
        """``actor``'s App Home: :meth:`actionable`, the last ``recent`` requests they
        decided, and the live standing approvals they may revoke (granted them, or approve
        them), those still needing their grant first, then newest first."""
        user = actor.id
        async with self._db.read() as tx:
            pending = await tx.approvals.pending_for_actor_candidates(limit=CANDIDATES)
            decided = [a for a in await tx.approvals.recent(limit=200)
                       if a.decided_by == user][:recent]
            live = await tx.standing.listing(live_only=True, now=self._clock.now())
            # the policy each was granted under declares the paths its scope masks
            policies = await tx.approvals.policies([s.granted_on for s in live])
        items = []
        for s in live:
            if await self._standing.may_revoke(s, user):
                policy = policies.get(s.granted_on)
                items.append(StandingItem(s, await self._standing.may_grant(s, user),
                                          sensitive_of_snapshot(policy)
                                          if policy is not None else ()))
        items.sort(key=lambda item: not item.may_grant)  # stable: newest first within
        return HomeView(await self._mine(pending, actor), tuple(decided), tuple(items),
                        self._clock.now())

    # -- run threads ---------------------------------------------------------------------
    async def turn(self, run_id: str, *, since_seq: int, after_audit: int,
                   limit: int) -> TurnView:
        """What run ``run_id``'s thread has not told: its events from ``since_seq``, at most
        ``limit`` audit entries after ``after_audit`` (one consistent snapshot)."""
        async with self._db.read(snapshot=True) as tx:
            run = await tx.runs.get(run_id)
            approvals = await tx.approvals.for_run(run_id)
            events = await tx.events.load(run_id, since=since_seq)
            entries = await tx.audit.of_run(run_id, after=after_audit, limit=limit)
            executions = await tx.executions.for_run(run_id)
            external = await tx.external.get(run_id) if is_external(run_id) else None
        return TurnView(run, tuple(approvals), tuple(events), tuple(entries), executions,
                        external)

    async def line_place(self, run_id: str, seq: Any) -> Place:
        """Where a line about run ``run_id`` written at ``seq`` goes (see
        :func:`runtime.threads.place`)."""
        async with self._db.read() as tx:
            return await place(tx, run_id, await tx.threads.get(run_id), seq)

    async def notice(self, run_id: str, call_id: str, seq: Any, *,
                     args: Any = None, has_args: bool = True) -> NoticeView | None:
        """A notice of call ``call_id`` of run ``run_id`` (None: an agent's run whose thread
        tells the call, from its audit entry, with its result one click away; a notice
        there would say it a second time). ``has_args`` False: a notice queued before the
        arguments rode in its payload, read from the transcript."""
        async with self._db.read() as tx:
            thread = await tx.threads.get(run_id)
            if not is_external(run_id) and (thread is None or thread.reposts <= MAX_REPOSTS):
                return None
            rec = await tx.executions.get(run_id, call_id)
            where = await place(tx, run_id, thread, seq, call_id=call_id)
            if where.wait:
                return NoticeView(where, rec, args, ())
            events = await tx.events.load(run_id) if not has_args else []
            run = await tx.runs.get(run_id)
        for ev in events:
            body = json.loads(ev.body)
            for call in body.get("tool_calls") or []:
                if call.get("id") == call_id:
                    args = call.get("arguments")
        hide: tuple[str, ...] = ()
        if rec is not None:
            # the paths resolved when the call was made (a row from before they were
            # recorded: those of the agent's tool now)
            hide = tuple(rec.sensitive_paths()) or (
                self._registry.sensitive_paths(run, rec.tool) if run is not None else ())
        return NoticeView(where, rec, args, hide)

    async def dead(self, *, approval_id: str | None, run_id: str | None,
                   call_id: str | None) -> DeadView:
        """What a dead delivery's report names (a notice names its tool through the
        execution it reports)."""
        async with self._db.read() as tx:
            a = await tx.approvals.get(approval_id) if approval_id else None
            run_id = a.run_id if a is not None else run_id
            thread = await tx.threads.get(run_id) if run_id else None
            rec = (await tx.executions.get(run_id, call_id)
                   if a is None and run_id and call_id else None)
        return DeadView(a, thread, rec)
