"""A decision means exactly what the approver saw: the gate's ways around, closed.

Each test here reproduces one way a hostile user got past the gate on an earlier main
(an expired request still approvable, a relaxed policy running a denied call, a stale
vote approving edited arguments, an edit that dead-ended a quorum, a cancel that went
unrecorded or was dropped while a step parked, refusals that left no trace) and checks
the fix on both dialects.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from datetime import timedelta
from typing import Any

import pytest
from approvald.runtime.approvals.decide import Actor
from approvald.runtime.kernel import binding
from approvald.runtime.kernel.canonical import call_digest
from approvald.runtime.kernel.errors import DecisionRefused
from approvald.runtime.kernel.outcomes import Cancelled, Completed, Paused
from approvald.runtime.models.scripted import ScriptedModel, reply
from approvald.runtime.policies.directory import StaticDirectory
from approvald.runtime.policies.policy import ApprovalPolicy, PolicyFile
from approvald.runtime.policies.tools import ToolContext, tool
from approvald.runtime.record.state import ToolMessage
from approvald.runtime.runs.agent import Agent
from approvald.runtime.runs.demo import REFUND_POLICY, DemoLedger, refund_agent

from tests.conftest import SIGNER, ledger_lines
from tests.helpers import Rows, parts

ALICE = Actor("U_ALICE", "slack")
BOB = Actor("U_BOB", "slack")
CAROL = Actor("U_CAROL", "slack")
STRANGER = Actor("U_MALLORY", "slack")
DANA = "U_DANA"  # the requester
TASK = "Refund order A-1001, customer was double charged"


def engine_with(make_engine, ledger_path, policy_file: PolicyFile | None = None,
                directory=None, **policy):
    base = REFUND_POLICY.model_dump()
    base.update(policy)
    agent = refund_agent(DemoLedger(str(ledger_path)),
                         approval=ApprovalPolicy.model_validate(base))
    return make_engine(agents=[agent], policy=policy_file, directory=directory)


def card_token(a) -> str:
    """The token on a card drawn now for ``a`` (the arguments it shows are bound in)."""
    params = inspect.signature(SIGNER.token).parameters
    if len(params) >= 3:
        return SIGNER.token(a.id, a.token_nonce, a.effective_digest)
    return SIGNER.token(a.id, a.token_nonce)  # a signer that binds no digest


async def pause(engine) -> Paused:
    outcome = await engine.run("demo-refund", TASK, requested_by=DANA)
    assert isinstance(outcome, Paused), outcome
    return outcome


async def approval(db, approval_id):
    return await Rows(db).approval(approval_id)


def refunds(ledger_path) -> list[dict[str, Any]]:
    return [e for e in ledger_lines(ledger_path) if e["tool"] == "issue_refund"]


async def trail(db, approval_id=None, run_id=None):
    return await Rows(db).audit(approval_id=approval_id, run_id=run_id)


# -- 1. an expired request cannot be approved, whatever the sweep has done -----------------

async def test_a_decision_after_expiry_is_refused_and_applies_the_expiry(make_engine, db, clock,
                                                                        ledger_path):
    engine = engine_with(make_engine, ledger_path, ttl="2s", reminders=[])
    paused = await pause(engine)
    [aid] = paused.approval_ids
    clock.advance(4)  # no sweep runs
    with pytest.raises(DecisionRefused) as refused:
        await engine.decide(aid, actor=ALICE, verdict="approve", token=card_token(
            await approval(db, aid)))
    assert refused.value.reason == "expired"
    a = await approval(db, aid)
    assert a.status == "expired" and a.decided_by == "system:expiry"  # applied then and there
    done = await engine.advance(paused.run_id)
    assert isinstance(done, Completed) and "expired" in done.result
    assert refunds(ledger_path) == []
    state = await engine.state(paused.run_id)
    assert {"status": "expired"} in [m.content for m in state.messages
                                     if isinstance(m, ToolMessage)]
    actions = [(e.action, json.loads(e.details).get("reason")) for e in await trail(db, aid)]
    assert ("expired", None) in actions and ("refused", "expired") in actions


async def test_a_decision_at_the_exact_expiry_instant_is_too_late(make_engine, db, clock,
                                                                 ledger_path):
    engine = engine_with(make_engine, ledger_path, ttl="2s", reminders=[])
    [aid] = (await pause(engine)).approval_ids
    clock.advance(2)
    with pytest.raises(DecisionRefused) as refused:
        await engine.decide(aid, actor=ALICE, verdict="deny", reason="too late anyway")
    assert refused.value.reason == "expired"
    assert (await approval(db, aid)).status == "expired"


async def test_a_late_decision_escalates_when_the_policy_says_so(make_engine, db, clock,
                                                                ledger_path):
    engine = engine_with(make_engine, ledger_path, ttl="2s", reminders=[],
                         on_expire="escalate", escalate=[{"approvers": ["U_CFO"], "ttl": "1h"}])
    paused = await pause(engine)
    [aid] = paused.approval_ids
    clock.advance(3)
    with pytest.raises(DecisionRefused):
        await engine.decide(aid, actor=ALICE, verdict="approve")
    rows = await Rows(db).approvals(paused.run_id)
    assert [(r.status, r.rung) for r in rows] == [("superseded", 0), ("pending", 1)]
    assert rows[1].approvers_value() == ["U_CFO"]
    assert refunds(ledger_path) == []


async def test_the_modal_preflight_refuses_an_expired_request(make_engine, db, clock,
                                                              ledger_path):
    engine = engine_with(make_engine, ledger_path, ttl="2s", reminders=[])
    [aid] = (await pause(engine)).approval_ids
    clock.advance(5)
    a = await approval(db, aid)
    with pytest.raises(DecisionRefused) as refused:
        parts(engine).decider.check_open(a, card_token(a))
    assert refused.value.reason == "expired"


# -- 2. the stored request decides, not today's policy file ---------------------------------

@pytest.mark.parametrize("how", ["deny", "expire"])
async def test_a_relaxed_policy_never_runs_a_refused_call(make_engine, db, clock, ledger_path,
                                                          how):
    engine = engine_with(make_engine, ledger_path, ttl="30m")
    paused = await pause(engine)
    [aid] = paused.approval_ids
    if how == "deny":
        await engine.decide(aid, actor=ALICE, verdict="deny", reason="not this one",
                            token=card_token(await approval(db, aid)))
    else:
        clock.advance(timedelta(hours=1))
        await engine.sweep()
    # someone relaxes the tool to `auto` in the policy file and restarts before the resume
    relaxed = PolicyFile.model_validate({"tools": {"issue_refund": {"policy": "auto"}}})
    restarted = engine_with(make_engine, ledger_path, policy_file=relaxed)
    done = await restarted.advance(paused.run_id)
    assert isinstance(done, Completed), done
    assert refunds(ledger_path) == []
    content = [m.content for m in (await restarted.state(paused.run_id)).messages
               if isinstance(m, ToolMessage) and m.name == "issue_refund"]
    assert content[0]["status"] == ("denied" if how == "deny" else "expired")


async def test_a_forbidding_policy_does_not_undo_an_approval_already_given(make_engine, db,
                                                                          ledger_path):
    engine = engine_with(make_engine, ledger_path)
    paused = await pause(engine)
    [aid] = paused.approval_ids
    await engine.decide(aid, actor=ALICE, verdict="approve", token=card_token(
        await approval(db, aid)))
    stricter = PolicyFile.model_validate({"tools": {"issue_refund": {"policy": "forbidden"}}})
    restarted = engine_with(make_engine, ledger_path, policy_file=stricter)
    done = await restarted.advance(paused.run_id)
    assert isinstance(done, Completed) and "was issued" in done.result
    assert len(refunds(ledger_path)) == 1  # the request already made keeps its rules


# -- 3. votes count only for the arguments they were cast on --------------------------------

class GatedDirectory(StaticDirectory):
    """Group membership whose lookups wait until released: a slow Slack in flight."""

    def __init__(self, groups: dict[str, list[str]]) -> None:
        super().__init__(groups)
        self.release = asyncio.Event()
        self.asked = asyncio.Event()

    async def members(self, group_id: str) -> frozenset[str]:
        self.asked.set()
        await self.release.wait()
        return await super().members(group_id)


async def test_a_vote_in_flight_during_an_edit_does_not_approve_the_edited_arguments(
        make_engine, db, ledger_path):
    directory = GatedDirectory({"S_OPS": ["U_BOB"]})
    engine = engine_with(make_engine, ledger_path, approvers=["U_ALICE", "S_OPS", "U_CAROL"],
                         quorum=2, directory=directory)
    paused = await pause(engine)
    [aid] = paused.approval_ids
    a = await approval(db, aid)
    old_card = card_token(a)  # every approver looks at the same card
    assert (await engine.decide(aid, actor=CAROL, verdict="approve", token=old_card)
            ).outcome == "voted"
    # Bob clicks Approve on that card; his group lookup is slow, so his click is in flight
    bob = asyncio.create_task(engine.decide(aid, actor=BOB, verdict="approve", token=old_card))
    await directory.asked.wait()
    # meanwhile Alice edits the amount (her edit counts as her approval of the new amount)
    edited = {"order_id": "A-1001", "amount_cents": 99_00, "reason": "duplicate charge"}
    alice = await engine.decide(aid, actor=ALICE, verdict="edit", args=edited,
                                token=old_card)
    assert alice.outcome == "voted" and alice.approvals == 1
    directory.release.set()
    with pytest.raises(DecisionRefused) as refused:
        await bob
    assert refused.value.reason in ("stale_card", "bad_token")
    a = await approval(db, aid)
    assert a.status == "pending" and a.effective_args()["amount_cents"] == 99_00
    await engine.advance(paused.run_id)
    assert refunds(ledger_path) == []  # one vote on the edited amount is not a quorum
    # Bob, looking at the re-drawn card, approves the amount he now sees: that is a quorum
    fresh = await approval(db, aid)
    assert card_token(fresh) != old_card
    done = await engine.decide(aid, actor=BOB, verdict="approve", token=card_token(fresh))
    assert done.outcome == "approved" and done.approvals == 2
    await engine.advance(paused.run_id)
    assert [r["args"]["amount_cents"] for r in refunds(ledger_path)] == [99_00]
    approved = [json.loads(e.details) for e in await trail(db, aid) if e.action == "approved"]
    assert approved[0]["approvers"] == ["U_ALICE", "U_BOB"]
    assert approved[0]["args"]["amount_cents"] == 99_00


async def test_the_cli_can_pin_the_arguments_it_decides_on(make_engine, db, ledger_path):
    engine = engine_with(make_engine, ledger_path, approvers=["U_ALICE", "U_BOB"], quorum=2)
    [aid] = (await pause(engine)).approval_ids
    seen = (await approval(db, aid)).effective_digest
    edited = {"order_id": "A-1001", "amount_cents": 10, "reason": "duplicate charge"}
    await engine.decide(aid, actor=ALICE, verdict="edit", args=edited)
    with pytest.raises(DecisionRefused) as refused:  # (the binding approvals show printed)
        await engine.decide(aid, actor=BOB, verdict="approve",
                            expect_digest=binding.short(seen))
    assert refused.value.reason == "stale_card"
    assert (await approval(db, aid)).status == "pending"
    # the command line may still give a plain digest, as earlier versions printed it; no
    # other face may (it would let anyone try candidates for a masked value)
    cli = Actor("U_BOB", "cli")
    with pytest.raises(DecisionRefused) as refused:
        await engine.decide(aid, actor=cli, verdict="approve", expect_digest=seen[:12])
    assert refused.value.reason == "stale_card"
    now = (await approval(db, aid)).effective_digest
    with pytest.raises(DecisionRefused) as refused:
        await engine.decide(aid, actor=BOB, verdict="approve", expect_digest=now[:12])
    assert refused.value.reason == "unknown_digest"
    assert now not in str(refused.value) and binding.short(now) in str(refused.value)
    done = await engine.decide(aid, actor=cli, verdict="approve", expect_digest=now[:12])
    assert done.outcome == "approved"


# -- 4. an edit under quorum resets the votes, and never dead-ends -------------------------

async def test_an_edit_under_quorum_resets_votes_and_the_earlier_voter_can_vote_again(
        make_engine, db, ledger_path):
    engine = engine_with(make_engine, ledger_path, approvers=["U_ALICE", "U_BOB"], quorum=2)
    paused = await pause(engine)
    [aid] = paused.approval_ids
    first = await engine.decide(aid, actor=ALICE, verdict="approve",
                                token=card_token(await approval(db, aid)))
    assert first.outcome == "voted"
    edited = {"order_id": "A-1001", "amount_cents": 30_00, "reason": "duplicate charge"}
    bob = await engine.decide(aid, actor=BOB, verdict="edit", args=edited,
                              token=card_token(await approval(db, aid)))
    assert bob.outcome == "voted" and bob.approvals == 1
    assert bob.discarded == ("U_ALICE",)  # Alice's vote was on the old amount
    a = await approval(db, aid)
    assert a.edited_by == "U_BOB" and a.approve_count == 1
    again = await engine.decide(aid, actor=ALICE, verdict="approve", token=card_token(a))
    assert again.outcome == "approved" and again.approvals == 2
    await engine.advance(paused.run_id)
    assert [r["args"]["amount_cents"] for r in refunds(ledger_path)] == [30_00]
    votes = await Rows(db).votes(aid)
    assert sorted((v.actor, v.digest == a.digest) for v in votes) == [
        ("U_ALICE", False), ("U_ALICE", True), ("U_BOB", False)]


async def test_propose_mode_needs_someone_other_than_the_editor(make_engine, db, ledger_path):
    engine = engine_with(make_engine, ledger_path, approvers=["U_ALICE", "U_BOB"], quorum=1,
                         edits="propose")
    paused = await pause(engine)
    [aid] = paused.approval_ids
    proposed = {"order_id": "A-1001", "amount_cents": 12_00, "reason": "partial refund"}
    edit = await engine.decide(aid, actor=ALICE, verdict="edit", args=proposed,
                               token=card_token(await approval(db, aid)))
    assert edit.outcome == "edited" and not edit.run_ready
    a = await approval(db, aid)
    assert a.status == "pending" and a.effective_args() == proposed
    with pytest.raises(DecisionRefused) as refused:
        await engine.decide(aid, actor=ALICE, verdict="approve", token=card_token(a))
    assert refused.value.reason == "own_edit"
    done = await engine.decide(aid, actor=BOB, verdict="approve", token=card_token(a))
    assert done.outcome == "approved"
    await engine.advance(paused.run_id)
    assert [r["args"] for r in refunds(ledger_path)] == [proposed]
    entries = {e.action: json.loads(e.details) for e in await trail(db, aid)}
    # the proposed, edited and executed arguments are separate records
    assert entries["requested"]["args"]["amount_cents"] == 42_00
    assert entries["edited"]["args"] == proposed and entries["edited"]["mode"] == "propose"
    assert entries["edited"]["previous_args"]["amount_cents"] == 42_00
    assert entries["approved"]["approvers"] == ["U_BOB"]
    assert entries["executed"]["args"] == proposed


async def test_a_proposal_needs_a_quorum_besides_its_author_even_one_who_voted_before(
        make_engine, db, ledger_path):
    """Found by the model test's long profile: in propose mode with quorum 2, Alice
    approves the original arguments, Bob edits them, Alice proposes the original ones
    again. Her first vote is on those very arguments; it must not count towards the
    quorum of her own proposal, or one other person would approve what she chose."""
    engine = engine_with(make_engine, ledger_path, approvers=[], quorum=2, edits="propose")
    paused = await pause(engine)
    [aid] = paused.approval_ids
    original = (await approval(db, aid)).effective_args()
    voted = await engine.decide(aid, actor=ALICE, verdict="approve",
                                token=card_token(await approval(db, aid)))
    assert voted.outcome == "voted"
    other = {**original, "amount_cents": 1_00}
    await engine.decide(aid, actor=BOB, verdict="edit", args=other,
                        token=card_token(await approval(db, aid)))
    back = await engine.decide(aid, actor=ALICE, verdict="edit", args=original,
                               token=card_token(await approval(db, aid)))
    assert back.outcome == "edited"
    one = await engine.decide(aid, actor=BOB, verdict="approve",
                              token=card_token(await approval(db, aid)))
    assert one.outcome == "voted" and one.approvals == 1, "Alice's old vote counted"
    done = await engine.decide(aid, actor=CAROL, verdict="approve",
                               token=card_token(await approval(db, aid)))
    assert done.outcome == "approved" and done.approvals == 2
    entries = [json.loads(e.details) for e in await trail(db, aid) if e.action == "approved"]
    assert entries[0]["approvers"] == ["U_BOB", "U_CAROL"]


# -- 7. a cancel leaves a trace, and wins over a step that parks ----------------------------

async def test_cancel_of_an_idle_run_records_who_when_and_why(make_engine, db, clock,
                                                              ledger_path):
    engine = engine_with(make_engine, ledger_path)
    paused = await pause(engine)
    assert await engine.cancel(paused.run_id, actor=Actor("U_OPS", "cli:ops"),
                               reason="customer withdrew the request") == "cancelled"
    entries = await trail(db, run_id=paused.run_id)
    run_level = [e for e in entries if e.action == "cancelled" and e.approval_id is None]
    assert [(e.actor, e.via, e.at) for e in run_level] == [("U_OPS", "cli:ops", clock.now())]
    assert json.loads(run_level[0].details)["reason"] == "customer withdrew the request"
    a = await approval(db, paused.approval_ids[0])
    assert a.status == "cancelled" and a.decided_by == "U_OPS"
    assert a.reason == "customer withdrew the request"


def parking_agent(ledger: DemoLedger, started: asyncio.Event, go: asyncio.Event) -> Agent:
    @tool(permission="read")
    async def check_inventory(ctx: ToolContext, sku: str) -> dict[str, Any]:
        """Slow read."""
        started.set()
        await go.wait()
        ledger.record(ctx, "check_inventory", {"sku": sku})
        return {"sku": sku, "count": 3}

    @tool(permission="execute", approval=ApprovalPolicy(approvers=["U_ALICE"]))
    async def ship(ctx: ToolContext, sku: str) -> dict[str, Any]:
        """Ship it."""
        ledger.record(ctx, "ship", {"sku": sku})
        return {"shipped": sku}

    def script(messages):
        if len(messages) == 1:
            return reply("checking and shipping", ("check_inventory", {"sku": "S-1"}),
                         ("ship", {"sku": "S-1"}), turn=0)
        return reply("done", turn=1)

    return Agent(name="parker", instructions="ship", model=ScriptedModel(script),
                 tools=[check_inventory, ship])


async def test_a_cancel_that_arrives_while_a_step_parks_asks_nobody(make_engine, db,
                                                                    ledger_path):
    started, go = asyncio.Event(), asyncio.Event()
    engine = make_engine(agents=[parking_agent(DemoLedger(str(ledger_path)), started, go)])
    run_id = await engine.start_run("parker", "ship S-1", requested_by=DANA)
    advancing = asyncio.create_task(engine.advance(run_id))
    await started.wait()  # the step is mid-tool-call, holding the lease
    assert await engine.cancel(run_id, actor=Actor("U_OPS", "cli:ops"),
                               reason="wrong warehouse") == "cancel_requested"
    go.set()
    outcome = await advancing
    assert isinstance(outcome, Cancelled), outcome
    async def run_and_rows(tx):  # type: ignore[no-untyped-def]
        return (await tx.runs.get(run_id), await tx.approvals.for_run(run_id),
                await tx.outbox.recent(kind="approval.requested"))

    run, approvals, posts = await Rows(db).in_one_read(run_and_rows)
    assert run.status == "cancelled" and "U_OPS" in run.error and "wrong warehouse" in run.error
    assert approvals == [] and posts == []  # no approver is asked about a cancelled run
    assert [e["tool"] for e in ledger_lines(ledger_path)] == ["check_inventory"]
    entries = [(e.action, e.actor) for e in await trail(db, run_id=run_id)]
    # the step's finished call is audited as the execution it was
    assert entries == [("cancel_requested", "U_OPS"), ("executed", "system:runtime"),
                       ("cancelled", "U_OPS")]
    state = await engine.state(run_id)  # the step's finished call is still recorded
    assert [m.name for m in state.messages if isinstance(m, ToolMessage)] == ["check_inventory"]


# -- 8. the audit log answers an auditor's first questions ----------------------------------

async def test_the_request_entry_names_who_started_the_run(make_engine, db, ledger_path):
    engine = engine_with(make_engine, ledger_path)
    [aid] = (await pause(engine)).approval_ids
    [requested] = [e for e in await trail(db, aid) if e.action == "requested"]
    assert json.loads(requested.details)["requested_by"] == DANA


async def test_every_refused_attempt_is_audited_with_its_reason(make_engine, db, clock,
                                                                ledger_path):
    engine = engine_with(make_engine, ledger_path, approvers=["U_ALICE", "U_BOB"], quorum=2,
                         ttl="10m", reminders=[])
    [aid] = (await pause(engine)).approval_ids
    a = await approval(db, aid)
    tries = [
        (STRANGER, "approve", card_token(a), "not_authorized"),
        (Actor(DANA, "slack"), "approve", card_token(a), "self_approval"),
        (ALICE, "approve", "forged.token", "bad_token"),
    ]
    for actor, verdict, token, _ in tries:
        with pytest.raises(DecisionRefused):
            await engine.decide(aid, actor=actor, verdict=verdict, token=token)
    await engine.decide(aid, actor=ALICE, verdict="approve", token=card_token(a))
    with pytest.raises(DecisionRefused):  # a second vote on the same arguments
        await engine.decide(aid, actor=ALICE, verdict="approve", token=card_token(a))
    clock.advance(timedelta(minutes=11))
    with pytest.raises(DecisionRefused):  # too late
        await engine.decide(aid, actor=BOB, verdict="approve", token=card_token(a))
    refused = [(e.actor, json.loads(e.details)["reason"]) for e in await trail(db, aid)
               if e.action == "refused"]
    assert refused == [("U_MALLORY", "not_authorized"), (DANA, "self_approval"),
                       ("U_ALICE", "bad_token"), ("U_ALICE", "already_voted"),
                       ("U_BOB", "expired")]
    votes = await Rows(db).votes(aid)
    assert [v.actor for v in votes] == ["U_ALICE"]  # refusals changed nothing else


async def test_digests_are_bound_into_tokens(make_engine, db, ledger_path):
    engine = engine_with(make_engine, ledger_path)
    [aid] = (await pause(engine)).approval_ids
    a = await approval(db, aid)
    other = call_digest("issue_refund", {"order_id": "A-1001", "amount_cents": 1,
                                         "reason": "x"})
    assert SIGNER.token(a.id, a.token_nonce, a.digest) != SIGNER.token(a.id, a.token_nonce,
                                                                       other)
    assert SIGNER.check(a.id, a.token_nonce, SIGNER.token(a.id, a.token_nonce, other),
                        digest=a.digest, original=a.digest) == "bad"
