"""HTTP API tokens and the requests made with them (calls their callers run themselves).

A request is created with ``INSERT ... ON CONFLICT DO NOTHING``: the schema's uniqueness
of (token, idempotency key) decides which of two concurrent creates with one key wins, and
the loser reads the winner's row. Reporting a result is a compare-and-set on
``result_digest``, telling the decision of an approval one on ``decided_approval``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, cast

from approvald.store.errors import KeyTaken
from approvald.store.fastsql import fast
from approvald.store.models import ApiToken, ExternalRequest, FaceSwitch, Run, ToolExecution
from approvald.store.records import paths_of
from approvald.store.repos.base import Repo, to_record
from approvald.store.rowsets import encoder, rowset
from sqlalchemy import Table, bindparam, case, delete, exists, func, insert, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.sql.selectable import CTE

_K = cast(Table, ApiToken.__table__)
_X = cast(Table, ExternalRequest.__table__)
_S = cast(Table, FaceSwitch.__table__)
_R = cast(Table, Run.__table__)
_E = cast(Table, ToolExecution.__table__)
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


@dataclass(frozen=True, slots=True)
class Checks:
    """What must still hold for a request to be made or found, checked by the statement
    that inserts or looks it up (so the caller may have read it from memory): the request's
    token is live, and so are ``live`` (other tokens: a person's bearer token a face's
    request is made for), and the face's form ``on`` is not switched off."""

    live: tuple[str, ...] = ()
    on: tuple[str, str] | None = None  # (face, form)

    @property
    def shape(self) -> tuple[int, bool]:
        return len(self.live), self.on is not None

    def params(self) -> dict[str, Any]:
        out: dict[str, Any] = {f"l_{i}": t for i, t in enumerate(self.live)}
        if self.on is not None:
            out["sw_face"], out["sw_form"] = self.on
        return out


NO_CHECKS = Checks()


# where a statement's values come from, by name and type: bound one by one (a rider's
# statement), or the columns of a batch's rows (:func:`_batched`)
Source = Callable[[str, Any], Any]


def _bound(name: str, type_: Any) -> Any:
    return bindparam(name, type_=type_)


def _still(token: Any, shape: tuple[int, bool], value: Source = _bound) -> list[Any]:
    """The conditions :class:`Checks` of ``shape`` make, for the request's ``token``."""
    n, switch = shape
    conds: list[Any] = [exists().where(_K.c.id == t, _K.c.revoked_at.is_(None))
             for t in (token, *(value(f"l_{i}", _K.c.id.type) for i in range(n)))]
    if switch:
        conds.append(~exists().where(_S.c.face == value("sw_face", _S.c.face.type),
                                     _S.c.form == value("sw_form", _S.c.form.type)))
    return conds


Shape = tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...] | None, tuple[int, bool]]
# a run's columns whose defaults a statement built once does not fill in (as_inserted's)
_RUN_DEFAULTS = {"failures": 0}


@dataclass(frozen=True, slots=True)
class Answered:
    """A request the policy answered at once, to be inserted with its run (and, when its
    caller runs the call now, the call's start): ``run`` is
    :func:`~store.repos.runs.new_run`'s columns (with ``result`` when it is over),
    ``request`` the request's, ``intent`` the execution ledger's intent row or None.

    The request is inserted only while its token is live (not revoked): a caller's token
    read from a cache is checked again by the write itself, at no cost of a statement.
    On PostgreSQL the three rows ride on the statement that chains the answer's audit
    entries (:meth:`~store.repos.audit.AuditRepo.append_if_head`): one statement records
    the decision and its audit entries."""

    run: dict[str, Any]
    request: dict[str, Any]
    intent: dict[str, Any] | None = None
    checks: Checks = NO_CHECKS

    @property
    def shape(self) -> Shape:
        return (tuple({**_RUN_DEFAULTS, **self.run}), tuple(self.request),
                None if self.intent is None else tuple(self.intent), self.checks.shape)

    def params(self) -> dict[str, Any]:
        return {**{f"r_{k}": v for k, v in {**_RUN_DEFAULTS, **self.run}.items()},
                **{f"x_{k}": v for k, v in self.request.items()},
                **{f"e_{k}": v for k, v in (self.intent or {}).items()},
                **self.checks.params()}

    @staticmethod
    def ctes(shape: Shape) -> tuple[CTE, list[CTE]]:
        return answered_ctes(shape)

    @staticmethod
    def batched(shape: Shape, guard: CTE) -> tuple[CTE, list[CTE], Encode]:
        return _batched(lambda value: _answered_batch(shape, guard, value))


@dataclass(frozen=True, slots=True)
class Reported:
    """The report on a call whose start was recorded with its request by this process
    (:class:`Answered` with its intent), written from what that process kept in memory:
    the request's result digest and time (``request``), the intent row's outcome
    (``execution``: status, result, error_class, error, finished_at, latency_ms) and the
    run's end (``run``: status, result, error, updated_at).

    Written only while what memory says still holds, checked by the statements themselves:
    the request is ``token_id``'s and not reported yet, and its call's intent row is
    ``owner``'s and still started (else nothing is written: the caller rolls back and
    reads). The run is ended only while its status is ``open`` (a run cancelled after its
    call started stays cancelled, its report taken all the same). Rows are locked in the
    one order: the run, the request, the execution (and the chain head last). On
    PostgreSQL they ride on the statement that chains the report's audit entry."""

    request_id: str
    token_id: str
    call_id: str
    owner: str
    open: str
    request: dict[str, Any]
    execution: dict[str, Any]
    run: dict[str, Any]

    @property
    def shape(self) -> Any:
        return tuple(self.request), tuple(self.execution), tuple(self.run)

    def params(self) -> dict[str, Any]:
        return {"u_rid": self.request_id, "u_tid": self.token_id, "u_cid": self.call_id,
                "u_owner": self.owner, "u_open": self.open,
                **{f"u_x_{k}": v for k, v in self.request.items()},
                **{f"u_e_{k}": v for k, v in self.execution.items()},
                **{f"u_r_{k}": v for k, v in self.run.items()}}

    @staticmethod
    def statements(shape: Any) -> tuple[Any, Any, Any]:
        """The run's, the request's and the execution's UPDATEs (bound by
        :meth:`params`), each alone, the request's and the execution's to be found
        done once (SQLite)."""
        return _reported_parts(shape)

    @staticmethod
    def ctes(shape: Any) -> tuple[CTE, list[CTE]]:
        """PostgreSQL: the execution's UPDATE as a CTE returning its row (none: what was
        kept no longer holds), and the run's and the request's, each the next one's
        condition, so that their rows are locked in the one order."""
        run_u, req_u, ex_u = _reported_updates(shape, chained=True)
        run = run_u.returning(_R.c.id).cte("run")
        req = req_u.where(_X.c.id == select(run.c.id).scalar_subquery()) \
            .returning(_X.c.id).cte("req")
        ex = ex_u.where(_E.c.run_id == select(req.c.id).scalar_subquery()) \
            .returning(_E.c.run_id).cte("ex")
        return ex, [run, req]

    @staticmethod
    def batched(shape: Any, guard: CTE) -> tuple[CTE, list[CTE], Encode]:
        return _batched(lambda value: _reported_batch(shape, guard, value))


def _reported_updates(shape: Any, *, chained: bool, value: Source = _bound
                      ) -> tuple[Any, Any, Any]:
    request, execution, run = shape
    is_open = _R.c.status == value("u_open", _R.c.status.type)
    run_u = update(_R).where(_R.c.id == value("u_rid", _R.c.id.type)).values({
        c: case((is_open, b), else_=_R.c[c])
        for c, b in _binds(_R, "u_r", run, value).items()})
    req_u = update(_X).where(_X.c.token_id == value("u_tid", _X.c.token_id.type),
                             _X.c.result_digest.is_(None)) \
        .values(_binds(_X, "u_x", request, value))
    ex_u = update(_E).where(_E.c.call_id == value("u_cid", _E.c.call_id.type),
                           _E.c.status == "started",
                           _E.c.owner == value("u_owner", _E.c.owner.type)) \
        .values(_binds(_E, "u_e", execution, value))
    if not chained:
        req_u = req_u.where(_X.c.id == value("u_rid", _X.c.id.type))
        ex_u = ex_u.where(_E.c.run_id == value("u_rid", _E.c.run_id.type))
    return run_u, req_u, ex_u


def _reported_batch(shape: Any, guard: CTE, value: Source) -> tuple[CTE, list[CTE]]:
    """:meth:`Reported.ctes` for every report of a batch (``value``: its rows' columns):
    each UPDATE matches a report's rows by its run, among those the one before it
    returned (the runs, then the requests, then the executions locked), and writes
    nothing without a row of ``guard``."""
    run_u, req_u, ex_u = _reported_updates(shape, chained=False, value=value)
    run = run_u.where(select(guard).exists()).returning(_R.c.id).cte("run")
    req = req_u.where(_X.c.id.in_(select(run.c.id))).returning(_X.c.id).cte("req")
    ex = ex_u.where(_E.c.run_id.in_(select(req.c.id))).returning(_E.c.run_id).cte("ex")
    return ex, [run, req]


@functools.cache
def _reported_parts(shape: Any) -> tuple[Any, Any, Any]:
    run, request, execution = _reported_updates(shape, chained=False)
    return fast(run), fast(request), fast(execution)


class Rider(Protocol):
    """Rows a write transaction records with its audit entries, on PostgreSQL in the
    statement that chains them (:class:`Answered`, :class:`Reported`): ``ctes(shape)``
    gives the CTE that must return one row (else nothing of it holds: the caller rolls
    back) and the others, bound by ``params()``; ``batched(shape, guard)``, the same
    for any number of riders of one shape at once (group commit: one statement
    whatever their number, ``store/repos/audit.py``), bound by the text its third
    part makes of the riders (:func:`_batched`): its first CTE returns one row for each
    rider whose rows hold, and none of its CTEs writes anything without a row of the
    CTE ``guard``."""

    @property
    def shape(self) -> Any: ...

    def params(self) -> dict[str, Any]: ...

    @staticmethod
    def ctes(shape: Any) -> tuple[CTE, list[CTE]]: ...

    @staticmethod
    def batched(shape: Any, guard: CTE) -> tuple[CTE, list[CTE], Encode]: ...


# the rows of a batch of riders: one CTE, a column for each of their parameters
RIDERS = "riders"
# a batch's riders' rows, bound as one JSON text (store/rowsets.py)
RIDER_ROWS = "rider_rows"
# ``riders -> the text bound as RIDER_ROWS``, for a batch of one kind and shape
Encode = Callable[[Sequence["Rider"]], str]


def _batched(build: Callable[[Source], tuple[CTE, list[CTE]]]
             ) -> tuple[CTE, list[CTE], Encode]:
    """The CTEs ``build`` makes for one rider, made for a batch of riders of one shape:
    their values are the columns of the CTE :data:`RIDERS`, a row per rider, decoded from
    ONE JSON text bound as :data:`RIDER_ROWS` (``json_to_recordset``, each column of its
    parameter's type: :mod:`store.rowsets`), so that the statement, its SQL and its plan
    are the same whatever the number of riders; and the function making that text of
    the riders' :meth:`Rider.params`. (``build`` is called twice: first on parameters
    bound one by one, to learn their names and types.)"""
    fields: dict[str, Any] = {}

    def learn(name: str, type_: Any) -> Any:
        fields.setdefault(name, type_)
        return bindparam(name, type_=type_)

    build(learn)
    table = rowset(RIDER_ROWS, "r", fields)
    rows = select(*(table.c[name] for name in fields)).cte(RIDERS)
    encode = encoder(fields)
    first, others = build(lambda name, _: rows.c[name])
    return first, others, lambda riders: encode([r.params() for r in riders])


def _binds(table: Table, prefix: str, cols: tuple[str, ...], value: Source = _bound
           ) -> dict[str, Any]:
    return {c: value(f"{prefix}_{c}", table.c[c].type) for c in cols}


def _live_request(dialect: str, cols: tuple[str, ...], checks: tuple[int, bool],
                  *also: Any, value: Source = _bound) -> Any:
    """``INSERT INTO external_requests ... SELECT <values> WHERE <its token is live, and
    what else checks says, and also> ON CONFLICT DO NOTHING``."""
    values = select(*(b.label(c) for c, b in _binds(_X, "x", cols, value).items())).where(
        *_still(value("x_token_id", _K.c.id.type), checks, value), *also)
    ins: Any = (postgresql.insert(_X) if dialect == "postgresql" else sqlite.insert(_X))
    return ins.from_select(list(cols), values).on_conflict_do_nothing()


@functools.cache
def _answered_parts(dialect: str, shape: Shape) -> tuple[Any, ...]:
    """SQLite: the run's, the request's and the intent's INSERTs, each on its own."""
    run, request, intent, checks = shape
    parts = [fast(insert(_R).values(_binds(_R, "r", run))),
             fast(_live_request(dialect, request, checks))]
    if intent is not None:
        parts.append(fast(sqlite.insert(_E).values(_binds(_E, "e", intent))
                          .on_conflict_do_nothing()))
    return tuple(parts)


def answered_ctes(shape: Shape) -> tuple[CTE, list[CTE]]:
    """PostgreSQL: the request's INSERT as a CTE returning its id (none: not inserted),
    and the others to add to the statement (data-modifying CTEs run exactly once; the
    request's and the intent's foreign keys are checked at the statement's end, the run
    inserted by then)."""
    run, request, intent, checks = shape
    req = _live_request("postgresql", request, checks).returning(_X.c.id).cte("req")
    others = [insert(_R).values(_binds(_R, "r", run)).cte("run")]
    if intent is not None:
        others.append(postgresql.insert(_E).values(_binds(_E, "e", intent))
                      .on_conflict_do_nothing().cte("intent"))
    return req, others


def _answered_batch(shape: Shape, guard: CTE, value: Source) -> tuple[CTE, list[CTE]]:
    """:func:`answered_ctes` for every answer of a batch (``value``: its rows' columns):
    a request is inserted only with a row of ``guard``, and its run and its intent only
    with the request (matched by its id, which its columns hold)."""
    run, request, intent, checks = shape
    assert "id" in request, "a batch's requests are matched by their ids"
    req = _live_request("postgresql", request, checks, select(guard).exists(), value=value) \
        .returning(_X.c.id).cte("req")
    made = value("x_id", _X.c.id.type).in_(select(req.c.id))
    others = [insert(_R).from_select(list(run), _values(_R, "r", run, value).where(made))
              .cte("run")]
    if intent is not None:
        others.append(postgresql.insert(_E).from_select(
            list(intent), _values(_E, "e", intent, value).where(made))
            .on_conflict_do_nothing().cte("intent"))
    return req, others


def _values(table: Table, prefix: str, cols: tuple[str, ...], value: Source) -> Any:
    """``SELECT <the values of cols>``, to insert only WHERE something holds."""
    return select(*(b.label(c) for c, b in _binds(table, prefix, cols, value).items()))


@functools.cache
def _alone(kind: Any, shape: Any) -> Any:
    """PostgreSQL: a :class:`Rider`'s rows in a statement of their own, answering how
    many rows its first CTE returned."""
    first, others = kind.ctes(shape)
    stmt = select(func.count()).select_from(first)
    for cte in others:
        stmt = stmt.add_cte(cte)
    return fast(stmt)


@functools.cache
def _by_key(checks: tuple[int, bool]) -> Any:
    return fast(select(_X).where(_X.c.token_id == bindparam("tid"),
                                 _X.c.idempotency_key == bindparam("key"),
                                 *_still(_X.c.token_id, checks)))


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
        again: see runtime.record.switches); False when it was not revoked."""
        res = await self.conn.execute(
            update(_K).where(_K.c.name == name, _K.c.revoked_at.is_not(None))
            .values(revoked_at=None, revoked_by=None))
        return bool(res.rowcount == 1)

    # -- requests -------------------------------------------------------------------------
    async def add(self, **values: Any) -> bool:
        """Insert a request; False when its token already has one under its idempotency key."""
        res = await self.conn.execute(self.insert_ignore(ExternalRequest), values)
        return bool(res.rowcount == 1)

    async def add_with_run(self, run: dict[str, Any], checks: Checks = NO_CHECKS,
                           **values: Any) -> bool:
        """Insert a request and its run (``run``: :func:`~store.repos.runs.new_run`'s
        columns); False when its token already has one under its idempotency key or was
        revoked (the run was inserted too: the caller rolls back). On PostgreSQL one
        statement (the run a data-modifying CTE of the request's INSERT)."""
        rows = Answered(run, values, checks=checks)
        if self.dialect != "postgresql":
            return bool(await self.add_answered(rows))
        done = await self.conn.execute(_alone(Answered, rows.shape), rows.params())
        return bool(done.scalar_one() == 1)

    async def add_answered(self, rows: Answered) -> bool | None:
        """Insert a request answered at once (:class:`Answered`): False when its token
        has one under its idempotency key or was revoked (the caller rolls back). On
        PostgreSQL nothing is sent now (None): the rows ride on the statement that chains
        the transaction's audit entries, which raises :class:`~store.errors.KeyTaken` if
        the request is not inserted."""
        if self.dialect == "postgresql":
            return None
        params = rows.params()
        run, request, *intent = _answered_parts(self.dialect, rows.shape)
        await self.conn.execute(run, params)
        if (await self.conn.execute(request, params)).rowcount != 1:
            return False
        for stmt in intent:
            await self.conn.execute(stmt, params)
        return True

    async def add_answered_now(self, rows: Rider) -> None:
        """PostgreSQL: :meth:`add_answered`'s rows (or :meth:`report_kept`'s) in a
        statement of their own (when no chaining statement takes them); raises
        :class:`~store.errors.KeyTaken` if the request is not inserted (what was kept of
        a reported call no longer holds)."""
        done = await self.conn.execute(_alone(type(rows), rows.shape), rows.params())
        if done.scalar_one() != 1:
            raise KeyTaken

    async def report_kept(self, rows: Reported) -> bool | None:
        """Record :class:`Reported`: False when what was kept no longer holds (nothing of
        it written that the caller's rollback does not undo). On PostgreSQL nothing is
        sent now (None): the rows ride on the statement that chains the transaction's
        audit entries, which raises :class:`~store.errors.KeyTaken` if they do not hold."""
        if self.dialect == "postgresql":
            return None
        params = rows.params()
        run, request, execution = Reported.statements(rows.shape)
        await self.conn.execute(run, params)
        if (await self.conn.execute(request, params)).rowcount != 1:
            return False
        return bool((await self.conn.execute(execution, params)).rowcount == 1)

    async def get(self, request_id: str) -> ExternalRecord | None:
        row = (await self.conn.execute(_GET, {"xid": request_id})).first()
        return to_record(ExternalRecord, row)

    async def lock(self, request_id: str) -> ExternalRecord | None:
        """:meth:`get`, holding the row until the transaction ends (after the run's row)."""
        row = (await self.conn.execute(_LOCK, {"xid": request_id})).first()
        return to_record(ExternalRecord, row)

    async def by_key(self, token_id: str, key: str, checks: Checks = NO_CHECKS
                     ) -> ExternalRecord | None:
        """The request ``token_id`` made under ``key``, while that token is live and
        ``checks`` hold (a token read from memory is checked again here: a revoked one
        finds nothing)."""
        row = (await self.conn.execute(_by_key(checks.shape), {
            "tid": token_id, "key": key, **checks.params()})).first()
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
