"""The approval lifecycle: persist-then-request, decide once, deny as data, expire, escalate."""

from __future__ import annotations

import asyncio
import json
import random
from datetime import timedelta

import pytest
from approvald.runtime.approvals.decide import Actor
from approvald.runtime.kernel.errors import DecisionRefused
from approvald.runtime.kernel.outcomes import Completed, Paused
from approvald.runtime.policies.directory import StaticDirectory
from approvald.runtime.policies.policy import ApprovalPolicy, Rung
from approvald.runtime.record.state import ToolMessage
from approvald.runtime.runs.demo import REFUND_POLICY, DemoLedger, refund_agent
from approvald.store.models import Outbox
from sqlalchemy import select

from tests.conftest import SIGNER, ledger_lines
from tests.helpers import Rows

ALICE = Actor("U_ALICE", "slack")
BOB = Actor("U_BOB", "slack")
CAROL = Actor("U_CAROL", "slack")
DANA = "U_DANA"  # the requester
TASK = "Refund order A-1001, customer was double charged"


def request_and_trail(aid: str):  # type: ignore[no-untyped-def]
    """A request and its audit trail, read together."""
    async def read(tx):  # type: ignore[no-untyped-def]
        return await tx.approvals.get(aid), await tx.audit.query(approval_id=aid)
    return read


def refunds(engine_factory, ledger_path, directory=None, **policy):
    base = REFUND_POLICY.model_dump()
    base.update(policy)
    agent = refund_agent(DemoLedger(str(ledger_path)),
                         approval=ApprovalPolicy.model_validate(base))
    return engine_factory(agents=[agent], directory=directory)


async def pause(engine) -> Paused:
    outcome = await engine.run("demo-refund", TASK, requested_by=DANA)
    assert isinstance(outcome, Paused), outcome
    return outcome


def refund_lines(ledger_path):
    return [e for e in ledger_lines(ledger_path) if e["tool"] == "issue_refund"]


async def test_request_is_committed_with_exact_args_before_anything_is_delivered(make_engine, db):
    engine = make_engine()
    outcome = await pause(engine)
    [approval_id] = outcome.approval_ids
    async def rows(tx):  # type: ignore[no-untyped-def]
        return (await tx.approvals.get(approval_id), await tx.runs.get(outcome.run_id),
                await tx.outbox.recent(kind="approval.requested"),
                await tx.audit.query(approval_id=approval_id))

    a, run, posts, trail = await Rows(db).in_one_read(rows)
    assert run.status == "awaiting_approval" and run.lease_owner is None
    assert a.status == "pending" and a.tool == "issue_refund"
    assert a.args_value() == {"order_id": "A-1001", "amount_cents": 4200,
                              "reason": "duplicate charge"}
    from approvald.runtime.kernel.canonical import call_digest

    assert a.digest == call_digest("issue_refund", a.args_value())
    assert len(a.token_nonce) == 32  # 128 random bits; the token itself is never stored
    assert a.expires_at - a.requested_at == timedelta(minutes=30)
    packet = json.loads(a.packet)
    assert "charged twice" in packet["doing"]
    assert packet["evidence"][0]["tool"] == "lookup_order"
    assert packet["impact"].startswith("$42.00") and packet["risk"] == "high"
    assert [p.status for p in posts] == ["pending"]  # queued, not sent
    assert json.loads(posts[0].payload) == {"approval_id": approval_id}
    assert [t.action for t in trail] == ["requested"]


async def test_approve_executes_the_refund_once_then_emails_and_finishes(make_engine, ledger_path):
    engine = make_engine()
    outcome = await pause(engine)
    decision = await engine.decide(outcome.approval_ids[0], actor=ALICE, verdict="approve")
    assert decision.outcome == "approved" and decision.run_ready
    done = await engine.advance(outcome.run_id)
    assert isinstance(done, Completed) and "was issued" in (done.result or "")
    assert len(refund_lines(ledger_path)) == 1
    again = await engine.advance(outcome.run_id)  # a second resume changes nothing
    assert again.status == "completed" and len(refund_lines(ledger_path)) == 1
    assert [e["tool"] for e in ledger_lines(ledger_path)] == [
        "lookup_order", "issue_refund", "send_customer_email"]


async def test_deny_reaches_the_model_as_a_tool_result_and_is_quoted(make_engine, ledger_path):
    engine = make_engine()
    outcome = await pause(engine)
    await engine.decide(outcome.approval_ids[0], actor=ALICE, verdict="deny",
                        reason="Customer already got a credit")
    done = await engine.advance(outcome.run_id)
    assert done.status == "completed"
    state = await engine.state(outcome.run_id)
    result = next(m for m in state.messages
                  if isinstance(m, ToolMessage) and m.name == "issue_refund")
    assert result.content == {"status": "denied", "reason": "Customer already got a credit",
                              "by": "U_ALICE"}
    assert '"Customer already got a credit"' in (done.result or "")
    assert refund_lines(ledger_path) == []


async def test_expiry_cancels_and_the_model_is_told(make_engine, clock, ledger_path):
    engine = make_engine()
    outcome = await pause(engine)
    clock.advance(timedelta(minutes=29))
    assert (await engine.sweep()).expired == []
    clock.advance(timedelta(minutes=1))
    swept = await engine.sweep()
    assert swept.expired == list(outcome.approval_ids)
    assert swept.runs_ready == {outcome.run_id}
    done = await engine.advance(outcome.run_id)
    assert "expired" in (done.result or "")
    state = await engine.state(outcome.run_id)
    assert any(isinstance(m, ToolMessage) and m.content == {"status": "expired"}
               for m in state.messages)
    assert refund_lines(ledger_path) == []
    with pytest.raises(DecisionRefused) as late:
        await engine.decide(outcome.approval_ids[0], actor=ALICE, verdict="approve")
    assert late.value.reason == "not_pending" and "expired" in str(late.value)


@pytest.mark.parametrize("actor,code", [
    (Actor(DANA, "slack"), "self_approval"),
    (Actor("U_MALLORY", "slack"), "not_authorized"),
])
async def test_requester_and_strangers_are_refused_and_change_nothing(
        make_engine, ledger_path, db, actor, code):
    engine = refunds(make_engine, ledger_path, approvers=["U_ALICE", "S_FINANCE"])
    outcome = await pause(engine)
    with pytest.raises(DecisionRefused) as err:
        await engine.decide(outcome.approval_ids[0], actor=actor, verdict="approve")
    assert err.value.reason == code
    async def request_and_votes(tx):  # type: ignore[no-untyped-def]
        a = await tx.approvals.get(outcome.approval_ids[0])
        return a, await tx.approvals.votes(a.id)

    a, votes = await Rows(db).in_one_read(request_and_votes)
    assert a.status == "pending" and votes == []


async def test_group_members_may_approve(make_engine, ledger_path):
    engine = refunds(make_engine, ledger_path, approvers=["S_FINANCE"],
                     directory=StaticDirectory({"S_FINANCE": ["U_BOB"]}))
    outcome = await pause(engine)
    with pytest.raises(DecisionRefused):
        await engine.decide(outcome.approval_ids[0], actor=ALICE, verdict="approve")
    decision = await engine.decide(outcome.approval_ids[0], actor=BOB, verdict="approve")
    assert decision.outcome == "approved"


async def test_tokens_bind_a_click_to_one_live_request(make_engine, db):
    engine = make_engine()
    outcome = await pause(engine)
    a = await Rows(db).approval(outcome.approval_ids[0])
    token = SIGNER.token(a.id, a.token_nonce, a.digest)
    legacy = SIGNER._mac(f"{a.id}|{a.token_nonce}")  # a card drawn before digests were bound
    for bad in ("", "x" * 32, token[:-1] + ("A" if token[-1] != "A" else "B"), legacy[:-1]):
        with pytest.raises(DecisionRefused) as err:
            await engine.decide(a.id, actor=ALICE, verdict="approve", token=bad)
        assert err.value.reason == "bad_token"
    decision = await engine.decide(a.id, actor=ALICE, verdict="approve", token=token)
    assert decision.outcome == "approved"
    other = await pause(engine)  # an unedited request still takes a pre-upgrade card's click
    b = await Rows(db).approval(other.approval_ids[0])
    assert (await engine.decide(b.id, actor=ALICE, verdict="approve",
                                token=SIGNER._mac(f"{b.id}|{b.token_nonce}"))).final


async def test_quorum_two_of_three(make_engine, ledger_path):
    engine = refunds(make_engine, ledger_path, approvers=["U_ALICE", "U_BOB", "U_CAROL"],
                     quorum=2)
    outcome = await pause(engine)
    aid = outcome.approval_ids[0]
    first = await engine.decide(aid, actor=ALICE, verdict="approve")
    assert (first.outcome, first.approvals, first.quorum, first.run_ready) == ("voted", 1, 2,
                                                                               False)
    with pytest.raises(DecisionRefused) as twice:
        await engine.decide(aid, actor=ALICE, verdict="approve")
    assert twice.value.reason == "already_voted"  # the same person twice is not two
    second = await engine.decide(aid, actor=BOB, verdict="approve")
    assert second.outcome == "approved" and second.run_ready
    done = await engine.advance(outcome.run_id)
    assert done.status == "completed" and len(refund_lines(ledger_path)) == 1


async def test_quorum_any_denial_denies(make_engine, ledger_path):
    engine = refunds(make_engine, ledger_path, approvers=["U_ALICE", "U_BOB", "U_CAROL"],
                     quorum=2)
    outcome = await pause(engine)
    aid = outcome.approval_ids[0]
    await engine.decide(aid, actor=ALICE, verdict="approve")
    denied = await engine.decide(aid, actor=CAROL, verdict="deny", reason="wrong amount")
    assert denied.outcome == "denied" and denied.run_ready
    with pytest.raises(DecisionRefused):
        await engine.decide(aid, actor=BOB, verdict="approve")
    done = await engine.advance(outcome.run_id)
    assert "wrong amount" in (done.result or "") and refund_lines(ledger_path) == []


async def test_edit_with_invalid_arguments_is_refused_and_changes_nothing(make_engine, db):
    engine = make_engine()
    outcome = await pause(engine)
    aid = outcome.approval_ids[0]
    for bad in ({"order_id": "A-1001", "amount_cents": "lots", "reason": "x"},
                {"order_id": "A-1001"}, {"order_id": "A-1001", "amount_cents": 1, "reason": "x",
                                         "extra": True}, ["not", "an", "object"]):
        with pytest.raises(DecisionRefused) as err:
            await engine.decide(aid, actor=ALICE, verdict="edit", args=bad)
        assert err.value.reason == "invalid_arguments"
    a, trail = await Rows(db).in_one_read(request_and_trail(aid))
    assert a.status == "pending" and a.edited_args is None
    # nothing changed but the record of four refused attempts
    assert [t.action for t in trail] == ["requested"] + ["refused"] * 4
    assert {json.loads(t.details)["reason"] for t in trail[1:]} == {"invalid_arguments"}


async def test_valid_edit_executes_the_edited_arguments_and_audit_shows_both(
        make_engine, db, ledger_path):
    engine = make_engine()
    outcome = await pause(engine)
    aid = outcome.approval_ids[0]
    edited = {"order_id": "A-1001", "amount_cents": 2100, "reason": "half of the duplicate"}
    decision = await engine.decide(aid, actor=ALICE, verdict="edit", args=edited)
    assert decision.outcome == "approved"
    await engine.advance(outcome.run_id)
    assert [e["args"] for e in refund_lines(ledger_path)] == [edited]
    a, trail = await Rows(db).in_one_read(request_and_trail(aid))
    from approvald.runtime.kernel.canonical import call_digest

    assert a.edited_digest == call_digest("issue_refund", edited) != a.digest
    edit_entry = next(t for t in trail if t.action == "edited")
    details = json.loads(edit_entry.details)
    assert details["args"] == edited and details["original_args"]["amount_cents"] == 4200
    assert details["original_digest"] == a.digest
    assert [t.action for t in trail] == ["requested", "edited", "approved", "executed"]
    state = await engine.state(outcome.run_id)
    obs = next(m for m in state.messages if isinstance(m, ToolMessage) and m.name == "issue_refund")
    assert obs.content["status"] == "executed_with_edits"


async def test_executor_refuses_an_approval_whose_arguments_were_tampered_with(
        make_engine, db, ledger_path):
    engine = make_engine()
    outcome = await pause(engine)
    aid = outcome.approval_ids[0]
    await engine.decide(aid, actor=ALICE, verdict="approve")
    from approvald.store.models import Approval

    # somebody rewrites the approved arguments in the database
    await Rows(db).forge(Approval, Approval.id == aid, args=json.dumps(
        {"order_id": "A-1001", "amount_cents": 999999, "reason": "x"}))
    done = await engine.advance(outcome.run_id)
    assert done.status == "failed" and "does not match" in done.error  # type: ignore[attr-defined]
    assert refund_lines(ledger_path) == []


@pytest.mark.parametrize("left", [timedelta(seconds=1), timedelta(0)])
async def test_fifty_concurrent_decisions_racing_expiry_have_one_outcome(
        make_engine, db, clock, ledger_path, left):
    engine = refunds(make_engine, ledger_path, approvers=["U_A0", "U_A1", "U_A2", "U_A3",
                                                          "U_A4", "U_A5"])
    outcome = await pause(engine)
    aid = outcome.approval_ids[0]
    # a second before its deadline the clicks can win; at the deadline only silence can
    clock.advance(timedelta(minutes=30) - left)
    rnd = random.Random(7)
    attempts = []
    for i in range(50):
        kind = rnd.choice(["approver", "approver", "requester", "stranger"])
        who = {"approver": f"U_A{i % 6}", "requester": DANA, "stranger": f"U_X{i}"}[kind]
        verdict = rnd.choice(["approve", "deny"])
        attempts.append(engine.decide(aid, actor=Actor(who, "slack"), verdict=verdict,
                                      reason="no" if verdict == "deny" else None))
    attempts.append(engine.sweep())
    results = await asyncio.gather(*attempts, return_exceptions=True)
    accepted = [r for r in results[:-1] if not isinstance(r, BaseException)]
    decisions = [r for r in accepted if not r.repeated]
    # the winner clicking the same verdict again: it stands, audited as a repeat
    repeats = [r for r in accepted if r.repeated]
    refusals = [r for r in results[:-1] if isinstance(r, DecisionRefused)]
    others = [r for r in results[:-1] if isinstance(r, BaseException)
              and not isinstance(r, DecisionRefused)]
    assert others == []
    a, trail = await Rows(db).in_one_read(request_and_trail(aid))
    decided = [t.action for t in trail if t.action in ("approved", "denied", "expired")]
    assert len(decided) == 1 and a.status in ("approved", "denied", "expired")
    assert len(decisions) == (1 if left else 0) and (a.status == "expired") == (not left)
    assert len(refusals) == 50 - len(decisions) - len(repeats)
    assert {r.approval.decided_by for r in repeats} <= {a.decided_by}
    assert len([t for t in trail if t.action == "repeated"]) == len(repeats)
    assert {r.reason for r in refusals} <= {"not_pending", "self_approval", "not_authorized",
                                            "already_voted", "expired"}
    assert len([t for t in trail if t.action == "refused"]) == len(refusals)
    done = await engine.advance(outcome.run_id)
    assert done.status == "completed"
    assert len(refund_lines(ledger_path)) == (1 if a.status == "approved" else 0)


async def test_escalation_ladder_reminds_escalates_then_cancels(make_engine, db, clock,
                                                               ledger_path):
    engine = refunds(make_engine, ledger_path, approvers=["U_ALICE"], ttl="30m",
                     reminders=["50%", "90%"], on_expire="escalate",
                     escalate=[Rung(approvers=["U_CFO"], ttl="1h")])
    outcome = await pause(engine)
    first = outcome.approval_ids[0]
    a = await Rows(db).approval(first)
    old_token = SIGNER.token(a.id, a.token_nonce, a.digest)

    clock.advance(timedelta(minutes=15))
    assert (await engine.sweep()).reminded == [first]
    assert (await engine.sweep()).reminded == []  # once per reminder
    clock.advance(timedelta(minutes=12))
    assert (await engine.sweep()).reminded == [first]
    clock.advance(timedelta(minutes=3))
    swept = await engine.sweep()
    assert swept.expired == [] and len(swept.escalated) == 1
    old, new = swept.escalated[0]
    assert old == first
    async def both_and_run(tx):  # type: ignore[no-untyped-def]
        return (await tx.approvals.get(first), await tx.approvals.get(new),
                await tx.runs.get(outcome.run_id))

    a_old, a_new, run = await Rows(db).in_one_read(both_and_run)
    assert a_old.status == "superseded" and a_new.status == "pending"
    assert a_new.approvers_value() == ["U_CFO"] and a_new.rung == 1 and a_new.supersedes == first
    assert a_new.token_nonce != a_old.token_nonce
    assert a_new.expires_at - a_new.requested_at == timedelta(hours=1)
    assert run.status == "awaiting_approval"
    with pytest.raises(DecisionRefused) as err:  # the old card's button stops working
        await engine.decide(first, actor=ALICE, verdict="approve", token=old_token)
    assert err.value.reason == "not_pending" and "escalated" in str(err.value)
    with pytest.raises(DecisionRefused) as err:  # and the old token does not fit the new one
        await engine.decide(new, actor=Actor("U_CFO", "slack"), verdict="approve",
                            token=old_token)
    assert err.value.reason == "bad_token"
    with pytest.raises(DecisionRefused):  # rung 0's approver is not on rung 1
        await engine.decide(new, actor=ALICE, verdict="approve")

    clock.advance(timedelta(minutes=30))
    assert (await engine.sweep()).reminded == [new]
    clock.advance(timedelta(minutes=30))
    final = await engine.sweep()
    assert final.expired == [new] and final.escalated == []  # end of the ladder: cancel
    done = await engine.advance(outcome.run_id)
    assert "expired" in (done.result or "") and refund_lines(ledger_path) == []
    actions = [t.action for t in await Rows(db).audit(run_id=outcome.run_id)]
    assert actions == ["executed", "requested", "reminded", "reminded", "requested",
                       "superseded", "escalated", "refused", "refused", "refused", "reminded",
                       "expired"]


async def test_silence_never_approves(make_engine, db, clock, ledger_path):
    """Whatever the policy, sweeping forever never runs a gated call."""
    engine = refunds(make_engine, ledger_path, on_expire="escalate",
                     escalate=[Rung(approvers=["U_X"], ttl="1m"),
                               Rung(approvers=["U_Y"], ttl="1m")])
    outcome = await pause(engine)
    for _ in range(20):
        clock.advance(timedelta(hours=1))
        await engine.sweep()
    done = await engine.advance(outcome.run_id)
    assert done.status == "completed" and refund_lines(ledger_path) == []
    statuses = [a.status for a in await Rows(db).approvals(outcome.run_id)]
    assert statuses == ["superseded", "superseded", "expired"]


async def test_several_gated_calls_resume_only_when_all_are_decided(make_engine, ledger_path):
    from approvald.runtime.models.scripted import ScriptedModel, reply
    from approvald.runtime.policies.tools import ToolContext, tool
    from approvald.runtime.runs.agent import Agent

    ran: list[int] = []

    @tool(permission="execute")
    async def pay(ctx: ToolContext, n: int) -> int:
        """Pays n."""
        ran.append(n)
        return n

    agent = Agent(name="payer", instructions="", tools=[pay], model=ScriptedModel.sequence([
        reply("three payments", ("pay", {"n": 1}), ("pay", {"n": 2}), ("pay", {"n": 3})),
        reply("done", turn=1)]))
    engine = make_engine(agents=[agent])
    outcome = await engine.run("payer", "pay", requested_by=DANA)
    assert isinstance(outcome, Paused) and len(outcome.approval_ids) == 3
    a1, a2, a3 = outcome.approval_ids
    assert not (await engine.decide(a1, actor=ALICE, verdict="approve")).run_ready
    assert not (await engine.decide(a2, actor=ALICE, verdict="deny", reason="no")).run_ready
    assert (await engine.advance(outcome.run_id)).status == "awaiting_approval"
    assert ran == []
    assert (await engine.decide(a3, actor=ALICE, verdict="approve")).run_ready
    done = await engine.advance(outcome.run_id)
    assert done.status == "completed" and ran == [1, 3]
    state = await engine.state(outcome.run_id)
    results = [m.content for m in state.messages if isinstance(m, ToolMessage)]
    assert results == [1, {"status": "denied", "reason": "no", "by": "U_ALICE"}, 3]


async def test_outbox_rows_per_transition(make_engine, db):
    engine = make_engine()
    outcome = await pause(engine)
    await engine.decide(outcome.approval_ids[0], actor=ALICE, verdict="approve")
    async def kinds(tx):  # type: ignore[no-untyped-def]
        return (await tx.conn.execute(select(Outbox.kind, Outbox.group_key)
                                      .order_by(Outbox.id))).all()

    rows = await Rows(db).in_one_read(kinds)
    aid = outcome.approval_ids[0]
    assert rows == [("approval.requested", aid), ("approval.updated", aid)]
