"""The outbox: rows written with the state they describe, delivered in order per group.

A row is ``pending`` until delivered (``delivered``) or given up (``dead``). Giving up is
by time (``give_up_at``), never by count: ``attempts`` counts claims, ``waits`` counts
the tries the far side answered with "not now" (a rate limit), which are not failures.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import datetime
from typing import Any, cast

from approvald.store.fastsql import fast
from approvald.store.models import Outbox
from approvald.store.records import OutboxRecord
from approvald.store.repos.base import Repo, to_record
from sqlalchemy import Table, bindparam, case, literal, or_, select, union_all, update
from sqlalchemy.orm import aliased

_T = cast(Table, Outbox.__table__)
STATUSES = ("pending", "delivered", "dead")  # every status a row can have


_INSERT = fast(_T.insert())


def _heads(with_stale: bool) -> Any:
    earlier = aliased(Outbox)
    blocked = (select(earlier.id)
               .where(earlier.group_key == Outbox.group_key, earlier.status == "pending",
                      earlier.id < Outbox.id).exists())
    free = or_(_T.c.claimed_until.is_(None), _T.c.claimed_until < bindparam("now"))
    if with_stale:
        free = or_(free, _T.c.claimed_by.in_(bindparam("stale", expanding=True)))
    return (select(_T).where(_T.c.status == "pending", _T.c.not_before <= bindparam("now"),
                             free, ~blocked)
            .order_by(_T.c.id).limit(bindparam("lim")))


_HEADS = {False: _heads(False), True: _heads(True)}
# the same heads as a claim: rows another transaction holds are passed over, never waited
# for (PostgreSQL; SQLAlchemy leaves FOR UPDATE out on SQLite, whose writer is alone)
_CLAIM_HEADS = {k: fast(v.with_for_update(skip_locked=True, key_share=True, of=_T))
                for k, v in _HEADS.items()}


def _claim_read(with_stale: bool) -> Any:
    """SQLite: :meth:`OutboxRepo.claim_many`'s compare-and-set on the heads
    :data:`_CLAIM_HEADS` has just read in the same write transaction (the heads read again
    by the same parameters: the same rows, as SQLite's writer is alone), built once where
    the ids read would make an ``IN`` list of their own each call."""
    free = or_(_T.c.claimed_until.is_(None), _T.c.claimed_until < bindparam("now"))
    if with_stale:
        free = or_(free, _T.c.claimed_by.in_(bindparam("stale", expanding=True)))
    heads = _heads(with_stale).with_only_columns(_T.c.id).scalar_subquery()
    return fast(update(_T).where(_T.c.id.in_(heads), _T.c.status == "pending", free)
                .values(claimed_by=bindparam("owner"), claimed_until=bindparam("until"),
                        attempts=_T.c.attempts + 1)
                .returning(_T.c.id))


_CLAIM_READ = {k: _claim_read(k) for k in (False, True)}


def _claim_in_one(with_stale: bool) -> Any:
    """PostgreSQL: :data:`_CLAIM_HEADS` and :meth:`OutboxRepo.claim_many`'s compare-and-set
    as ONE statement (the heads locked in a CTE, claimed by the UPDATE that joins them),
    returning the heads as they were before the claim: atomic on its own, so a drain sends
    it in autocommit, with no BEGIN and COMMIT around it (issue 50)."""
    heads = _CLAIM_HEADS[with_stale].cte("heads")
    free = or_(_T.c.claimed_until.is_(None), _T.c.claimed_until < bindparam("now"))
    if with_stale:
        free = or_(free, _T.c.claimed_by.in_(bindparam("stale", expanding=True)))
    return fast(update(_T).where(_T.c.id == heads.c.id, _T.c.status == "pending", free)
                .values(claimed_by=bindparam("owner"), claimed_until=bindparam("until"),
                        attempts=_T.c.attempts + 1)
                .returning(*(heads.c[c.name] for c in _T.c)))


_CLAIM_IN_ONE = {k: _claim_in_one(k) for k in (False, True)}

# a drain's mark of what it delivered (of rows its owner still claims), several at once
_DELIVERED = fast(update(_T)
                  .where(_T.c.id == bindparam("oid"), _T.c.claimed_by == bindparam("owner"),
                         _T.c.status == "pending")
                  .values(status="delivered", delivered_at=bindparam("now"),
                          result=bindparam("res"), claimed_until=None, last_error=None))
_CLAIMERS = fast(select(_T.c.claimed_by).where(_T.c.status == "pending",
                                               _T.c.claimed_by.is_not(None)).distinct())

def _free(now: datetime, stale_owners: Sequence[str]) -> Any:
    free = or_(Outbox.claimed_until.is_(None), Outbox.claimed_until < now)
    if stale_owners:
        free = or_(free, Outbox.claimed_by.in_(list(stale_owners)))
    return free


_ADDED = ("kind", "group_key", "payload", "status", "attempts", "not_before", "created_at",
          "give_up_at", "waits")


def add_if_group_insert(having: str, statuses: tuple[str, ...], when: Any = None) -> Any:
    """``INSERT INTO outbox``: the row (``o_kind``, ``o_group``, ``o_payload``) and the
    row (``f_kind``, ``f_group``, ``f_payload``) when group ``f_group`` holds a row of
    kind ``having`` in one of ``statuses``, both queued at ``o_now``, and each only
    ``when`` (a condition of the statement it is part of; :meth:`OutboxRepo.add_if_group`
    in a statement of its own)."""
    def values(prefix: str, *where: Any) -> Any:
        given = {c: bindparam(f"{prefix}_{k}", type_=_T.c[c].type)
                 for c, k in (("kind", "kind"), ("group_key", "group"), ("payload", "payload"))}
        now = bindparam("o_now", type_=_T.c.not_before.type)
        given.update(status=literal("pending", type_=_T.c.status.type),
                     attempts=literal(0, type_=_T.c.attempts.type), not_before=now,
                     created_at=now, give_up_at=literal(None, type_=_T.c.give_up_at.type),
                     waits=literal(0, type_=_T.c.waits.type))
        cond = [w for w in (*where, when) if w is not None]
        return select(*(given[c].label(c) for c in _ADDED)).where(*cond)

    holds = select(Outbox.id).where(Outbox.kind == having,
                                    Outbox.group_key == bindparam("f_group"),
                                    Outbox.status.in_(list(statuses))).exists()
    return _T.insert().from_select(list(_ADDED), union_all(values("o"), values("f", holds)))


def add_if_group_params(row: tuple[str, str, str], follow: tuple[str, str, str],
                        now: datetime) -> dict[str, Any]:
    """The parameters of :func:`add_if_group_insert`."""
    return {"o_kind": row[0], "o_group": row[1], "o_payload": row[2], "f_kind": follow[0],
            "f_group": follow[1], "f_payload": follow[2], "o_now": now}


@functools.lru_cache(maxsize=8)
def _add_if_group(having: str, statuses: tuple[str, ...]) -> Any:
    return fast(add_if_group_insert(having, statuses))


class OutboxRepo(Repo):
    async def claimers(self) -> list[str]:
        """Workers holding a claim on a pending row (to spot dead ones)."""
        return [str(r[0]) for r in await self.conn.execute(_CLAIMERS)]

    async def add(self, *, kind: str, group_key: str, payload: str, now: datetime,
                  give_up_at: datetime | None = None) -> None:
        """Queue one row. Without ``give_up_at`` the drain works the deadline out from
        the row's kind the first time a delivery fails (see ``runtime.record.outbox``)."""
        await self.conn.execute(
            _INSERT,
            {"kind": kind, "group_key": group_key, "payload": payload, "status": "pending",
             "attempts": 0, "not_before": now, "created_at": now, "give_up_at": give_up_at},
        )

    async def add_many(self, rows: list[tuple[str, str, str]], *, now: datetime,
                       give_up_at: datetime | None = None) -> None:
        """Insert ``(kind, group_key, payload)`` rows in one statement."""
        if rows:
            await self.conn.execute(_T.insert(), [
                {"kind": k, "group_key": g, "payload": p, "status": "pending", "attempts": 0,
                 "not_before": now, "created_at": now, "give_up_at": give_up_at}
                for k, g, p in rows])

    async def get(self, outbox_id: int) -> OutboxRecord | None:
        row = (await self.conn.execute(select(_T).where(Outbox.id == outbox_id))).first()
        return to_record(OutboxRecord, row)

    async def recent(self, *, status: str | None = None, kind: str | None = None,
                   limit: int = 1000) -> list[OutboxRecord]:
        stmt = select(_T).order_by(Outbox.id).limit(limit)
        if status:
            stmt = stmt.where(Outbox.status == status)
        if kind:
            stmt = stmt.where(Outbox.kind == kind)
        return [OutboxRecord(**r._mapping) for r in await self.conn.execute(stmt)]

    async def newest(self, *, statuses: Sequence[str] = (), limit: int = 50
                     ) -> list[OutboxRecord]:
        """The newest ``limit`` rows (of ``statuses``, if given), oldest first."""
        stmt = select(_T).order_by(Outbox.id.desc()).limit(limit)
        if statuses:
            stmt = stmt.where(Outbox.status.in_(list(statuses)))
        rows = [OutboxRecord(**r._mapping) for r in await self.conn.execute(stmt)]
        return rows[::-1]

    async def in_group(self, group_key: str, *, kind: str | None = None
                       ) -> list[OutboxRecord]:
        """The rows of one delivery group (of ``kind``, if given), oldest first."""
        stmt = select(_T).where(Outbox.status.in_(STATUSES), Outbox.group_key == group_key) \
            .order_by(Outbox.id)  # (every status named: the status-first index serves it)
        if kind:
            stmt = stmt.where(Outbox.kind == kind)
        return [OutboxRecord(**r._mapping) for r in await self.conn.execute(stmt)]

    async def add_if_group(self, row: tuple[str, str, str], follow: tuple[str, str, str], *,
                           having: str, statuses: Sequence[str], now: datetime) -> None:
        """Queue ``row`` (kind, group, payload) and, in the same statement, ``follow``
        when ``follow``'s group holds a row of kind ``having`` in one of ``statuses``
        (what :meth:`groups_having` then :meth:`add` would do, in one round trip)."""
        await self.conn.execute(_add_if_group(having, tuple(statuses)),
                                add_if_group_params(row, follow, now))

    async def groups_having(self, kind: str, group_keys: Sequence[str], *,
                            statuses: Sequence[str] = STATUSES) -> set[str]:
        """Those of ``group_keys`` that hold a row of ``kind`` (in one of ``statuses``)."""
        if not group_keys:
            return set()
        rows = await self.conn.execute(
            select(Outbox.group_key).where(Outbox.status.in_(list(statuses)),
                                           Outbox.group_key.in_(list(group_keys)),
                                           Outbox.kind == kind).distinct())
        return {str(r[0]) for r in rows}

    async def latest(self, kind: str) -> OutboxRecord | None:
        """The newest row of ``kind``, whatever its status."""
        row = (await self.conn.execute(
            select(_T).where(Outbox.kind == kind).order_by(Outbox.id.desc()).limit(1))).first()
        return to_record(OutboxRecord, row)

    async def heads(self, *, now: datetime, limit: int,
                    stale_owners: Sequence[str] = ()) -> list[OutboxRecord]:
        """The oldest pending row of each group, if it is due and not claimed by a live worker.

        Later rows of a group wait for the head, so a card is posted before it is updated.
        A claim by a worker known to be dead (``stale_owners``) does not count.
        """
        params: dict[str, Any] = {"now": now, "lim": limit}
        if stale_owners:
            params["stale"] = list(stale_owners)
        rows = await self.conn.execute(_HEADS[bool(stale_owners)], params)
        return [OutboxRecord(**r._mapping) for r in rows]

    async def claim_heads(self, *, owner: str, now: datetime, until: datetime, limit: int,
                          stale_owners: Sequence[str] = ()) -> list[OutboxRecord]:
        """Claim up to ``limit`` of :meth:`heads` for ``owner`` until ``until``; returns
        the rows claimed, as they were before the claim (``attempts`` not yet counted).

        Run it in a write transaction. On PostgreSQL the heads are selected ``FOR NO KEY
        UPDATE SKIP LOCKED``: heads another replica is claiming right now are passed over
        (not waited for), so replicas claiming at once get disjoint rows and each still
        gets up to ``limit``. The compare-and-set of :meth:`claim_many` follows in the same
        transaction and stays the guarantee; skipping locked rows only removes the waiting.
        On PostgreSQL both are one statement, atomic on its own: a drain sends it alone
        (``Database.write_one``), in autocommit.
        """
        params: dict[str, Any] = {"now": now, "lim": limit}
        if stale_owners:
            params["stale"] = list(stale_owners)
        if self.dialect == "postgresql":
            params.update(owner=owner, until=until)
            got = await self.conn.execute(_CLAIM_IN_ONE[bool(stale_owners)], params)
            return sorted((OutboxRecord(**r._mapping) for r in got), key=lambda r: r.id)
        rows = [OutboxRecord(**r._mapping) for r in
                await self.conn.execute(_CLAIM_HEADS[bool(stale_owners)], params)]
        if not rows:
            return []
        params.update(owner=owner, until=until)
        claimed = {int(r[0]) for r in
                   await self.conn.execute(_CLAIM_READ[bool(stale_owners)], params)}
        return [r for r in rows if r.id in claimed]

    async def claim_many(self, ids: Sequence[int], *, owner: str, now: datetime,
                         until: datetime, stale_owners: Sequence[str] = ()) -> set[int]:
        """Claim every row of ``ids`` still free, in one statement; returns those claimed."""
        if not ids:
            return set()
        rows = await self.conn.execute(
            update(_T)
            .where(Outbox.id.in_(list(ids)), Outbox.status == "pending",
                   _free(now, stale_owners))
            .values(claimed_by=owner, claimed_until=until, attempts=Outbox.attempts + 1)
            .returning(Outbox.id))
        return {int(r[0]) for r in rows}

    async def delivered_many(self, results: Sequence[tuple[int, str | None]], *, owner: str,
                             now: datetime) -> None:
        """Mark ``(id, result)`` rows delivered (only those this owner still claims): one
        statement, each row's mark on its own, so it may be sent alone (autocommit)."""
        if results:
            await self.conn.execute(_DELIVERED, [{"oid": oid, "res": res, "owner": owner,
                                                  "now": now} for oid, res in results])

    async def failed(self, outbox_id: int, *, owner: str, error: str, retry_at: datetime,
                     give_up_at: datetime, dead: bool, waited: bool = False) -> bool:
        """Record a try that did not deliver (only if this owner still claims the row):
        try again at ``retry_at``, or park the row as dead (then ``retry_at`` is when it
        was given up, which ``not_before`` keeps). ``waited``: the far side asked us to
        wait, which is counted apart from failures. Returns whether it was recorded."""
        values: dict[str, Any] = {"status": "dead" if dead else "pending",
                                  "last_error": error[:2000], "not_before": retry_at,
                                  "claimed_until": None, "give_up_at": give_up_at}
        if waited:
            values["waits"] = Outbox.waits + 1
        rows = await self.conn.execute(
            update(_T).where(Outbox.id == outbox_id, Outbox.claimed_by == owner,
                             Outbox.status == "pending")
            .values(values).returning(Outbox.id))
        return rows.first() is not None

    async def redrive(self, ids: Sequence[int] | None, *, now: datetime,
                      give_up_at: datetime) -> list[OutboxRecord]:
        """Put rows back to work now: the dead ones among ``ids`` with the new deadline
        ``give_up_at``, the pending ones keeping theirs (only their next try moves to now);
        with ``ids=None`` every dead row. Delivered rows are never touched. Returns the rows
        as they now stand."""
        if ids is None:
            which = Outbox.status == "dead"
        elif not ids:
            return []
        else:
            which = Outbox.id.in_(list(ids)) & Outbox.status.in_(("dead", "pending"))
        rows = await self.conn.execute(
            update(_T).where(which)
            .values(status="pending", not_before=now,
                    give_up_at=case((Outbox.status == "dead", give_up_at),
                                    else_=Outbox.give_up_at))
            .returning(*_T.c))
        return sorted((OutboxRecord(**r._mapping) for r in rows), key=lambda r: r.id)

