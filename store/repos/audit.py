"""Audit log rows and the chain head. Hashing rules live in :mod:`runtime.record.audit`."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Sequence
from datetime import datetime
from typing import Any, cast

from approvald.store.errors import KeyTaken, NothingWritten
from approvald.store.fastsql import fast
from approvald.store.models import AuditCheckpoint, AuditEntry, AuditFold, AuditHead, AuditRequest
from approvald.store.records import AuditRecord
from approvald.store.repos.base import Repo
from approvald.store.repos.external import RIDER_ROWS, Encode, ExternalRepo, Rider
from approvald.store.rowsets import encoder, rowset
from sqlalchemy import (
    Integer,
    String,
    Table,
    and_,
    bindparam,
    case,
    delete,
    func,
    literal,
    literal_column,
    or_,
    select,
    union_all,
    update,
)
from sqlalchemy import cast as sql_cast
from sqlalchemy.exc import DBAPIError

GENESIS = "0" * 64
_T = cast(Table, AuditEntry.__table__)
_H = cast(Table, AuditHead.__table__)
_C = cast(Table, AuditCheckpoint.__table__)
_CHECKPOINT = fast(select(_C.c.seq, _C.c.hash, _C.c.key_id, _C.c.unkeyed_until, _C.c.mac)
                   .where(_C.c.id == 1))
# a checkpoint only moves forward: two verifiers racing leave the further one
_ADVANCE = fast(update(_C).where(_C.c.id == 1, _C.c.seq <= bindparam("seq")).values(
    seq=bindparam("seq"), hash=bindparam("hash"), key_id=bindparam("key_id"),
    unkeyed_until=bindparam("unkeyed_until"), mac=bindparam("mac")))
_R = cast(Table, AuditRequest.__table__)
_F = cast(Table, AuditFold.__table__)
_FOLD = fast(select(_F.c.through, _F.c.folded, _F.c.unkeyed_until, _F.c.key_id, _F.c.mac)
             .where(_F.c.id == 1))
# the fold moves only from the state its writer read: two readers racing, one writes
_MOVE_FOLD = fast(update(_F).where(_F.c.id == 1, _F.c.through == bindparam("was_through"),
                                   _F.c.mac == bindparam("was_mac")).values(
    through=bindparam("through"), folded=bindparam("folded"),
    unkeyed_until=bindparam("unkeyed_until"), key_id=bindparam("key_id"),
    mac=bindparam("mac")))
_FOLDED = fast(select(_R.c.seq, _R.c.folded, _R.c.state, _R.c.key_id, _R.c.mac)
               .where(_R.c.seq > bindparam("after")).order_by(_R.c.seq)
               .limit(bindparam("n")))
_ANY_FOLDED = fast(select(_R.c.seq).limit(1))
_INSERT_FOLDED = fast(_R.insert())
_COUNT_UPTO = fast(select(func.count()).select_from(_T).where(_T.c.seq <= bindparam("upto")))
_ONE = fast(select(_T).where(_T.c.seq == bindparam("seq")))
# what a reader of the record takes of an entry (not its chain fields)
RECORD_COLUMNS = ("seq", "at", "action", "actor", "run_id", "approval_id", "details")
_INSERT = fast(_T.insert())
# the time of the entry the head names, in a statement that updates the head (RETURNING):
# the head's own (migration 0025), else (a head moved before it) its entry's, the head's
# seq named with its table, which SQLAlchemy leaves out of a RETURNING on SQLite (where
# ``seq`` alone would be the entries' own: any entry's time)
_HEAD_AT = func.coalesce(_H.c.at, select(_T.c.at).where(
    _T.c.seq == literal_column(f"{_H.name}.seq", Integer)).scalar_subquery()).label("at")
# the no-op SET takes the row lock on PostgreSQL; it returns the head and the time of the
# entry it names (times never run backwards), in the one statement
_LOCK = fast(update(_H).where(_H.c.id == 1).values(seq=_H.c.seq)
             .returning(_H.c.seq, _H.c.hash, _HEAD_AT))
_MOVE = fast(update(_H).where(_H.c.id == 1).values(seq=bindparam("s"), hash=bindparam("h"),
                                       at=bindparam("head_at", type_=_H.c.at.type)))
# PostgreSQL: one entry and the head's move in one statement (a data-modifying CTE runs
# exactly once): the head's lock, the queue every audited commit waits in, is held for a
# round trip less. (SQLite allows no UPDATE in a WITH; its two statements cost no trip.)
_APPEND_ONE = fast(_T.insert().add_cte(
    update(_H).where(_H.c.id == 1).values(seq=bindparam("s"), hash=bindparam("h"),
                                       at=bindparam("head_at", type_=_H.c.at.type))
    .cte("moved")))
# several entries at once (a request answered at once: requested and its answer), the
# same way: their rows as one multi-row INSERT, numbered parameters ``<column>_<i>``
_ROW = ("seq", "at", "action", "actor", "via", "run_id", "approval_id", "digest", "details",
        "key_id", "prev_hash", "hash")
_MANY = 4  # entries one statement takes (past that, the INSERT and the head's move)
# writes one statement sent alone takes together (group commit: about 70 parameters each)
TOGETHER = 8


@functools.cache
def _append_many(n: int) -> Any:
    rows = [{c: bindparam(f"{c}_{i}", type_=_T.c[c].type) for c in _ROW} for i in range(n)]
    return fast(_T.insert().values(rows).add_cte(
        update(_H).where(_H.c.id == 1).values(seq=bindparam("s"), hash=bindparam("h"),
                                       at=bindparam("head_at", type_=_H.c.at.type))
        .cte("moved")))


# PostgreSQL: the condition is in the SET, not the WHERE. A WHERE is first checked on the
# row as the statement's snapshot sees it: while another transaction holds the head, moved
# to the very head guessed but not committed yet, the old row would not match and the
# statement would pass over it without waiting. Matched on id alone, the row is waited
# for, and the SET's condition is worked out on the row as that transaction left it; the
# head returned is the guess's last entry if it moved. If it did not, the head returned is
# the head as it stands, its lock held (SQLite: its writer holds the database): the caller
# chains to it without reading it again, with the time of the entry it names, the head
# row's own: when the statement waited for the transaction that moved the head, its
# snapshot does not see that transaction's entries, but the row is the one it left.
_STILL = and_(_H.c.seq == bindparam("es"), _H.c.hash == bindparam("eh"))
_MOVE_IF = (update(_H).where(_H.c.id == 1)
            .values(seq=case((_STILL, bindparam("s")), else_=_H.c.seq),
                    hash=case((_STILL, bindparam("h")), else_=_H.c.hash),
                    at=case((_STILL, bindparam("head_at", type_=_H.c.at.type)),
                            else_=_H.c.at))
            .returning(_H.c.seq, _H.c.hash, _HEAD_AT))
_MOVE_IF_ALONE = fast(_MOVE_IF)
# a head: (last seq, last hash, the last entry's time: None when there is none)
Head = tuple[int, str, datetime | None]


def _chained_entries(moved: Any, n: int) -> tuple[Any, Any]:
    """The CTE inserting ``n`` entries (parameters ``<column>_<i>``) only if the head's
    move ``moved`` moved it to the last of them, and the count of those it inserted."""
    rows = [select(*(bindparam(f"{c}_{i}", type_=_T.c[c].type).label(c) for c in _ROW))
            .where(select(moved.c.hash).where(moved.c.hash == bindparam("h")).exists())
            for i in range(n)]
    entries = (_T.insert().from_select(list(_ROW), rows[0] if n == 1 else union_all(*rows))
               .returning(_T.c.seq).cte("entries"))
    return entries, select(func.count()).select_from(entries).scalar_subquery()


@functools.cache
def _append_if(n: int) -> Any:
    """The entries and the head's move if the head is still the one guessed, as one
    statement: ``SELECT`` (entries inserted, and the head as the statement left it)."""
    moved = _MOVE_IF.cte("moved")
    _, chained = _chained_entries(moved, n)
    return fast(select(chained, moved.c.seq, moved.c.hash, moved.c.at))


# the mark of a statement sent alone that found what it was written under gone: it fails
# whole (see _append_alone), with this in its error's message
ABORTED = "approvald: nothing written"


@functools.cache
def _append_riding(n: int, kind: Any, shape: Any) -> Any:
    """:func:`_append_if` with a :class:`~store.repos.external.Rider`'s rows (a request
    answered at once, a kept call's report) in the same statement: ``SELECT`` (the rows
    its first CTE returned, the entries inserted). The head moves and the entries are
    inserted only if it is still the one guessed; the rider's rows whether or not (the
    caller appends the entries otherwise). The head is locked only once the rider's
    first CTE has returned its row (the head last, as in every write transaction: a
    statement that locked it first could wait, holding it, for a row whose holder waits
    for the head)."""
    first, others = kind.ctes(shape)
    moved = _MOVE_IF.where(select(first).exists()).cte("moved")
    _, chained = _chained_entries(moved, n)
    done = select(func.count()).select_from(first).scalar_subquery()
    stmt = select(done, chained,
                  *(select(moved.c[c]).scalar_subquery() for c in ("seq", "hash", "at")))
    for cte in others:
        stmt = stmt.add_cte(cte)
    return fast(stmt)


# a group commit's entries, bound as one JSON text (store/rowsets.py), and the
# parameters its statement is planned for
ENTRY_ROWS = "entry_rows"
_ENTRY_FIELDS = {c: _T.c[c].type for c in _ROW}
_ENTRIES = encoder(_ENTRY_FIELDS)
_KEYS = frozenset(("s", "h", "head_at", "es", "eh", "riders", "entries", RIDER_ROWS,
                   ENTRY_ROWS))
# the statements of _append_alone built and planned, by rider kind and shape
_BUILT: set[tuple[Any, ...]] = set()


async def _built(conn: Any, kind: Any, shape: Any) -> tuple[Any, Encode]:
    """:func:`_append_alone`'s statement, built and planned (for ``params``' names) on a
    worker thread the first time: a statement of many CTEs costs 10-20 ms of CPU to build
    and compile, met the first time each rider kind and shape is (a handful in a serve's
    life: one statement serves every batch size, issue 50); with the function making
    the text its riders' rows are bound as."""
    key = (kind, shape)
    if key not in _BUILT:
        await asyncio.to_thread(lambda: conn.prime(_append_alone(kind, shape)[0], _KEYS))
        _BUILT.add(key)
    return _append_alone(kind, shape)


@functools.cache
def _append_alone(kind: Any, shape: Any) -> tuple[Any, Encode]:
    """The rows of any number ``m`` of :class:`~store.repos.external.Rider` of one kind
    and shape and their entries (``n`` each), chained one after the other to the head
    guessed, in ONE statement sent on its own in autocommit, with no transaction to roll
    back what it wrote: ``SELECT`` (the entries inserted, 0); and the function making
    the text its riders' rows are bound as. Its values are bound as two JSON texts, a
    row for each rider (``rider_rows``: :meth:`~store.repos.external.Rider.batched`) and
    for each entry (``entry_rows``, :data:`_ENTRIES`; :mod:`store.rowsets`), with their
    counts (``riders`` = ``m``, ``entries`` = ``m * n``): one statement, so one plan and
    one prepared statement a connection, for every ``m`` and ``n`` (bound as arrays, a
    column each, their encoding was half of an auto decision's Python calls; issue 50:
    a statement for each ``m`` and ``n``, built, planned and prepared the first time
    each was met, stalled a serve's first minutes).

    Unless every rider's first CTE returned its row (as many rows as ``riders``) AND
    every entry was inserted, it fails whole (its last column casts a text naming the
    counts, :data:`ABORTED`, to an integer: an error, so none of its CTEs' rows is
    written; the text depends on the CTEs, so the planner cannot work it out, and fail,
    beforehand). Its rows are locked in the same order as a transaction's: the head
    last, moved only once every rider's first CTE has returned its row. Before any, the
    head guessed is looked for as the statement's snapshot has it (``guessed``, no lock):
    when another process's chaining committed since (most stale guesses), none of the
    riders' rows is written, the statement answers (0, 0) and fails nothing; it fails
    whole only when what it was written under changed while it ran, or a rider's rows do
    not hold (a key taken, a token revoked, a kept call reported elsewhere)."""
    guessed = select(literal(1, Integer).label("one")).where(
        _H.c.id == 1, _STILL).cte("guessed")
    first, others, encode = kind.batched(shape, guessed)
    riders = bindparam("riders", type_=Integer)
    expected = bindparam("entries", type_=Integer)
    done = select(func.count()).select_from(first).scalar_subquery()
    moved = _MOVE_IF.where(done == riders).cte("moved")
    rows = rowset(ENTRY_ROWS, "e", _ENTRY_FIELDS)
    values = select(*(rows.c[c] for c in _ROW)).where(
        select(moved.c.hash).where(moved.c.hash == bindparam("h")).exists())
    entries = _T.insert().from_select(list(_ROW), values).returning(_T.c.seq).cte("entries")
    chained = select(func.count()).select_from(entries).scalar_subquery()
    said = (literal(ABORTED + ": rows ", String) + sql_cast(done, String)
            + literal(" of ", String) + sql_cast(riders, String)
            + literal(", entries ", String) + sql_cast(chained, String))
    stmt = select(chained, case((or_(and_(done == riders, chained == expected),
                                     ~select(guessed).exists()), 0),
                                else_=sql_cast(said, Integer))).add_cte(guessed)
    for cte in others:
        stmt = stmt.add_cte(cte)
    return fast(stmt), encode


def aborted(exc: BaseException) -> bool:
    """Whether ``exc`` is a statement sent alone failing whole (:func:`_append_alone`)."""
    return isinstance(exc, DBAPIError) and ABORTED in str(exc.orig)


@functools.cache
def _records(actions: tuple[str, ...], unasked: tuple[str, ...], since: bool) -> Any:
    stmt = select(*(_T.c[c] for c in RECORD_COLUMNS)).where(
        _T.c.seq > bindparam("after"), _T.c.seq <= bindparam("upto"),
        or_(_T.c.action.in_(actions),
            and_(_T.c.action.in_(unasked), _T.c.approval_id.is_(None))))
    if since:
        stmt = stmt.where(_T.c.at >= bindparam("since"))
    return fast(stmt.order_by(_T.c.seq).limit(bindparam("n")))



_HEAD = fast(select(_H.c.seq, _H.c.hash))


@functools.cache
def _entries(upto: bool, run: bool, since: bool) -> Any:
    """Whole entries past seq ``after`` in seq order, at most ``n`` (up to seq ``upto``,
    of run ``rid``, from time ``since``): one planned statement per shape, every value a
    parameter (:meth:`AuditRepo.iterate` is walked after each step by a chain watcher)."""
    stmt = select(_T).where(_T.c.seq > bindparam("after"))
    if upto:
        stmt = stmt.where(_T.c.seq <= bindparam("upto"))
    if run:
        stmt = stmt.where(_T.c.run_id == bindparam("rid"))
    if since:
        stmt = stmt.where(_T.c.at >= bindparam("since"))
    return fast(stmt.order_by(_T.c.seq).limit(bindparam("n")))

class AuditRepo(Repo):
    async def lock_head(self) -> tuple[int, str, datetime | None]:
        """Lock the chain head row and return (last seq, last hash, the last entry's time:
        None when there is none).

        The no-op UPDATE takes the row lock on PostgreSQL (SQLite's write transaction
        already holds the database lock), so appends are serialized and the chain cannot fork.
        """
        row = (await self.conn.execute(_LOCK)).first()
        if row is None:
            await self.conn.execute(
                self.insert_ignore(AuditHead), {"id": 1, "seq": 0, "hash": GENESIS}
            )
            return await self.lock_head()
        return int(row[0]), str(row[1]), cast("datetime | None", row[2])

    async def append_rows(self, rows: list[dict[str, Any]]) -> None:
        """Insert consecutive entries and move the head to the last one."""
        head = {"s": rows[-1]["seq"], "h": rows[-1]["hash"], "head_at": rows[-1]["at"]}
        if len(rows) == 1 and self.dialect == "postgresql":
            await self.conn.execute(_APPEND_ONE, {**rows[0], **head})
            return
        if len(rows) <= _MANY and self.dialect == "postgresql":
            await self.conn.execute(_append_many(len(rows)), {
                **{f"{c}_{i}": row[c] for i, row in enumerate(rows) for c in _ROW}, **head})
            return
        await self.conn.execute(_INSERT, rows)
        await self.conn.execute(_MOVE, head)

    async def append_if_head(self, rows: list[dict[str, Any]], *, seq: int, hash: str,
                             along: Rider | None = None) -> Head | None:
        """:meth:`append_rows` if the head is still entry ``seq`` with ``hash`` (the entries
        chained to it), without reading it first: None if they were appended; if not
        (nothing was written), the head as it stands, locked as :meth:`lock_head` leaves
        it, so the caller chains to it without reading it again. On PostgreSQL one
        statement; on SQLite,
        whose writer holds the database, the head's move and the rows. ``along``: a
        request answered at once (PostgreSQL), inserted in the same statement whether or
        not the head was still that one; :class:`~store.errors.KeyTaken` if it was not
        inserted (or, for a kept call's report, what was kept no longer holds)."""
        head = {"s": rows[-1]["seq"], "h": rows[-1]["hash"], "head_at": rows[-1]["at"],
                "es": seq, "eh": hash}
        n = len(rows)
        numbered = ({f"{c}_{i}": row[c] for i, row in enumerate(rows) for c in _ROW}
                    if self.dialect == "postgresql" and n <= _MANY else {})
        if along is not None and n <= _MANY:
            done = (await self.conn.execute(_append_riding(n, type(along), along.shape), {
                **numbered, **head, **along.params()})).one()
            if done[0] != 1:
                raise KeyTaken
            return None if done[1] == n else await self._stood(done[2:])
        if along is not None:
            await ExternalRepo(self.conn, self.dialect).add_answered_now(along)
        if numbered:
            done = (await self.conn.execute(_append_if(n), {**numbered, **head})).first()
            if done is not None and done[0] == n:
                return None
            return await self._stood(None if done is None else done[1:])
        moved = (await self.conn.execute(_MOVE_IF_ALONE, head)).first()
        if moved is None or moved[1] != head["h"]:
            return await self._stood(moved)
        await self.conn.execute(_INSERT, rows)
        return None

    async def _stood(self, head: Sequence[Any] | None) -> Head:
        """The head a guessed statement that missed returned (seq, hash, time), locked by
        it; read under its lock when none was returned (no head row)."""
        if head is None or head[0] is None:
            return await self.lock_head()
        return int(head[0]), str(head[1]), cast("datetime | None", head[2])

    async def append_alone(self, rows: list[dict[str, Any]], *, seq: int, hash: str,
                           along: Rider) -> None:
        """:meth:`append_if_head` with ``along``, as ONE statement that writes all or
        nothing (PostgreSQL; the write it is sent in is that statement alone, in
        autocommit): ``along``'s rows and the entries, chained to the head ``seq``,
        ``hash``. :class:`~store.errors.NothingWritten` if it wrote nothing: the head was
        not that one, or ``along``'s rows did not hold (a key taken, a token revoked, a
        kept call reported), or they cannot be one statement (nothing sent then)."""
        await self.append_together([(rows, along)], seq=seq, hash=hash)

    async def append_together(self, members: Sequence[tuple[list[dict[str, Any]], Rider]],
                              *, seq: int, hash: str) -> None:
        """:meth:`append_alone` for several writes at once (group commit: the answers of
        one process that arrived while its statement before was in flight), ONE statement
        that writes all of them or nothing: each member's rider's rows, and its entries
        chained after the member's before it, the first's to the head ``seq``, ``hash``.
        Members of one rider kind and shape, with as many entries each, at most
        :data:`TOGETHER` of them. :class:`~store.errors.NothingWritten` if it wrote
        nothing (the head was not that one, or one member's rows did not hold: the caller
        writes each again on its own, where only that one is refused)."""
        n, along = len(members[0][0]), members[0][1]
        m = len(members)
        if self.dialect != "postgresql" or n > _MANY or m > TOGETHER:
            raise NothingWritten
        for rows, rider in members:
            assert len(rows) == n and type(rider) is type(along) \
                and rider.shape == along.shape, "one kind and shape a statement"
        chain = [row for rows, _ in members for row in rows]
        last = chain[-1]
        params: dict[str, Any] = {
            "s": last["seq"], "h": last["hash"], "head_at": last["at"], "es": seq, "eh": hash,
            "riders": m, "entries": m * n, ENTRY_ROWS: _ENTRIES(chain)}
        try:
            stmt, encode = await _built(self.conn, type(along), along.shape)
            params[RIDER_ROWS] = encode([rider for _, rider in members])
            done = (await self.conn.execute(stmt, params)).one()
        except DBAPIError as exc:
            if aborted(exc):
                raise NothingWritten from None
            raise
        if done[0] == 0:  # the head moved before it began: nothing written
            raise NothingWritten
        assert done[0] == m * n, done

    async def head(self) -> tuple[int, str]:
        row = (await self.conn.execute(_HEAD)).first()
        return (0, GENESIS) if row is None else (int(row[0]), str(row[1]))

    async def iterate(self, *, batch: int = 1000, upto: int | None = None,
                      run_id: str | None = None, since: datetime | None = None,
                      after: int = 0) -> AsyncIterator[AuditRecord]:
        """Entries in seq order (after seq ``after``, up to seq ``upto``, of one run, from a
        time), in batches: a short batch, or one that reached ``upto``, is the last (no
        statement asks for a page past the end)."""
        stmt = _entries(upto is not None, bool(run_id), bool(since))
        params: dict[str, Any] = {"n": batch}
        if upto is not None:
            params["upto"] = upto
        if run_id:
            params["rid"] = run_id
        if since:
            params["since"] = since
        last = after
        while True:
            rows = list(await self.conn.execute(stmt, {**params, "after": last}))
            if not rows:
                return
            for r in rows:
                yield AuditRecord(**r._mapping)
            last = rows[-1].seq
            if len(rows) < batch or (upto is not None and last >= upto):
                return

    async def records(self, *, actions: Sequence[str], unasked: Sequence[str] = (),
                      after: int, upto: int, since: datetime | None = None,
                      batch: int = 5000) -> AsyncIterator[list[Any]]:
        """The entries ``after`` < seq <= ``upto`` (from time ``since``) whose action is one
        of ``actions``, or of ``unasked`` with no approval: batches of rows of
        :data:`RECORD_COLUMNS` in seq order. For a reader of a long record: one statement
        per ``batch`` rows, and no object per entry beyond its row."""
        stmt = _records(tuple(actions), tuple(unasked), since is not None)
        params: dict[str, Any] = {"upto": upto}
        if since is not None:
            params["since"] = since
        async for rows in self._pages(stmt, params, after=after, batch=batch):
            yield rows

    async def _pages(self, stmt: Any, params: dict[str, Any], *, after: int,
                     batch: int) -> AsyncIterator[list[Any]]:
        """Keyset pages of ``stmt`` (its rows' first column the key, bound as ``after``,
        at most ``n`` = ``batch`` rows a page), until a short or empty page."""
        while True:
            rows = list(await self.conn.execute(stmt, {**params, "after": after, "n": batch}))
            if not rows:
                return
            yield rows
            if len(rows) < batch:
                return
            after = int(rows[-1][0])

    async def count_upto(self, seq: int) -> int:
        """How many entries have seq <= ``seq`` (all of them, if none was deleted)."""
        return int((await self.conn.execute(_COUNT_UPTO, {"upto": seq})).scalar_one())

    async def entry(self, seq: int) -> AuditRecord | None:
        row = (await self.conn.execute(_ONE, {"seq": seq})).first()
        return None if row is None else AuditRecord(**row._mapping)

    async def checkpoint(self) -> tuple[int, str, str, int, str] | None:
        """The verified-through checkpoint: (seq, hash, key_id, unkeyed_until, mac)."""
        row = (await self.conn.execute(_CHECKPOINT)).first()
        return None if row is None else (int(row[0]), str(row[1]), str(row[2]),
                                         int(row[3]), str(row[4]))

    async def advance_checkpoint(self, *, seq: int, hash: str, key_id: str,
                                 unkeyed_until: int, mac: str) -> None:
        """Record the checkpoint, unless one further on is recorded already."""
        values = {"seq": seq, "hash": hash, "key_id": key_id, "unkeyed_until": unkeyed_until,
                  "mac": mac}
        if (await self.conn.execute(_ADVANCE, values)).rowcount:
            return
        await self.conn.execute(self.insert_ignore(AuditCheckpoint), {"id": 1, **values})

    # -- the requests on the record, kept folded (issue 51: runtime.record.history_fold) --
    async def fold(self) -> tuple[int, int, int, str, str] | None:
        """How far the requests are kept folded: (through, folded, unkeyed_until, key_id,
        mac), or None."""
        row = (await self.conn.execute(_FOLD)).first()
        return None if row is None else (int(row[0]), int(row[1]), int(row[2]),
                                         str(row[3]), str(row[4]))

    async def any_folded(self) -> bool:
        return (await self.conn.execute(_ANY_FOLDED)).first() is not None

    async def folded(self, *, batch: int = 5000) -> AsyncIterator[list[Any]]:
        """Every folded request, in batches of rows (seq, folded, state, key_id, mac) in
        seq order."""
        async for rows in self._pages(_FOLDED, {}, after=0, batch=batch):
            yield rows

    async def save_fold(self, *, was: tuple[int, str] | None, fold: dict[str, Any],
                        rows: list[dict[str, Any]], replace_all: bool) -> bool:
        """Move the fold from ``was`` (through, mac; None: none recorded) to ``fold`` and
        write ``rows`` (all of them when ``replace_all``, else those that changed): False,
        and nothing written, when another writer moved it first."""
        await self.conn.execute(self.insert_ignore(AuditFold), {
            "id": 1, "through": -1, "folded": 0, "unkeyed_until": 0, "key_id": "",
            "mac": ""})
        was_through, was_mac = was if was is not None else (-1, "")
        moved = await self.conn.execute(_MOVE_FOLD, {**fold, "was_through": was_through,
                                                     "was_mac": was_mac})
        if moved.rowcount != 1:
            return False
        if replace_all:
            await self.conn.execute(delete(_R))
        else:
            seqs = [r["seq"] for r in rows]
            for i in range(0, len(seqs), 1000):
                await self.conn.execute(delete(_R).where(_R.c.seq.in_(seqs[i:i + 1000])))
        for i in range(0, len(rows), 5000):
            await self.conn.execute(_INSERT_FOLDED, rows[i:i + 5000])
        return True

    async def of_run(self, run_id: str, *, after: int, limit: int = 200) -> list[AuditRecord]:
        """The run's entries past seq ``after``, oldest first, at most ``limit`` of them."""
        rows = await self.conn.execute(_entries(False, True, False),
                                       {"rid": run_id, "after": after, "n": limit})
        return [AuditRecord(**r._mapping) for r in rows]

    async def query(self, *, run_id: str | None = None, since: datetime | None = None,
                    approval_id: str | None = None) -> list[AuditRecord]:
        stmt = select(_T).order_by(AuditEntry.seq)
        if run_id:
            stmt = stmt.where(AuditEntry.run_id == run_id)
        if since:
            stmt = stmt.where(AuditEntry.at >= since)
        if approval_id:
            stmt = stmt.where(AuditEntry.approval_id == approval_id)
        return [AuditRecord(**r._mapping) for r in await self.conn.execute(stmt)]
