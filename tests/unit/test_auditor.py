"""The auditor's test (issue 52): from one export file and the key, the six questions are
answered for a request that was edited, escalated and approved by a quorum: what was
asked (the card's content), under which policy (its text), who was asked and reminded
and to whom it escalated, what changed and why, who decided (names as they were, the
quorum's votes, the batch), and what ran. Entry times never run backwards."""

from __future__ import annotations

import hashlib
import hmac
import json
from datetime import timedelta
from pathlib import Path

from approvald.runtime.approvals.batch import Target
from approvald.runtime.approvals.decide import Actor
from approvald.runtime.policies.policy import Rung, load_policy_file
from approvald.runtime.record import audit
from approvald.runtime.record.audit import AuditKey
from approvald.runtime.record.audit_file import verify_export

from tests.helpers import Rows, parts
from tests.unit.test_decisions import ALICE, DANA, approval, engine_with

SECRET = "audit-key-kept-in-a-vault-0123456789"
KEY = AuditKey(SECRET)
POLICY = """# refunds: finance decides what the agent's own rules do not
[default]
policy = "approve_before"
"""
CFO = Actor("U_CFO", "slack", name="Cleo (CFO)")
CAROL = Actor("U_CAROL", "slack", name="Carol Finance")


async def test_six_questions_from_one_export_file_and_the_key(make_engine, ledger_path, db,
                                                             clock, tmp_path: Path):
    policy_path = tmp_path / "policy.toml"
    policy_path.write_text(POLICY)
    engine = engine_with(
        make_engine, ledger_path, policy_file=load_policy_file(policy_path),
        approvers=["U_ALICE"], ttl="30m", reminders=["50%"], on_expire="escalate",
        escalate=[Rung(approvers=["U_CFO", "U_CAROL"], quorum=2, ttl="1h")])
    engine.use_audit_key(KEY)
    await engine.note_policy()
    paused = await engine.run("demo-refund", "Refund order A-1001, customer was double charged",
                              requested_by=DANA)
    first = paused.approval_ids[0]
    clock.advance(timedelta(minutes=16))
    await engine.sweep()  # a reminder to Alice
    clock.advance(timedelta(minutes=15))
    swept = await engine.sweep()  # silence: escalated to the CFO and Carol
    [(_, second)] = swept.escalated
    a = await approval(db, second)
    edited = {**a.args_value(), "amount_cents": 1000}
    await engine.decide(second, actor=CFO, verdict="edit", args=edited,
                        reason="only the duplicate charge")
    [outcome] = await engine.decide_each([Target(second)], actor=CAROL, verdict="approve")
    assert outcome.decision is not None and outcome.decision.outcome == "approved"
    await engine.advance(paused.run_id)
    assert (await audit.verify(db, keys=[KEY])).ok

    export = tmp_path / "audit.jsonl"
    export.write_text("".join([c async for c in audit.export(db, keys=[KEY])]))

    # -- the auditor's side: the file and the key, nothing else ------------------------
    lines = export.read_text().splitlines()
    report = verify_export(lines, keys=[KEY])
    assert report.ok, report.problems
    # each row's export MAC, recomputed by the recipe the audit how-to gives (v1)
    k = hashlib.sha256(b"approvald-audit-v1\x00" + SECRET.encode()).digest()
    k_export = hmac.new(k, b"approvald-export-v1", hashlib.sha256).digest()
    for line in lines:
        row = json.loads(line)
        mac = row.pop("export_mac")
        text = json.dumps(row, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        assert mac == "v1:" + hmac.new(k_export, text.encode(), hashlib.sha256).hexdigest()
    rows = [json.loads(x) for x in lines]
    times = [r["at"] for r in rows]
    assert times == sorted(times)  # never backwards
    of = {r["approval_id"]: [] for r in rows}
    for r in rows:
        of[r["approval_id"]].append(r)
    asked = next(r for r in of[second] if r["action"] == "requested")

    # 1. what was asked, as the card showed it, and what silence would do
    card = asked["details"]["card"]
    assert card["doing"] and card["why"] and "impact" in card
    assert asked["details"]["on_expire"] == "escalate"
    assert asked["details"]["approvers"] == ["U_CFO", "U_CAROL"]
    assert asked["details"]["quorum"] == 2
    first_asked = next(r for r in of[first] if r["action"] == "requested")
    assert first_asked["details"]["escalate"][0]["approvers"] == ["U_CFO", "U_CAROL"]

    # 2. under which policy: the file's text, by its SHA-256
    digest = asked["details"]["policy_file"]
    [loaded] = [r for r in rows if r["action"] == "policy_loaded"
                and r["details"]["digest"] == digest]
    assert loaded["details"]["text"] == POLICY
    assert hashlib.sha256(loaded["details"]["text"].encode()).hexdigest() == digest
    assert digest == hashlib.sha256(policy_path.read_bytes()).hexdigest()

    # 3. who was asked, reminded, and to whom it escalated when nobody answered
    [reminded] = [r for r in of[first] if r["action"] == "reminded"]
    assert reminded["details"]["to"] == ["U_ALICE"]
    assert [r["action"] for r in of[first]][-1] == "superseded"
    escalated = next(r for r in of[second] if r["action"] == "escalated")
    assert escalated["details"]["from"] == first
    assert escalated["details"]["approvers"] == ["U_CFO", "U_CAROL"]

    # 4. what changed, by whom and why
    [edit] = [r for r in of[second] if r["action"] == "edited"]
    assert edit["actor"] == "U_CFO" and edit["details"]["actor_name"] == "Cleo (CFO)"
    assert edit["details"]["reason"] == "only the duplicate charge"
    assert edit["details"]["args"]["amount_cents"] == 1000
    assert edit["details"]["original_args"]["amount_cents"] != 1000

    # 5. who decided: the quorum, on the edited arguments, in a batch, with names
    [approved] = [r for r in of[second] if r["action"] == "approved"]
    assert approved["actor"] == "U_CAROL"
    assert approved["details"]["actor_name"] == "Carol Finance"
    assert approved["details"]["batch"]
    assert sorted(approved["details"]["approvers"]) == ["U_CAROL", "U_CFO"]
    assert approved["digest"] == edit["digest"]

    # 6. what ran: exactly the approved arguments
    ran = [r for r in rows if r["action"] == "executed"
           and r["details"].get("tool") == "issue_refund"]
    assert len(ran) == 1 and ran[0]["digest"] == approved["digest"]
    assert ran[0]["details"]["args"]["amount_cents"] == 1000


async def test_a_standing_use_is_never_recorded_before_its_request(make_engine, ledger_path,
                                                                   db, clock):
    engine = engine_with(make_engine, ledger_path, approvers=["U_ALICE"])
    paused = await engine.run("demo-refund", "Refund order A-1001: $30", requested_by=DANA)
    a = await approval(db, paused.approval_ids[0])
    from approvald.runtime.policies.scope import scope_for

    await engine.grant_standing(a.id, actor=ALICE, window=timedelta(minutes=30),
                                scope=scope_for(a, "condition", when="true"))
    await engine.advance(paused.run_id)
    # the clock ticks between the use's decision and its request being stamped
    original = parts(engine).clock.now
    ticks = iter(range(1000))

    def ticking():
        return original() + timedelta(milliseconds=next(ticks))

    parts(engine).clock.now = ticking  # type: ignore[method-assign]
    try:
        again = await engine.run("demo-refund", "Refund order A-1001: $20", requested_by=DANA)
        await engine.advance(again.run_id)
    finally:
        parts(engine).clock.now = original  # type: ignore[method-assign]
    entries = await Rows(db).audit()
    times = [e.at for e in entries]
    assert times == sorted(times)
