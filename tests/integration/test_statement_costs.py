"""What a decision costs the database does not grow with the rest of the database.

Every statement from an Approve to the completed run, counted in SQLite VM instructions
(a progress handler called on each one: exact and repeatable, unlike time) with one other
run waiting for approval and with many. A statement that reads rows it does not need
(say, every pending request in the database, because the planner chose an index led by
``status`` over the run's own; see migration 0008) costs more with more waiting runs.
"""

from __future__ import annotations

import collections
import re
from pathlib import Path
from typing import Any

import pytest
from approvald.runtime.approvals.decide import Actor
from approvald.runtime.engine import assemble
from approvald.runtime.kernel.outcomes import Completed, Paused
from approvald.runtime.runs.agent import Registry
from approvald.runtime.runs.demo import REFUND_POLICY, DemoLedger, refund_agent
from approvald.store import migrate, private_aiosqlite
from approvald.store.db import Database

from tests.conftest import SIGNER
from tests.unit.test_decisions import card_token

pytestmark = pytest.mark.sqlite

LITERALS = re.compile(r"'(?:[^']|'')*'|\b\d+(?:\.\d+)?\b")


async def decision_cost(tmp_path: Path, waiting: int,
                        monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """VM instructions per statement (literals folded) for one decision, with
    ``waiting`` other runs paused on a request."""
    counts: collections.Counter[str] = collections.Counter()
    counting = [False]
    connections: list[Any] = []
    real = private_aiosqlite.connect

    async def connect(path: str, **kwargs: Any) -> Any:
        conn = await real(path, **kwargs)
        raw, current = conn._connection, [""]

        def trace(sql: str) -> None:
            current[0] = LITERALS.sub("?", sql)

        def step() -> int:
            counts[current[0]] += 1
            return 0

        raw.set_trace_callback(trace)
        connections.append((raw, step))
        if counting[0]:
            raw.set_progress_handler(step, 1)
        return conn

    monkeypatch.setattr(private_aiosqlite, "connect", connect)
    db = Database(f"sqlite+aiosqlite:///{tmp_path / f'cost{waiting}.db'}", fast_path=True)
    try:
        await migrate.upgrade(db)
        ledger = DemoLedger(str(tmp_path / f"ledger{waiting}.json"))
        engine = assemble(db, Registry([refund_agent(ledger, approval=REFUND_POLICY)]),
                        signer=SIGNER)
        for _ in range(waiting + 1):
            paused = await engine.run("demo-refund", "Refund order A-1001, customer was "
                                      "double charged", requested_by="U_DANA")
            assert isinstance(paused, Paused)
        approval = await engine.approval(paused.approval_ids[0])
        counting[0] = True
        for raw, step in connections:
            raw.set_progress_handler(step, 1)
        await engine.decide(approval.id, actor=Actor("U_ALICE", "slack"), verdict="approve",
                            token=card_token(approval))
        assert isinstance(await engine.advance(approval.run_id), Completed)
        counting[0] = False
        for raw, _ in connections:
            raw.set_progress_handler(None, 1)
    finally:
        await db.close()
    return dict(counts)


async def test_no_statement_of_a_decision_grows_with_other_waiting_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    alone = await decision_cost(tmp_path, 1, monkeypatch)
    crowded = await decision_cost(tmp_path, 60, monkeypatch)
    assert alone and set(crowded) == set(alone)
    grew = {sql[:160]: (alone[sql], crowded[sql]) for sql in alone
            if crowded[sql] > alone[sql] + 10}
    assert grew == {}, grew
