"""A batch's rows bound as ONE parameter (PostgreSQL): a JSON text, an object per row,
decoded in SQL by ``json_to_recordset`` with each column's type (issue 50).

A group commit's statement (``store/repos/audit.py``, ``_append_alone``) takes any number
of rows of one shape with one SQL text. Bound as an array per column (``unnest``), its
about 50 arrays were half of an auto decision's Python calls: asyncpg's array encoder and
SQLAlchemy's array processing check each array and each element in Python. One text per
batch costs a call per row and one ``json.dumps`` (in C).

The values are those a plan binds (each through its type's bind processor: sealed text
sealed, times in UTC), written as JSON: text, numbers (a float as its shortest repr, read
back exactly), booleans, null (SQL NULL), a time as ISO 8601 with its offset (cast to
``timestamptz`` exactly, to the microsecond). The server casts each to the column's type
by that type's input function, so what is stored is what a bound parameter stores."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any

from approvald.store.fastsql import processed
from sqlalchemy import Text, bindparam, column, func
from sqlalchemy import cast as sql_cast
from sqlalchemy.dialects.postgresql import JSON
from sqlalchemy.dialects.postgresql.asyncpg import dialect as asyncpg_dialect

# the only PostgreSQL driver approvald runs on (store/db.py)
_DIALECT: Any = asyncpg_dialect()  # type: ignore[no-untyped-call]


def _time(value: Any) -> str:
    if isinstance(value, datetime) and value.tzinfo is not None:
        return value.isoformat()
    raise TypeError(f"not a value of a JSON row: {value!r}")


# compact, in UTF-8 (a text bound as is), a time by its ISO form; NaN is no JSON: refused
_DUMPS = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=_time,
                          allow_nan=False).encode


def rowset(param: str, name: str, fields: Mapping[str, Any]) -> Any:
    """``json_to_recordset(CAST(:param AS JSON)) AS name(<field> <its type>, ...)``: the
    rows bound under ``param`` (:func:`encoder`), a column for each of ``fields``."""
    rows = func.json_to_recordset(sql_cast(bindparam(param, type_=Text), JSON))
    return rows.table_valued(*(column(f, t) for f, t in fields.items())) \
        .render_derived(name=name, with_types=True)


def encoder(fields: Mapping[str, Any]) -> Callable[[Iterable[Mapping[str, Any]]], str]:
    """``rows -> text``: the JSON :func:`rowset` decodes, an object of ``fields``' values
    for each row (a mapping with a value under each field's name), in order."""
    names = tuple(fields)
    values = processed(fields, _DIALECT)

    def encode(rows: Iterable[Mapping[str, Any]]) -> str:
        return _DUMPS([dict(zip(names, values(row), strict=True)) for row in rows])
    return encode
