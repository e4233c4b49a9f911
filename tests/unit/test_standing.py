"""Standing approvals (issue 13): "approve this, and calls like it, for a while", scoped,
bounded, revocable and audited per use; time moves only through the injected clock."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from approvald.bot.slack import story
from approvald.runtime.approvals.decide import Actor
from approvald.runtime.approvals.standing import StandingRefused
from approvald.runtime.kernel.outcomes import Completed, Paused
from approvald.runtime.policies.directory import StaticDirectory
from approvald.runtime.policies.policy import PolicyFile
from approvald.runtime.policies.scope import Scope, scope_for
from approvald.runtime.record.outbox_kinds import CARD_POST
from approvald.runtime.record.shown import RunMasking

from tests.helpers import Rows, parts
from tests.unit.test_decisions import ALICE, BOB, CAROL, DANA, approval, engine_with, refunds


class Groups(StaticDirectory):
    """User groups whose members come and go, as Slack's do."""

    def __init__(self, groups: dict[str, list[str]]) -> None:
        super().__init__(groups)
        self.now = {k: set(v) for k, v in groups.items()}

    async def members(self, group_id: str) -> frozenset[str]:
        return frozenset(self.now.get(group_id, ()))

    def leave(self, group_id: str, user: str) -> None:
        self.now[group_id].discard(user)


UP_TO_50 = "args.order_id == 'A-1001' && args.amount_cents <= 5000"


def task(amount: str, order: str = "A-1001") -> str:
    return f"Refund order {order}: {amount}"


async def start(engine, amount: str, order: str = "A-1001", requested_by: str = DANA):
    return await engine.run("demo-refund", task(amount, order), requested_by=requested_by)


async def grant_on_first(engine, db, *, window=timedelta(minutes=30), when=UP_TO_50,
                         by: Actor = ALICE):
    paused = await start(engine, "$30")
    assert isinstance(paused, Paused), paused
    a = await approval(db, paused.approval_ids[0])
    standing, decision = await engine.grant_standing(
        a.id, actor=by, window=window, scope=scope_for(a, "condition", when=when))
    assert decision.outcome in ("approved", "voted")
    return paused, standing


def between_check_and_use(engine, act) -> None:
    """Run ``act()`` (a coroutine) right after the next standing-approval candidate is
    read, before its use's compare-and-set."""
    original = parts(engine).standing.candidate

    async def read_then_act(*args, **kwargs):
        found = await original(*args, **kwargs)
        await act()
        return found

    parts(engine).standing.candidate = read_then_act


async def card_posts(db, approval_id: str) -> int:
    rows = await Rows(db).in_one_read(lambda tx: tx.outbox.recent(kind=CARD_POST, limit=500))
    return sum(json.loads(r.payload).get("approval_id") == approval_id for r in rows)


async def test_the_issue_scenario(make_engine, db, clock, ledger_path) -> None:
    engine = engine_with(make_engine, ledger_path)
    paused, standing = await grant_on_first(engine, db)
    assert standing.status == "active" and standing.grants_value() == ["U_ALICE"]
    assert isinstance(await engine.advance(paused.run_id), Completed)  # the granting one
    # three matching calls run without a card, each naming the standing approval
    for amount in ("$20", "$45", "$50"):
        done = await start(engine, amount)
        assert isinstance(done, Completed), done

        async def request_and_entries(tx, run_id=done.run_id):  # type: ignore[no-untyped-def]
            [a] = [x for x in await tx.approvals.for_run(run_id) if x.kind == "tool_call"]
            return a, await tx.audit.query(approval_id=a.id)

        a, entries = await Rows(db).in_one_read(request_and_entries)
        assert (a.status, a.decided_via, a.decided_by) == (
            "approved", "standing", f"standing:{standing.id}")
        assert await card_posts(db, a.id) == 0
        approved = [e for e in entries if e.action == "approved"]
        assert [json.loads(e.details)["standing_approval"] for e in approved] == [standing.id]
        executed = [e for e in entries if e.action == "executed"]
        assert len(executed) == 1
        # the run thread says what allowed it
        [told] = story.entry_lines(approved[0], {a.id: a}, {}, {}, RunMasking())
        assert told.text.endswith(f"`issue_refund` approved by a standing approval: "
                                  f"`{standing.id}`, granted by <@U_ALICE>; nobody was "
                                  "asked this time.")
    # a fourth, for $60, is outside the scope: it asks
    over = await start(engine, "$60")
    assert isinstance(over, Paused)
    assert await card_posts(db, over.approval_ids[0]) == 1
    # after the window, a matching call asks again
    clock.advance(timedelta(minutes=31))
    late = await start(engine, "$10", order="A-1001")
    assert isinstance(late, Paused)
    got = await engine.standing_grant(standing.id)
    assert got.uses == 3 and got.state(clock.now()) == "expired"
    assert [r["args"]["amount_cents"] for r in refunds(ledger_path)] == [3000, 2000, 4500, 5000]


async def test_revoke_stops_the_next_match_at_once(make_engine, db, clock, ledger_path) -> None:
    engine = engine_with(make_engine, ledger_path)
    _, standing = await grant_on_first(engine, db)
    assert isinstance(await start(engine, "$20"), Completed)
    revoked = await engine.revoke_standing(standing.id, actor=BOB, reason="too broad")
    assert revoked.status == "revoked" and revoked.revoked_by == "U_BOB"
    assert isinstance(await start(engine, "$20"), Paused)
    with pytest.raises(StandingRefused, match="already revoked"):
        await engine.revoke_standing(standing.id, actor=ALICE)
    entries = [e for e in await Rows(db).audit() if e.action.startswith("standing_")
               or (e.action == "refused" and "standing" in e.details)]
    assert [e.action for e in entries] == ["standing_granted", "standing_revoked", "refused"]
    refused = json.loads(entries[-1].details)
    assert (entries[-1].actor, refused["verdict"], refused["reason"]) == (
        "U_ALICE", "standing_revoke", "not_live")


async def test_a_use_loses_to_a_revocation_that_committed_first(make_engine, db, clock,
                                                               ledger_path) -> None:
    # the candidate was read before the revocation; the use's compare-and-set sees it
    engine = engine_with(make_engine, ledger_path)
    _, standing = await grant_on_first(engine, db)
    between_check_and_use(engine, lambda: engine.revoke_standing(standing.id, actor=ALICE))
    outcome = await start(engine, "$20")
    assert isinstance(outcome, Paused)  # it asked instead
    assert (await engine.standing_grant(standing.id)).uses == 0


async def test_the_requester_cannot_join_the_granters_between_check_and_use(
        make_engine, db, clock, ledger_path) -> None:
    # the candidate was checked while the requester was not among the granters; their own
    # grant, tried before the use, is refused (the approval has all the grants it needs), so
    # the call never runs on a standing approval the requester is a granter of
    engine = engine_with(make_engine, ledger_path)
    _, standing = await grant_on_first(engine, db)
    refused: list[StandingRefused] = []

    async def bob_grants() -> None:
        try:
            await engine.add_standing_grant(standing.id, actor=BOB)
        except StandingRefused as exc:
            refused.append(exc)

    between_check_and_use(engine, bob_grants)
    outcome = await start(engine, "$20", requested_by="U_BOB")
    assert [r.reason for r in refused] == ["fully_granted"]
    assert isinstance(outcome, Completed)
    got = await engine.standing_grant(standing.id)
    assert got.grants_value() == ["U_ALICE"] and got.uses == 1


async def test_a_quorum_2_tool_needs_two_grants(make_engine, db, clock, ledger_path) -> None:
    engine = engine_with(make_engine, ledger_path, approvers=["U_ALICE", "U_BOB", "U_CAROL"],
                         quorum=2)
    _paused, standing = await grant_on_first(engine, db)
    assert standing.status == "proposed"
    assert isinstance(await start(engine, "$20"), Paused)  # one grant covers nothing
    with pytest.raises(StandingRefused, match="already granted"):
        await engine.add_standing_grant(standing.id, actor=ALICE)
    with pytest.raises(StandingRefused, match="not an approver"):
        await engine.add_standing_grant(standing.id, actor=Actor("U_MALLORY", "slack"))
    # a stranger's attempt leaves its trace, and changed nothing
    [tried] = [e for e in await Rows(db).audit() if e.actor == "U_MALLORY"]
    assert tried.action == "refused" and json.loads(tried.details)["reason"] == "not_authorized"
    assert (await engine.standing_grant(standing.id)).grants_value() == ["U_ALICE"]
    active = await engine.add_standing_grant(standing.id, actor=CAROL)
    assert active.status == "active" and active.grants_value() == ["U_ALICE", "U_CAROL"]
    done = await start(engine, "$20", requested_by="U_DANA")
    assert isinstance(done, Completed)


async def test_a_granter_taken_off_the_approvers_lends_no_grant(make_engine, db, clock,
                                                                ledger_path) -> None:
    groups = Groups({"S_REFUNDS": ["U_ALICE", "U_BOB"]})
    engine = engine_with(make_engine, ledger_path, directory=groups, approvers=["S_REFUNDS"])
    _, standing = await grant_on_first(engine, db)
    assert isinstance(await start(engine, "$20"), Completed)
    groups.leave("S_REFUNDS", "U_ALICE")  # Alice left the group
    assert isinstance(await start(engine, "$20"), Paused)
    assert (await engine.standing_grant(standing.id)).uses == 1


async def test_never_across_a_band_nor_for_a_forbidden_call(make_engine, db, clock,
                                                            ledger_path) -> None:
    rules = PolicyFile.model_validate({"tools": {"issue_refund": {"rules": [
        {"when": "args.amount_cents > 4000", "policy": "forbidden", "reason": "too much"},
        {"when": "args.amount_cents > 2500", "approvers": ["U_CAROL"]}]}}})
    engine = engine_with(make_engine, ledger_path, policy_file=rules)
    paused = await start(engine, "$20")
    a = await approval(db, paused.approval_ids[0])
    standing, _ = await engine.grant_standing(
        a.id, actor=ALICE, window=timedelta(hours=1),
        scope=scope_for(a, "condition", when="args.order_id == 'A-1001'"))
    assert isinstance(await start(engine, "$15"), Completed)  # same band: covered
    assert isinstance(await start(engine, "$30"), Paused)  # Carol's band: asks Carol
    forbidden = await start(engine, "$45")
    assert isinstance(forbidden, Completed) and "forbidden" in (forbidden.result or "")
    assert (await engine.standing_grant(standing.id)).uses == 1


async def test_the_requester_does_not_ride_their_own_grant(make_engine, db, clock,
                                                           ledger_path) -> None:
    engine = engine_with(make_engine, ledger_path)
    _, standing = await grant_on_first(engine, db)
    mine = await start(engine, "$20", requested_by="U_ALICE")
    assert isinstance(mine, Paused)
    assert (await engine.standing_grant(standing.id)).uses == 0


@pytest.mark.parametrize(("policy", "window", "message"), [
    ({}, timedelta(minutes=5), "lasts 15m to 1h00m"),
    ({}, timedelta(hours=2), "lasts 15m to 1h00m"),
    ({"max_standing": "4h"}, timedelta(hours=9), "lasts 15m to 4h00m"),
    ({"max_standing": "0"}, timedelta(minutes=30), "turned off"),
])
async def test_windows_are_bounded_by_policy(make_engine, db, clock, ledger_path, policy,
                                             window, message) -> None:
    engine = engine_with(make_engine, ledger_path, **policy)
    paused = await start(engine, "$30")
    a = await approval(db, paused.approval_ids[0])
    with pytest.raises(StandingRefused, match=message):
        await engine.grant_standing(a.id, actor=ALICE, window=window,
                                    scope=scope_for(a, "exact"))
    assert (await approval(db, a.id)).status == "pending"  # nothing was decided


def test_scopes() -> None:
    exact = Scope(kind="exact", digest="d" * 64, values={"a": 1})
    assert not exact.covers("t", {"a": 1})  # the digest decides, not the values shown
    fields = Scope(kind="fields", values={"order_id": "A-1"})
    assert fields.covers("t", {"order_id": "A-1", "amount_cents": 9})
    assert not fields.covers("t", {"order_id": "A-2"})
    cond = Scope(kind="condition", when="args.amount_cents <= 5000")
    assert cond.covers("t", {"amount_cents": 5000})
    assert not cond.covers("t", {"amount": 1})  # cannot be evaluated: covers nothing
    with pytest.raises(ValueError, match="not a valid CEL"):
        Scope(kind="condition", when="args.amount_cents >> 1")


async def test_audit_verify_proves_every_use_from_the_chain(make_engine, db, clock,
                                                            ledger_path) -> None:
    from approvald.runtime.record.audit import verify

    engine = engine_with(make_engine, ledger_path)
    paused, standing = await grant_on_first(engine, db)
    await engine.advance(paused.run_id)
    assert isinstance(await start(engine, "$20"), Completed)  # one use, covered
    report = await verify(db)
    assert report.ok, report.problems
    assert any("1 calls that standing approvals let run" in n for n in report.notes)

    # a process that skipped the checks (or a writer who appends with the key) records a
    # use after the revocation, and one outside the scope: the chain alone refutes both
    await engine.revoke_standing(standing.id, actor=ALICE)
    use = {"tool": "issue_refund", "standing_approval": standing.id,
           "subject": "agent:demo-refund/issue_refund",
           "policy_digest": standing.policy_digest, "granted_by": [ALICE.id]}

    async def used_after_revoked(tx):  # type: ignore[no-untyped-def]
        parts(engine).audit.record(tx, at=clock.now(), action="approved",
                                   actor=f"standing:{standing.id}", via="standing",
                                   details={**use, "args": {"order_id": "A-1001",
                                                            "amount_cents": 2000, "reason": "r"}})

    await Rows(db).in_one_write(used_after_revoked)
    report = await verify(db)
    assert not report.ok and "was revoked at" in report.problems[0], report.problems


async def test_audit_verify_refutes_a_use_outside_the_granted_scope(make_engine, db, clock,
                                                                    ledger_path) -> None:
    from approvald.runtime.record.audit import verify

    engine = engine_with(make_engine, ledger_path)
    _, standing = await grant_on_first(engine, db)

    async def used_outside_scope(tx):  # type: ignore[no-untyped-def]
        parts(engine).audit.record(
            tx, at=clock.now(), action="approved", actor=f"standing:{standing.id}",
            via="standing", details={
                "tool": "issue_refund", "standing_approval": standing.id,
                "subject": "agent:demo-refund/issue_refund",
                "policy_digest": standing.policy_digest,
                "args": {"order_id": "A-1001", "amount_cents": 900_000, "reason": "r"}})

    await Rows(db).in_one_write(used_outside_scope)
    report = await verify(db)
    assert not report.ok and "outside its scope" in report.problems[0], report.problems


async def test_a_standing_approval_with_all_its_grants_takes_no_more(make_engine, db, clock,
                                                                    ledger_path) -> None:
    """A further grant once the quorum is met would only inflate the audited count ("2 of 1
    grants"): it is refused, audited as a refusal, and changes nothing."""
    engine = engine_with(make_engine, ledger_path, approvers=["U_ALICE", "U_BOB", "U_CAROL"],
                         quorum=2)
    _paused, standing = await grant_on_first(engine, db)
    active = await engine.add_standing_grant(standing.id, actor=CAROL)
    assert active.status == "active"
    with pytest.raises(StandingRefused, match="already has the 2 grants it needs"):
        await engine.add_standing_grant(standing.id, actor=BOB)
    [tried] = [e for e in await Rows(db).audit() if e.actor == "U_BOB"]
    assert tried.action == "refused" and json.loads(tried.details)["reason"] == "fully_granted"
    got = await engine.standing_grant(standing.id)
    assert got.grants_value() == ["U_ALICE", "U_CAROL"] and got.status == "active"
