"""Issue 50: a group commit's rows are bound as ONE JSON text per table (the riders', the
entries'), decoded in SQL (``store/rowsets.py``), not as an array per column: asyncpg's
array encoder and SQLAlchemy's array processing checked each of about 50 arrays and each
element in Python, half of an auto decision's Python calls. What is stored is what a
bound parameter stores (texts of any character, NULLs, times to the microsecond).
PostgreSQL only, as group commit is."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from approvald.runtime.runs.external import NewRequest
from approvald.store.rowsets import encoder, rowset
from approvald.store.types import UTCDateTime
from sqlalchemy import Boolean, Float, Integer, String, Text, select

from tests.helpers import Rows
from tests.unit.test_group_commit import CHAINED, PG, Held, _chained_whole, _engine, joined

# what the chained statement may bind: the heads (guessed, moved), the counts, two texts,
# and the statement's constants (a margin of a few; as arrays, about 60)
_AT_MOST = 24
_TEXTS = ["", "é ✓ 😀 字", "quote ' \" back \\ slash", "line\nbreak\ttab \u2028 \x01",
          "{\"not\": [\"json\"]}", "null"]


@PG
async def test_a_batch_is_bound_as_a_few_texts_not_an_array_per_column(
        make_engine, monkeypatch: pytest.MonkeyPatch) -> None:
    engine, token = await _engine(make_engine)
    import asyncpg.prepared_stmt  # type: ignore[import-untyped]

    bound: list[tuple[Any, ...]] = []  # the chained statements' parameters, as sent
    fetch = asyncpg.prepared_stmt.PreparedStatement.fetch

    async def spied(stmt: Any, *args: Any, **kwargs: Any) -> Any:
        if stmt._query.startswith(CHAINED):
            bound.append(args)
        return await fetch(stmt, *args, **kwargs)

    monkeypatch.setattr(asyncpg.prepared_stmt.PreparedStatement, "fetch", spied)
    held = Held(monkeypatch, 1)  # (wraps the spy: the first held, the rest come meanwhile)
    until = joined(monkeypatch, engine)

    def ask(i: int) -> Any:
        return asyncio.ensure_future(engine.open_request(token, NewRequest(
            tool="read_metrics", args={"n": i, "text": _TEXTS[i % len(_TEXTS)], "none": None},
            requested_by="U_DANA")))

    lead = ask(0)
    await held.sent.wait()
    rest = [ask(i) for i in range(1, 7)]
    await until(7)
    held.release.set()
    docs = list(await asyncio.gather(lead, *rest))
    assert len(bound) == 2, bound  # the lead alone, then the batch of 6
    for args in bound:
        assert len(args) <= _AT_MOST, (len(args), args)
        assert not any(isinstance(a, (list, tuple)) for a in args), args
    for i, (doc, new) in enumerate(docs):  # each its own values, stored as given
        assert new and doc["status"] == "approved", doc
        row = await Rows.of(engine).external(doc["id"])
        assert json.loads(row.args) == {"n": i, "text": _TEXTS[i % len(_TEXTS)],
                                        "none": None}, row
        assert row.reason is None or isinstance(row.reason, str), row
    await _chained_whole(engine, {doc["id"] for doc, _ in docs})


@PG
async def test_rows_bound_as_json_are_read_back_as_they_were_given(make_engine) -> None:
    """Every kind of value a batch's rows hold comes back from the JSON text as it was
    given (as a parameter bound alone would): texts of any character, NULLs, integers at
    their bounds, floats exactly, booleans, times to the microsecond in any zone."""
    engine, _ = await _engine(make_engine)
    fields = {"t": Text(), "v": String(40), "i": Integer(), "f": Float(), "b": Boolean(),
              "at": UTCDateTime(timezone=True)}
    at = datetime(2026, 12, 7, 23, 15, 9, 123456, tzinfo=UTC)
    rows = [{"t": t, "v": t[:40], "i": (-2**31, 2**31 - 1, 0)[k % 3],
             "f": (0.1 + 0.2, 1e-300, -2.5)[k % 3], "b": k % 2 == 0,
             "at": (at + timedelta(microseconds=k)).astimezone(
                 timezone(timedelta(hours=k - 3)))} for k, t in enumerate(_TEXTS)]
    rows.append({f: None for f in fields})
    rows.append({**rows[0], "at": at.replace(microsecond=0)})
    table = rowset("rows", "r", fields)

    async def read(tx: Any) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in await tx.audit.conn.execute(
            select(*(table.c[f] for f in fields)), {"rows": encoder(fields)(rows)})]
    got = await Rows.of(engine).in_one_read(read)
    assert got == [tuple(r[f] for f in fields) for r in rows]
