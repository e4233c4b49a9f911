"""Runs: creation, leases (compare-and-set), checkpoints, cancellation."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from approvald.store.fastsql import fast
from approvald.store.models import Approval, Run, RunEvent, ToolExecution
from approvald.store.records import RunRecord
from approvald.store.repos.base import Repo, pinned, to_record
from approvald.store.repos.events import EventsRepo
from sqlalchemy import (
    Interval,
    Table,
    and_,
    bindparam,
    case,
    func,
    insert,
    or_,
    select,
    union_all,
    update,
)
from sqlalchemy.sql.functions import coalesce


@dataclass(frozen=True, slots=True)
class Woken:
    """A waiting run set ``running`` again; ``leased``: to the owner that asked."""

    leased: bool
    run: RunRecord | None = None  # the row as the statement left it (when it leased it)


@dataclass(frozen=True, slots=True)
class CancelRequest:
    """A run's cancel flag as a checkpoint saw it, with who asked and why."""

    requested: bool
    by: str | None = None
    reason: str | None = None

    # whether the call's outcome given to the checkpoint (``Settled``) was written by its
    # statement: None when it was not given, or it is left to the caller (SQLite)
    settled: bool | None = None

    def __bool__(self) -> bool:
        return self.requested


@dataclass(frozen=True, slots=True)
class Settled:
    """A call's outcome recorded with its step's checkpoint (issue 50): the intent row of
    ``call_id`` of the run, while it is ``started`` or ``unknown``, set to ``status``
    with its result or error (what ``ExecutionsRepo.record_result`` writes)."""

    call_id: str
    status: str
    result: str | None
    error_class: str | None
    error: str | None
    latency_ms: float | None

    def params(self) -> dict[str, Any]:
        return {"x_cid": self.call_id, "x_status": self.status, "x_result": self.result,
                "x_error_class": self.error_class, "x_error": self.error,
                "x_latency_ms": self.latency_ms}


# hot-path statements, built once: a step runs them thousands of times
_T = cast(Table, Run.__table__)
_E = cast(Table, RunEvent.__table__)
_X = cast(Table, ToolExecution.__table__)
_OWNED = and_(_T.c.id == bindparam("rid"), _T.c.lease_owner == bindparam("owner"))


# Lease times. With ``server_time`` (PostgreSQL's default) they are read and written with
# the database's own clock, so replicas whose clocks disagree still agree on when a lease
# lapses; otherwise they come from the caller's clock (SQLite: one host, one clock).
def _lease_now(server: bool) -> Any:
    return func.clock_timestamp() if server else bindparam("now")


def _lease_until(server: bool) -> Any:
    if server:
        return func.clock_timestamp() + bindparam("ttl", type_=Interval())
    return bindparam("until")


def lease_renewal(server: bool, journal: bool) -> Any:
    """``UPDATE runs``: ``owner``'s lease on run ``rid`` extended (and, with ``journal``,
    the step's model reply journaled), returning its id if it was ``owner``'s."""
    values: dict[str, Any] = {"lease_expires_at": _lease_until(server)}
    if journal:
        values["inflight"] = bindparam("inflight")
    return update(_T).where(_OWNED).values(values).returning(_T.c.id)


@functools.lru_cache(maxsize=8)
def _renew(server: bool, journal: bool) -> Any:
    values: dict[str, Any] = {"lease_expires_at": _lease_until(server)}
    if journal:
        values["inflight"] = bindparam("inflight")
    return fast(update(_T).where(_OWNED).values(values))


_GET = fast(select(_T).where(_T.c.id == bindparam("rid")))
# who holds a lease (every replica looks for dead ones now and then)
_LEASE_OWNERS = fast(select(_T.c.lease_owner).where(_T.c.lease_owner.is_not(None)).distinct())
_INSERT = fast(insert(_T))
# the lease holder, read just before the compare-and-set that takes it (SQLite)
_OWNER = fast(select(_T.c.lease_owner).where(_T.c.id == bindparam("rid")))
# see store.db: the run row is the first lock of every transaction about a run's approvals
_LOCK = select(_T.c.id).where(_T.c.id == bindparam("rid")).with_for_update(key_share=True)
_GET_LOCKED = fast(_GET.with_for_update(key_share=True))
_RELEASE = fast(update(_T).where(_OWNED).values(lease_owner=None, lease_expires_at=None))


_DUE = or_(_T.c.wait_until.is_(None), _T.c.wait_until <= bindparam("now"))


def _lapsed(with_stale: bool, server: bool) -> Any:
    """A lease nobody live holds: none, expired, or held by a dead owner."""
    free = or_(_T.c.lease_owner.is_(None), _T.c.lease_expires_at < _lease_now(server))
    if with_stale:
        free = or_(free, _T.c.lease_owner.in_(bindparam("stale", expanding=True)))
    return free


def _takeable(with_stale: bool, server: bool) -> Any:
    return (_T.c.status == "running", _DUE,
            or_(_lapsed(with_stale, server), _T.c.lease_owner == bindparam("owner")))


_PREV_OWNER = "prev_lease_owner"


@functools.lru_cache(maxsize=8)
def _acquire(with_stale: bool, server: bool, dialect: str) -> Any:
    stmt = (update(_T).where(_T.c.id == bindparam("rid"), *_takeable(with_stale, server))
            .values(lease_owner=bindparam("owner"), lease_expires_at=_lease_until(server)))
    if dialect != "postgresql":
        return fast(stmt.returning(_T))
    # who held the lease before, in the same statement: PostgreSQL's RETURNING shows only
    # new values, so the row is joined to itself as locked just before (the lock the
    # UPDATE takes anyway; it waits for a concurrent holder as a plain UPDATE would)
    prev = (select(_T.c.id, _T.c.lease_owner.label(_PREV_OWNER))
            .where(_T.c.id == bindparam("rid")).with_for_update(key_share=True)
            .subquery("prev"))
    return fast(stmt.where(_T.c.id == prev.c.id).returning(*_T.c, prev.c[_PREV_OWNER]))


@functools.lru_cache(maxsize=8)
def _ready(with_stale: bool, server: bool, excluding: bool) -> Any:
    # candidates for a claim: locked rows are passed over, never waited for (PostgreSQL;
    # SQLAlchemy leaves FOR UPDATE out on SQLite, whose writer is alone)
    stmt = select(_T.c.id, _T.c.lease_owner).where(_T.c.status == "running", _DUE,
                                                   _lapsed(with_stale, server))
    if excluding:
        stmt = stmt.where(_T.c.id.not_in(bindparam("exclude", expanding=True)))
    return (stmt.order_by(_T.c.updated_at).limit(bindparam("lim"))
            .with_for_update(skip_locked=True, key_share=True))


@functools.lru_cache(maxsize=8)
def _claim(with_stale: bool, server: bool) -> Any:
    return (update(_T).where(_T.c.id.in_(bindparam("ids", expanding=True)),
                             *_takeable(with_stale, server))
            .values(lease_owner=bindparam("owner"), lease_expires_at=_lease_until(server))
            .returning(_T))


@functools.lru_cache(maxsize=64)
def _update(keys: tuple[str, ...], with_status: bool) -> Any:
    stmt = update(_T).where(_T.c.id == bindparam("rid"))
    if with_status:
        stmt = stmt.where(_T.c.status.in_(bindparam("expect", expanding=True)))
    return fast(stmt.values({k: bindparam(f"v_{k}") for k in keys}))


_A = cast(Table, Approval.__table__)
def wake_update(lease: bool, server: bool, *, but: Any = None) -> Any:
    """``UPDATE runs``: run ``rid`` set ``running`` from status ``from`` if no request of
    ``kind`` of it is pending (other than ``but``, a request the same statement closes:
    its own snapshot still sees it pending), leased to ``owner`` with ``lease`` unless
    someone holds it (then keeping theirs)."""
    values: dict[str, Any] = {"status": "running", "updated_at": bindparam("now")}
    if lease:  # and take its lease, unless someone holds it (then keep theirs)
        free = or_(_T.c.lease_owner.is_(None), _T.c.lease_expires_at <= _lease_now(server))
        values.update(lease_owner=case((free, bindparam("owner")), else_=_T.c.lease_owner),
                      lease_expires_at=case((free, _lease_until(server)),
                                            else_=_T.c.lease_expires_at))
    pending = select(_A.c.id).where(_A.c.run_id == bindparam("rid"), _A.c.status == "pending",
                                    _A.c.kind == bindparam("kind"))
    if but is not None:
        pending = pending.where(_A.c.id != but)
    return (update(_T)
            .where(_T.c.id == bindparam("rid"), _T.c.status == bindparam("from"),
                   ~pending.exists())
            .values(pinned(_T, values)))


@functools.lru_cache(maxsize=4)
def _wake_if_idle(lease: bool, server: bool) -> Any:
    # leased: the whole row, the resumed run's start (runtime.kernel.handoff); else its holder
    return fast(wake_update(lease, server)
                .returning(*(_T.c if lease else (_T.c.lease_owner,))))


@functools.lru_cache(maxsize=8)
def _checkpoint(server: bool, release: bool) -> Any:
    return fast(
        update(_T).where(_OWNED)
        .values(step=bindparam("step"), next_seq=bindparam("next_seq"),
                status=bindparam("status"), updated_at=bindparam("now"), inflight=None,
                lease_owner=None if release else bindparam("owner"),
                lease_expires_at=None if release else _lease_until(server),
                # typed as the columns are, so the values are sealed on the way in
                result=coalesce(bindparam("result", type_=_T.c.result.type), _T.c.result),
                error=coalesce(bindparam("error", type_=_T.c.error.type), _T.c.error),
                wait_until=None, wait_reason=None, failures=0)  # a step went through
        .returning(_T.c.id, _T.c.cancel_requested, _T.c.cancel_requested_by,
                   _T.c.cancel_reason)
    )


@functools.lru_cache(maxsize=32)
def _checkpoint_with_events(server: bool, release: bool, n: int,
                            settled: bool = False) -> Any:
    """PostgreSQL, one statement: the run row's checkpoint while ``owner`` holds the lease,
    and the step's ``n`` events appended only then (a data-modifying CTE runs exactly
    once, and the INSERT selects from the UPDATE's row: no row, no events); answers the
    run's cancel request as the checkpoint saw it, no row if the lease was not ours.
    ``settled``: and a call's outcome (:class:`Settled`) written to its intent row, only
    then too, the run's row locked before the execution's (the one order); answers also
    whether it was (a row settled by someone else is not: the caller rolls back)."""
    ck = _checkpoint(server, release).cte("ck")
    more: list[Any] = []
    if settled:
        ex = (update(_X).where(_X.c.run_id == select(ck.c.id).scalar_subquery(),
                               _X.c.call_id == bindparam("x_cid", type_=_X.c.call_id.type),
                               _X.c.status.in_(["started", "unknown"]))
              .values(pinned(_X, {
                  "status": bindparam("x_status", type_=_X.c.status.type),
                  "result": bindparam("x_result", type_=_X.c.result.type),
                  "error_class": bindparam("x_error_class", type_=_X.c.error_class.type),
                  "error": bindparam("x_error", type_=_X.c.error.type),
                  "finished_at": bindparam("now", type_=_X.c.finished_at.type),
                  "latency_ms": bindparam("x_latency_ms", type_=_X.c.latency_ms.type)}))
              .returning(_X.c.call_id).cte("ex"))
        more.append(select(func.count()).select_from(ex).scalar_subquery().label("settled"))
    rows = [select(ck.c.id.label("run_id"),
                   *(bindparam(f"{c}_{i}", type_=_E.c[c].type).label(c)
                     for c in ("seq", "step", "v", "body")))
            for i in range(n)]
    events = (insert(_E).from_select(["run_id", "seq", "step", "v", "body"],
                                     rows[0] if n == 1 else union_all(*rows))
              .cte("events"))
    return fast(select(ck.c.cancel_requested, ck.c.cancel_requested_by, ck.c.cancel_reason,
                       *more).add_cte(events))


@dataclass(frozen=True, slots=True)
class Lease:
    """A run whose lease was just taken, and from whom: ``taken_from`` is the previous
    holder when its lease had lapsed (expired, or a dead owner's) and was taken over."""

    run: RunRecord
    taken_from: str | None = None

    @property
    def taken_over(self) -> bool:
        return self.taken_from is not None


def _lease(row: Any, owner: str, prev: str | None) -> Lease:
    m = dict(row._mapping)
    m.pop(_PREV_OWNER, None)
    return Lease(RunRecord(**m), prev if prev is not None and prev != owner else None)


def new_run(*, run_id: str, agent: str, task: str, requested_by: str,
            instructions_version: str, now: datetime, status: str = "running",
            agent_version: str | None = None) -> dict[str, Any]:
    """The columns a new run is inserted with (:meth:`RunsRepo.create`)."""
    return {
        "id": run_id, "agent": agent, "status": status, "step": 0, "next_seq": 0,
        "task": task, "requested_by": requested_by,
        "instructions_version": instructions_version, "cancel_requested": False,
        "created_at": now, "updated_at": now, "agent_version": agent_version,
    }


def as_inserted(values: dict[str, Any]) -> RunRecord:
    """The run :func:`new_run`'s ``values`` make, every column (those not given take their
    defaults, named here)."""
    return RunRecord(**values, result=None, error=None, inflight=None,
                     cancel_requested_by=None, cancel_reason=None, lease_owner=None,
                     lease_expires_at=None, wait_until=None, wait_reason=None, failures=0)


class RunsRepo(Repo):
    async def create(self, *, run_id: str, agent: str, task: str, requested_by: str,
                     instructions_version: str, now: datetime, status: str = "running",
                     agent_version: str | None = None) -> RunRecord:
        """Insert a run; the record as inserted (what :meth:`get` would read back now,
        without the read: the columns not given take their defaults, named here)."""
        values = new_run(run_id=run_id, agent=agent, task=task, requested_by=requested_by,
                         instructions_version=instructions_version, now=now, status=status,
                         agent_version=agent_version)
        await self.conn.execute(_INSERT, values)
        return as_inserted(values)

    async def get(self, run_id: str) -> RunRecord | None:
        row = (await self.conn.execute(_GET, {"rid": run_id})).first()
        return to_record(RunRecord, row)

    def _now(self, now: datetime) -> Any:
        """"Now" for comparing lease expiries: the database's clock, or the caller's."""
        return func.clock_timestamp() if self.server_time else now

    async def lock(self, run_id: str) -> None:
        """Hold the run's row until the transaction ends: the first lock of any transaction
        that changes the run's approvals (SQLite's write transaction holds it already)."""
        if self.dialect == "postgresql":
            await self.conn.execute(_LOCK, {"rid": run_id})

    async def lock_many(self, run_ids: Sequence[str]) -> None:
        """:meth:`lock` several runs, in id order (one order, so lockers cannot deadlock)."""
        if self.dialect == "postgresql" and run_ids:
            await self.conn.execute(
                select(_T.c.id).where(_T.c.id.in_(sorted(set(run_ids)))).order_by(_T.c.id)
                .with_for_update(key_share=True))

    async def get_locked(self, run_id: str) -> RunRecord | None:
        """:meth:`get`, holding the row like :meth:`lock`."""
        row = (await self.conn.execute(_GET_LOCKED, {"rid": run_id})).first()
        return to_record(RunRecord, row)

    async def find(self, prefix: str, limit: int = 2) -> list[RunRecord]:
        """Up to ``limit`` runs whose id starts with ``prefix``, in id order (see
        :func:`runtime.kernel.prefix.resolve`)."""
        rows = await self.conn.execute(
            select(Run.__table__).where(Run.id.startswith(prefix, autoescape=True))
            .order_by(Run.id).limit(limit)
        )
        return [RunRecord(**r._mapping) for r in rows]

    async def recent(self, *, status: str | None = None, limit: int = 50) -> list[RunRecord]:
        stmt = select(Run.__table__).order_by(Run.created_at.desc(), Run.id).limit(limit)
        if status:
            stmt = stmt.where(Run.status == status)
        return [RunRecord(**r._mapping) for r in await self.conn.execute(stmt)]

    async def with_status(self, statuses: Sequence[str]) -> list[RunRecord]:
        """Every run with one of ``statuses``, oldest first (a pre-deploy check reads
        the runs that have not ended)."""
        stmt = (select(Run.__table__).where(Run.status.in_(list(statuses)))
                .order_by(Run.created_at, Run.id))
        return [RunRecord(**r._mapping) for r in await self.conn.execute(stmt)]

    async def count_by_status(self) -> dict[str, int]:
        rows = await self.conn.execute(select(Run.status, func.count()).group_by(Run.status))
        return {status: int(n) for status, n in rows}

    async def acquire_lease(self, run_id: str, *, owner: str, now: datetime, until: datetime,
                            stale_owners: Sequence[str] = ()) -> Lease | None:
        """Take the lease of a ``running`` run that is free, expired, ours, or held by a dead
        owner; returns the run and whose lapsed lease was taken over, or None when it is not
        ours to advance. A compare-and-set: it waits for a concurrent holder of the row."""
        params: dict[str, Any] = {"rid": run_id, "owner": owner, "now": now,
                                  **self._lease(now, until)}
        if stale_owners:
            params["stale"] = list(stale_owners)
        stmt = _acquire(bool(stale_owners), self.server_time, self.dialect)
        prev: str | None = None
        if self.dialect != "postgresql":  # one writer: reading first is the same instant
            prev = (await self.conn.execute(_OWNER, {"rid": run_id})).scalar_one_or_none()
        row = (await self.conn.execute(stmt, params)).first()
        if row is None:
            return None
        return _lease(row, owner, row._mapping.get(_PREV_OWNER, prev))

    async def claim_runnable(self, *, owner: str, now: datetime, until: datetime, limit: int,
                             stale_owners: Sequence[str] = (),
                             exclude: Sequence[str] = ()) -> list[Lease]:
        """Take the lease of up to ``limit`` of the :meth:`runnable` runs, oldest first, for
        ``owner`` until ``until``; returns them, each with whose lapsed lease it took over.

        This is how a worker's poll shares ready runs with other replicas: it claims only
        what it can start at once, and a run it claimed is no longer ready to anyone else.
        Run it in a write transaction. On PostgreSQL the candidates are selected ``FOR NO
        KEY UPDATE SKIP LOCKED``, so runs another replica is claiming (or a lease being
        taken, a decision being recorded) are passed over instead of waited for; the same
        compare-and-set as :meth:`acquire_lease` then takes them in this transaction and
        stays the guarantee. The claimer advances a run under the same ``owner``, whose
        :meth:`acquire_lease` then only renews the claim. ``exclude``: runs the claimer is
        advancing (or about to) already, under lease ids of their own.
        """
        params: dict[str, Any] = {"now": now, "lim": limit}
        if stale_owners:
            params["stale"] = list(stale_owners)
        if exclude:
            params["exclude"] = list(exclude)
        stale = bool(stale_owners)
        stmt = _ready(stale, self.server_time, bool(exclude))
        candidates = {r[0]: r[1] for r in await self.conn.execute(stmt, params)}
        if not candidates:
            return []
        params.update(ids=list(candidates), owner=owner, **self._lease(now, until))
        rows = {r.id: r for r in await self.conn.execute(_claim(stale, self.server_time),
                                                         params)}
        return [_lease(rows[i], owner, prev) for i, prev in candidates.items() if i in rows]

    def _lease(self, now: datetime, until: datetime) -> dict[str, Any]:
        """Bind a lease's expiry: a span from the database's clock, or an instant."""
        return {"ttl": until - now} if self.server_time else {"until": until}
    async def renew_lease(self, run_id: str, *, owner: str, now: datetime, until: datetime,
                          journal: str | None = None) -> bool:
        """Extend our lease (and journal the step's model reply); False if it is not ours."""
        params: dict[str, Any] = {"rid": run_id, "owner": owner, **self._lease(now, until)}
        if journal is not None:
            params["inflight"] = journal
        res = await self.conn.execute(_renew(self.server_time, journal is not None), params)
        return bool(res.rowcount == 1)

    async def release_lease(self, run_id: str, *, owner: str) -> None:
        await self.conn.execute(_RELEASE, {"rid": run_id, "owner": owner})

    async def update(self, run_id: str, *, expect_status: Sequence[str] | None = None,
                     **values: Any) -> bool:
        """Update the run, optionally only if its status is one of ``expect_status``."""
        keys = tuple(sorted(values))
        params: dict[str, Any] = {"rid": run_id, **{f"v_{k}": values[k] for k in keys}}
        if expect_status is not None:
            params["expect"] = list(expect_status)
        res = await self.conn.execute(_update(keys, expect_status is not None), params)
        return bool(res.rowcount == 1)

    async def wake_if_idle(self, run_id: str, *, kind: str, now: datetime,
                           from_status: str = "awaiting_approval",
                           lease: tuple[str, datetime] | None = None) -> Woken | None:
        """Set the run ``running`` if it waits and no request of ``kind`` is pending;
        None if it did not. ``lease=(owner, until)`` also leases it to ``owner`` in the
        same statement, unless another holds an unexpired lease on it (``Woken.leased``
        says which)."""
        params: dict[str, Any] = {"rid": run_id, "kind": kind, "now": now,
                                  "from": from_status}
        if lease is not None:
            params.update(owner=lease[0], **self._lease(now, lease[1]))
        row = (await self.conn.execute(_wake_if_idle(lease is not None, self.server_time),
                                       params)).first()
        if row is None:
            return None
        if lease is None:
            return Woken(leased=False)
        run = RunRecord(**row._mapping)
        return Woken(leased=run.lease_owner == lease[0], run=run)

    async def wake(self, run_ids: Sequence[str], *, now: datetime) -> list[str]:
        """Move waiting runs back to ``running``; returns those that were waiting."""
        if not run_ids:
            return []
        rows = await self.conn.execute(
            update(_T).where(_T.c.id.in_(list(run_ids)), _T.c.status == "awaiting_approval")
            .values(status="running", updated_at=now).returning(_T.c.id))
        return [r[0] for r in rows]

    async def runnable(self, *, now: datetime, limit: int = 100,
                       stale_owners: Sequence[str] = ()) -> list[RunRecord]:
        """Runs that are ``running`` and not held by a live lease: ready to advance."""
        free = or_(Run.lease_owner.is_(None), Run.lease_expires_at < self._now(now))
        if stale_owners:
            free = or_(free, Run.lease_owner.in_(list(stale_owners)))
        due = or_(Run.wait_until.is_(None), Run.wait_until <= now)  # a waiting run waits
        rows = await self.conn.execute(
            select(Run.__table__).where(Run.status == "running", free, due)
            .order_by(Run.updated_at).limit(limit)
        )
        return [RunRecord(**r._mapping) for r in rows]

    async def lease_owners(self) -> list[str]:
        return [str(r[0]) for r in await self.conn.execute(_LEASE_OWNERS)]

    async def checkpoint(self, run_id: str, *, owner: str, step: int, next_seq: int,
                         status: str, now: datetime, lease_until: datetime | None,
                         release: bool, result: str | None = None,
                         error: str | None = None) -> CancelRequest | None:
        """Write the step's run-row changes while we hold the lease.

        Clears the journaled reply, renews (or releases) the lease, and returns the run's
        cancel request as seen at this step boundary, or None if the lease is no longer
        ours and nothing was written.
        """
        params: dict[str, Any] = {
            "rid": run_id, "owner": owner, "step": step, "next_seq": next_seq,
            "status": status, "now": now, "result": result, "error": error}
        if not release:
            assert lease_until is not None
            params.update(self._lease(now, lease_until))
        row = (await self.conn.execute(_checkpoint(self.server_time, release), params)).first()
        return None if row is None else CancelRequest(bool(row[1]), row[2], row[3])

    async def checkpoint_with_events(self, run_id: str, *, owner: str, first_seq: int,
                                     step: int, events: Sequence[tuple[int, str]],
                                     status: str, now: datetime,
                                     lease_until: datetime | None, release: bool,
                                     result: str | None = None,
                                     error: str | None = None,
                                     settled: Settled | None = None) -> CancelRequest | None:
        """The step's ``(schema_version, body)`` events appended from ``first_seq`` and
        the run row's :meth:`checkpoint`, only while ``owner`` holds the lease: None (and
        nothing written) if it does not. On PostgreSQL one statement, which a caller may
        send on its own in autocommit (issue 50); on SQLite the two. ``settled``: a call's
        outcome, on PostgreSQL written in the same statement (``CancelRequest.settled``
        says whether it was); elsewhere left to the caller (``settled`` None)."""
        if self.dialect != "postgresql" or not events:
            req = await self.checkpoint(run_id, owner=owner, step=step,
                                        next_seq=first_seq + len(events), status=status,
                                        now=now, lease_until=lease_until, release=release,
                                        result=result, error=error)
            if req is not None and events:  # (the caller's transaction holds both)
                await EventsRepo(self.conn, self.dialect).append(run_id, first_seq, step,
                                                                 events)
            return req
        params: dict[str, Any] = {
            "rid": run_id, "owner": owner, "step": step,
            "next_seq": first_seq + len(events), "status": status, "now": now,
            "result": result, "error": error}
        for i, (v, body) in enumerate(events):
            params.update({f"seq_{i}": first_seq + i, f"step_{i}": step, f"v_{i}": v,
                           f"body_{i}": body})
        if not release:
            assert lease_until is not None
            params.update(self._lease(now, lease_until))
        if settled is not None:
            params.update(settled.params())
        row = (await self.conn.execute(
            _checkpoint_with_events(self.server_time, release, len(events),
                                    settled is not None), params)).first()
        if row is None:
            return None
        return CancelRequest(bool(row[0]), row[1], row[2],
                             None if settled is None else row[3] == 1)

    async def park(self, run_id: str, *, owner: str, until: datetime, reason: str,
                   failures: int, now: datetime) -> bool:
        """Leave the run ``running`` but untouchable until ``until``, and give the lease back
        (a rate limit, an outage, a backoff after an error); False if not ours."""
        res = await self.conn.execute(
            update(_T).where(_T.c.id == run_id, _T.c.lease_owner == owner)
            .values(wait_until=until, wait_reason=reason[:2000], failures=failures,
                    lease_owner=None, lease_expires_at=None, updated_at=now))
        return bool(res.rowcount == 1)

    async def end(self, run_id: str, *, owner: str, status: str, error: str,
                  now: datetime) -> bool:
        """End a run that cannot go on (``failed`` or ``needs_attention``), releasing it."""
        res = await self.conn.execute(
            update(_T).where(_T.c.id == run_id, _T.c.lease_owner == owner)
            .values(status=status, error=error[:4000], lease_owner=None, lease_expires_at=None,
                    wait_until=None, wait_reason=None, inflight=None, updated_at=now))
        return bool(res.rowcount == 1)

    async def count_leased(self, agent: str, *, now: datetime, excluding: str) -> int:
        """Runs of ``agent`` some worker holds a live lease on (other than ``excluding``)."""
        n = (await self.conn.execute(
            select(func.count()).select_from(_T).where(
                _T.c.agent == agent, _T.c.status == "running", _T.c.id != excluding,
                _T.c.lease_owner.is_not(None),
                _T.c.lease_expires_at >= self._now(now)))).scalar_one()
        return int(n)

    async def waiting(self, *, now: datetime, limit: int = 100) -> list[RunRecord]:
        """Runs that wait (a rate limit, an outage, a backoff), soonest first."""
        rows = await self.conn.execute(
            select(_T).where(_T.c.status == "running", _T.c.wait_until > now)
            .order_by(_T.c.wait_until).limit(limit))
        return [RunRecord(**r._mapping) for r in rows]

    async def request_cancel(self, run_id: str, *, by: str, reason: str | None,
                             now: datetime) -> None:
        """Flag the run for its worker to cancel at its next step boundary."""
        await self.conn.execute(
            update(_T).where(_T.c.id == run_id)
            .values(cancel_requested=True, cancel_requested_by=by, cancel_reason=reason,
                    updated_at=now))

    async def cancel_if_idle(self, run_id: str, *, now: datetime, error: str, by: str,
                             reason: str | None, stale_owners: Sequence[str] = ()) -> bool:
        """Cancel at once unless a live worker is mid-step (then only the flag is set)."""
        idle = or_(
            Run.status.in_(["awaiting_approval", "needs_attention", "external"]),
            and_(Run.status == "running",
                 or_(Run.lease_owner.is_(None), Run.lease_expires_at < self._now(now),
                     Run.lease_owner.in_(list(stale_owners)))),
        )
        res = await self.conn.execute(
            update(Run).where(Run.id == run_id, idle)
            .values(status="cancelled", cancel_requested=True, cancel_requested_by=by,
                    cancel_reason=reason, error=error, updated_at=now,
                    lease_owner=None, lease_expires_at=None, inflight=None)
        )
        return bool(res.rowcount == 1)
