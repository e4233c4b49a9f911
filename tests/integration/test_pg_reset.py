"""The per-test reset of the session's PostgreSQL database (tests/conftest.py) empties every
table the migrations make, rows that others refer to included, and restarts their
sequences."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from approvald.runtime.approvals.decide import Actor
from approvald.runtime.engine import assemble
from approvald.runtime.kernel.clock import ManualClock
from approvald.runtime.runs.agent import Registry
from approvald.runtime.runs.demo import DemoLedger, refund_agent
from approvald.store.db import Database
from approvald.store.models import Base

from tests.conftest import SIGNER, TABLES, keep_pg, reset_pg
from tests.helpers import START, Rows


async def test_the_reset_names_every_table_and_empties_them(pg_url: str | None,
                                                            tmp_path: Path) -> None:
    if pg_url is None:  # only without APPROVALD_REQUIRE_PG (CI sets it)
        import pytest

        pytest.skip("PostgreSQL is not reachable (set APPROVALD_TEST_PG_URL)")
    db = Database(pg_url)
    rows = Rows(db)
    try:
        names = await rows.select("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        # (a test may add a probe table of its own; the reset leaves it be)
        assert set(TABLES) == set(Base.metadata.tables) <= {r[0] for r in names}
        await rows.execute("INSERT INTO policy_in_force (id, digest, source, loaded_at) "
                           "VALUES (1, 'd', 's', now())")
        # rows that refer to others: a run waiting on an approval with a vote, its events,
        # thread, audit entries and outbox rows
        engine = assemble(db, Registry([refund_agent(DemoLedger(str(tmp_path / "l.jsonl")))]),
                          clock=ManualClock(START), signer=SIGNER)
        run_id = await engine.start_run("demo-refund", "Refund order A-1",
                                        requested_by="U_DANA")
        await engine.advance(run_id)
        [approval] = await rows.in_one_read(lambda tx: tx.approvals.for_run(run_id))
        await engine.decide(approval.id, actor=Actor("U_ALICE", "slack"), verdict="approve")
        filled = {t for t in TABLES if await rows.count(t)}
        assert {"runs", "approvals", "approval_votes", "audit_log", "outbox"} <= filled
        await reset_pg(pg_url)
        for table in TABLES:
            count = await rows.count(table)
            assert count == 0, table
        [(restarted,)] = await rows.select("SELECT nextval('outbox_id_seq')")
        assert restarted == 1
    finally:
        await db.close()


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_a_reset_puts_back_what_was_kept(db_url: str, tmp_path: Path) -> None:
    """``reset_pg(url, keep_pg(url))``: the database as it was kept, every row of every
    table and where each sequence was, whatever was written after the keep (what each of
    the model-based test's schedules starts from, tests/integration/test_gate_model.py)."""
    pg_url = db_url
    db = Database(pg_url)
    rows = Rows(db)

    async def everything() -> dict[str, Any]:
        tables = {t: sorted(map(repr, await rows.select(f"SELECT * FROM {t}"))) for t in TABLES}
        [(outbox, called)] = await rows.select("SELECT last_value, is_called FROM outbox_id_seq")
        return {**tables, "outbox_id_seq": (outbox, called)}

    try:
        engine = assemble(db, Registry([refund_agent(DemoLedger(str(tmp_path / "l.jsonl")))]),
                          clock=ManualClock(START), signer=SIGNER)
        first = await engine.start_run("demo-refund", "Refund order A-1", requested_by="U_DANA")
        await engine.advance(first)
        kept, before = await keep_pg(pg_url), await everything()
        assert {"runs", "approvals", "audit_log", "outbox"} <= {t for t in TABLES if before[t]}
        assert before["outbox_id_seq"][1], "the outbox's sequence was used before the keep"
        # written after the keep: another run, a decision, a vote, outbox rows
        [approval] = await rows.in_one_read(lambda tx: tx.approvals.for_run(first))
        await engine.decide(approval.id, actor=Actor("U_ALICE", "slack"), verdict="approve")
        await engine.advance(await engine.start_run("demo-refund", "Refund order A-2",
                                                    requested_by="U_DANA"))
        assert await everything() != before
        await reset_pg(pg_url, kept)
        assert await everything() == before
    finally:
        await db.close()
