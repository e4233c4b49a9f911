"""Issue 50: a planned statement on PostgreSQL is executed on asyncpg's protocol as
``PreparedStatement.fetch`` executes it (``store/private_asyncpg.py``: ``fetch``), without
the sixteen or so Python calls of asyncpg's guards around it: the same rows and status,
the same errors in the same order, the same clean-up after a schema change; a wrapped
``fetch`` (a statement counter) still sees every statement."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from approvald.store import private_asyncpg
from approvald.store.db import Database
from asyncpg import exceptions  # type: ignore[import-untyped]
from asyncpg.prepared_stmt import PreparedStatement  # type: ignore[import-untyped]

from tests.helpers import Rows
from tests.unit.test_store_cpu import T0, Calls


class _State:
    """What a PreparedStatement holds of its server-side statement."""

    def __init__(self) -> None:
        self.closed = False
        self.attached = 0

    def attach(self) -> None:
        self.attached += 1

    def detach(self) -> None:
        self.attached -= 1

    def mark_closed(self) -> None:
        self.closed = True


class _Protocol:
    def __init__(self, conn: _Conn) -> None:
        self.conn = conn
        self.seen: list[tuple[Any, ...]] = []
        self.connected = True

    def is_connected(self) -> bool:
        return self.connected

    async def bind_execute(self, state: Any, args: Any, portal: str, limit: int,
                           extra: bool, wait: Any) -> Any:
        self.seen.append((state, args, portal, limit, extra, wait))
        if self.conn.outdated:
            raise exceptions.OutdatedSchemaCacheError("the type of a column changed")
        return [("a", 1)], b"SELECT 1", True


class _Conn:
    def __init__(self) -> None:
        self._pool_release_ctr = 0
        self._aborted = False
        self.outdated = False
        self.reloaded = 0
        self._protocol = _Protocol(self)

    def is_closed(self) -> bool:  # asyncpg's own
        return self._aborted or not self._protocol.is_connected()

    async def reload_schema_state(self) -> None:
        self.reloaded += 1

    def _maybe_gc_stmt(self, state: Any) -> None:
        pass


async def _outcome(call: Any) -> tuple[str, Any]:
    try:
        return "value", await call()
    except Exception as exc:
        return type(exc).__name__, str(exc)


@pytest.mark.parametrize("case", ["open", "closed statement", "released", "aborted",
                                  "disconnected", "schema changed"])
async def test_a_statement_is_fetched_as_asyncpg_fetches_it(case: str) -> None:
    """Against asyncpg's own ``fetch`` then ``get_statusmsg``, on the same (stand-in)
    connection and protocol: the same answer or the same error, and the same state left."""
    outcomes, left = [], []
    for mine in (False, True):
        conn, state = _Conn(), _State()
        stmt = PreparedStatement(conn, "SELECT a, 1", state)
        if case == "closed statement":
            state.mark_closed()
        elif case == "released":
            conn._pool_release_ctr += 1
        elif case == "aborted":
            conn._aborted = True
        elif case == "disconnected":
            conn._protocol.connected = False
        elif case == "schema changed":
            conn.outdated = True

        async def theirs(stmt: Any = stmt) -> Any:
            return await stmt.fetch(7, "x"), stmt.get_statusmsg()

        outcomes.append(await _outcome(
            (lambda stmt=stmt: private_asyncpg.fetch(stmt, (7, "x"))) if mine else theirs))
        left.append((state.closed, conn.reloaded,
                     [(s is state, *rest) for s, *rest in conn._protocol.seen]))
    assert outcomes[0] == outcomes[1], outcomes
    assert left[0] == left[1], left
    if case == "open":
        assert outcomes[1] == ("value", ([("a", 1)], "SELECT 1"))
    elif case == "schema changed":
        assert left[1][:2] == (True, 1)  # closed, and the server's types read again
    else:
        assert outcomes[1][0] == "InterfaceError" and not left[1][2]  # nothing sent


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_a_planned_statement_makes_one_python_call_in_asyncpg(db: Database) -> None:
    """asyncpg's own Python per planned statement: none (its ``fetch`` went through its
    guard, its checks and two helpers each time, and ``get_statusmsg`` through the guard
    again: 16 calls)."""
    async def read(tx: Any) -> Any:
        return await tx.runs.get("r1")

    await Rows(db).in_one_write(lambda tx: tx.runs.create(
        run_id="r1", agent="a", task="t", requested_by="U", instructions_version="v",
        now=T0))
    await Rows(db).in_one_read(read)  # the plan made, the statement prepared

    async def counted(tx: Any) -> Counter[str]:
        return await Calls(("asyncpg/",)).during(lambda: read(tx))
    seen = await Rows(db).in_one_read(counted)
    assert seen == Counter(), seen
