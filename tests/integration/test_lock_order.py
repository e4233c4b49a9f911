"""One lock order everywhere: a cancel and a click on the same run cannot deadlock.

PostgreSQL only (SQLite has one writer). The test holds the audit chain head from another
connection so both transactions are provably inside their critical sections at once,
then lets them go: with one lock order (run, approvals, audit head) one waits for the
other; with two orders they deadlock and PostgreSQL kills one of them.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from approvald.runtime.approvals.decide import Actor
from approvald.runtime.kernel.outcomes import Paused

from tests.conftest import PG_ADMIN_URL
from tests.helpers import Rows


async def _waiting_on_locks(admin, dbname: str) -> int:  # type: ignore[no-untyped-def]
    return int(await admin.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND wait_event_type = 'Lock'",
        dbname))


async def _until(predicate, what: str, within: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + within
    while not await predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


# SQLite serialises writers; the lock order matters on PostgreSQL
@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_a_cancel_racing_a_click_on_the_same_run_both_get_answers(db_url, make_engine,
                                                                      db):
    import asyncpg  # type: ignore[import-untyped]

    engine = make_engine()
    paused = await engine.run("demo-refund", "Refund order A-1001", requested_by="U_DANA")
    assert isinstance(paused, Paused)
    dbname = db.url.database
    base = PG_ADMIN_URL.replace("+asyncpg", "").rsplit("/", 1)[0]
    holder = await asyncpg.connect(f"{base}/{dbname}")
    watcher = await asyncpg.connect(f"{base}/{dbname}")
    try:
        tx = holder.transaction()
        await tx.start()
        await holder.execute("SELECT 1 FROM audit_head WHERE id = 1 FOR UPDATE")
        click = asyncio.create_task(engine.decide(
            paused.approval_ids[0], actor=Actor("U_ALICE", "slack"), verdict="approve"))
        await _until(lambda: _waiting(watcher, dbname, 1), "the click to block")
        cancel = asyncio.create_task(engine.cancel(paused.run_id,
                                                   actor=Actor("U_OPS", "cli:ops")))
        await _until(lambda: _waiting(watcher, dbname, 2), "the cancel to block")
        await tx.rollback()  # let both go
        results = await asyncio.wait_for(asyncio.gather(click, cancel, return_exceptions=True),
                                         timeout=30)
    finally:
        await holder.close()
        await watcher.close()
    errors = [r for r in results if isinstance(r, BaseException)]
    assert errors == [], errors  # no deadlock victim, nobody left without an answer
    decision, cancelled = results
    assert decision.outcome == "approved"
    assert cancelled == "cancelled"
    run = await Rows(db).run(paused.run_id)
    assert run.status == "cancelled"


async def _waiting(conn, dbname: str, n: int) -> bool:  # type: ignore[no-untyped-def]
    return await _waiting_on_locks(conn, dbname) >= n
