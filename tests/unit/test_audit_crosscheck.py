"""The proof covers what the views show (issue 52.8): ``audit verify`` cross-checks the
decisions, votes, edits and standing approvals in the tables against the chain, and names
each row that disagrees; the views say so too. Each tampering an attacker with write
access to the database (and not the key) could make is caught, on both dialects."""

from __future__ import annotations

import json
from datetime import timedelta

from approvald.runtime.policies.scope import scope_for
from approvald.runtime.record import audit
from approvald.runtime.record.audit import AuditKey
from approvald.runtime.record.audit_check import disagreements_of
from approvald.store.models import Approval, ApprovalVote, StandingApproval

from tests.helpers import Rows
from tests.unit.test_decisions import ALICE, BOB, CAROL, DANA, engine_with

KEY = AuditKey("audit-key-kept-in-a-vault-0123456789")
TASK = "Refund order A-1001, customer was double charged"


async def edited_quorum(make_engine, ledger_path, db):
    """A request edited by Alice (who approves it so), then approved by Bob: a quorum of
    two on the edited arguments."""
    engine = engine_with(make_engine, ledger_path, approvers=["U_ALICE", "U_BOB", "U_CAROL"],
                         quorum=2)
    engine.use_audit_key(KEY)
    paused = await engine.run("demo-refund", TASK, requested_by=DANA)
    aid = paused.approval_ids[0]
    a = await Rows(db).approval(aid)
    edited = {**a.args_value(), "amount_cents": 1000}
    await engine.decide(aid, actor=ALICE, verdict="edit", args=edited, reason="half only")
    await engine.decide(aid, actor=BOB, verdict="approve")
    return engine, aid


async def verified(db) -> audit.VerifyReport:
    return await audit.verify(db, keys=[KEY])


async def test_an_untouched_history_agrees_with_the_chain(make_engine, ledger_path, db):
    await edited_quorum(make_engine, ledger_path, db)
    report = await verified(db)
    assert report.ok, report.problems
    assert any("tables agree" in n for n in report.notes), report.notes


async def test_a_forged_decider_is_named(make_engine, ledger_path, db):
    _, aid = await edited_quorum(make_engine, ledger_path, db)
    await Rows(db).forge(Approval, Approval.id == aid, decided_by="U_MALLORY")
    report = await verified(db)
    assert not report.ok
    line = next(p for p in report.problems if aid in p)
    assert "decided_by" in line and "U_MALLORY" in line and "U_BOB" in line
    said = await Rows(db).in_one_read(lambda tx: disagreements_of(tx, aid))
    assert any("U_MALLORY" in s for s in said)


async def test_forged_edited_arguments_are_named(make_engine, ledger_path, db):
    _, aid = await edited_quorum(make_engine, ledger_path, db)
    a = await Rows(db).approval(aid)
    forged = {**(a.edited_value() if hasattr(a, "edited_value") else
                 json.loads(a.edited_args or "{}")), "amount_cents": 999999}
    await Rows(db).forge(Approval, Approval.id == aid, edited_args=json.dumps(forged))
    report = await verified(db)
    assert not report.ok
    assert any(aid in p and "edited arguments" in p for p in report.problems), report.problems


async def test_a_forged_editor_is_named(make_engine, ledger_path, db):
    _, aid = await edited_quorum(make_engine, ledger_path, db)
    await Rows(db).forge(Approval, Approval.id == aid, edited_by="U_CAROL")
    report = await verified(db)
    assert any(aid in p and "edited_by" in p for p in report.problems), report.problems


async def test_a_forged_vote_is_named(make_engine, ledger_path, db):
    _, aid = await edited_quorum(make_engine, ledger_path, db)
    await Rows(db).forge(ApprovalVote, ApprovalVote.approval_id == aid,
                         ApprovalVote.actor == "U_ALICE", actor="U_CAROL")
    report = await verified(db)
    assert not report.ok
    assert any(aid in p and "vote" in p and "U_CAROL" in p for p in report.problems), \
        report.problems
    assert any(aid in p and "vote" in p and "U_ALICE" in p for p in report.problems), \
        report.problems


async def test_a_forged_verdict_is_named(make_engine, ledger_path, db):
    _, aid = await edited_quorum(make_engine, ledger_path, db)
    await Rows(db).forge(Approval, Approval.id == aid, status="denied")
    report = await verified(db)
    assert any(aid in p and "status" in p for p in report.problems), report.problems


async def standing(make_engine, ledger_path, db):
    engine = engine_with(make_engine, ledger_path, approvers=["U_ALICE", "U_BOB"])
    engine.use_audit_key(KEY)
    paused = await engine.run("demo-refund", "Refund order A-1001: $30", requested_by=DANA)
    a = await Rows(db).approval(paused.approval_ids[0])
    s, _ = await engine.grant_standing(
        a.id, actor=ALICE, window=timedelta(minutes=30),
        scope=scope_for(a, "condition", when="args.amount_cents <= 5000"))
    return engine, s


async def test_a_standing_approvals_forged_grantor_is_named(make_engine, ledger_path, db):
    _, s = await standing(make_engine, ledger_path, db)
    assert (await verified(db)).ok
    await Rows(db).forge(StandingApproval, StandingApproval.id == s.id,
                         grants=json.dumps([CAROL.id]))
    report = await verified(db)
    assert any(s.id in p and "grants" in p for p in report.problems), report.problems


async def test_a_standing_approvals_widened_scope_is_named(make_engine, ledger_path, db):
    _, s = await standing(make_engine, ledger_path, db)
    scope = json.loads(s.scope)
    scope["when"] = "true"
    await Rows(db).forge(StandingApproval, StandingApproval.id == s.id, scope=json.dumps(scope))
    report = await verified(db)
    assert any(s.id in p and "scope" in p for p in report.problems), report.problems


async def test_the_trace_and_the_documents_say_a_row_disagrees(make_engine, ledger_path, db,
                                                               clock):
    engine, aid = await edited_quorum(make_engine, ledger_path, db)
    await Rows(db).forge(Approval, Approval.id == aid, decided_by="U_MALLORY")
    a = await Rows(db).approval(aid)
    view = await engine.approval_check(aid)
    assert view and any("U_MALLORY" in s for s in view)
    trace = await engine.trace(a.run_id)
    entry = next(e for e in trace.entries if e.kind == "approval" and e.approval_id == aid)
    assert entry.disagrees and "U_MALLORY" in entry.disagrees[0]
    assert BOB.id in entry.disagrees[0]


async def test_an_aborted_question_and_its_cancelled_run_agree_with_the_chain(make_engine, db):
    """A question answered Abort (denied) whose run is then cancelled: the cancel's entry
    names the request, which stays denied (no false alarm)."""
    from approvald.runtime.kernel import failpoints

    from tests.helpers import Crash, crash

    engine = make_engine(audit_key=KEY)
    paused = await engine.run("demo-refund", TASK, requested_by=DANA)
    await engine.decide(paused.approval_ids[0], actor=ALICE, verdict="approve")
    failpoints.arm("before_result@2", crash)
    try:
        try:
            await engine.advance(paused.run_id)
        except Crash:
            pass
    finally:
        failpoints.arm("")
    assert (await engine.advance(paused.run_id)).status == "needs_attention"
    [q] = [a for a in await Rows(db).approvals(paused.run_id) if a.status == "pending"]
    await engine.decide(q.id, actor=BOB, verdict="abort", reason="it did not happen")
    report = await verified(db)
    assert report.ok, report.problems
