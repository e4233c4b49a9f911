"""Standing approvals: insert, read, and the three compare-and-sets that change one.

A grant appends a user to ``grants`` only while the row is still ``proposed`` or
``active``, unexpired, and the user is not already there (the JSON text is compared as it
was read, so two grants racing for one row cannot both append to the same old list); a
use counts itself only while the row is ``active``, unexpired and has the very grants the
caller checked (a grant added since, the requester's say, was not checked); a revocation
moves ``proposed``/``active`` to ``revoked``. Each is one UPDATE whose WHERE clause is the
check, so whichever of a use and a grant or revocation commits first decides, on both
dialects.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from approvald.store.fastsql import fast
from approvald.store.models import StandingApproval
from approvald.store.repos.base import Repo, to_record
from sqlalchemy import Table, Text, bindparam, select, type_coerce, update

_S = cast(Table, StandingApproval.__table__)
_GET = fast(select(_S).where(_S.c.id == bindparam("sid")))
_GRANTED_ON = fast(select(_S).where(_S.c.tool == bindparam("tool"),
                                    _S.c.granted_on == bindparam("aid"))
                   .order_by(_S.c.created_at, _S.c.id))
# every standing approval, a batch in id order, its scope as stored (what `audit verify` reads)
_EVERY = fast(select(*(type_coerce(c, Text).label("scope") if c.name == "scope" else c
                       for c in _S.c))
              .where(_S.c.id > bindparam("after")).order_by(_S.c.id)
              .limit(bindparam("batch")))
_LIVE = ("proposed", "active")


@dataclass(frozen=True, slots=True)
class StandingRecord:
    id: str
    tool: str
    scope: str
    rule: str | None
    approvers: str
    quorum: int
    allow_self_approval: bool
    grants: str
    status: str
    granted_on: str
    uses: int
    created_at: datetime
    expires_at: datetime
    revoked_at: datetime | None
    revoked_by: str | None
    subject: str | None = None  # the source and tool it covers; None: covers nothing
    policy_digest: str | None = None

    def scope_value(self) -> dict[str, Any]:
        value: dict[str, Any] = json.loads(self.scope)
        return value

    def approvers_value(self) -> list[str]:
        return [str(x) for x in json.loads(self.approvers)]

    def grants_value(self) -> list[str]:
        return [str(x) for x in json.loads(self.grants)]

    def state(self, now: datetime) -> str:
        """``status``, except that a live one past its window reads ``expired``."""
        if self.status in _LIVE and now >= self.expires_at:
            return "expired"
        return self.status


class StandingRepo(Repo):
    async def insert(self, **values: Any) -> None:
        await self.conn.execute(_S.insert(), values)

    async def get(self, standing_id: str) -> StandingRecord | None:
        row = (await self.conn.execute(_GET, {"sid": standing_id})).first()
        return to_record(StandingRecord, row)

    async def find(self, prefix: str, limit: int = 2) -> list[StandingRecord]:
        """Up to ``limit`` standing approvals whose id starts with ``prefix``, in id order."""
        rows = (await self.conn.execute(
            select(_S).where(_S.c.id.startswith(prefix, autoescape=True))
            .order_by(_S.c.id).limit(limit))).all()
        return [StandingRecord(**r._mapping) for r in rows]

    async def active_for(self, subject: str, now: datetime) -> list[StandingRecord]:
        """Standing approvals that may cover a call of ``subject`` (a source's tool) now,
        oldest first."""
        rows = (await self.conn.execute(
            select(_S).where(_S.c.subject == subject, _S.c.status == "active",
                             _S.c.expires_at > now).order_by(_S.c.created_at, _S.c.id),
        )).all()
        return [StandingRecord(**r._mapping) for r in rows]

    async def granted_on(self, approval_id: str, *, tool: str) -> list[StandingRecord]:
        """The standing approvals proposed on request ``approval_id`` (a call of ``tool``:
        the tool narrows the search to its rows), oldest first."""
        rows = (await self.conn.execute(_GRANTED_ON, {"tool": tool, "aid": approval_id})).all()
        return [StandingRecord(**r._mapping) for r in rows]

    async def every(self, *, after: str = "", batch: int = 500) -> list[StandingRecord]:
        """A batch of every standing approval in id order after ``after``, its scope as
        stored (sealed or not: see :func:`runtime.record.audit_check.opened`)."""
        rows = (await self.conn.execute(_EVERY, {"after": after, "batch": batch})).all()
        return [StandingRecord(**r._mapping) for r in rows]

    async def listing(self, *, live_only: bool, now: datetime,
                      limit: int = 200) -> list[StandingRecord]:
        stmt = select(_S)
        if live_only:
            stmt = stmt.where(_S.c.status.in_(_LIVE), _S.c.expires_at > now)
        rows = (await self.conn.execute(
            stmt.order_by(_S.c.created_at.desc(), _S.c.id).limit(limit))).all()
        return [StandingRecord(**r._mapping) for r in rows]

    async def add_grant(self, standing_id: str, *, seen: str, grants: str, status: str,
                        now: datetime) -> StandingRecord | None:
        """Replace ``grants`` (as ``seen`` was read) and set ``status``, while the row is
        live and unexpired; None if it changed meanwhile or is no longer live."""
        row = (await self.conn.execute(
            update(_S).where(_S.c.id == standing_id, _S.c.status.in_(_LIVE),
                             _S.c.grants == seen, _S.c.expires_at > now)
            .values(grants=grants, status=status).returning(_S))).first()
        return to_record(StandingRecord, row)

    async def use(self, standing_id: str, *, seen: str, now: datetime) -> StandingRecord | None:
        """Count one use, while the row is active, unexpired and still has the grants
        ``seen`` (the JSON text read when it was found to cover the call); None otherwise."""
        row = (await self.conn.execute(
            update(_S).where(_S.c.id == standing_id, _S.c.status == "active",
                             _S.c.expires_at > now, _S.c.grants == seen)
            .values(uses=_S.c.uses + 1).returning(_S))).first()
        return to_record(StandingRecord, row)

    async def revoke(self, standing_id: str, *, by: str,
                     now: datetime) -> StandingRecord | None:
        """``proposed``/``active`` -> ``revoked``; None if it was not live."""
        row = (await self.conn.execute(
            update(_S).where(_S.c.id == standing_id, _S.c.status.in_(_LIVE))
            .values(status="revoked", revoked_at=now, revoked_by=by).returning(_S))).first()
        return to_record(StandingRecord, row)
