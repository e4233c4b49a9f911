"""Approvals and votes. Every transition is a compare-and-set on ``status``."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from approvald.store.fastsql import fast
from approvald.store.models import Approval, ApprovalVote, Run, RunThread, StandingApproval
from approvald.store.records import ApprovalRecord, RunRecord, VoteRecord
from approvald.store.repos.base import Repo, pinned, to_record
from approvald.store.repos.outbox import OutboxRepo, add_if_group_insert, add_if_group_params
from approvald.store.repos.runs import RunsRepo, Woken, wake_update
from sqlalchemy import (
    Insert,
    Select,
    Table,
    Text,
    Update,
    bindparam,
    exists,
    func,
    literal,
    or_,
    select,
    true,
    type_coerce,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite

_T = cast(Table, Approval.__table__)
_V = cast(Table, ApprovalVote.__table__)
_R = cast(Table, Run.__table__)
# statements built once: SQLAlchemy then skips construction and cache-key work per call
_GET = fast(select(_T).where(_T.c.id == bindparam("aid")))
_TH = cast(Table, RunThread.__table__)
_ST = cast(Table, StandingApproval.__table__)
# a card's redraw: the request, where its run's thread is, and whether a standing approval
# was proposed on it, in one statement (issue 50)
_CARD_EXTRA = ("thread_channel", "thread_ts", "has_standing")
_CARD = fast(select(_T, _TH.c.channel.label("thread_channel"), _TH.c.ts.label("thread_ts"),
                    exists().where(_ST.c.tool == _T.c.tool, _ST.c.granted_on == _T.c.id)
                    .label("has_standing"))
             .select_from(_T.outerjoin(_TH, _TH.c.run_id == _T.c.run_id))
             .where(_T.c.id == bindparam("aid")))


@dataclass(frozen=True, slots=True)
class CardRow:
    """What a card is drawn from, read in one statement: the request, its run's thread
    (``thread``: channel and ts, once the thread's parent is posted) and whether any
    standing approval was proposed on it (then read on its own)."""

    approval: ApprovalRecord
    thread: tuple[str, str] | None
    has_standing: bool
# FOR NO KEY UPDATE on PostgreSQL (votes' foreign-key checks still pass), nothing on SQLite,
# whose write transaction already holds the database lock
_LOCK = fast(_GET.with_for_update(key_share=True))
# PostgreSQL: the run's row locked (an InitPlan, evaluated before the approval's row is
# locked: the one lock order, run then approval), then the approval's, read as it stands
# once both are held (a row changed meanwhile is read again by the lock, at READ
# COMMITTED), in one statement (issue 50)
_LOCK_IN_RUN = fast(select(_T).where(
    _T.c.id == bindparam("aid"),
    _T.c.run_id == select(_R.c.id).where(_R.c.id == bindparam("rid"))
    .with_for_update(key_share=True).scalar_subquery(),
).with_for_update(key_share=True, of=_T))
# the same with the run found from the request (its run never changes): a decision that
# has not read the request before it locks it (issue 50)
_OWN_RUN = _T.alias("own")
_LOCK_BY_ID = fast(select(_T).where(
    _T.c.id == bindparam("aid"),
    _T.c.run_id == select(_R.c.id).where(
        _R.c.id == select(_OWN_RUN.c.run_id).where(_OWN_RUN.c.id == bindparam("aid"))
        .scalar_subquery())
    .with_for_update(key_share=True).scalar_subquery(),
).with_for_update(key_share=True, of=_T))
_VOTERS = fast(select(_V.c.actor).where(_V.c.approval_id == bindparam("aid"),
                                        _V.c.verdict == "approve",
                                        _V.c.digest == bindparam("d"))
               .order_by(_V.c.at, _V.c.actor))
_FOR_RUN = fast(select(_T).where(_T.c.run_id == bindparam("rid"))
                .order_by(_T.c.requested_at))
_VOTES = fast(select(_V).where(_V.c.approval_id == bindparam("aid")).order_by(_V.c.at))
# the votes on a batch of requests (an IN list of the caller's: its SQL changes with its
# length, so SQLAlchemy runs it, but the statement is built once)
_VOTES_OF = (select(_V).where(_V.c.approval_id.in_(bindparam("aids", expanding=True)))
             .order_by(_V.c.approval_id, _V.c.at))
# the requests as `audit verify` compares them with the chain, a batch in id order, or one
_DECIDED = select(_T.c.id, _T.c.run_id, _T.c.kind, _T.c.tool, _T.c.digest, _T.c.edited_digest,
                  _T.c.edited_by, _T.c.status, _T.c.decided_by, _T.c.decided_via,
                  type_coerce(_T.c.args, Text).label("args"),
                  type_coerce(_T.c.edited_args, Text).label("edited_args"))
_DECIDED_AFTER = fast(_DECIDED.where(_T.c.id > bindparam("after")).order_by(_T.c.id)
                      .limit(bindparam("batch")))
_DECIDED_ONE = fast(_DECIDED.where(_T.c.id == bindparam("only")))
# the request's row unless another transaction holds it (then nothing, at once)
_UNLOCKED = (select(_T.c.id).where(_T.c.id == bindparam("aid"))
             .with_for_update(skip_locked=True, key_share=True))
# overdue requests as a claim: each with its run's row, both locked FOR NO KEY UPDATE, and
# rows another transaction holds passed over (PostgreSQL; nothing on SQLite: one writer)
_CLAIM_OVERDUE = (
    select(_T.c.id).join(_R, _R.c.id == _T.c.run_id)
    .where(_T.c.status == "pending", _T.c.expires_at <= bindparam("now"))
    .order_by(_T.c.expires_at, _T.c.id).limit(bindparam("lim"))
    .with_for_update(skip_locked=True, key_share=True, of=[_R, _T]))
_INSERT = fast(_T.insert())
# where a request's card was posted (once per request, by the face that posted it)
_SET_MESSAGE = fast(update(_T).where(_T.c.id == bindparam("aid"))
                    .values(channel=bindparam("ch"), message_ts=bindparam("ts")))
_VOTE: dict[str, Insert] = {
    "sqlite": fast(cast(Any, sqlite.insert(_V)).on_conflict_do_nothing()),
    "postgresql": cast(Any, postgresql.insert(_V)).on_conflict_do_nothing(),
}


@functools.lru_cache(maxsize=64)
def _transition(to: str, from_: tuple[str, ...], keys: tuple[str, ...], on_digest: bool,
                in_time: bool) -> Update:
    stmt = update(_T).where(_T.c.id == bindparam("aid"), _T.c.status.in_(from_))
    if on_digest:  # the arguments are still the ones the decision was made on
        stmt = stmt.where(func.coalesce(_T.c.edited_digest, _T.c.digest) == bindparam("d"))
    if in_time:  # a decision after expires_at is no decision
        stmt = stmt.where(_T.c.expires_at > bindparam("now"))
    return fast(stmt.values(pinned(_T, {"status": to,
                                         **{k: bindparam(f"v_{k}") for k in keys}}))
                .returning(_T))


@functools.lru_cache(maxsize=64)
def _vote_then(to: str, keys: tuple[str, ...]) -> Any:
    """PostgreSQL, one statement: the vote inserted (unless this actor voted on these
    arguments already), then, only if it was, the request's compare-and-set (pending,
    these arguments, not expired); answers ``voted`` and the request as it now stands
    (its columns NULL if it was not changed)."""
    vote, upd = _vote_upd(to, keys)
    one = select(literal(1).label("one")).subquery("one")
    return fast(select(select(func.count()).select_from(vote).scalar_subquery()
                       .label(_VOTED), *upd.c)
                .select_from(one.outerjoin(upd, true())))


def _vote_upd(to: str, keys: tuple[str, ...]) -> tuple[Any, Any]:
    """The vote's INSERT and, only if it inserted, the request's compare-and-set: CTEs."""
    vote = (cast(Any, postgresql.insert(_V))
            .values(approval_id=bindparam("aid", type_=_V.c.approval_id.type),
                    actor=bindparam("actor", type_=_V.c.actor.type),
                    digest=bindparam("d", type_=_V.c.digest.type),
                    verdict=bindparam("vote", type_=_V.c.verdict.type),
                    via=bindparam("via", type_=_V.c.via.type),
                    at=bindparam("now", type_=_V.c.at.type))
            .on_conflict_do_nothing().returning(_V.c.actor).cte("vote"))
    upd = (_transition(to, ("pending",), keys, True, True)
           .where(select(vote.c.actor).exists()).cte("upd"))
    return vote, upd


_VOTED = "vote_inserted"
_RUN = "r_"  # the woken run's columns, in the statement that closes its request


@dataclass(frozen=True, slots=True)
class Closing:
    """What a request's close writes with it: its card's update (``card``: kind, group,
    payload) and, when group ``follow[1]`` holds a row of kind ``having`` in one of
    ``statuses`` (the request was mailed), ``follow`` (:meth:`OutboxRepo.add_if_group`);
    and its run ``run_id`` woken once no request of ``kind`` of it is pending, leased to
    ``lease`` (owner, until) unless another holds it (:meth:`RunsRepo.wake_if_idle`)."""

    run_id: str
    card: tuple[str, str, str]
    follow: tuple[str, str, str]
    having: str
    statuses: tuple[str, ...]
    kind: str
    lease: tuple[str, datetime] | None


@functools.lru_cache(maxsize=64)
def _vote_then_close(to: str, keys: tuple[str, ...], having: str, statuses: tuple[str, ...],
                     lease: bool, server: bool) -> tuple[Any, tuple[str, ...], tuple[str, ...]]:
    """PostgreSQL, one statement (issue 50): :func:`_vote_then`, and only if the request
    was closed by it, its card's update queued (:func:`add_if_group_insert`) and its run
    woken (:func:`wake_update`; this request, which the statement's snapshot still sees
    pending, left out by id), the run's row as it left it in ``r_<column>`` (NULL: not
    woken). The run's row was locked by the decision's first statement, and every writer
    of its requests locks it first: what the snapshot sees of them is what a statement of
    its own would. With it, the names of its row's columns after the first (whether the
    vote was new): the request's, then the run's (unprefixed), in the row's order."""
    vote, upd = _vote_upd(to, keys)
    closed = select(upd.c.id).exists()
    card = add_if_group_insert(having, statuses, closed).cte("card")
    woke = (wake_update(lease, server, but=bindparam("aid"))
            .where(closed).returning(*_R.c).cte("woke"))
    one = select(literal(1).label("one")).subquery("one")
    stmt = fast(select(select(func.count()).select_from(vote).scalar_subquery()
                       .label(_VOTED), *upd.c, *(c.label(_RUN + c.name) for c in woke.c))
                .select_from(one.outerjoin(upd, true()).outerjoin(woke, true()))
                .add_cte(card))
    return stmt, tuple(c.name for c in upd.c), tuple(c.name for c in woke.c)


class ApprovalsRepo(Repo):
    async def insert(self, **values: Any) -> None:
        await self.conn.execute(_INSERT, values)

    async def get(self, approval_id: str) -> ApprovalRecord | None:
        row = (await self.conn.execute(_GET, {"aid": approval_id})).first()
        return to_record(ApprovalRecord, row)

    async def card(self, approval_id: str) -> CardRow | None:
        """Request ``approval_id`` with what its card needs besides (:class:`CardRow`),
        in one statement; None if there is no such request."""
        row = (await self.conn.execute(_CARD, {"aid": approval_id})).first()
        if row is None:
            return None
        m = dict(row._mapping)
        channel, ts, standing = (m.pop(k) for k in _CARD_EXTRA)
        return CardRow(ApprovalRecord(**m), (channel, ts) if channel and ts else None,
                       bool(standing))

    async def lock(self, approval_id: str) -> ApprovalRecord | None:
        """Read the approval and hold its row until the transaction ends (lock the run
        row first: see :mod:`store.db` for the one lock order)."""
        row = (await self.conn.execute(_LOCK, {"aid": approval_id})).first()
        return to_record(ApprovalRecord, row)

    async def lock_in_run(self, approval_id: str, run_id: str | None) -> ApprovalRecord | None:
        """Lock run ``run_id``'s row, then read approval ``approval_id`` (of that run) and
        hold its row: ``RunsRepo.lock`` then :meth:`lock`, in one statement on
        PostgreSQL (SQLite's write transaction holds both already). ``run_id`` None: the
        request's run, found from the request in the same statement."""
        if self.dialect != "postgresql":
            return await self.lock(approval_id)
        if run_id is None:
            row = (await self.conn.execute(_LOCK_BY_ID, {"aid": approval_id})).first()
        else:
            row = (await self.conn.execute(_LOCK_IN_RUN, {"aid": approval_id,
                                                          "rid": run_id})).first()
        return to_record(ApprovalRecord, row)

    async def run_ids(self, approval_ids: Sequence[str]) -> list[str]:
        """The distinct runs of ``approval_ids``, in id order (the order to lock them in)."""
        if not approval_ids:
            return []
        rows = await self.conn.execute(
            select(_T.c.run_id).where(_T.c.id.in_(list(approval_ids))).distinct()
            .order_by(_T.c.run_id))
        return [r[0] for r in rows]

    async def policies(self, approval_ids: Sequence[str]) -> dict[str, str]:
        """The stored policy snapshot of each of ``approval_ids`` that exists (nothing
        else of the row: no sealed column is read)."""
        if not approval_ids:
            return {}
        rows = await self.conn.execute(
            select(_T.c.id, _T.c.policy).where(_T.c.id.in_(list(approval_ids))))
        return {r[0]: r[1] for r in rows}

    async def find(self, prefix: str, limit: int = 2) -> list[ApprovalRecord]:
        """Up to ``limit`` requests whose id starts with ``prefix``, in id order."""
        rows = await self.conn.execute(
            select(_T).where(Approval.id.startswith(prefix, autoescape=True))
            .order_by(_T.c.id).limit(limit)
        )
        return [ApprovalRecord(**r._mapping) for r in rows]

    async def for_run(self, run_id: str) -> list[ApprovalRecord]:
        rows = await self.conn.execute(_FOR_RUN, {"rid": run_id})
        return [ApprovalRecord(**r._mapping) for r in rows]

    async def recent(self, *, status: str | None = None, run_id: str | None = None,
                   limit: int = 100) -> list[ApprovalRecord]:
        stmt = select(_T).order_by(Approval.requested_at.desc()).limit(limit)
        if status:
            stmt = stmt.where(Approval.status == status)
        if run_id:
            stmt = stmt.where(Approval.run_id == run_id)
        return [ApprovalRecord(**r._mapping) for r in await self.conn.execute(stmt)]

    async def oldest(self, *, status: str | None = None, run_id: str | None = None,
                     limit: int = 100, match: Match | None = None) -> list[ApprovalRecord]:
        """The ``limit`` oldest requests (of ``status``, of ``run_id``, that ``match``),
        oldest first: the head of the queue, whatever its length."""
        stmt = select(_T).order_by(Approval.requested_at, Approval.id).limit(limit)
        return [ApprovalRecord(**r._mapping)
                for r in await self.conn.execute(_where(stmt, status, run_id, match))]

    async def count(self, *, status: str | None = None, run_id: str | None = None,
                    match: Match | None = None) -> int:
        """How many requests there are (of ``status``, of ``run_id``, that ``match``)."""
        stmt = _where(select(func.count()).select_from(Approval), status, run_id, match)
        return int((await self.conn.execute(stmt)).scalar_one())

    async def pending_schedule(self) -> list[tuple[str, datetime, datetime | None]]:
        """(id, expires_at, next_reminder_at) of every pending approval."""
        rows = await self.conn.execute(
            select(Approval.id, Approval.expires_at, Approval.next_reminder_at)
            .where(Approval.status == "pending")
        )
        return [(r[0], r[1], r[2]) for r in rows]

    async def due_for_expiry(self, now: datetime, limit: int) -> list[str]:
        rows = await self.conn.execute(
            select(Approval.id).where(Approval.status == "pending", Approval.expires_at <= now)
            .order_by(Approval.expires_at).limit(limit)
        )
        return [r[0] for r in rows]

    async def claim_overdue(self, *, now: datetime, limit: int) -> list[str]:
        """Claim up to ``limit`` pending requests past their expiry, oldest first: hold
        each one's row and its run's row until the transaction ends; returns their ids.

        For a sweep's write transaction, followed there by :meth:`expire_batch` (the
        compare-and-set that decides). On PostgreSQL requests whose row or run row another
        transaction holds (another replica's sweep, a click being recorded) are passed
        over, never waited for: replicas sweeping at once split the overdue requests, and
        since a skipping lock never waits it cannot deadlock with the one lock order
        (run, approvals, audit head) of a transaction holding a run and waiting for one
        of its approvals. A request passed over is settled by its holder or the next sweep.
        """
        rows = await self.conn.execute(_CLAIM_OVERDUE, {"now": now, "lim": limit})
        return [r[0] for r in rows]

    async def due_for_reminder(self, now: datetime, limit: int,
                               only: Sequence[str] | None = None) -> list[ApprovalRecord]:
        stmt = select(_T).where(Approval.status == "pending", Approval.next_reminder_at <= now,
                                Approval.expires_at > now)
        if only is not None:
            stmt = stmt.where(Approval.id.in_(list(only)))
        rows = await self.conn.execute(stmt.order_by(Approval.next_reminder_at).limit(limit))
        return [ApprovalRecord(**r._mapping) for r in rows]

    async def transition(self, approval_id: str, *, to: str, from_: Sequence[str] = ("pending",),
                         digest: str | None = None, before: datetime | None = None,
                         **values: Any) -> ApprovalRecord | None:
        """Compare-and-set ``status`` from one of ``from_`` to ``to``; None if we lost.

        ``digest``: only while the effective arguments still have this digest;
        ``before``: only while the request has not expired at that instant.
        """
        keys = tuple(sorted(values))
        params: dict[str, Any] = {"aid": approval_id, **{f"v_{k}": values[k] for k in keys}}
        if digest is not None:
            params["d"] = digest
        if before is not None:
            params["now"] = before
        row = (await self.conn.execute(
            _transition(to, tuple(from_), keys, digest is not None, before is not None), params,
        )).first()
        return to_record(ApprovalRecord, row)

    async def vote_and_transition(self, *, approval_id: str, actor: str, vote: str,
                                  digest: str, via: str, at: datetime, to: str,
                                  **values: Any) -> tuple[bool, ApprovalRecord | None]:
        """:meth:`add_vote` (its verdict: ``vote``), then, only if the vote was new,
        :meth:`transition` from ``pending`` to ``to`` on ``digest`` before ``at`` (with
        ``values``): (whether the vote was new, the request as the transition left it or
        None). On PostgreSQL one
        statement (issue 50); on SQLite the two."""
        if self.dialect != "postgresql":
            if not await self.add_vote(approval_id=approval_id, actor=actor, verdict=vote,
                                       digest=digest, via=via, at=at):
                return False, None
            return True, await self.transition(approval_id, to=to, digest=digest,
                                               before=at, **values)
        keys = tuple(sorted(values))
        params: dict[str, Any] = {"aid": approval_id, "d": digest, "now": at,
                                  "actor": actor, "vote": vote, "via": via,
                                  **{f"v_{k}": values[k] for k in keys}}
        row = (await self.conn.execute(_vote_then(to, keys), params)).one()
        m = dict(row._mapping)
        voted = bool(m.pop(_VOTED))
        return voted, None if m["id"] is None else ApprovalRecord(**m)

    async def vote_and_close(self, *, approval_id: str, actor: str, vote: str, digest: str,
                             via: str, at: datetime, to: str, closing: Closing,
                             **values: Any) -> tuple[bool, ApprovalRecord | None, Woken | None]:
        """:meth:`vote_and_transition`, and once the request is closed by it, what
        ``closing`` says: (whether the vote was new, the request as the transition left it
        or None, the run as :meth:`RunsRepo.wake_if_idle` answers). On PostgreSQL one
        statement (issue 50); on SQLite, whose writer is alone, the four."""
        if self.dialect != "postgresql":
            voted, done = await self.vote_and_transition(
                approval_id=approval_id, actor=actor, vote=vote, digest=digest, via=via,
                at=at, to=to, **values)
            if done is None:
                return voted, None, None
            await OutboxRepo(self.conn, self.dialect).add_if_group(
                closing.card, closing.follow, having=closing.having,
                statuses=closing.statuses, now=at)
            woken = await RunsRepo(self.conn, self.dialect, server_time=self.server_time) \
                .wake_if_idle(closing.run_id, kind=closing.kind, now=at, lease=closing.lease)
            return voted, done, woken
        keys = tuple(sorted(values))
        params: dict[str, Any] = {
            "aid": approval_id, "d": digest, "now": at, "actor": actor, "vote": vote,
            "via": via, **{f"v_{k}": values[k] for k in keys},
            **add_if_group_params(closing.card, closing.follow, at),
            "rid": closing.run_id, "kind": closing.kind, "from": "awaiting_approval"}
        if closing.lease is not None:
            params["owner"] = closing.lease[0]
            params.update({"ttl": closing.lease[1] - at} if self.server_time
                          else {"until": closing.lease[1]})
        stmt, asked, its_run = _vote_then_close(
            to, keys, closing.having, tuple(closing.statuses), closing.lease is not None,
            self.server_time)
        row = (await self.conn.execute(stmt, params)).one()
        # split by position, the statement's own order (not by each of its ~80 names)
        n = 1 + len(asked)
        voted = bool(row[0])
        m = dict(zip(asked, row[1:n], strict=True))
        run = dict(zip(its_run, row[n:], strict=True))
        done = None if m["id"] is None else ApprovalRecord(**m)
        if run["id"] is None:
            return voted, done, None
        if closing.lease is None:
            return voted, done, Woken(leased=False)
        woke = RunRecord(**run)
        return voted, done, Woken(leased=woke.lease_owner == closing.lease[0], run=woke)

    async def expire_batch(self, ids: Sequence[str], *, now: datetime) -> list[ApprovalRecord]:
        """Compare-and-set each still-pending, overdue approval in ``ids`` to expired."""
        if not ids:
            return []
        rows = await self.conn.execute(
            update(_T)
            .where(Approval.id.in_(list(ids)), Approval.status == "pending",
                   Approval.expires_at <= now)
            .values(status="expired", decided_at=now, decided_by="system:expiry",
                    decided_via="scheduler", verdict="expired")
            .returning(_T)
        )
        return [ApprovalRecord(**r._mapping) for r in rows]

    async def approvers_on(self, approval_id: str, digest: str) -> list[str]:
        """Who has voted to approve exactly the arguments with ``digest``, oldest first."""
        rows = await self.conn.execute(_VOTERS, {"aid": approval_id, "d": digest})
        return [r[0] for r in rows]

    async def set_count(self, approval_id: str, count: int) -> None:
        await self.conn.execute(
            update(_T).where(_T.c.id == approval_id).values(approve_count=count))

    async def add_vote(self, *, approval_id: str, actor: str, verdict: str, digest: str,
                       via: str, at: datetime) -> bool:
        """Record a vote; False if this actor already voted on these exact arguments."""
        res = await self.conn.execute(
            _VOTE[self.dialect],
            {"approval_id": approval_id, "actor": actor, "verdict": verdict, "digest": digest,
             "via": via, "at": at},
        )
        return bool(res.rowcount == 1)

    async def decided_rows(self, *, after: str = "", batch: int = 500,
                           only: str | None = None) -> list[dict[str, Any]]:
        """A batch of requests in id order after ``after`` (``only``: that one): what
        ``audit verify`` compares with the chain (the arguments as stored, sealed or not)."""
        rows = await self.conn.execute(
            _DECIDED_AFTER if only is None else _DECIDED_ONE,
            {"after": after, "batch": batch} if only is None else {"only": only})
        return [dict(r._mapping) for r in rows]

    async def votes_of(self, approval_ids: Sequence[str]) -> list[VoteRecord]:
        """Every vote on the requests ``approval_ids``."""
        if not approval_ids:
            return []
        rows = await self.conn.execute(_VOTES_OF, {"aids": list(approval_ids)})
        return [VoteRecord(**r._mapping) for r in rows]

    async def votes(self, approval_id: str) -> list[VoteRecord]:
        rows = await self.conn.execute(_VOTES, {"aid": approval_id})
        return [VoteRecord(**r._mapping) for r in rows]

    async def set_edit(self, approval_id: str, *, edited_args: str, edited_digest: str,
                       edited_by: str, edited_at: datetime, expect_digest: str,
                       packet: str) -> bool:
        """Replace the arguments of a pending request (compare-and-set on the arguments the
        editor saw); votes on earlier arguments stop counting. ``packet``: the request's
        packet with the edit's impact recorded beside its words (see runtime/requests/packet.py)."""
        res = await self.conn.execute(
            update(_T).where(
                Approval.id == approval_id, Approval.status == "pending",
                func.coalesce(Approval.edited_digest, Approval.digest) == expect_digest)
            .values(edited_args=edited_args, edited_digest=edited_digest, edited_by=edited_by,
                    edited_at=edited_at, approve_count=0, packet=packet)
        )
        return bool(res.rowcount == 1)

    async def advance_reminder(self, approval_id: str, *, sent: int,
                               next_at: datetime | None) -> bool:
        """Count one reminder as sent, if nobody else did already (compare-and-set).

        A request whose row another transaction holds (another replica sending this very
        reminder, a click being recorded) is not waited for: False at once (PostgreSQL),
        and the next sweep looks again if it is still due."""
        res = await self.conn.execute(
            update(_T).where(Approval.id.in_(_UNLOCKED), Approval.status == "pending",
                             Approval.reminders_sent == sent)
            .values(reminders_sent=sent + 1, next_reminder_at=next_at), {"aid": approval_id}
        )
        return bool(res.rowcount == 1)

    async def stop_reminders(self, approval_id: str, *, sent: int) -> bool:
        """Send this pending request no more reminders (its next one could not be worked
        out), unless one was counted meanwhile (compare-and-set on ``reminders_sent``)."""
        res = await self.conn.execute(
            update(_T).where(Approval.id == approval_id, Approval.status == "pending",
                             Approval.reminders_sent == sent,
                             Approval.next_reminder_at.is_not(None))
            .values(next_reminder_at=None))
        return bool(res.rowcount == 1)

    async def set_packet(self, approval_id: str, packet: str) -> None:
        """Replace a decided request's packet (what its card says: an approved call that
        was not executed says why there)."""
        await self.conn.execute(
            update(_T).where(_T.c.id == approval_id).values(packet=packet))

    async def set_message(self, approval_id: str, *, channel: str, ts: str) -> None:
        await self.conn.execute(_SET_MESSAGE, {"aid": approval_id, "ch": channel, "ts": ts})

    async def cancel_pending_for_run(self, run_id: str, *, now: datetime, by: str,
                                     reason: str | None = None) -> list[ApprovalRecord]:
        rows = await self.conn.execute(
            update(_T).where(Approval.run_id == run_id, Approval.status == "pending")
            .values(status="cancelled", decided_at=now, decided_by=by, verdict="cancelled",
                    reason=reason)
            .returning(_T)
        )
        return [ApprovalRecord(**r._mapping) for r in rows]

    async def pending_for_actor_candidates(self, limit: int = 200) -> list[ApprovalRecord]:
        rows = await self.conn.execute(
            select(_T).where(Approval.status == "pending")
            .order_by(Approval.expires_at).limit(limit)
        )
        return [ApprovalRecord(**r._mapping) for r in rows]

    async def runs_without_pending(self, run_ids: Sequence[str], *, kind: str) -> list[str]:
        """Those of ``run_ids`` with no pending approval of ``kind`` left."""
        if not run_ids:
            return []
        rows = await self.conn.execute(
            select(Approval.run_id).where(Approval.run_id.in_(list(run_ids)),
                                          Approval.status == "pending", Approval.kind == kind)
            .distinct())
        busy = {r[0] for r in rows}
        return [r for r in run_ids if r not in busy]


@dataclass(frozen=True)
class Match:
    """Requests by their stored columns (the runtime says which columns make an outcome:
    :func:`runtime.kernel.vocabulary.match_of`). A field left None matches anything; ``statuses``
    with ``exclude``: any status but those."""

    statuses: frozenset[str] | None = None
    exclude: bool = False
    kinds: frozenset[str] | None = None
    verdicts: frozenset[str] | None = None
    edited: bool | None = None  # edited_args set (True) or not (False)
    via: str | None = None  # decided_via is this one
    not_via: str | None = None  # decided_via is not this one (or none)


def _where(stmt: Select[Any], status: str | None, run_id: str | None,
           match: Match | None = None) -> Select[Any]:
    if status:
        stmt = stmt.where(Approval.status == status)
    if match is not None:
        if match.statuses is not None:
            stmt = stmt.where(Approval.status.not_in(sorted(match.statuses)) if match.exclude
                              else Approval.status.in_(sorted(match.statuses)))
        if match.kinds is not None:
            stmt = stmt.where(Approval.kind.in_(sorted(match.kinds)))
        if match.verdicts is not None:
            stmt = stmt.where(Approval.verdict.in_(sorted(match.verdicts)))
        if match.edited is not None:
            stmt = stmt.where(Approval.edited_args.is_not(None) if match.edited
                              else Approval.edited_args.is_(None))
        if match.via is not None:
            stmt = stmt.where(Approval.decided_via == match.via)
        if match.not_via is not None:
            stmt = stmt.where(or_(Approval.decided_via.is_(None),
                                  Approval.decided_via != match.not_via))
    if run_id:
        stmt = stmt.where(Approval.run_id == run_id)
    return stmt
