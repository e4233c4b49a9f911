"""What an approval sends the database, from the click to the completed run (issue 50):
the decision, the run's resume under the lease the decision took, the approved call's
intent and result, the run's last step. Counted exactly (every statement the driver is
given), on both dialects, and each statement taken off that path shown not needed.
"""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

from approvald.runtime.approvals.decide import Actor
from approvald.runtime.engine import Engine, assemble
from approvald.runtime.kernel.outcomes import Completed, Paused
from approvald.runtime.record.audit import verify
from approvald.runtime.runs.agent import Registry
from approvald.runtime.runs.demo import REFUND_POLICY, DemoLedger, refund_agent
from approvald.store.db import Database

from tests.conftest import SIGNER
from tests.helpers import parts, through_sqlalchemy
from tests.unit.test_decisions import card_token
from tests.unit.test_intake_statements import Statements, statements  # noqa: F401  (a fixture)


async def test_an_approval_to_its_completed_run(db: Database, tmp_path: Path,
                                                statements) -> None:  # noqa: F811
    ledger = DemoLedger(str(tmp_path / "ledger.json"))
    engine = assemble(db, Registry([refund_agent(ledger, approval=REFUND_POLICY)]),
                      signer=SIGNER)
    for i in range(2):  # the first: connections opened, plans made
        paused = await engine.run("demo-refund", f"Refund order A-100{i}, customer was "
                                  "double charged", requested_by="U_DANA")
        assert isinstance(paused, Paused)
        approval = await engine.approval(paused.approval_ids[0])
        window = statements.during()
        await engine.decide(approval.id, actor=Actor("U_ALICE", "slack"), verdict="approve",
                            token=card_token(approval))
        assert isinstance(await engine.advance(approval.run_id), Completed)
        kinds = window.kinds()
    assert kinds == collections.Counter({
        # the decision: the approval, locked after its run (on PostgreSQL in one
        # statement: ``SELECT approvals ... WHERE run_id = (SELECT runs.id ... WHERE
        # runs.id = (SELECT own.run_id ...) FOR NO KEY UPDATE) FOR NO KEY UPDATE OF
        # approvals``), not read before (its approvers are named: no group to look up);
        # the vote, the transition, the card's update queued with its mail thread's
        # follow-up in one INSERT ... SELECT (no separate read of whether it was mailed),
        # the run woken, the audit entry
        # (the vote, the transition, the card's update and the run's wake: on PostgreSQL
        # one statement, ``WITH vote AS (INSERT INTO approval_votes ...), upd AS (UPDATE
        # approvals ... WHERE EXISTS (vote)), card AS (INSERT INTO outbox ... WHERE
        # EXISTS (upd)), woke AS (UPDATE runs ... WHERE EXISTS (upd))``)
        # the run's resume: its events, executions and approvals read in one statement
        # (``SELECT 0 AS part, run_events.* ... UNION ALL ... tool_executions ... UNION
        # ALL ... approvals``: ``tx.events.state``)
        "SELECT run_events": 1,
        "SELECT approvals": 1,
        # the refund and its notice: two calls, each an intent and a result (the notice
        # queued; each result, on PostgreSQL, in its step's checkpoint statement: ``WITH
        # ck AS (UPDATE runs ...), ex AS (UPDATE tool_executions ... WHERE run_id =
        # (SELECT id FROM ck)) INSERT INTO run_events ...``); the last step
        "INSERT outbox": 1,
        **_lines(db.dialect)}), dict(kinds)
    assert (await verify(db)).ok


class _WatchedLedger(DemoLedger):
    """The demo's ledger, noting the statements sent so far when the refund starts (it
    asks for the order's update first thing)."""

    def __init__(self, path: str, sent: Statements) -> None:
        super().__init__(path)
        self.statements = sent
        self.at_start: list[int] = []

    def order_update(self, order_id: str, run_id: str) -> dict[str, Any] | None:
        self.at_start.append(len(self.statements.sent))
        return super().order_update(order_id, run_id)


async def test_an_approvals_own_path_is_two_commits_to_its_tool_start_and_one_read_for_its_card(
        db: Database, tmp_path: Path, statements: Statements) -> None:  # noqa: F811
    """Issue 50's targets are set on "click to tool start to card updated": the decision
    (one commit), the run's resume (one read), the call's intent (one commit) before the
    tool starts, then the card's redraw (one read). What the run does after its call (the
    result's step, the model's last reply) is the agent's, counted by the test above."""
    ledger = _WatchedLedger(str(tmp_path / "ledger.json"), statements)
    engine = assemble(db, Registry([refund_agent(ledger, approval=REFUND_POLICY)]),
                      signer=SIGNER)
    taken: list[tuple[str, str]] = []  # the decided runs, leased to this process's worker
    parts(engine).signals.take_decided(lambda run_id, claim: taken.append((run_id, claim)))
    for i in range(2):  # the first: connections opened, plans made
        paused = await engine.run("demo-refund", f"Refund order A-100{i}, customer was "
                                  "double charged", requested_by="U_DANA")
        assert isinstance(paused, Paused)
        approval = await engine.approval(paused.approval_ids[0])
        first = len(statements.sent)
        await engine.decide(approval.id, actor=Actor("U_ALICE", "slack"), verdict="approve",
                            token=card_token(approval))
        run_id, claim = taken.pop()  # as serve's worker takes it: no lease of its own
        assert isinstance(await parts(engine).runner.advance(run_id, claim=claim), Completed)
        to_start = statements.sent[first:ledger.at_start[-1]]
        redraw = len(statements.sent)
        assert await engine.views.card(approval.id) is not None
        card = statements.sent[redraw:]
    commits = [sql for sql in to_start if sql.split()[0].rstrip(";") == "COMMIT"]
    if db.dialect == "postgresql":
        # the decision: BEGIN, the locking read, the vote and its consequences, the
        # audit entry, COMMIT; the resume's read; the intent, alone in autocommit
        assert len(to_start) == 7, to_start
        assert len(commits) == 1 and _first_words(to_start)[-1] == "WITH", to_start
    else:
        # SQLite: no data-modifying CTE, so more, smaller statements; each write a
        # BEGIN IMMEDIATE ... COMMIT: the decision's nine (the locking read, the vote,
        # the transition, the card's row, the run woken, the audit head and entry), the
        # resume's read, the intent's four (the lease renewed, the intent row)
        assert len(commits) == 2, to_start
        assert len(to_start) == 9 + 1 + 4, to_start
    assert len(card) == 1 and card[0].startswith("SELECT"), card


def _first_words(sent: list[str]) -> list[str]:
    return [sql.split()[0].rstrip(";").upper() for sql in sent]


def _lines(dialect: str) -> dict[str, int]:
    """What differs by dialect: the run events written (one more on SQLite); the three
    audit entries (the decision, the two calls run), each chained to the head this
    process left: the head's move if it is still that one and the entry (on PostgreSQL
    one statement); and each call's intent: on PostgreSQL one statement in autocommit
    (``WITH fence AS (UPDATE runs ... lease renewed) INSERT INTO tool_executions ...``),
    on SQLite a transaction of the renewal and the insert (issue 50). The run: on
    PostgreSQL locked by the decision's read of the approval (its resume reads it in the
    lease's ``UPDATE ... FROM``); on SQLite the resume's read of it."""
    if dialect == "postgresql":
        # each checkpoint's events and run row: one statement (``WITH ck AS (UPDATE
        # runs ...) INSERT INTO run_events ... FROM ck``); the last, in autocommit
        return {"WITH": 3 + 2 + 3 + 1, "UPDATE runs": 1, "BEGIN": 4, "COMMIT": 4}
    return {"INSERT outbox": 2, "INSERT approval_votes": 1, "UPDATE approvals": 1,
            "UPDATE tool_executions": 2,
            "INSERT run_events": 4,
            "UPDATE audit_head": 3, "INSERT audit_log": 3,
            "INSERT tool_executions": 2, "UPDATE runs": 7, "BEGIN": 7, "COMMIT": 7,
            "SELECT runs": 1}


async def paused_refund(db: Database, tmp_path: Path) -> tuple[Engine, Paused]:
    """An engine with the demo refund agent, and a run of it paused on its refund."""
    ledger = DemoLedger(str(tmp_path / "ledger.json"))
    engine = assemble(db, Registry([refund_agent(ledger, approval=REFUND_POLICY)]),
                      signer=SIGNER)
    paused = await engine.run("demo-refund", "Refund order A-1001, customer was double "
                              "charged", requested_by="U_DANA")
    assert isinstance(paused, Paused)
    return engine, paused


async def test_a_posted_card_is_recorded_by_plan(db: Database, tmp_path: Path) -> None:
    # once per request, by serve's drain: where its card is (the clicks' updates go there)
    engine, paused = await paused_refund(db, tmp_path)
    with through_sqlalchemy(db, "approvals") as through:
        await engine.card_posted(paused.approval_ids[0], channel="C_APPROVALS",
                                 ts="1.000001")
    if db.fast_path:
        assert through == []
    approval = await engine.approval(paused.approval_ids[0])
    assert (approval.channel, approval.message_ts) == ("C_APPROVALS", "1.000001")


async def test_a_run_s_last_step_makes_no_copy_of_its_record(db: Database,
                                                              tmp_path: Path) -> None:
    """Issue 50: the checkpoint that gives the lease back (a run completed, failed, paused
    or cancelled) leaves the in-memory record of the run as it was: its caller returns at
    once and reads nothing of it but its id (a ``dataclasses.replace`` of ~30 fields
    per approval, for nobody)."""
    import dataclasses
    import sys
    from types import FrameType

    from approvald.store.records import RunRecord
    engine, paused = await paused_refund(db, tmp_path)
    approval = await engine.approval(paused.approval_ids[0])
    await engine.decide(approval.id, actor=Actor("U_ALICE", "slack"), verdict="approve",
                        token=card_token(approval))
    copies: list[str] = []

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event == "call" and frame.f_code is dataclasses.replace.__code__:
            obj = frame.f_locals.get("obj")
            if isinstance(obj, RunRecord):
                copies.append(obj.status)

    sys.setprofile(profile)
    try:
        outcome = await engine.advance(approval.run_id)
    finally:
        sys.setprofile(None)
    assert isinstance(outcome, Completed)
    assert copies == [], copies
