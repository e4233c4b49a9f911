"""A verification that resumes (``audit.ChainVerifier``): each check walks only the entries
appended since the one before, and says what a whole ``audit verify`` says; the head it
verified last, held outside the database, catches a log cut back or re-chained up to it."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from approvald.runtime.approvals.decide import Actor
from approvald.runtime.policies.scope import scope_for
from approvald.runtime.record import audit
from approvald.runtime.record.sealing import DataKey, Sealer, is_sealed
from approvald.store import types
from approvald.store.models import Approval, AuditEntry, AuditHead

from tests.helpers import Rows, executed_on


async def _refund(engine: Any, approver: str) -> None:
    """A request, its approval, the refund and the customer's mail: entries appended."""
    out = await engine.run("demo-refund", "Refund order A-1001", requested_by="U_DANA")
    await engine.decide(out.approval_ids[0], actor=Actor(approver, "slack"), verdict="approve")
    await engine.advance(out.run_id)


async def _check(db: Any, verifier: audit.ChainVerifier) -> audit.VerifyReport:
    return await Rows(db).in_one_read(verifier.check, snapshot=True)


async def test_a_resumed_check_walks_only_the_new_entries_and_reports_as_a_whole_one(
        make_engine, db):
    engine = make_engine()
    await _refund(engine, "U_ALICE")
    walked: list[Any] = []
    verifier = audit.ChainVerifier(visit=walked.append)
    first = await _check(db, verifier)
    assert first.ok and first.entries == len(walked) > 0 and verifier.head == first.head
    again = await _check(db, verifier)  # nothing appended: nothing walked, the same report
    assert again.ok and (again.entries, again.head) == (first.entries, first.head)
    assert len(walked) == first.entries
    await _refund(engine, "U_BOB")
    with executed_on("audit_log") as statements:
        resumed = await _check(db, verifier)
    # the entry verified last, read again, and the new ones: one statement (by its plan or
    # through SQLAlchemy)
    assert len(statements) == 1, statements
    whole = await audit.verify(db)
    assert resumed.ok and whole.ok and whole.entries > first.entries
    assert [e.seq for e in walked] == list(range(1, whole.entries + 1))  # each once, in order
    assert (resumed.entries, resumed.head, resumed.unkeyed, resumed.notes) == \
        (whole.entries, whole.head, whole.unkeyed, whole.notes)


async def _rechain(rows: Rows, actor: str) -> None:
    """What someone who can write the database does to an unkeyed chain: change every
    approval's actor, recompute every MAC after it, and move the head to the last."""
    prev = audit.GENESIS
    for e in sorted(await rows.audit(), key=lambda e: e.seq):
        who = actor if e.action == "approved" else e.actor
        h = audit.entry_hash(None, prev, seq=e.seq, at=e.at, action=e.action, actor=who,
                             via=e.via, run_id=e.run_id, approval_id=e.approval_id,
                             digest=e.digest, details=e.details)
        await rows.forge(AuditEntry.__table__, AuditEntry.seq == e.seq, actor=who,
                         prev_hash=prev, hash=h)
        prev = h
    await rows.forge(AuditHead.__table__, AuditHead.id == 1, hash=prev)


async def _cut_back(rows: Rows, seq: int) -> None:
    """The entries after ``seq`` deleted and the head moved back to it: a chain that a
    whole verification alone finds sound (without a head recorded elsewhere)."""
    kept = next(e for e in await rows.audit() if e.seq == seq)
    await rows.remove(AuditEntry.__table__, AuditEntry.seq > seq)
    await rows.forge(AuditHead.__table__, AuditHead.id == 1, seq=seq, hash=kept.hash)


@pytest.mark.parametrize("change", ["the entry verified last edited", "the history re-chained",
                                    "the log cut back", "an entry after it edited",
                                    "a request's row changed"])
async def test_a_resumed_check_catches_what_was_changed_since_the_last(make_engine, db,
                                                                       change):
    engine = make_engine()
    await _refund(engine, "U_ALICE")
    verifier = audit.ChainVerifier()
    assert (await _check(db, verifier)).ok
    last = verifier.head[0]
    rows = Rows(db)
    if change == "the entry verified last edited":
        await rows.forge(AuditEntry.__table__, AuditEntry.seq == last, actor="U_MALLORY")
        expected = f"entry {last} "
        said = "edited since it was verified"
    elif change == "the history re-chained":
        await _rechain(rows, "U_MALLORY")
        expected, said = f"entry {last} ", "the history up to it was rewritten"
    elif change == "the log cut back":
        await _cut_back(rows, last - 2)
        expected, said = "the log ends", f"entries {last - 1}-{last} were deleted"
    elif change == "an entry after it edited":
        await _refund(engine, "U_BOB")
        await rows.forge(AuditEntry.__table__, AuditEntry.seq == last + 2, actor="U_MALLORY")
        expected, said = f"entry {last + 2} ", "does not match its MAC"
    else:
        asked = (await rows.requests(limit=1))[0]
        await rows.forge(Approval.__table__, Approval.id == asked.id, decided_by="U_MALLORY")
        expected, said = f"approval {asked.id}: decided_by U_MALLORY", "not the decider"
    report = await _check(db, verifier)
    assert not report.ok
    problem = report.problems[0]
    assert problem.startswith(expected) and said in problem, report.problems


async def test_after_a_broken_check_the_next_walks_the_chain_from_its_first_entry(
        make_engine, db):
    await _refund(make_engine(), "U_ALICE")
    walked: list[Any] = []
    verifier = audit.ChainVerifier(visit=walked.append)
    assert (await _check(db, verifier)).ok
    last = verifier.head[0]
    actor = next(e.actor for e in await Rows(db).audit() if e.seq == last)
    await Rows(db).forge(AuditEntry.__table__, AuditEntry.seq == last, actor="U_MALLORY")
    assert not (await _check(db, verifier)).ok
    assert verifier.head == (0, audit.GENESIS)
    await Rows(db).forge(AuditEntry.__table__, AuditEntry.seq == last, actor=actor)
    walked.clear()
    report = await _check(db, verifier)
    assert report.ok and [e.seq for e in walked] == list(range(1, last + 1))


async def test_an_entry_edited_before_the_head_verified_last_is_left_to_a_whole_check(
        make_engine, db):
    """What a resumed check trusts (the entries it verified before, but the last) and who
    catches a change to them: ``audit verify``, or a new verifier's first check."""
    await _refund(make_engine(), "U_ALICE")
    verifier = audit.ChainVerifier()
    assert (await _check(db, verifier)).ok
    await Rows(db).forge(AuditEntry.__table__, AuditEntry.seq == 2, actor="U_MALLORY")
    assert (await _check(db, verifier)).ok
    whole = await audit.verify(db)
    assert not whole.ok and whole.problems[0].startswith("entry 2 ")
    assert (await _check(db, audit.ChainVerifier())).problems == whole.problems


async def test_a_check_hands_over_every_vote_and_standing_approval_it_compared(make_engine, db):
    """``compared``: the votes and the standing approvals (each scope opened under the data
    key) a check compared with the chain, in its snapshot, for a caller that checks them
    too (the model-based test, after every step) without reading them again."""
    types.set_codec(Sealer([DataKey("resumed-data-key-0123456789")]))
    engine = make_engine()
    await _refund(engine, "U_ALICE")
    await _refund(engine, "U_BOB")
    out = await engine.run("demo-refund", "Refund order A-1002", requested_by="U_DANA")
    a = await Rows(db).approval(out.approval_ids[0])
    s, _ = await engine.grant_standing(
        a.id, actor=Actor("U_CAROL", "slack"), window=timedelta(minutes=30),
        scope=scope_for(a, "condition", when="args.amount_cents <= 5000"))
    verifier = audit.ChainVerifier()
    assert (await _check(db, verifier)).ok
    assert (await _check(db, verifier)).ok  # (each check's rows, not every check's)
    rows = Rows(db)
    votes = [v for r in await rows.requests() for v in await rows.votes(r.id)]
    assert len(votes) >= 2
    assert sorted(verifier.compared.votes, key=repr) == sorted(votes, key=repr)
    [(stored,)] = await rows.select("SELECT scope FROM standing_approvals")
    assert is_sealed(stored)
    [held] = verifier.compared.standing
    assert held.id == s.id and json.loads(held.scope) == json.loads(s.scope)
    # a check that breaks hands over nothing (none of the rows was compared)
    await rows.forge(AuditEntry.__table__, AuditEntry.seq == verifier.head[0], actor="U_X")
    assert not (await _check(db, verifier)).ok
    assert verifier.compared == audit.Compared()
