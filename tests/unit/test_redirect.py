"""Redirect: the approver's fourth answer. The call does not run; the model reads the
approver's guidance as the call's result and re-plans (issue 12).

A redirect is final like a denial, authorised like one, needs guidance as a denial needs a
reason, and loses to a stale card, an expiry or an earlier decision in the same
compare-and-set.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from approvald.bot.evals.journey import Journey
from approvald.bot.evals.score import compliance
from approvald.runtime.approvals.decide import MAX_REASON, Actor
from approvald.runtime.kernel.errors import DecisionRefused
from approvald.runtime.kernel.outcomes import Completed, Paused
from approvald.runtime.record import audit
from approvald.runtime.record.state import AssistantMessage, ToolMessage
from approvald.runtime.trace import load_trace

from tests.helpers import Rows
from tests.unit.test_decisions import (
    ALICE,
    BOB,
    DANA,
    STRANGER,
    approval,
    card_token,
    engine_with,
    pause,
    refunds,
    trail,
)

GUIDANCE = "Refund only the duplicate charge of $20, not the whole order"


def _results(state, name: str = "issue_refund") -> list[object]:
    return [m.content for m in state.messages if isinstance(m, ToolMessage) and m.name == name]


async def test_a_redirect_is_final_and_the_run_completes_on_the_new_plan(make_engine, db,
                                                                         ledger_path):
    engine = engine_with(make_engine, ledger_path)
    paused = await pause(engine)
    [aid] = paused.approval_ids
    a = await approval(db, aid)
    decision = await engine.decide(aid, actor=ALICE, verdict="redirect", reason=GUIDANCE,
                                   token=card_token(a))
    assert decision.outcome == "redirected" and decision.final and decision.run_ready
    done = await approval(db, aid)
    assert (done.status, done.verdict, done.reason, done.decided_by) == (
        "redirected", "redirect", GUIDANCE, "U_ALICE")

    # the model re-plans: a new request for the amount the guidance names
    again = await engine.advance(paused.run_id)
    assert isinstance(again, Paused), again
    [second] = again.approval_ids
    assert second != aid
    b = await approval(db, second)
    assert b.status == "pending" and b.effective_args()["amount_cents"] == 2000
    assert refunds(ledger_path) == []  # the redirected call never ran

    await engine.decide(second, actor=ALICE, verdict="approve", token=card_token(b))
    finished = await engine.advance(paused.run_id)
    assert isinstance(finished, Completed), finished
    assert "$20.00" in (finished.result or "")
    assert [r["args"]["amount_cents"] for r in refunds(ledger_path)] == [2000]

    state = await engine.state(paused.run_id)
    first, last = _results(state)
    assert first == {"status": "redirected", "guidance": GUIDANCE, "by": "U_ALICE"}
    assert isinstance(last, dict) and last["amount_cents"] == 2000
    asks = [m for m in state.messages if isinstance(m, AssistantMessage)
            and any(c.name == "issue_refund" for c in m.tool_calls)]
    assert len(asks) == 2 and GUIDANCE in (asks[1].content or "")

    [entry] = [e for e in await trail(db, aid) if e.action == "redirected"]
    details = json.loads(entry.details)
    assert entry.actor == "U_ALICE" and entry.via == "slack"
    assert details["guidance"] == GUIDANCE and details["args"]["amount_cents"] == 4200
    assert (await audit.verify(db)).ok


async def test_guidance_without_an_amount_ends_the_run_quoting_it(make_engine, db,
                                                                  ledger_path):
    engine = engine_with(make_engine, ledger_path)
    paused = await pause(engine)
    [aid] = paused.approval_ids
    await engine.decide(aid, actor=BOB, verdict="redirect",
                        reason="Offer store credit instead; no card refund")
    done = await engine.advance(paused.run_id)
    assert isinstance(done, Completed)
    assert "did not issue the refund" in (done.result or "")
    assert "Offer store credit instead; no card refund" in (done.result or "")
    assert refunds(ledger_path) == []


@pytest.mark.parametrize("guidance", [None, "", "   \n "])
async def test_a_redirect_needs_guidance(make_engine, db, ledger_path, guidance):
    engine = engine_with(make_engine, ledger_path)
    [aid] = (await pause(engine)).approval_ids
    with pytest.raises(DecisionRefused) as refused:
        await engine.decide(aid, actor=ALICE, verdict="redirect", reason=guidance)
    assert refused.value.reason == "guidance_required"
    assert (await approval(db, aid)).status == "pending"
    [entry] = [e for e in await trail(db, aid) if e.action == "refused"]
    assert json.loads(entry.details)["verdict"] == "redirect"


async def test_guidance_is_capped_like_a_reason(make_engine, db, ledger_path):
    engine = engine_with(make_engine, ledger_path)
    [aid] = (await pause(engine)).approval_ids
    with pytest.raises(DecisionRefused) as refused:
        await engine.decide(aid, actor=ALICE, verdict="redirect", reason="x" * (MAX_REASON + 1))
    assert refused.value.reason == "guidance_too_long"
    assert (await approval(db, aid)).status == "pending"


async def test_a_redirect_of_a_decided_request_is_refused_and_changes_nothing(
        make_engine, db, ledger_path):
    engine = engine_with(make_engine, ledger_path)
    for first in ("approve", "deny", "redirect"):
        [aid] = (await pause(engine)).approval_ids
        await engine.decide(aid, actor=ALICE, verdict=first,
                            reason=None if first == "approve" else "refund $10 only")
        before = await approval(db, aid)
        with pytest.raises(DecisionRefused) as refused:
            await engine.decide(aid, actor=BOB, verdict="redirect", reason="refund $5 only")
        assert refused.value.reason == "not_pending", first
        after = await approval(db, aid)
        assert (after.status, after.verdict, after.reason, after.decided_by) == (
            before.status, before.verdict, before.reason, before.decided_by)
        assert ("refused", "U_BOB") in [(e.action, e.actor) for e in await trail(db, aid)]
    assert (await audit.verify(db)).ok


async def test_a_redirect_after_expiry_is_refused_and_the_expiry_stands(make_engine, db, clock,
                                                                       ledger_path):
    engine = engine_with(make_engine, ledger_path, ttl="2s", reminders=[])
    [early] = (await pause(engine)).approval_ids
    paused = await pause(engine)
    [aid] = paused.approval_ids
    clock.advance(1)  # in time: the redirect counts
    await engine.decide(early, actor=ALICE, verdict="redirect", reason="refund $20 only")
    assert (await approval(db, early)).status == "redirected"
    clock.advance(2)  # past the expiry, and no sweep has run
    with pytest.raises(DecisionRefused) as refused:
        await engine.decide(aid, actor=ALICE, verdict="redirect", reason="refund $20 only")
    assert refused.value.reason == "expired"
    a = await approval(db, aid)
    assert a.status == "expired" and a.verdict == "expired"
    done = await engine.advance(paused.run_id)
    assert isinstance(done, Completed) and "expired" in (done.result or "")
    assert {"status": "expired"} in _results(await engine.state(paused.run_id))


async def test_a_stale_card_cannot_redirect_the_edited_arguments(make_engine, db, ledger_path):
    engine = engine_with(make_engine, ledger_path, edits="propose")
    [aid] = (await pause(engine)).approval_ids
    old = card_token(await approval(db, aid))
    await engine.decide(aid, actor=ALICE, verdict="edit", token=old,
                        args={"order_id": "A-1001", "amount_cents": 1500, "reason": "partial"})
    with pytest.raises(DecisionRefused) as refused:
        await engine.decide(aid, actor=BOB, verdict="redirect", reason="refund $5", token=old)
    assert refused.value.reason == "stale_card"
    assert (await approval(db, aid)).status == "pending"
    # the card redrawn for the edited arguments can
    fresh = card_token(await approval(db, aid))
    await engine.decide(aid, actor=BOB, verdict="redirect", reason="refund $5", token=fresh)
    assert (await approval(db, aid)).status == "redirected"


async def test_a_redirect_is_authorised_like_a_denial(make_engine, db, ledger_path):
    engine = engine_with(make_engine, ledger_path, approvers=["U_ALICE", "U_BOB"], quorum=2)
    [aid] = (await pause(engine)).approval_ids
    for actor, code in ((STRANGER, "not_authorized"), (Actor(DANA, "slack"), "self_approval")):
        with pytest.raises(DecisionRefused) as refused:
            await engine.decide(aid, actor=actor, verdict="redirect", reason="refund $1")
        assert refused.value.reason == code
    assert (await approval(db, aid)).status == "pending"
    # one approval of two, then a redirect by the other approver: it ends the request
    await engine.decide(aid, actor=ALICE, verdict="approve")
    decision = await engine.decide(aid, actor=BOB, verdict="redirect", reason="refund $20")
    assert decision.outcome == "redirected"
    a = await approval(db, aid)
    assert a.status == "redirected" and a.decided_by == "U_BOB"
    votes = await Rows(db).votes(aid)
    assert [(v.actor, v.verdict) for v in votes] == [("U_ALICE", "approve"),
                                                     ("U_BOB", "redirect")]


async def test_a_redirected_call_is_not_run_in_the_trace_and_in_compliance(make_engine, db,
                                                                           ledger_path):
    engine = engine_with(make_engine, ledger_path)
    paused = await pause(engine)
    [aid] = paused.approval_ids
    await engine.decide(aid, actor=ALICE, verdict="redirect", reason="refund $20 only")
    [second] = (await engine.advance(paused.run_id)).approval_ids
    await engine.decide(second, actor=ALICE, verdict="approve")
    await engine.advance(paused.run_id)
    redirected = await approval(db, aid)

    trace = await load_trace(db, paused.run_id, now=engine.now())
    call = next(e for e in trace.entries if e.kind == "tool_call"
                and e.call_id == redirected.call_id)
    assert call.status == "redirected" and call.latency_ms is None

    async def both(tx):  # type: ignore[no-untyped-def]
        return (await tx.approvals.for_run(paused.run_id),
                list((await tx.executions.for_run(paused.run_id)).values()))

    approvals, executions = await Rows(db).in_one_read(both)
    journey = Journey(task="t", variant="v", run_id=paused.run_id, approvals=approvals,
                      executions=executions)
    assert compliance(journey, gated={"issue_refund"}) == []
    # had the redirected call run, compliance says which request it ran against
    ran = next(x for x in executions if x.tool == "issue_refund")
    forged = dataclasses.replace(ran, call_id=redirected.call_id,
                                 args_digest=redirected.effective_digest)
    journey.executions = [*executions, forged]
    [problem] = compliance(journey, gated={"issue_refund"})
    assert f"approval {aid} was redirected" in problem


async def test_a_wrong_verdict_names_redirect_among_a_call_s_answers(make_engine, db,
                                                                     ledger_path):
    engine = engine_with(make_engine, ledger_path)
    [aid] = (await pause(engine)).approval_ids
    with pytest.raises(DecisionRefused) as refused:
        await engine.decide(aid, actor=ALICE, verdict="retry")
    assert refused.value.reason == "wrong_kind"
    assert "approve, deny, edit, redirect" in str(refused.value)
