"""HTTP API tokens and the requests made with them (calls their callers run themselves).

A request is created with ``INSERT ... ON CONFLICT DO NOTHING``: the schema's uniqueness
of (token, idempotency key) decides which of two concurrent creates with one key wins, and
the loser reads the winner's row. Reporting a result is a compare-and-set on
``result_digest``, telling the decision of an approval one on ``decided_approval``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from approvald.store.models import ApiToken, ExternalRequest, FaceSwitch, Run
from approvald.store.records import paths_of
from approvald.store.repos.base import Repo, to_record
from sqlalchemy import Table, bindparam, delete, insert, or_, select, update

_K = cast(Table, ApiToken.__table__)
_X = cast(Table, ExternalRequest.__table__)
_S = cast(Table, FaceSwitch.__table__)
_GET = select(_X).where(_X.c.id == bindparam("xid"))
_LOCK = _GET.with_for_update(key_share=True)


@dataclass(frozen=True, slots=True)
class TokenRecord:
    id: str
    name: str
    token_hash: str
    webhook_url: str | None
    created_at: datetime
    created_by: str
    revoked_at: datetime | None
    revoked_by: str | None
    tools: str | None = None  # JSON list of names or globs; None: made before scopes
    face: str | None = None  # the one face it may call (hook:claude-code); None: /v1
    requested_by: str | None = None  # who a face token's calls are made for


@dataclass(frozen=True, slots=True)
class ExternalRecord:
    id: str
    token_id: str
    idempotency_key: str | None
    fingerprint: str
    tool: str
    args: str
    digest: str
    policy_name: str | None
    kind: str
    reason: str | None
    webhook_url: str | None
    decided_approval: str | None
    result_digest: str | None
    reported_at: datetime | None
    created_at: datetime
    sensitive: str | None = None  # JSON list of its declared paths (0015)
    answered_at: datetime | None = None  # a call was told its refusal (0016)

    def sensitive_paths(self) -> tuple[str, ...]:
        """The argument paths its policy declared sensitive when it was made."""
        return paths_of(self.sensitive)


@dataclass(frozen=True, slots=True)
class SwitchRecord:
    """A face's form switched off: by whom, when, why."""

    face: str
    form: str
    off_at: datetime
    off_by: str
    reason: str | None


class ExternalRepo(Repo):
    # -- tokens ---------------------------------------------------------------------------
    async def add_token(self, **values: Any) -> bool:
        """Insert a token; False when its name (or hash) is taken."""
        res = await self.conn.execute(self.insert_ignore(ApiToken), values)
        return bool(res.rowcount == 1)

    async def token_by_hash(self, token_hash: str) -> TokenRecord | None:
        row = (await self.conn.execute(select(_K).where(_K.c.token_hash == token_hash))).first()
        return to_record(TokenRecord, row)

    async def token(self, token_id: str) -> TokenRecord | None:
        row = (await self.conn.execute(select(_K).where(_K.c.id == token_id))).first()
        return to_record(TokenRecord, row)

    async def token_named(self, name: str) -> TokenRecord | None:
        row = (await self.conn.execute(select(_K).where(_K.c.name == name))).first()
        return to_record(TokenRecord, row)

    async def tokens(self) -> list[TokenRecord]:
        rows = await self.conn.execute(select(_K).order_by(_K.c.created_at, _K.c.name))
        return [TokenRecord(**r._mapping) for r in rows]

    async def revoke_token(self, name: str, *, by: str, now: datetime) -> TokenRecord | None:
        """Revoke a live token (compare-and-set); None when there is none by that name."""
        row = (await self.conn.execute(
            update(_K).where(_K.c.name == name, _K.c.revoked_at.is_(None))
            .values(revoked_at=now, revoked_by=by).returning(_K))).first()
        return to_record(TokenRecord, row)

    async def unrevoke_token(self, name: str) -> bool:
        """Clear a revocation (of approvald's own credential for a face, switched on
        again: see runtime.switches); False when it was not revoked."""
        res = await self.conn.execute(
            update(_K).where(_K.c.name == name, _K.c.revoked_at.is_not(None))
            .values(revoked_at=None, revoked_by=None))
        return bool(res.rowcount == 1)

    # -- requests -------------------------------------------------------------------------
    async def add(self, **values: Any) -> bool:
        """Insert a request; False when its token already has one under its idempotency key."""
        res = await self.conn.execute(self.insert_ignore(ExternalRequest), values)
        return bool(res.rowcount == 1)

    async def add_with_run(self, run: dict[str, Any], **values: Any) -> bool:
        """Insert a request and its run (``run``: :func:`~store.repos.runs.new_run`'s
        columns); False when its token already has one under its idempotency key (the
        run was inserted too: the caller rolls back). On PostgreSQL one statement (the run
        a data-modifying CTE of the request's INSERT: the request's foreign key is checked
        at the statement's end, the run inserted by then)."""
        if self.dialect != "postgresql":
            await self.conn.execute(insert(Run), run)
            return await self.add(**values)
        stmt = self.insert_ignore(ExternalRequest).values(**values) \
            .add_cte(insert(Run).values(**run).cte("run")).returning(_X.c.id)
        return len(list(await self.conn.execute(stmt))) == 1

    async def get(self, request_id: str) -> ExternalRecord | None:
        row = (await self.conn.execute(_GET, {"xid": request_id})).first()
        return to_record(ExternalRecord, row)

    async def lock(self, request_id: str) -> ExternalRecord | None:
        """:meth:`get`, holding the row until the transaction ends (after the run's row)."""
        row = (await self.conn.execute(_LOCK, {"xid": request_id})).first()
        return to_record(ExternalRecord, row)

    async def by_key(self, token_id: str, key: str) -> ExternalRecord | None:
        row = (await self.conn.execute(
            select(_X).where(_X.c.token_id == token_id, _X.c.idempotency_key == key))).first()
        return to_record(ExternalRecord, row)

    async def mark_decided(self, request_id: str, approval_id: str) -> bool:
        """Note that the decision of ``approval_id`` has been told; False if it already was."""
        res = await self.conn.execute(
            update(_X).where(_X.c.id == request_id,
                             or_(_X.c.decided_approval.is_(None),
                                 _X.c.decided_approval != approval_id))
            .values(decided_approval=approval_id))
        return bool(res.rowcount == 1)

    async def mark_answered(self, request_id: str, *, now: datetime) -> bool:
        """Note when a caller was first told the request's final answer; False if one
        already was (compare-and-set on there being no such time)."""
        res = await self.conn.execute(
            update(_X).where(_X.c.id == request_id, _X.c.answered_at.is_(None))
            .values(answered_at=now))
        return bool(res.rowcount == 1)

    # -- faces switched off -----------------------------------------------------------
    async def switches(self, face: str) -> list[SwitchRecord]:
        """The forms of ``face`` switched off now."""
        rows = await self.conn.execute(select(_S).where(_S.c.face == face).order_by(_S.c.form))
        return [SwitchRecord(**r._mapping) for r in rows]

    async def switch_off(self, face: str, form: str, *, by: str, now: datetime,
                         reason: str | None) -> bool:
        """Switch ``form`` of ``face`` off; False when it already was."""
        res = await self.conn.execute(self.insert_ignore(FaceSwitch), {
            "face": face, "form": form, "off_at": now, "off_by": by, "reason": reason})
        return bool(res.rowcount == 1)

    async def switch_on(self, face: str, form: str) -> SwitchRecord | None:
        """Switch ``form`` of ``face`` on again: the row it was off by, or None when it
        was on."""
        row = (await self.conn.execute(
            delete(_S).where(_S.c.face == face, _S.c.form == form).returning(_S))).first()
        return to_record(SwitchRecord, row)

    async def set_reported(self, request_id: str, *, result_digest: str,
                           now: datetime) -> bool:
        """Record the caller's report (once: compare-and-set on there being none)."""
        res = await self.conn.execute(
            update(_X).where(_X.c.id == request_id, _X.c.result_digest.is_(None))
            .values(result_digest=result_digest, reported_at=now))
        return bool(res.rowcount == 1)
