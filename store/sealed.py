"""Every sealed column's values, read and written as stored (for ``approvald keys reseal``).

The columns of :class:`~approvald.store.types.SealedText` are found in the schema, so a
table that gains one is resealed with the rest. Each table is rewritten in one
transaction: a value that cannot be opened fails it whole, with nothing changed.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import cast

from approvald.store.db import Database
from approvald.store.models import Approval, Base, Run
from approvald.store.types import SealedText
from sqlalchemy import Column, Table, Text, select, type_coerce, update


def sealed_columns() -> list[tuple[Table, Column[str]]]:
    """(table, column) of every sealed column, in schema order."""
    return [(table, cast(Column[str], col)) for table in Base.metadata.sorted_tables
            for col in table.columns if isinstance(col.type, SealedText)]


async def rewrite(db: Database, fn: Callable[[str, str], str]) -> int:
    """Replace each stored value ``v`` of a sealed column by ``fn(v, "table.column")``
    (both as stored); the number of values changed."""
    changed = 0
    for table, col in sealed_columns():
        name = cast(SealedText, col.type).column
        keys = list(table.primary_key.columns)
        raw = type_coerce(col, Text)
        async with db.write() as tx:
            conn = tx.conn
            rows = (await conn.execute(select(*keys, raw).where(col.is_not(None)))).all()
            for row in rows:
                stored = cast(str, row[-1])
                new = fn(stored, name)
                if new == stored:
                    continue
                where = [k == row[i] for i, k in enumerate(keys)]
                await conn.execute(update(table).where(*where)
                                   .values({col.name: type_coerce(new, Text)}))
                changed += 1
    return changed


async def waiting_values(db: Database, *, final: Collection[str], limit: int = 100
                         ) -> list[tuple[str, str]]:
    """(column, value as stored) of what a starting process will need first: the
    arguments of pending requests and the tasks of runs not ended (``final``: the statuses
    of ended runs), up to ``limit`` of each."""
    approvals = cast(Table, Approval.__table__)
    runs = cast(Table, Run.__table__)
    async with db.read() as tx:
        args = await tx.conn.execute(
            select(type_coerce(approvals.c.args, Text))
            .where(approvals.c.status == "pending").limit(limit))
        tasks = await tx.conn.execute(
            select(type_coerce(runs.c.task, Text))
            .where(runs.c.status.not_in(list(final))).limit(limit))
        return ([("approvals.args", r[0]) for r in args]
                + [("runs.task", r[0]) for r in tasks])
