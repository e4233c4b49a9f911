"""Every sealed column's values, read and written as stored (for ``approvald keys reseal``
and ``serve``'s start check).

The columns of :class:`~approvald.store.types.SealedText` are found in the schema, so a
table that gains one is resealed with the rest. A column is rewritten in batches of rows
in primary-key order, each batch its own short transaction, so a reseal of any size holds
no lock for long and can run beside a serving process. Each value is replaced by
compare-and-set on the value read: a value a serving process wrote meanwhile (sealed
under the current key already) is left as it is. A value that cannot be opened fails its
batch whole, with nothing in it changed; a rerun carries on where the rows still need it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any, cast

from approvald.store.db import Database
from approvald.store.models import Approval, Base, Run
from approvald.store.types import SealedText
from sqlalchemy import Column, ColumnElement, Table, Text, func, select, tuple_, type_coerce, update

BATCH = 500  # rows read and rewritten per transaction


def sealed_columns() -> list[tuple[Table, Column[str]]]:
    """(table, column) of every sealed column, in schema order."""
    return [(table, cast(Column[str], col)) for table in Base.metadata.sorted_tables
            for col in table.columns if isinstance(col.type, SealedText)]


async def rewrite(db: Database, fn: Callable[[str, str], str], *, sealed_prefix: str,
                  batch: int = BATCH) -> dict[str, int]:
    """Replace each stored value ``v`` of a sealed column by ``fn(v, "table.column")``
    (both as stored), in batches; the number of values changed in each table that had
    any. ``sealed_prefix``: how a sealed value starts; in a column written in clear
    (``audit_log.details``: see store.caller_data.MASKED) only such values are given to ``fn``."""
    changed: dict[str, int] = {}
    for table, col in sealed_columns():
        kind = cast(SealedText, col.type)
        keys = list(table.primary_key.columns)
        raw = type_coerce(col, Text)
        wanted: list[ColumnElement[bool]] = [col.is_not(None)]
        if not kind.sealed:  # written in clear: only the values sealed before
            wanted.append(raw.startswith(sealed_prefix, autoescape=True))
        after: tuple[Any, ...] | None = None
        while True:
            stmt = select(*keys, raw).where(*wanted).order_by(*keys).limit(batch)
            if after is not None:
                stmt = stmt.where(tuple_(*keys) > tuple_(*after))
            async with db.write() as tx:
                rows = (await tx.conn.execute(stmt)).all()
                for row in rows:
                    stored = cast(str, row[-1])
                    new = fn(stored, kind.column)
                    if new == stored:
                        continue
                    done = await tx.conn.execute(
                        update(table).where(*(k == row[i] for i, k in enumerate(keys)),
                                            raw == type_coerce(stored, Text))
                        .values({col.name: type_coerce(new, Text)}))
                    if done.rowcount:  # (0: rewritten meanwhile, by a serving process)
                        changed[table.name] = changed.get(table.name, 0) + 1
            if len(rows) < batch:
                break
            after = tuple(rows[-1][:len(keys)])
    return changed


async def waiting_key_ids(db: Database, *, final: Collection[str], sealed_prefix: str,
                          id_length: int) -> set[str]:
    """The key ids of every sealed value a starting process will need first: the
    arguments of pending requests and the tasks of runs not ended (``final``: the statuses
    of ended runs). A sealed value starts with ``sealed_prefix`` and its key id of
    ``id_length`` characters; the ids are read by the database, distinct, so the check
    is exact and reads a few bytes whatever the number of waiting rows."""
    approvals = cast(Table, Approval.__table__)
    runs = cast(Table, Run.__table__)
    start = len(sealed_prefix) + 1  # SQL counts from 1

    def ids(col: ColumnElement[str], *where: ColumnElement[bool]) -> Any:
        raw = type_coerce(col, Text)
        return (select(func.substr(raw, start, id_length))
                .where(*where, raw.startswith(sealed_prefix, autoescape=True)).distinct())

    async with db.read() as tx:
        found = await tx.conn.execute(
            ids(approvals.c.args, approvals.c.status == "pending")
            .union(ids(runs.c.task, runs.c.status.not_in(list(final)))))
        return {str(r[0]) for r in found}
