"""The audit log names outcomes as every view does (issue 48 item 2, design invariant 24),
and every execution has its entry (item 1): after a scenario that ends requests every way
the runtime can (approved, with edits, by a standing approval, denied, redirected,
expired, escalated, cancelled, a "cannot run" question re-planned and aborted) and runs
calls nobody was asked about, each closed request has exactly one audit entry carrying
its outcome, that outcome is :func:`outcome_of` of the request, each call the policy ran
without asking is audited with its policy's outcome, and each row of the execution ledger
has its ``executed`` entry. On both dialects."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

from approvald.runtime.engine import Engine
from approvald.runtime.kernel.clock import ManualClock
from approvald.runtime.kernel.outcomes import Paused
from approvald.runtime.kernel.vocabulary import OutcomeName, outcome_of
from approvald.runtime.policies.policy import Rung
from approvald.runtime.runs.demo import DemoLedger, refund_agent
from approvald.store.db import Database

from tests.helpers import Rows
from tests.unit.test_decisions import ALICE, BOB, engine_with
from tests.unit.test_releases import without
from tests.unit.test_standing import grant_on_first, start

N = OutcomeName
ARGS = {"order_id": "A-1001", "amount_cents": 1000, "reason": "duplicate charge"}


async def paused(engine: Engine, amount: str = "$42") -> tuple[str, str]:
    out = await start(engine, amount)
    assert isinstance(out, Paused), out
    return out.run_id, out.approval_ids[0]


async def test_every_closed_request_and_every_execution_has_its_outcome_in_the_audit_log(
        make_engine: Callable[..., Engine], db: Database, clock: ManualClock,
        ledger_path: Path) -> None:
    engine = engine_with(make_engine, ledger_path, approvers=["U_ALICE", "U_BOB"])
    expect: dict[str, OutcomeName] = {}

    _, aid = await paused(engine)
    await engine.decide(aid, actor=ALICE, verdict="approve")
    expect[aid] = N.APPROVED
    _, aid = await paused(engine)
    await engine.decide(aid, actor=ALICE, verdict="edit", args=ARGS)
    expect[aid] = N.APPROVED_WITH_EDITS
    _, aid = await paused(engine)
    await engine.decide(aid, actor=BOB, verdict="deny", reason="no")
    expect[aid] = N.DENIED
    _, aid = await paused(engine)
    await engine.decide(aid, actor=BOB, verdict="redirect", reason="refund $5 only")
    expect[aid] = N.REDIRECTED
    run_id, aid = await paused(engine)
    await engine.cancel(run_id, actor=ALICE, reason="the customer called")
    expect[aid] = N.CANCELLED
    first, _ = await grant_on_first(engine, db)
    expect[first.approval_ids[0]] = N.APPROVED
    covered = await start(engine, "$20")
    assert not isinstance(covered, Paused), covered
    [used] = await Rows(db).approvals(covered.run_id)
    expect[used.id] = N.APPROVED_STANDING

    # a deploy the approved call cannot run on: re-planned, and aborted
    old = replace(refund_agent(DemoLedger(str(ledger_path))), version="1")
    for answer, name in (("replan", N.REPLANNED), ("abort", N.ABORTED)):
        run_id, aid = await paused(make_engine(agents=[old]))
        new = make_engine(agents=[without(old, "issue_refund", "2")])
        await new.decide(aid, actor=ALICE, verdict="approve")
        await new.advance(run_id)
        [q] = [a for a in await Rows(db).approvals(run_id) if a.kind == "cannot_run"]
        await new.decide(q.id, actor=ALICE, verdict=answer,  # type: ignore[arg-type]
                         reason="paid by hand" if answer == "abort" else None)
        expect[aid], expect[q.id] = N.APPROVED, name

    # silence: one request expires, one escalates to the next approvers
    quiet = engine_with(make_engine, ledger_path, approvers=["U_ALICE"])
    _, expired = await paused(quiet)
    ladder = engine_with(make_engine, ledger_path, approvers=["U_ALICE"], on_expire="escalate",
                         escalate=[Rung(approvers=["U_BOB"], ttl=timedelta(hours=1))])
    _, escalated = await paused(ladder)
    clock.advance(timedelta(minutes=31))
    await ladder.sweep()
    expect[expired], expect[escalated] = N.EXPIRED, N.ESCALATED

    async def entries_and_rows(tx):  # type: ignore[no-untyped-def]
        entries = await tx.audit.query()
        approvals = {a.id: a for run in {e.run_id for e in entries if e.run_id}
                     for a in await tx.approvals.for_run(run)}
        ledger = {(run, call): rec for run in {e.run_id for e in entries if e.run_id}
                  for call, rec in (await tx.executions.for_run(run)).items()}
        return entries, approvals, ledger

    entries, approvals, ledger = await Rows(db).in_one_read(entries_and_rows)
    details = [(e, json.loads(e.details)) for e in entries]
    named: dict[str, list[str]] = {}
    for e, d in details:
        if "outcome" in d and e.approval_id is not None:
            named.setdefault(e.approval_id, []).append(d["outcome"])
    closed = {i: a for i, a in approvals.items() if a.status != "pending"}
    assert set(expect) <= set(closed)
    for i, a in closed.items():
        assert named.get(i) == [outcome_of(a).value], (a.kind, a.status, a.verdict, named.get(i))
    assert {i: N(named[i][0]) for i in expect} == expect

    # every execution has its entry; those nobody was asked about name their policy
    executed: dict[str, dict[str, Any]] = {d["idempotency_key"]: d for e, d in details
                                           if e.action == "executed"}
    assert {f"{run}:{call}" for run, call in ledger} <= set(executed)
    auto = [d for e, d in details if e.action == "executed" and e.approval_id is None]
    assert {d["tool"] for d in auto} == {"lookup_order", "send_customer_email"}
    assert all(d["outcome"] == d["answer"] for d in auto)
    assert all("outcome" not in d for e, d in details
               if e.action == "executed" and e.approval_id is not None)
