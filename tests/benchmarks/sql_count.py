"""Count the statements a ``serve`` process sends its database (a benchmark instrument).

``bench_agent`` (which ``serve`` imports in the benchmarks) calls :func:`install` when
``BENCH_SQL_COUNT`` names a directory: every asyncpg call that sends a statement is
counted by its SQL (``BEGIN`` and ``COMMIT`` included: asyncpg says them with
``Connection.execute``), and each ``SIGUSR1`` writes the running counts to
``<dir>/<pid>.json``. The benchmark signals before the clicks and after the last run
completed, and reads the difference (:func:`snapshot`, :func:`per_kind`): the figure
``statements per approval`` says whether a change made the decision path do less, in
one process or spread over several, without a profiler's cost in the timings (a
counter per statement, about a microsecond).

On SQLite (``install(directory, sqlite=True)``) every statement the sqlite3 connections
run is counted through sqlite3's own trace callback (``BEGIN`` and ``COMMIT``
included), whichever path sent it (SQLAlchemy, or the fast path straight on the
connection); the literal values the trace shows are replaced by ``?`` so that one
statement is counted under one text.

With ``BENCH_SQL_WHERE=1`` each statement is also counted by where it came from
(:func:`origin`: the store function that sent it and the first function of ``runtime``
or ``bot`` above it), written to ``<dir>/<pid>.where.json`` beside the counts and read
with :func:`snapshot_where`: which part of ``serve`` a statement more is owed to (a walk
up the stack per statement: for a breakdown, not for timings); a statement sent under
a run's step checkpoint is marked so (:data:`STEP`, :func:`of_steps`), and a write sent
alone in autocommit is counted by origin too, under :data:`AUTOCOMMIT`.
"""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

_COUNTS: collections.Counter[str] = collections.Counter()
_WHERE: collections.Counter[str] = collections.Counter()  # "origin\tsql" (BENCH_SQL_WHERE)
_ROOT = str(Path(__file__).resolve().parents[2]) + os.sep  # the checkout approvald runs from
_OWN = tuple(_ROOT + part + os.sep for part in ("runtime", "bot"))
_STORE = _ROOT + "store" + os.sep
_RUNNER = _ROOT + os.path.join("runtime", "runs", "runner.py")
STEP = "[a run's step]"  # the mark :func:`origin` adds under a step's checkpoint


def install(directory: str, *, sqlite: bool = False) -> None:
    where = os.environ.get("BENCH_SQL_WHERE") == "1"
    if sqlite:
        _install_sqlite()
    else:
        _install_asyncpg(where)
    target = Path(directory) / f"{os.getpid()}.json"

    _install_process()

    def dump(signum: int, frame: Any) -> None:
        _PROCESS["gc cpu us"] = round(_GC_CPU[0] * 1e6)
        _write(target.with_suffix(".proc.json"), _PROCESS)  # first, like the next
        if where:  # first: once the counts are there, so is this
            _write(target.with_suffix(".where.json"), _WHERE)
        _write(target, _COUNTS)

    signal.signal(signal.SIGUSR1, dump)


# what else the process did (:func:`snapshot_process`): its collections by generation
# and the CPU they took, the wake-ups it heard from other replicas and sent them, by kind
_PROCESS: collections.Counter[str] = collections.Counter()
_GC_CPU = [0.0]


def _install_process() -> None:
    import gc
    import time

    started = [0.0]

    def collected(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started[0] = time.process_time()
        else:
            _GC_CPU[0] += time.process_time() - started[0]
            _PROCESS[f"gc gen{info['generation']}"] += 1

    gc.callbacks.append(collected)
    try:
        from approvald.store import wakeups
    except ImportError:
        return
    received, publish = wakeups.Wakeups._received, wakeups.Wakeups.publish

    def heard(self: Any, conn: Any, pid: int, channel: str, payload: str) -> None:
        origin, _, rest = payload.partition("|")
        mine = origin == self.origin
        _PROCESS[f"notified {'own' if mine else 'heard'} {rest.partition('|')[0]}"] += 1
        received(self, conn, pid, channel, payload)

    def told(self: Any, kind: str, key: str = "") -> None:
        if not self._relaying and self._tasks:
            _PROCESS[f"notified sent {kind}"] += 1
        publish(self, kind, key)

    wakeups.Wakeups._received = heard  # type: ignore[method-assign]
    wakeups.Wakeups.publish = told  # type: ignore[method-assign]


def snapshot_process(directory: Path, pid: int) -> dict[str, int]:
    """What :func:`_install_process` counted in ``pid`` as it last wrote it."""
    path = directory / f"{pid}.proc.json"
    return dict(json.loads(path.read_text())) if path.exists() else {}


def _write(target: Path, counts: collections.Counter[str]) -> None:
    tmp = target.with_suffix(".tmp")
    tmp.write_text(json.dumps(counts))
    tmp.replace(target)  # the reader never sees half a file


def origin(depth: int = 2) -> str:
    """Where the statement being sent comes from: ``store/<file>:<function>`` (the
    outermost store frame: the repository method, or the transaction's BEGIN or COMMIT in
    ``store/db.py``) ``< runtime/<file>:<function>`` (the first frame of ``runtime`` or
    ``bot`` above it, the part that asked). Coroutine frames are linked while they run,
    and SQLAlchemy's greenlet is entered from the awaiting coroutine, so the walk reaches
    the caller whichever path (planned or SQLAlchemy's) sent the statement."""
    f: Any = sys._getframe(depth)
    store = own = ""
    while f is not None:
        name = f.f_code.co_filename
        if name.startswith(_STORE):
            store = f"{name[len(_ROOT):]}:{f.f_code.co_name}"
        elif name.startswith(_OWN):
            own = f"{name[len(_ROOT):]}:{f.f_code.co_name}"
            break
        f = f.f_back
    while f is not None:  # sent by a run's step checkpoint, further up?
        if f.f_code.co_name == "_checkpoint" and f.f_code.co_filename == _RUNNER:
            return f"{store or '?'} < {own or '?'} {STEP}"
        f = f.f_back
    return f"{store or '?'} < {own or '?'}"


def of_steps(origin_and_sql: str) -> bool:
    """Whether a :func:`snapshot_where` key was sent by a run's step checkpoint (the
    runner's ``_checkpoint``: a step's events, the results in it, their audit entries),
    as opposed to the decision, the resume, the call's intent and the card's redraw."""
    return origin_and_sql.split("\t", 1)[0].endswith(STEP)


# not a statement: the count of writes sent outside a transaction, kept beside them
AUTOCOMMIT = "#autocommit writes"
_WRITE = re.compile(r"\b(INSERT INTO|UPDATE|DELETE FROM)\b")
_LITERAL = re.compile(r"'(?:[^']|'')*'|\b\d+(?:\.\d+)?\b|X'[0-9A-Fa-f]*'")


def _install_sqlite() -> None:
    import sqlite3
    import threading

    lock = threading.Lock()  # the callback runs on the connections' threads too
    connect = sqlite3.connect

    def traced(sql: str) -> None:
        if sql.startswith("--"):  # a trigger's statement, part of the one that fired it
            return
        with lock:
            _COUNTS[_LITERAL.sub("?", sql)] += 1

    def connected(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        conn = connect(*args, **kwargs)
        conn.set_trace_callback(traced)
        return conn

    sqlite3.connect = connected  # type: ignore[assignment]


def _install_asyncpg(where: bool = False) -> None:
    import asyncpg.connection  # type: ignore[import-untyped]
    import asyncpg.prepared_stmt  # type: ignore[import-untyped]

    def counted(cls: Any, name: str, sql_of: Any, conn_of: Any) -> None:
        original = getattr(cls, name)

        async def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            sql = sql_of(self, args)
            _COUNTS[sql] += 1
            here = origin() if where else ""
            if where:
                _WHERE[f"{here}\t{sql}"] += 1
            if _WRITE.search(sql) and not conn_of(self).is_in_transaction():
                _COUNTS[AUTOCOMMIT] += 1  # a transaction of its own, with no BEGIN
                if where:
                    _WHERE[f"{here}\t{AUTOCOMMIT}"] += 1
            return await original(self, *args, **kwargs)

        setattr(cls, name, call)

    statement = asyncpg.prepared_stmt.PreparedStatement
    for name in ("fetch", "fetchrow", "fetchval", "executemany"):
        counted(statement, name, lambda self, args: self._query,
                lambda self: self._connection)
    for name in ("execute", "executemany", "fetch", "fetchrow", "fetchval"):
        counted(asyncpg.connection.Connection, name, lambda self, args: args[0],
                lambda self: self)


def snapshot(directory: Path, pids: Iterable[int]) -> dict[str, int]:
    """The counts of ``pids`` summed, as each last wrote them (empty if none did)."""
    total: collections.Counter[str] = collections.Counter()
    for pid in pids:
        path = directory / f"{pid}.json"
        if path.exists():
            total.update(json.loads(path.read_text()))
    return dict(total)


def snapshot_where(directory: Path, pids: Iterable[int]) -> dict[str, int]:
    """:func:`snapshot` of the counts by origin (``BENCH_SQL_WHERE=1``): ``origin\tsql``."""
    total: collections.Counter[str] = collections.Counter()
    for pid in pids:
        path = directory / f"{pid}.where.json"
        if path.exists():
            total.update(json.loads(path.read_text()))
    return dict(total)


def by_statement(before: dict[str, int], after: dict[str, int]) -> list[tuple[int, str]]:
    """What was sent between two snapshots, statement by statement, most sent first (the
    SQL on one line, a long column list shortened to ``*``): which statements a change
    should look at."""
    sent = [(n - before.get(sql, 0), shape(sql)) for sql, n in after.items()
            if sql != AUTOCOMMIT]
    return sorted(((n, sql) for n, sql in sent if n), key=lambda x: (-x[0], x[1]))


def shape(sql: str) -> str:
    """``sql`` on one line, a SELECT's or RETURNING's list of more than two columns as ``*``
    (two reads of one table differ in their WHERE, not in their columns)."""
    flat = " ".join(sql.split())
    return re.sub(r"\b(SELECT|RETURNING) ((?:DISTINCT )?)([^,() ]+, [^,() ]+(?:, [^,() ]+)+)"
                  r"(?= FROM|$)", r"\1 \2*", flat)


def per_kind(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """What was sent between two snapshots, by the statement's first word (``BEGIN``,
    ``SELECT``, ``WITH``...), and ``all``."""
    kinds: collections.Counter[str] = collections.Counter()
    for sql, n in after.items():
        if sql == AUTOCOMMIT:
            continue
        sent = n - before.get(sql, 0)
        if sent:
            words = sql.split()
            kinds[words[0].upper() if words else "?"] += sent
            kinds["all"] += sent
    return dict(kinds)


def begins(kinds: dict[str, int]) -> int:
    """The BEGINs among :func:`per_kind`'s counts, however asyncpg spelled them:
    ``BEGIN;`` on a connection at the server's default level (one kept checked out
    between transactions, store/leases.py), ``BEGIN ISOLATION LEVEL ...`` on one that
    SQLAlchemy set a level on."""
    return kinds.get("BEGIN", 0) + kinds.get("BEGIN;", 0)


def autocommit_writes(before: dict[str, int], after: dict[str, int]) -> int:
    """How many writes were sent between two snapshots as ONE statement in autocommit
    (``Database.write_one``), on a connection in no transaction: each a transaction of
    its own with no BEGIN, so counted beside the BEGINs as commits (PostgreSQL)."""
    return after.get(AUTOCOMMIT, 0) - before.get(AUTOCOMMIT, 0)
