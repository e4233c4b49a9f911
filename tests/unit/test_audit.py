"""The audit log is append-only and chained with a key kept outside the database;
tampering is detected and named, and a head recorded elsewhere proves the past."""

from __future__ import annotations

import asyncio
import csv
import io
import json
from contextvars import ContextVar
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from approvald.runtime.approvals.decide import Actor
from approvald.runtime.record import audit
from approvald.runtime.record.audit import AuditKey
from approvald.store.fastsql import Conn
from approvald.store.models import AuditEntry, AuditHead
from approvald.store.repos.audit import AuditRepo
from sqlalchemy import delete, select, update

from tests.helpers import Rows

KEY = AuditKey("audit-key-kept-in-a-vault-0123456789")


async def _history(engine) -> str:
    """A real log: two lookups (read calls, audited as executions), a request, an
    approval, the refund and the customer's mail executed, a request and its denial."""
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
    assert report.entries == 8


async def _tamper_and_verify(db, change) -> str:
    await Rows(db).in_one_write(lambda tx: change(tx.conn))
    report = await audit.verify(db)
    assert not report.ok
    return report.problems[0]


async def test_an_edited_entry_is_named(make_engine, db):
    await _history(make_engine())

    async def edit(conn):
        row = (await conn.execute(select(AuditEntry.details).where(AuditEntry.seq == 3))).scalar()
        details = json.loads(row)
        details["args"]["amount_cents"] = 1
        await conn.execute(update(AuditEntry).where(AuditEntry.seq == 3)
                           .values(details=json.dumps(details)))
    problem = await _tamper_and_verify(db, edit)
    assert problem.startswith("entry 3 (approved by U_ALICE") and "edited" in problem


async def test_an_edited_actor_is_detected_even_with_a_recomputed_own_hash(make_engine, db):
    await _history(make_engine())

    async def forge(conn):
        e = (await conn.execute(select(AuditEntry.__table__).where(AuditEntry.seq == 2))).one()
        h = audit.entry_hash(None, e.prev_hash, seq=2, at=e.at, action=e.action, actor="U_MALLORY",
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
    assert "entries 4-8 deleted from the end" in problem


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
    assert [x["action"] for x in lines] == ["executed", "requested", "approved", "executed",
                                            "executed", "executed", "requested", "denied"]
    assert [x["tool"] for x in lines if x["action"] == "executed"] == [
        "lookup_order", "issue_refund", "send_customer_email", "lookup_order"]
    approved = next(x for x in lines if x["action"] == "approved")
    assert approved["actor"] == "U_ALICE" and approved["via"] == "slack"
    assert approved["args"] == {"order_id": "A-1001", "amount_cents": 4200,
                                "reason": "duplicate charge"}
    denied = next(x for x in lines if x["action"] == "denied")
    assert denied["reason"] == "duplicate <!channel> request" and denied["via"] == "cli:root"
    only = [json.loads(x) async for x in audit.export(db, run_id=run_id)]
    assert {x["run_id"] for x in only} == {run_id} and len(only) == 5
    text = "".join([c async for c in audit.export(db, fmt="csv")])
    rows = list(csv.DictReader(io.StringIO(text)))
    assert len(rows) == 8 and rows[2]["action"] == "approved"
    assert json.loads(rows[2]["args"])["amount_cents"] == 4200


async def _rewrite_everything(conn, *, actor: str, key: AuditKey | None) -> None:
    """What someone with write access to the database does: change an actor, then
    recompute every entry's hash and the head, with ``key`` (None: plain SHA-256)."""
    rows = (await conn.execute(select(AuditEntry.__table__).order_by(AuditEntry.seq))).all()
    prev = audit.GENESIS
    for e in rows:
        who = actor if e.action == "approved" else e.actor
        h = audit.entry_hash(key, prev, seq=e.seq, at=e.at, action=e.action, actor=who,
                             via=e.via, run_id=e.run_id, approval_id=e.approval_id,
                             digest=e.digest, details=e.details)
        await conn.execute(update(AuditEntry).where(AuditEntry.seq == e.seq).values(
            actor=who, prev_hash=prev, hash=h, key_id=key.id if key else ""))
        prev = h
    await conn.execute(update(AuditHead).where(AuditHead.id == 1).values(hash=prev))


async def test_without_the_key_a_rewritten_chain_does_not_verify(make_engine, db):
    await _history(make_engine(audit_key=KEY))
    assert (await audit.verify(db, keys=[KEY])).ok
    await Rows(db).in_one_write(  # the forger has the database, not the key
        lambda tx: _rewrite_everything(tx.conn, actor="U_MALLORY", key=None))
    report = await audit.verify(db, keys=[KEY])
    assert not report.ok and report.problems[0].startswith("entry 1 ")
    assert "not keyed" in report.problems[0]
    await Rows(db).in_one_write(  # nor does a guessed key help
        lambda tx: _rewrite_everything(tx.conn, actor="U_MALLORY",
                                       key=AuditKey("a-guessed-key-0123456789abcdef")))
    report = await audit.verify(db, keys=[KEY])
    assert not report.ok and "was not given" in report.problems[0]


async def test_a_keyed_entry_edited_with_its_own_mac_recomputed_is_caught(make_engine, db):
    await _history(make_engine(audit_key=KEY))

    await Rows(db).forge(AuditEntry, AuditEntry.seq == 3, actor="U_MALLORY")
    report = await audit.verify(db, keys=[KEY])
    assert len(report.problems) == 1
    assert report.problems[0].startswith("entry 3 (approved by U_MALLORY")


async def test_a_rotated_key_verifies_with_the_old_one_kept(make_engine, db):
    await _history(make_engine(audit_key=KEY))
    new = AuditKey("the-next-audit-key-0123456789abcdef")
    await _history(make_engine(audit_key=new))
    assert (await audit.verify(db, keys=[new, KEY])).ok
    missing = await audit.verify(db, keys=[new])
    assert not missing.ok and KEY.id in missing.problems[0]


async def test_entries_from_before_the_key_verify_only_up_to_the_declared_point(
        make_engine, db):
    await _history(make_engine())  # 8 unkeyed entries, before the deployment had a key
    await _history(make_engine(audit_key=KEY))
    assert not (await audit.verify(db, keys=[KEY])).ok
    report = await audit.verify(db, keys=[KEY], unkeyed_until=8)
    assert report.ok and report.unkeyed == 8
    assert any("without an audit key" in n for n in report.notes)


async def test_a_recorded_head_proves_nothing_was_cut_off_the_end(make_engine, db):
    await _history(make_engine(audit_key=KEY))
    recorded = (await audit.verify(db, keys=[KEY])).head
    assert recorded[0] == 8 and len(recorded[1]) == 64

    async def cut_off(tx):  # drop the denial and "fix" the head, as a forger would
        third = (await tx.conn.execute(select(AuditEntry.hash).where(AuditEntry.seq == 3))
                 ).scalar_one()
        await tx.conn.execute(delete(AuditEntry).where(AuditEntry.seq >= 4))
        await tx.conn.execute(update(AuditHead).values(seq=3, hash=third))
    await Rows(db).in_one_write(cut_off)
    # the chain alone cannot tell; the tables can: they hold a request it no longer does
    cut = await audit.verify(db, keys=[KEY])
    assert cut.problems and all(p.startswith("approval ") for p in cut.problems)
    assert any("the audit log records it" in p or "no request of it" in p
               for p in cut.problems), cut.problems
    report = await audit.verify(db, keys=[KEY], expect=recorded)
    assert not report.ok and "entries 4-8 were deleted" in report.problems[0]


async def test_a_recorded_head_proves_the_history_before_it(make_engine, db):
    await _history(make_engine())  # unkeyed: anyone can recompute the chain...
    recorded = (await audit.verify(db)).head
    await Rows(db).in_one_write(
        lambda tx: _rewrite_everything(tx.conn, actor="U_MALLORY", key=None))
    # ...and without a key the chain verifies: only the tables (which name the real
    # deciders) say otherwise, and a forger can rewrite those too
    forged = await audit.verify(db)
    assert all(p.startswith("approval ") for p in forged.problems), forged.problems
    report = await audit.verify(db, expect=recorded)
    assert not report.ok and "rewritten" in report.problems[0]
    assert (await audit.verify(db, expect=(3, "0" * 64))).problems  # a wrong head fails
    assert audit.parse_head(f"{recorded[0]}:{recorded[1]}") == recorded
    with pytest.raises(ValueError):
        audit.parse_head("5:nothex")


async def test_csv_cells_that_look_like_formulas_are_neutralised(make_engine, db):
    engine = make_engine()
    first = await engine.run("demo-refund", "Refund order A-1001", requested_by="U_DANA")
    evil = '=HYPERLINK("http://evil.example","x")'
    await engine.decide(first.approval_ids[0], actor=Actor("U_BOB", "cli:root"),
                        verdict="deny", reason=evil)
    text = "".join([c async for c in audit.export(db, fmt="csv")])
    rows = list(csv.DictReader(io.StringIO(text)))
    denied = next(r for r in rows if r["action"] == "denied")
    assert denied["reason"] == "'" + evil
    for cell in (c for r in rows for c in r.values()):
        assert not cell.startswith(("=", "+", "-", "@", "\t", "\r")), cell
    jsonl = [json.loads(x) async for x in audit.export(db, fmt="jsonl")]
    assert next(x for x in jsonl if x["action"] == "denied")["reason"] == evil  # exact


async def test_an_entry_appended_during_verification_is_no_false_alarm(make_engine, db,
                                                                       monkeypatch):
    engine = make_engine()
    await _history(engine)
    walk = AuditRepo.iterate
    appended = asyncio.Event()

    async def walk_while_someone_appends(self, **kw):
        async for e in walk(self, **kw):
            if not appended.is_set():
                appended.set()
                # another process decides while the walk is under way
                other = await engine.run("demo-refund", "Refund order C-3003",
                                         requested_by="U_DANA")
                assert other.approval_ids
            yield e
    monkeypatch.setattr(AuditRepo, "iterate", walk_while_someone_appends)
    report = await audit.verify(db)
    assert report.ok, report.problems
    monkeypatch.undo()
    assert (await audit.verify(db)).entries == 10  # and its lookup, and its request


async def test_appends_of_one_entry_and_of_several_chain_alike(db, monkeypatch):
    """Each audited commit waits for the chain head's lock, so an entry is appended in as
    few round trips as its database allows: on PostgreSQL one statement inserts it and
    moves the head (a data-modifying CTE), and so do up to four entries (one multi-row
    INSERT); more entries, and SQLite, take two. The first chaining of a process reads
    the head under its lock first; the next ones chain to the head it left, moved only
    if it still is that one, without reading it. Either way the chain verifies and the
    head is the last entry."""
    trail = audit.AuditTrail(KEY)
    statements: list[str] = []
    appending = False
    execute = Conn.execute

    async def counted(self, stmt, params=None):
        if appending:
            statements.append(str(stmt).split()[0])
        return await execute(self, stmt, params)

    def counting(real):
        async def call(self, *args, **kwargs):
            nonlocal appending
            appending = True
            try:
                return await real(self, *args, **kwargs)
            finally:
                appending = False
        return call

    monkeypatch.setattr(Conn, "execute", counted)
    monkeypatch.setattr(AuditRepo, "append_rows", counting(AuditRepo.append_rows))
    monkeypatch.setattr(AuditRepo, "append_if_head", counting(AuditRepo.append_if_head))
    monkeypatch.setattr(AuditRepo, "lock_head", counting(AuditRepo.lock_head))
    now = datetime(2026, 12, 3, 9, 0, tzinfo=UTC)
    for k, n in enumerate((1, 3, 6, 1)):
        statements.clear()
        await Rows(db).in_one_write(lambda tx, n=n: trail.record_many(tx, [
            audit.Entry(at=now, action="requested", actor="U_DANA", via="cli",
                        run_id=f"r{n}-{i}") for i in range(n)]))
        one = n <= 4 and db.dialect == "postgresql"
        if k == 0:  # the head read under its lock (made first: a new database), then
            # the rows and the head's move
            assert statements == ["UPDATE", "INSERT", "UPDATE"] \
                + (["WITH"] if one else ["INSERT", "UPDATE"]), (n, statements)
        else:  # chained to the head this trail left: the head's move if it still is
            assert statements == (["WITH"] if one else ["UPDATE", "INSERT"]), (n, statements)
    report = await audit.verify(db, keys=[KEY])
    assert report.ok, report.problems
    assert report.entries == 11

    async def head_and_last(tx):
        return await tx.audit.head(), [e async for e in tx.audit.iterate()][-1]
    (seq, digest), last = await Rows(db).in_one_read(head_and_last)
    assert (seq, digest) == (11, last.hash)


async def test_a_head_moved_by_another_writer_is_read_before_chaining(db):
    """A process chains to the head it last left without reading it; when another writer
    (another process, here another trail) moved it meanwhile, nothing is written by that
    guess and the head is read under its lock: one chain, every entry once, in order. A
    transaction that chained and then rolled back leaves the guess wrong the same way."""
    a, b = audit.AuditTrail(KEY), audit.AuditTrail(KEY)
    now = datetime(2026, 12, 3, 9, 0, tzinfo=UTC)

    async def append(trail: audit.AuditTrail, run_id: str, n: int = 2,
                     fail: bool = False) -> None:
        def chain(tx):
            trail.record_many(tx, [audit.Entry(at=now, action="requested",
                                               actor="U_DANA", via="cli", run_id=run_id)
                                   for _ in range(n)])
            if fail:
                tx.before_commit(_boom)
        try:
            await Rows(db).in_one_write(chain)
        except RuntimeError:
            pass

    await append(a, "a1")
    await append(b, "b1")
    await append(a, "a2")  # a's guess (entry 2) is stale: b moved the head to 4
    await append(b, "b2", n=6)  # b's guess (entry 4) is stale too, and past four entries
    await append(a, "x", fail=True)  # chained, then rolled back: a's guess is wrong again
    await append(a, "a3", n=1)
    report = await audit.verify(db, keys=[KEY])
    assert report.ok, report.problems
    entries = await Rows(db).audit()
    assert [e.seq for e in entries] == list(range(1, 14))
    assert [e.run_id for e in entries] == ["a1"] * 2 + ["b1"] * 2 + ["a2"] * 2 \
        + ["b2"] * 6 + ["a3"]


def _chain_statements(monkeypatch) -> list[str]:
    """The first word of each statement the chain's head statements send (appends and
    the head's reads), in order; ``lock_head`` noted as ``lock_head``."""
    statements: list[str] = []
    inside: ContextVar[bool] = ContextVar("inside", default=False)  # (per task)
    execute = Conn.execute

    async def counted(self, stmt, params=None):
        if inside.get():
            statements.append(str(stmt).split()[0])
        return await execute(self, stmt, params)

    def counting(real, name=None):
        async def call(self, *args, **kwargs):
            if name:
                statements.append(name)
            token = inside.set(True)
            try:
                return await real(self, *args, **kwargs)
            finally:
                inside.reset(token)
        return call

    monkeypatch.setattr(Conn, "execute", counted)
    monkeypatch.setattr(AuditRepo, "append_rows", counting(AuditRepo.append_rows))
    monkeypatch.setattr(AuditRepo, "append_if_head", counting(AuditRepo.append_if_head))
    monkeypatch.setattr(AuditRepo, "lock_head", counting(AuditRepo.lock_head, "lock_head"))
    return statements


async def test_a_guess_that_misses_is_answered_with_the_head_and_chains_once_more(
        db, monkeypatch):
    """Two processes (trails) on one database, chaining in turn: each one's guess of the
    head is stale every time (the other moved it). The guessed statement, which holds the
    head's lock once it has matched its row, answers with the head as it stands (seq,
    MAC, time): the entries are chained to it without reading it again (no lock_head),
    in one statement more on PostgreSQL (up to four entries; past that, and on SQLite,
    the rows and the head's move), and their details are masked and put in JSON once,
    not again for the second chaining. One chain, every entry once, in order, its times
    never running back (the other's entries are later than the ones chained after)."""
    trails = audit.AuditTrail(KEY), audit.AuditTrail(KEY)
    built = []
    recorded = audit.recorded_text

    def spy(details, sensitive=()):
        built.append(details.get("n"))
        return recorded(details, sensitive)

    monkeypatch.setattr(audit, "recorded_text", spy)
    statements = _chain_statements(monkeypatch)
    t0 = datetime(2026, 12, 3, 9, 0, tzinfo=UTC)
    sizes = (2, 2, 1, 6, 4, 1, 2, 1)
    run_ids = []
    for k, n in enumerate(sizes):
        statements.clear()
        built.clear()
        # the second trail's entries are stamped earlier than the first's before them
        at = t0 + timedelta(minutes=0 if k % 2 else k)
        await Rows(db).in_one_write(lambda tx, k=k, n=n, at=at: trails[k % 2].record_many(tx, [
            audit.Entry(at=at + timedelta(seconds=i), action="requested",
                        actor="U_DANA", via="cli", run_id=f"r{k}", details={"n": i})
            for i in range(n)]))
        run_ids += [f"r{k}"] * n
        assert built == list(range(n)), (k, built)  # each entry's text built once
        if k < 2:  # each trail's first chaining reads the head under its lock
            assert statements[0] == "lock_head", (k, statements)
            continue
        one = n <= 4 and db.dialect == "postgresql"
        # the guessed statement missed and answered with the head; then the entries
        assert statements == (["WITH", "WITH"] if one
                              else ["UPDATE", "INSERT", "UPDATE"]), (k, n, statements)
    report = await audit.verify(db, keys=[KEY])
    assert report.ok, report.problems
    entries = await Rows(db).audit()
    assert [e.seq for e in entries] == list(range(1, len(run_ids) + 1))
    assert [e.run_id for e in entries] == run_ids
    times = [e.at for e in entries]
    assert times == sorted(times), (db.dialect, times)  # clamped to the head returned


# PostgreSQL only: SQLite's one writer never waits inside a statement for the head
@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_a_guess_that_waited_for_the_head_answers_with_its_entry_time(db, monkeypatch):
    """PostgreSQL: a guessed statement that waited for another transaction holding the
    head answers with the head that transaction left, time included, though its snapshot
    (taken before that transaction committed) does not see that transaction's entry: the
    head row carries its entry's time. The entries chained after it are clamped to it
    (times never run back) with no statement more, and the chain verifies."""
    a, b = audit.AuditTrail(KEY), audit.AuditTrail(KEY)
    t0 = datetime(2026, 12, 3, 9, 0, tzinfo=UTC)

    async def append(trail: audit.AuditTrail, run_id: str, at: datetime, hold=None) -> None:
        def chain(tx):
            trail.record(tx, at=at, action="requested", actor="U_DANA", via="cli",
                         run_id=run_id)
            if hold is not None:
                tx.before_commit(hold)  # after the chaining: the head's lock held
        await Rows(db).in_one_write(chain)

    await append(a, "a1", t0)
    await append(b, "b1", t0)  # a's guess (entry 1) is stale from now on
    statements = _chain_statements(monkeypatch)
    waiting = asyncio.Event()
    behind: list[asyncio.Task[None]] = []

    async def hold(tx: Any) -> None:  # a chains while b holds the head it moved
        behind.append(asyncio.ensure_future(append(a, "a2", t0)))
        for _ in range(500):
            if await Rows(db).select("SELECT 1 FROM pg_stat_activity WHERE wait_event_type"
                                     " = 'Lock' AND query LIKE 'WITH moved%'"):
                waiting.set()
                return
            await asyncio.sleep(0.01)
        raise AssertionError("the guessed statement never waited for the head")

    await append(b, "b2", t0 + timedelta(minutes=5), hold)
    await behind[0]
    assert waiting.is_set()
    # a's: the guessed statement (missed, waited), then the entry
    assert statements[-2:] == ["WITH", "WITH"], statements
    assert statements.count("SELECT") == 0, statements
    assert "lock_head" not in statements
    report = await audit.verify(db, keys=[KEY])
    assert report.ok, report.problems
    entries = await Rows(db).audit()
    assert [e.run_id for e in entries] == ["a1", "b1", "b2", "a2"]
    assert entries[-1].at == t0 + timedelta(minutes=5)  # not t0: clamped to b2's


async def test_a_head_moved_before_it_carried_its_time_is_timed_by_its_entry(db):
    """A head moved before migration 0025 carries no time of its own: the head's reads
    take the time of the entry it names (on SQLite too, whose RETURNING names the head's
    seq with its table: not any entry's time), so the entries chained after it are never
    stamped before it."""
    t0 = datetime(2026, 12, 3, 9, 0, tzinfo=UTC)
    await Rows(db).in_one_write(lambda tx: audit.AuditTrail(KEY).record_many(tx, [
        audit.Entry(at=t0 + timedelta(minutes=i), action="requested", actor="U_DANA",
                    via="cli", run_id=f"r{i}") for i in range(3)]))
    await Rows(db).execute("UPDATE audit_head SET at = NULL")
    await Rows(db).in_one_write(  # a new process: the head read under its lock
        lambda tx: audit.AuditTrail(KEY).record(tx, at=t0, action="requested",
                                                actor="U_DANA", via="cli", run_id="late"))
    report = await audit.verify(db, keys=[KEY])
    assert report.ok, report.problems
    entries = await Rows(db).audit()
    assert [e.at for e in entries][-2:] == [t0 + timedelta(minutes=2)] * 2


async def _boom(tx: Any) -> None:
    raise RuntimeError("the commit fails after the entries were chained")


async def test_chainings_of_one_process_at_once_follow_each_other(db, monkeypatch):
    """Twenty transactions of one process chaining at once: each sends its head statement
    after the one before it was answered, so each finds the head it guessed (the one
    before's rows, once that commits) and none reads the head under its lock; one chain,
    every entry once."""
    trail = audit.AuditTrail(KEY)
    now = datetime(2026, 12, 3, 9, 0, tzinfo=UTC)
    reads = []
    lock_head = AuditRepo.lock_head

    async def counted(self):
        reads.append(1)
        return await lock_head(self)

    monkeypatch.setattr(AuditRepo, "lock_head", counted)

    async def append(run_id: str) -> None:
        await Rows(db).in_one_write(lambda tx: trail.record(
            tx, at=now, action="requested", actor="U_DANA", via="cli", run_id=run_id))

    await append("first")  # the head read under its lock (made first: a new database)
    assert reads
    read = len(reads)
    await asyncio.gather(*(append(f"r{i}") for i in range(20)))
    assert len(reads) == read
    report = await audit.verify(db, keys=[KEY])
    assert report.ok, report.problems
    assert report.entries == 21


async def test_a_long_record_is_read_in_keyset_pages_each_entry_once_in_order(make_engine, db):
    """The record's readers (the replay's intake, the kept requests) page by seq: pages
    of at most the batch, every entry once, in seq order, whether the last page is full
    or short."""
    await _history(make_engine())
    await _history(make_engine())

    async def paged(tx):
        head, _ = await tx.audit.head()
        every = [r async for r in tx.audit.iterate()]
        actions = tuple(sorted({r.action for r in every}))
        for batch in (1, 3, 4, len(every), len(every) + 5):
            pages = [page async for page in tx.audit.records(actions=actions, after=0,
                                                            upto=head, batch=batch)]
            assert all(0 < len(p) <= batch for p in pages), (batch, [len(p) for p in pages])
            assert [int(r[0]) for p in pages for r in p] == [r.seq for r in every]
        after = every[2].seq
        pages = [page async for page in tx.audit.records(actions=actions, after=after,
                                                        upto=every[-2].seq, batch=2)]
        assert [int(r[0]) for p in pages for r in p] == [r.seq for r in every[3:-1]]
    await Rows(db).in_one_read(paged)


async def test_a_walk_of_the_log_asks_for_no_page_past_its_end(make_engine, db):
    """``iterate`` stops at a short page or at ``upto``: a verification (the model test's
    check after every step, ``approvald audit verify``) reads a log shorter than its batch
    in one statement, not two (the second found nothing), and a log up to a seq no
    further than that seq (each statement counted, by plan or through SQLAlchemy)."""
    from tests.helpers import executed_on

    await _history(make_engine())

    async def walked(tx):
        with executed_on("audit_log") as seen:
            every = [r async for r in tx.audit.iterate()]
        assert len(every) == 8 and len(seen) == 1, seen
        for batch, upto, pages in ((3, None, 3), (4, None, 3), (4, every[3].seq, 1),
                                   (8, every[-1].seq, 1), (2, every[4].seq, 3)):
            with executed_on("audit_log") as seen:
                got = [r.seq async for r in tx.audit.iterate(batch=batch, upto=upto)]
            assert got == [r.seq for r in every if upto is None or r.seq <= upto]
            assert len(seen) == pages, (batch, upto, len(seen))
    await Rows(db).in_one_read(walked)



async def test_the_chain_s_walks_run_by_plan(make_engine, db):
    """The chain's head, a walk of its entries (whole, up to a seq, of one run, from a
    time, in pages) and a run's entries are planned statements (``store/fastsql.py``): a
    chain watcher (the model test's check after every step, ``audit verify``, a run
    thread's turn) pays no SQLAlchemy execution for them; they read what SQLAlchemy reads."""
    from tests.helpers import executed_on, through_sqlalchemy

    run_id = await _history(make_engine())
    every = await Rows(db).audit()
    ran = [e for e in every if e.run_id == run_id]

    async def walked(tx):
        with through_sqlalchemy(db, "audit_log", "audit_head") as through, \
                executed_on("audit_log", "audit_head") as asked:
            head = await tx.audit.head()
            walks = [[r async for r in tx.audit.iterate(**kw)] for kw in (
                {}, {"batch": 3}, {"upto": every[4].seq}, {"run_id": run_id, "batch": 2},
                {"since": every[3].at, "after": every[1].seq})]
            of_run = await tx.audit.of_run(run_id, after=every[0].seq, limit=3)
        # the head; the walks' pages (8 entries in 3s: 3; the run's in 2s: a page past a
        # full last one); the run's entries
        assert len(asked) == 1 + 1 + 3 + 1 + (len(ran) // 2 + 1) + 1 + 1, asked
        if db.fast_path:  # (APPROVALD_DB_FAST_PATH=0: no plans, all through SQLAlchemy)
            assert through == []
        assert head == (every[-1].seq, every[-1].hash)
        assert walks == [every, every, every[:5], ran,
                         [e for e in every[2:] if e.at >= every[3].at]]
        assert of_run == [e for e in ran if e.seq > every[0].seq][:3]
    await Rows(db).in_one_read(walked)


async def test_the_tables_check_asks_for_no_page_past_the_last_request(make_engine, db):
    """``table_disagreements`` (every verification's comparison of the approvals table with
    the chain) stops at a short page: two requests read in one page when its batch holds
    them, not a second page that finds nothing; a full page is still followed."""
    from approvald.runtime.record.audit_check import ChainFacts, table_disagreements

    from tests.helpers import executed_on

    await _history(make_engine())

    async def compared(tx):
        facts = ChainFacts()
        async for e in tx.audit.iterate():
            facts.apply(e)
        for batch, pages in ((500, 1), (3, 1), (2, 2), (1, 3)):
            with executed_on("approvals") as seen:
                assert await table_disagreements(tx, facts, batch=batch) == []
            assert len(seen) == pages, (batch, seen)
    await Rows(db).in_one_read(compared)

# One process's chainings at once (issue 50): each works out its rows as it arrives, chained
# to the head the chaining before it is about to leave, so the turn the next one waits for
# is held for the statement's round trip alone; when that chaining leaves another head, the
# rows are chained again to the head it left. PostgreSQL only: on SQLite the database's
# write lock lets one write transaction at a time reach its chaining.
TURN_AT = datetime(2026, 12, 6, 9, 0, tzinfo=UTC)


async def _append_one(db: Any, trail: audit.AuditTrail, run_id: str) -> None:
    await Rows(db).in_one_write(lambda tx: trail.record(
        tx, at=TURN_AT, action="requested", actor="U_DANA", via="cli", run_id=run_id))


async def _until_true(check: Any, what: str) -> None:
    for _ in range(500):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(what)


def _held_first_statement(monkeypatch: pytest.MonkeyPatch, *, fail: bool
                          ) -> tuple[asyncio.Event, asyncio.Event, list[Any]]:
    """The first guessed head statement held until released (then failing, if ``fail``);
    every guessed statement's guess (seq) noted."""
    sent, release = asyncio.Event(), asyncio.Event()
    guesses: list[Any] = []
    append_if_head = AuditRepo.append_if_head

    async def held(self: AuditRepo, rows: Any, **kw: Any) -> Any:
        guesses.append(kw["seq"])
        if len(guesses) == 1:
            sent.set()
            await release.wait()
            if fail:
                raise RuntimeError("the statement fails")
        return await append_if_head(self, rows, **kw)

    monkeypatch.setattr(AuditRepo, "append_if_head", held)
    return sent, release, guesses


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_a_chaining_works_out_its_rows_while_the_one_before_is_in_flight(
        db, monkeypatch):
    trail = audit.AuditTrail(KEY)
    await _append_one(db, trail, "first")  # the head known
    hashed: list[int] = []
    entry_hash = audit.entry_hash

    def counted(*a: Any, **kw: Any) -> str:
        hashed.append(kw["seq"])
        return entry_hash(*a, **kw)

    monkeypatch.setattr(audit, "entry_hash", counted)
    sent, release, guesses = _held_first_statement(monkeypatch, fail=False)
    a = asyncio.create_task(_append_one(db, trail, "a"))
    await sent.wait()
    b = asyncio.create_task(_append_one(db, trail, "b"))
    # b's entry is hashed, chained after a's, while a's statement is still in flight
    await _until_true(lambda: hashed == [2, 3], f"b's rows not worked out ahead: {hashed}")
    assert not b.done() and guesses == [1]
    release.set()
    await asyncio.gather(a, b)
    assert hashed == [2, 3] and guesses == [1, 2]  # nothing worked out twice
    report = await audit.verify(db, keys=[KEY])
    assert report.ok, report.problems
    assert report.entries == 3


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_a_chaining_after_one_that_failed_is_chained_to_the_head_it_left(
        db, monkeypatch):
    """The chaining before failed (its rows never written): the rows worked out after
    them are chained again to the head as it stands, read under its lock, with no
    statement sent on the guess that failed."""
    trail = audit.AuditTrail(KEY)
    await _append_one(db, trail, "first")
    reads = []
    lock_head = AuditRepo.lock_head

    async def counted(self: AuditRepo) -> Any:
        reads.append(1)
        return await lock_head(self)

    monkeypatch.setattr(AuditRepo, "lock_head", counted)
    sent, release, guesses = _held_first_statement(monkeypatch, fail=True)
    a = asyncio.create_task(_append_one(db, trail, "a"))
    await sent.wait()
    b = asyncio.create_task(_append_one(db, trail, "b"))
    await asyncio.sleep(0.1)
    release.set()
    with pytest.raises(RuntimeError):
        await a
    await b
    assert guesses == [1] and len(reads) == 1  # b: the head read, no guess of a's rows
    report = await audit.verify(db, keys=[KEY])
    assert report.ok, report.problems
    assert report.entries == 2

    async def run_ids(tx):
        return [r.run_id async for r in tx.audit.iterate()]
    assert await Rows(db).in_one_read(run_ids) == ["first", "b"]
