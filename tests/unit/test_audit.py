"""The audit log is append-only and hash-chained; tampering is detected and named."""

from __future__ import annotations

import csv
import io
import json

from sqlalchemy import delete, select, update

from runtime import audit
from runtime.decide import Actor
from store.models import AuditEntry


async def _history(engine) -> str:
    """A real log: a request, an approval, an execution, a denial, an expiry."""
    first = await engine.run("demo-refund", "Refund order A-1001", requested_by="U_DANA")
    await engine.decide(first.approval_ids[0], actor=Actor("U_ALICE", "slack"),
                        verdict="approve")
    await engine.advance(first.run_id)
    second = await engine.run("demo-refund", "Refund order B-2002", requested_by="U_DANA")
    await engine.decide(second.approval_ids[0], actor=Actor("U_BOB", "cli:root"),
                        verdict="deny", reason="duplicate <!channel> request")
    await engine.advance(second.run_id)
    return first.run_id


async def test_a_real_log_verifies(make_engine, db):
    await _history(make_engine())
    report = await audit.verify(db)
    assert report.ok, report.problems
    assert report.entries == 5


async def _tamper_and_verify(db, change) -> str:
    async with db.write() as tx:
        await change(tx.conn)
    report = await audit.verify(db)
    assert not report.ok
    return report.problems[0]


async def test_an_edited_entry_is_named(make_engine, db):
    await _history(make_engine())

    async def edit(conn):
        row = (await conn.execute(select(AuditEntry.details).where(AuditEntry.seq == 2))).scalar()
        details = json.loads(row)
        details["args"]["amount_cents"] = 1
        await conn.execute(update(AuditEntry).where(AuditEntry.seq == 2)
                           .values(details=json.dumps(details)))
    problem = await _tamper_and_verify(db, edit)
    assert problem.startswith("entry 2 (approved by U_ALICE") and "edited" in problem


async def test_an_edited_actor_is_detected_even_with_a_recomputed_own_hash(make_engine, db):
    await _history(make_engine())

    async def forge(conn):
        e = (await conn.execute(select(AuditEntry.__table__).where(AuditEntry.seq == 2))).one()
        h = audit.entry_hash(e.prev_hash, seq=2, at=e.at, action=e.action, actor="U_MALLORY",
                             via=e.via, run_id=e.run_id, approval_id=e.approval_id,
                             digest=e.digest, details=e.details)
        await conn.execute(update(AuditEntry).where(AuditEntry.seq == 2)
                           .values(actor="U_MALLORY", hash=h))
    problem = await _tamper_and_verify(db, forge)
    assert problem.startswith("entry 3 ") and "does not follow entry 2" in problem


async def test_a_deleted_entry_is_named(make_engine, db):
    await _history(make_engine())

    async def drop(conn):
        await conn.execute(delete(AuditEntry).where(AuditEntry.seq == 3))
    problem = await _tamper_and_verify(db, drop)
    assert problem.startswith("entry 3 deleted")


async def test_a_deleted_tail_is_detected(make_engine, db):
    await _history(make_engine())

    async def drop(conn):
        await conn.execute(delete(AuditEntry).where(AuditEntry.seq >= 4))
    problem = await _tamper_and_verify(db, drop)
    assert "entries 4-5 deleted from the end" in problem


async def test_swapped_entries_are_named(make_engine, db):
    await _history(make_engine())
    cols = [c for c in AuditEntry.__table__.columns.keys() if c != "seq"]

    async def swap(conn):
        a = (await conn.execute(select(AuditEntry.__table__).where(AuditEntry.seq == 2))).one()
        b = (await conn.execute(select(AuditEntry.__table__).where(AuditEntry.seq == 3))).one()
        await conn.execute(update(AuditEntry).where(AuditEntry.seq == 2)
                           .values({c: b._mapping[c] for c in cols}))
        await conn.execute(update(AuditEntry).where(AuditEntry.seq == 3)
                           .values({c: a._mapping[c] for c in cols}))
    problem = await _tamper_and_verify(db, swap)
    assert problem.startswith("entry 2 ")


async def test_export_has_every_decision_with_the_exact_arguments(make_engine, db):
    run_id = await _history(make_engine())
    lines = [json.loads(x) async for x in audit.export(db, fmt="jsonl")]
    assert [x["action"] for x in lines] == ["requested", "approved", "executed", "requested",
                                            "denied"]
    approved = next(x for x in lines if x["action"] == "approved")
    assert approved["actor"] == "U_ALICE" and approved["via"] == "slack"
    assert approved["args"] == {"order_id": "A-1001", "amount_cents": 4200,
                                "reason": "duplicate charge"}
    denied = next(x for x in lines if x["action"] == "denied")
    assert denied["reason"] == "duplicate <!channel> request" and denied["via"] == "cli:root"
    only = [json.loads(x) async for x in audit.export(db, run_id=run_id)]
    assert {x["run_id"] for x in only} == {run_id} and len(only) == 3
    text = "".join([c async for c in audit.export(db, fmt="csv")])
    rows = list(csv.DictReader(io.StringIO(text)))
    assert len(rows) == 5 and rows[1]["action"] == "approved"
    assert json.loads(rows[1]["args"])["amount_cents"] == 4200
