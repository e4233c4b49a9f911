"""Hot statements without SQLAlchemy's per-statement machinery.

Through SQLAlchemy Core a statement that SQLite answers in ~4 us costs ~100 us of Python
on this project's machines (an execution context, parameter processing, a cursor result
and its metadata, a greenlet switch per await): the measured cost of a decision and of a
step (issue 14's benchmarks). A statement built once (at import, or by a cached
builder) is registered with :func:`fast`; the first time it runs with a given set of
parameter names it is compiled by SQLAlchemy itself, and what SQLAlchemy would do per
call is kept as a plan:
the SQL, where each positional parameter comes from (the caller, a constant bound in the
statement, a column's scalar default) with its type's bind processor, and each result
column's key and result processor. Later calls apply the plan straight to the driver and
return a small result with the parts of SQLAlchemy's ``Result`` the repositories use:

* SQLite: on the sqlite3 connection, on the event loop's thread, where
  :func:`store.private_aiosqlite.inline` allows (a statement that may wait for a lock goes
  through SQLAlchemy, which waits on the driver's thread);
* PostgreSQL: on the asyncpg adapter, as its cursor would say it for SQLAlchemy (its
  prepared statements, kept by the connection's lease; its transaction begun the same
  way), with result processors picked by the types the server described on the first
  execution.

Same SQL, same types in and out, same exceptions (driver errors are wrapped as
SQLAlchemy's; a connection the server ended is invalidated, as SQLAlchemy would), same
transactions. Anything a plan does not cover (an ``IN`` list the caller passes, a
callable default, several parameter sets at once on PostgreSQL) goes through SQLAlchemy
unchanged. ``tests/unit/test_fastsql.py`` compares every planned ``SELECT`` with
SQLAlchemy's own answer on both databases.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from operator import itemgetter
from typing import Any, TypeVar, cast

from approvald.store import private_aiosqlite, private_sqlalchemy
from approvald.store.liveness import server_gone
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.dml import ValuesBase

Processor = Callable[[Any], Any] | None
Params = Mapping[str, Any] | list[dict[str, Any]] | None
_CALLER = object()  # a plan's parameter slot filled from the caller's parameters
_NONE: Mapping[str, Any] = {}  # no parameters (never changed)


class _Plan:
    __slots__ = ("parameters", "procs", "reads", "resolved", "row", "rows", "slots", "sql",
                 "types")

    def __init__(self, sql: str, slots: list[tuple[str, Any, Processor]],
                 keys: tuple[str, ...], types: tuple[Any, ...]) -> None:
        self.sql = sql
        # SQLite: runs on the loop's thread outside a transaction too (a WAL read)
        self.reads = private_aiosqlite.reads(sql)
        self.slots = slots  # (parameter name, _CALLER or the processed constant, processor)
        # the caller's parameters in the driver's order, processed: one call (built once)
        self.parameters: Callable[[Mapping[str, Any]], tuple[Any, ...]] = _parameters(slots)
        # result columns, keyed as SQLAlchemy names them in a Row's _mapping
        self.row = type("Row", (Row,), {"__slots__": (), "_keys": keys})
        self.types = types  # their SQLAlchemy types
        self.procs: tuple[Processor, ...] | None = None
        self.rows: Callable[[Sequence[Any]], list[Row]] = self._unresolved
        self.resolved = False

    def resolve(self, dialect: Dialect, coltypes: list[Any] | None = None) -> None:
        """Each result column's processor, as SQLAlchemy picks it: on PostgreSQL by the
        type the server described (known after a first execution), on SQLite without."""
        procs = tuple(result_processor(t, dialect, c) for t, c in
                      zip(self.types, coltypes or [None] * len(self.types), strict=True))
        self.procs = procs if any(p is not None for p in procs) else None
        self.rows = _rows(self.row, self.procs)
        self.resolved = True

    def _unresolved(self, fetched: Sequence[Any]) -> list[Row]:
        raise AssertionError("a plan's rows read before its result types were resolved")


def _parameters(slots: list[tuple[str, Any, Processor]]
                ) -> Callable[[Mapping[str, Any]], tuple[Any, ...]]:
    """``params -> tuple`` for a plan's slots, built once as one expression: the caller's
    values through their processors (a processor's inline expression where it has one:
    no call per value), constants as they are (no loop, no list per call)."""
    env: dict[str, Any] = {}
    items = []
    for i, (name, const, proc) in enumerate(slots):
        if const is not _CALLER:
            env[f"c{i}"] = const
            items.append(f"c{i}")
            continue
        inline = _inline(proc, i, f"x{i}", f"(x{i} := params[{name!r}])", env, bind=True)
        if inline is not None:
            items.append(inline)
        elif proc is not None:
            env[f"p{i}"] = proc
            items.append(f"p{i}(params[{name!r}])")
        else:
            items.append(f"params[{name!r}]")
    comma = "," if len(items) == 1 else ""
    return cast(Callable[[Mapping[str, Any]], tuple[Any, ...]],
                _build(env, "params", f"return ({', '.join(items)}{comma})"))


def processed(fields: Mapping[str, Any], dialect: Dialect
              ) -> Callable[[Mapping[str, Any]], tuple[Any, ...]]:
    """``values -> tuple``: the values named ``fields``' keys, each through its type's
    bind processor on ``dialect``, as a plan binds them (one call, built once)."""
    return _parameters([(name, _CALLER, bind_processor(type_, dialect))
                        for name, type_ in fields.items()])


def _rows(row: type[Row], procs: tuple[Processor, ...] | None, *, inline: bool = True
          ) -> Callable[[Sequence[Any]], list[Row]]:
    """``fetched -> rows`` for a plan's result columns, built once: only the columns
    that have a processor are touched (a long read's rows: issue 51), None left as is,
    each by its processor's inline expression where it has one (no call per value)."""
    if procs is None:
        return lambda fetched: list(map(row, fetched))
    env: dict[str, Any] = {"row": row, "_width": _checked_width}
    names = [f"v{i}" for i in range(len(procs))]
    values = []
    for i, p in enumerate(procs):
        expr = _inline(p, i, f"v{i}", f"v{i}", env, bind=False) if inline else None
        if p is None:
            values.append(f"v{i}")
        elif expr is not None:
            values.append(f"(None if v{i} is None else {expr})")
        else:
            env[f"p{i}"] = p
            values.append(f"(None if v{i} is None else p{i}(v{i}))")
    # unpacking checks each row's width; the message says what was wrong
    body = (f"try:\n        return [row(({', '.join(values)},)) for {', '.join(names)}, in "
            f"fetched]\n    except ValueError:\n        for r in fetched:\n"
            f"            _width(r, {len(procs)})\n        raise")
    return cast(Callable[[Sequence[Any]], list[Row]], _build(env, "fetched", body))


def _inline(proc: Processor, i: int, var: str, first: str, env: dict[str, Any], *,
            bind: bool) -> str | None:
    """``proc``'s inline expression (``store/types.py``: :func:`~store.types.inlined`)
    for slot or column ``i``, its value in ``var`` (``first``: where it is read first),
    its names added to ``env``; None if it has none, or if the expression does not
    answer its probes (and None, for a bound value) as ``proc`` itself does."""
    spec = getattr(proc, "inline", None)
    if spec is None:
        return None
    template: str = spec[0]
    names, probes = spec[1], spec[2]
    own = {k: f"_{k}_{i}" for k in names}
    expr = template.format(v=var, p=f"p{i}", t=f"t{i}", first="\x00", **own)
    scope = {f"p{i}": proc, **{own[k]: v for k, v in names.items()}}
    # read as the plan reads it: a bound value where it is read first, a result's before
    body = f"return {expr.replace(chr(0), f'({var} := arg)')}" if bind else \
        f"{var} = arg\n    return {expr.replace(chr(0), var)}"
    check = _build(dict(scope), "arg", body)
    for probe in (*probes, None) if bind else probes:
        try:
            if not same(check(probe), cast(Callable[[Any], Any], proc)(probe)):
                return None
        except Exception:
            return None
    env.update(scope)
    return expr.replace("\x00", first)


def same(a: Any, b: Any) -> bool:
    """The same value, of the same type, in the same time zone."""
    return type(a) is type(b) and a == b and getattr(a, "tzinfo", None) == getattr(
        b, "tzinfo", None)


def _checked_width(r: Any, width: int) -> Any:
    if len(r) != width:
        raise ValueError(f"a row of {len(r)} columns, not {width}")
    return r


def _build(env: dict[str, Any], arg: str, body: str) -> Callable[[Any], Any]:
    """A function of ``arg`` running ``body`` with ``env``'s names bound, compiled once.
    ``body`` is made by this module from slot indices and ``repr`` of parameter names
    (never a caller's text)."""
    code = f"def _f({arg}, {', '.join(f'{k}={k}' for k in env)}):\n    {body}\n"
    scope: dict[str, Any] = {}
    exec(compile(code, f"{__file__} (a plan)", "exec"), dict(env), scope)
    return cast(Callable[[Any], Any], scope["_f"])


def bind_processor(type_: Any, dialect: Dialect) -> Processor:
    """``type_``'s bind processor on ``dialect``: its plan-path one where it has one
    (``store/types.py``: the same values, fewer calls), else SQLAlchemy's."""
    impl = type_.dialect_impl(dialect)
    mine = getattr(impl, "planned_bind", None)
    return cast(Processor, mine(dialect) if mine is not None else impl.bind_processor(dialect))


def result_processor(type_: Any, dialect: Dialect, coltype: Any) -> Processor:
    """The same for a result column (``coltype``: what the driver described, if known)."""
    impl = type_.dialect_impl(dialect)
    mine = getattr(impl, "planned_result", None)
    return cast(Processor, mine(dialect, coltype) if mine is not None
                else impl.result_processor(dialect, coltype))


def _plan(stmt: ClauseElement, dialect: Dialect, keys: frozenset[str]) -> _Plan | None:
    """What SQLAlchemy would do for ``stmt`` with parameters named ``keys``, or None
    where this module would have to guess (then the statement goes through SQLAlchemy)."""
    column_keys = sorted(keys) if isinstance(stmt, ValuesBase) else None
    compiled: Any = stmt.compile(dialect=dialect, column_keys=column_keys)
    if not compiled.positional or compiled.update_prefetch or compiled.escaped_bind_names:
        return None
    by_name = {name: bp for bp, name in compiled.bind_names.items()}
    if any(bp.expanding and (bp.key in keys or name in keys) for name, bp in by_name.items()):
        return None  # an IN list the caller passes: its SQL changes with its length
    defaults = {c.key: c.default for c in compiled.insert_prefetch}
    if any(d is None or not d.is_scalar for d in defaults.values()):
        return None  # a callable default: SQLAlchemy computes it per row
    # constant IN lists rendered once, as SQLAlchemy renders them per call
    try:
        state = compiled.construct_expanded_state({k: None for k in keys})
    except sa_exc.InvalidRequestError:  # a parameter is missing: SQLAlchemy will say which
        return None
    slots: list[tuple[str, Any, Processor]] = []
    for name in state.positiontup:
        bp = by_name.get(name)
        if bp is None:
            bp = by_name.get(name.rsplit("_", 1)[0])
        if bp is None:
            return None
        proc = bind_processor(bp.type, dialect)
        if name in by_name and (bp.key in keys or name in keys):
            slots.append((bp.key if bp.key in keys else name, _CALLER, proc))
            continue
        if name in defaults:
            value = defaults[name].arg
        elif name not in by_name:  # one item of a constant IN list
            value = state.parameters[name]
        elif bp.callable is not None or bp.required:
            return None
        else:
            value = bp.value
        slots.append((name, proc(value) if proc is not None and value is not None else value,
                      None))
    cols = private_sqlalchemy.result_columns(compiled)
    plan = _Plan(state.statement, slots, tuple(c.keyname for c in cols),
                 tuple(c.type for c in cols))
    if dialect.name != "postgresql":  # PostgreSQL's wait for the server's description
        plan.resolve(dialect)
    return plan


class Prepared:
    """A statement registered with :func:`fast`; its plans are compiled on first use, one
    per dialect and set of parameter names (at most a handful)."""

    __slots__ = ("plans", "stmt")

    def __init__(self, stmt: Any) -> None:
        self.stmt = stmt
        # by (dialect name, parameter names); read directly by Conn.execute
        self.plans: dict[tuple[str, frozenset[str]], _Plan | None] = {}

    def plan(self, dialect: Dialect, keys: frozenset[str]) -> _Plan | None:
        key = (dialect.name, keys)
        try:
            return self.plans[key]
        except KeyError:
            plan = self.plans[key] = _plan(self.stmt, dialect, keys)
            return plan


def plans_for(dialect: Dialect) -> Dialect | None:
    """``dialect`` if statements can run by plan on it: SQLite's, and asyncpg's where
    SQLAlchemy's adapter has the cursor call this module uses (else all goes through
    SQLAlchemy, as it would without this module)."""
    if dialect.name == "sqlite":
        return dialect
    if dialect.driver == "asyncpg" and not private_sqlalchemy.missing():
        return dialect
    return None


# by the statement itself, hashed by identity (object's own hash, in C: looked up with
# one call per statement, none to take its id first)
_PREPARED: dict[ClauseElement, Prepared] = {}
S = TypeVar("S", bound=ClauseElement)


def fast(stmt: S) -> S:
    """Register a statement built once (at import, or by a cached builder) for the plan
    path; returns it unchanged. The registry keeps it alive. A statement hashed otherwise
    than by identity (a column expression, whose ``==`` makes SQL) is refused."""
    if type(stmt).__hash__ is not object.__hash__:
        raise TypeError(f"{type(stmt).__name__} is not hashed by identity: not registered")
    _PREPARED.setdefault(stmt, Prepared(stmt))
    return stmt


class Row(tuple[Any, ...]):
    """A result row: a tuple, with columns by attribute and ``_mapping`` as on
    SQLAlchemy's ``Row``."""

    __slots__ = ()
    _keys: tuple[str, ...] = ()

    @property
    def _mapping(self) -> dict[str, Any]:
        return dict(zip(self._keys, self, strict=True))

    def __getattr__(self, name: str) -> Any:
        try:
            return self[self._keys.index(name)]
        except ValueError:
            raise AttributeError(name) from None


class Rows(tuple[list[Row], int]):
    """The parts of SQLAlchemy's ``CursorResult`` the repositories use. A pair (its rows,
    its rowcount), so that making one, once a statement, calls no Python (issue 50)."""

    __slots__ = ()
    rowcount: int = cast(int, property(itemgetter(1)))  # read in C: no Python call

    def __iter__(self) -> Iterator[Row]:  # type: ignore[override]
        return iter(self[0])

    def all(self) -> list[Row]:
        return list(self[0])

    def first(self) -> Row | None:
        rows = self[0]
        return rows[0] if rows else None

    def one(self) -> Row:
        rows = self[0]
        if len(rows) != 1:
            raise sa_exc.NoResultFound("No row was found when one was required") \
                if not rows else sa_exc.MultipleResultsFound("Multiple rows were found")
        return rows[0]

    def scalar_one(self) -> Any:
        return self.one()[0]

    def scalar_one_or_none(self) -> Any:
        rows = self[0]
        if len(rows) > 1:
            raise sa_exc.MultipleResultsFound("Multiple rows were found")
        return rows[0][0] if rows else None


SQLITE_BUSY = 5


async def begin_immediate(raw: Any, dialect: Dialect, busy_timeout_ms: int) -> None:
    """``BEGIN IMMEDIATE`` on a write connection whose own busy timeout is 0.

    When SQLite's write lock is free (always, unless another process is writing) it is
    taken right here in microseconds: no hop to the driver's thread and back, which costs
    two turns of a busy event loop while this process's write lock is held. When another
    process holds it, the BEGIN is said again on the driver's thread, waiting up to
    ``busy_timeout_ms`` as any other connection would, and ends as that would: in
    SQLAlchemy's ``OperationalError`` (retryable) if the lock stays taken."""
    # the sqlite3 connection read in C (aiosqlite's ``_conn`` property and a helper were
    # two Python calls a write), refused as that property refuses it once closed
    db = private_aiosqlite.connection_of(raw)
    if db is None:
        raise ValueError("no active connection")
    try:
        db.execute("BEGIN IMMEDIATE")
        return
    except sqlite3.OperationalError as err:
        if err.sqlite_errorcode & 0xFF != SQLITE_BUSY:
            raise sa_exc.DBAPIError.instance("BEGIN IMMEDIATE", (), err, sqlite3.Error,
                                             dialect=dialect) from err

    # the lock is taken by another process: wait for it on the driver's thread, as any
    # other connection would (three round trips, but only when another process writes)
    try:
        await raw.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
        try:
            await raw.execute("BEGIN IMMEDIATE")
        finally:
            await raw.execute("PRAGMA busy_timeout=0")
    except sqlite3.Error as err:
        raise sa_exc.DBAPIError.instance("BEGIN IMMEDIATE", (), err, sqlite3.Error,
                                         dialect=dialect) from err


async def on_driver_thread(raw: Any, sql: str, dialect: Dialect) -> None:
    """Say ``sql`` (``BEGIN IMMEDIATE``, ``COMMIT``: statements that may wait, for the
    lock or for the disk) on the driver connection's own thread, as SQLAlchemy would, with
    a driver error raised as SQLAlchemy's (``database is locked`` is then retryable)."""
    try:
        await private_aiosqlite.say(raw, sql)  # one round trip to its thread
    except sqlite3.Error as err:
        raise sa_exc.DBAPIError.instance(sql, (), err, sqlite3.Error,
                                         dialect=dialect) from err


class Conn:
    """A transaction's connection: a statement registered with :func:`fast` runs by its
    plan where it can, anything else through SQLAlchemy. A plain read on SQLite starts
    with the driver's connection alone and opens a SQLAlchemy connection only if a
    statement needs one (``open_conn``)."""

    __slots__ = ("_adapted", "_conn", "_dialect", "_kept", "_open", "_pg", "_raw", "sent",
                 "through")

    def __init__(self, dialect: Dialect | None, *, conn: AsyncConnection | None = None,
                 raw: Any = None, adapted: Any = None, kept: dict[str, Any] | None = None,
                 open_conn: Callable[[], Awaitable[AsyncConnection]] | None = None) -> None:
        self._dialect = dialect  # None: no plans
        self._pg = dialect is not None and dialect.name == "postgresql"
        self._conn = conn
        self._raw = raw
        self._adapted = adapted  # PostgreSQL: conn's asyncpg adapter, when known already
        self._kept = kept  # PostgreSQL: its prepared statements, kept by its lease
        self._open = open_conn
        self.sent = 0  # statements given to execute() (a write sent alone checks it)
        # the SQLAlchemy connection was asked for (a statement went through it, maybe):
        # else it cannot be in a transaction of its own (SQLite's write asks it only then)
        self.through = False

    def prime(self, stmt: Any, keys: frozenset[str]) -> None:
        """Make ``stmt``'s plan for parameters named ``keys`` now (where plans run here
        and ``stmt`` is registered with :func:`fast`), as its first execution would:
        callable from a worker thread (no event loop, no connection), so that a statement
        whose compilation takes tens of milliseconds does not stall the event loop's
        thread meanwhile (issue 50: a group commit's statement, for each rider shape)."""
        prepared = _PREPARED.get(stmt) if self._dialect is not None else None
        if prepared is not None and prepared.stmt is stmt:
            assert self._dialect is not None
            prepared.plan(self._dialect, keys)

    async def connection(self) -> AsyncConnection:
        """The SQLAlchemy connection, opened now if this read had none yet."""
        self.through = True
        if self._conn is None:
            assert self._open is not None
            self._conn = await self._open()
        return self._conn

    async def execute(self, stmt: Any, params: Params = None) -> Any:
        self.sent += 1
        dialect = self._dialect
        prepared = _PREPARED.get(stmt) if dialect is not None else None
        if prepared is not None and prepared.stmt is stmt:
            assert dialect is not None
            # one parameter set (a dict, as nearly always: no call to tell), or several
            many = params.__class__ is not dict and isinstance(params, list)
            given: Any = params  # (a list when ``many``: no cast to call)
            first: Any = (given[0] if given else None) if many else given or _NONE
            if first is not None:
                key = (dialect.name, frozenset(first))
                try:
                    plan = prepared.plans[key]
                except KeyError:
                    plan = prepared.plan(dialect, key[1])
                if plan is None:
                    pass
                elif self._pg:
                    if not many:
                        return await self._run_pg(plan, first)
                else:
                    # may it run right here (private_aiosqlite.inline_connection, read
                    # with what the plan knows of its SQL: no call)
                    db = private_aiosqlite.connection_of(self._raw or self._driver())
                    if db is not None and (db.in_transaction or plan.reads):
                        if many:
                            return self._run_many(db, plan, params)
                        # one statement, here rather than in a method: one call fewer
                        args = plan.parameters(first)
                        try:
                            cur = db.execute(plan.sql, args)
                            try:
                                fetched = cur.fetchall() if cur.description else []
                                rowcount = cur.rowcount
                            finally:
                                cur.close()
                        except sqlite3.Error as err:
                            raise _sqlite_error(plan, args, err, dialect) from err
                        return Rows((plan.rows(fetched) if fetched else [], rowcount))
        self.through = True
        return await (self._conn or await self.connection()).execute(stmt, params)

    def _driver(self) -> Any:
        assert self._conn is not None
        sync = self._conn.sync_connection
        assert sync is not None
        self._raw = sync.connection.driver_connection
        return self._raw

    async def _run_pg(self, plan: _Plan, params: Mapping[str, Any]) -> Rows:
        """One statement by its plan on PostgreSQL: said on the asyncpg adapter as its
        cursor would (the same prepared statements; it begins the adapter's transaction
        first, as it does for SQLAlchemy: :func:`store.private_sqlalchemy.execute`),
        skipping the cursor, the execution context and the result machinery around it."""
        conn, dialect, adapted = self._conn, self._dialect, self._adapted
        assert conn is not None and dialect is not None
        if adapted is None:
            assert conn.sync_connection is not None
            adapted = conn.sync_connection.connection.dbapi_connection
            assert adapted is not None
        args = plan.parameters(params)
        try:
            fetched, attributes, rowcount = await private_sqlalchemy.execute(
                adapted, plan.sql, args, self._kept)
            if not plan.resolved:
                plan.resolve(dialect, [a.type.oid for a in attributes or ()] or None)
        except dialect.loaded_dbapi.Error as err:
            # as SQLAlchemy would: its exception class, and a connection the server ended
            # invalidated (the pool replaces it; a transaction that never reached COMMIT
            # is then retryable: see store.db.is_retryable)
            gone = server_gone(err) or adapted.driver_connection.is_closed()
            if gone:
                await conn.invalidate()
            raise sa_exc.DBAPIError.instance(
                plan.sql, args, err, dialect.loaded_dbapi.Error, dialect=dialect,
                connection_invalidated=gone) from err
        except BaseException:
            # cancelled (or exiting) mid-statement: as SQLAlchemy does, the connection is
            # never used again. Cancelled while its BEGIN was answered, asyncpg holds the
            # transaction as open and the adapter does not: back in the pool, the next
            # transaction on it would be a savepoint inside this one that never commits
            with contextlib.suppress(Exception):  # what is raised is the cancellation
                await asyncio.shield(conn.invalidate())
            raise
        return Rows((plan.rows(fetched) if fetched else [], rowcount))

    def _run_many(self, db: sqlite3.Connection, plan: _Plan, params: Any) -> Rows:
        args = [plan.parameters(p) for p in params]
        try:
            cur = db.executemany(plan.sql, args)
            try:
                fetched = cur.fetchall() if cur.description else []
                rowcount = cur.rowcount
            finally:
                cur.close()
        except sqlite3.Error as err:
            assert self._dialect is not None
            raise _sqlite_error(plan, args, err, self._dialect) from err
        return Rows((plan.rows(fetched) if fetched else [], rowcount))


def _sqlite_error(plan: _Plan, args: Any, err: sqlite3.Error, dialect: Dialect) -> Exception:
    """A sqlite3 error as SQLAlchemy raises it (its exception class)."""
    return cast(Exception, sa_exc.DBAPIError.instance(plan.sql, args, err, sqlite3.Error,
                                                      dialect=dialect))
