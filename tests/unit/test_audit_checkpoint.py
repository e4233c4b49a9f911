"""The record is read from the chain's verified-through checkpoint: the entries after it
verified in full, the checkpointed entry and the count before it checked, the checkpoint
itself MAC'd with the key (issue 51). What it trades away (an edit before the checkpoint)
is still caught by ``audit verify`` and by a ``full`` read."""

from __future__ import annotations

import json

import pytest
from approvald.runtime.approvals.decide import Actor
from approvald.runtime.record import audit
from approvald.runtime.record.audit import AuditKey
from approvald.runtime.record.audit_checkpoint import checkpoint_mac, record_checkpoint
from approvald.runtime.record.history import ChainBroken
from approvald.store.models import AuditCheckpoint, AuditEntry

from tests.helpers import Rows

KEY = AuditKey("audit-key-kept-in-a-vault-0123456789")


async def _request(engine, task: str, verdict: str) -> None:
    run = await engine.run("demo-refund", task, requested_by="U_DANA")
    await engine.decide(run.approval_ids[0], actor=Actor("U_ALICE", "slack"), verdict=verdict,
                        reason="no" if verdict == "deny" else None)
    await engine.advance(run.run_id)


async def _checkpointed(engine, db) -> int:
    """Two requests, a full verify that records its checkpoint, then a third request."""
    await _request(engine, "Refund order A-1001", "approve")
    await _request(engine, "Refund order B-2002", "deny")
    report = await audit.verify(db, keys=[KEY])
    assert report.ok, report.problems
    assert await record_checkpoint(db, report, [KEY], 0)
    await _request(engine, "Refund order C-3003", "approve")
    return report.head[0]


async def _checkpoint(db) -> tuple[int, str]:
    found = await Rows(db).audit_checkpoint()
    assert found is not None
    return found[0], found[1]


def _summary(history) -> list[tuple[str, str, str | None]]:
    return [(r.tool, r.outcome, r.decided_by) for r in history.requests]


async def _edit(db, seq: int) -> None:
    """Someone who can write the database, without the key, edits entry ``seq``."""
    rows = Rows(db)
    details = json.loads(await rows.value(AuditEntry.details, AuditEntry.seq == seq))
    details["edited_by_hand"] = True
    await rows.forge(AuditEntry, AuditEntry.seq == seq, details=json.dumps(details))


async def test_a_read_verifies_from_the_checkpoint_and_moves_it_to_the_head(make_engine, db):
    engine = make_engine(audit_key=KEY)
    at = await _checkpointed(engine, db)
    assert (await _checkpoint(db))[0] == at
    history = await engine.history(since=None, keys=[KEY])
    head = await Rows(db).audit_head()
    assert tuple(history.head) == head and head[0] > at
    assert await _checkpoint(db) == head  # the tail it verified is verified
    full = await engine.history(since=None, keys=[KEY], full=True)
    assert _summary(history) == _summary(full)
    assert [s for s in _summary(history) if s[0] == "issue_refund"] == [
        ("issue_refund", "approved", "U_ALICE"), ("issue_refund", "denied", "U_ALICE"),
        ("issue_refund", "approved", "U_ALICE")]
    assert [r.args for r in history.requests] == [r.args for r in full.requests]


async def test_an_edit_after_the_checkpoint_is_caught(make_engine, db):
    engine = make_engine(audit_key=KEY)
    at = await _checkpointed(engine, db)
    await _edit(db, at + 1)
    with pytest.raises(ChainBroken, match=rf"entry {at + 1} .* was edited"):
        await engine.history(since=None, keys=[KEY])


async def test_an_edit_of_the_checkpointed_entry_is_caught(make_engine, db):
    engine = make_engine(audit_key=KEY)
    at = await _checkpointed(engine, db)
    await _edit(db, at)
    with pytest.raises(ChainBroken, match=rf"entry {at} .* was edited"):
        await engine.history(since=None, keys=[KEY])


async def test_an_edit_before_the_checkpoint_is_caught_by_verify_and_by_a_full_read(
        make_engine, db):
    engine = make_engine(audit_key=KEY)
    await _checkpointed(engine, db)
    await _edit(db, 2)
    # the trade-off (docs/how-to/audit.md): a read that trusts the checkpoint does not
    # recompute the MACs before it...
    await engine.history(since=None, keys=[KEY])
    # ...while the full walks do
    with pytest.raises(ChainBroken, match=r"entry 2 .* was edited"):
        await engine.history(since=None, keys=[KEY], full=True)
    report = await audit.verify(db, keys=[KEY])
    assert not report.ok and "entry 2 " in report.problems[0]


async def test_a_deleted_entry_before_the_checkpoint_is_caught(make_engine, db):
    engine = make_engine(audit_key=KEY)
    at = await _checkpointed(engine, db)
    await Rows(db).remove(AuditEntry, AuditEntry.seq == 2)
    with pytest.raises(ChainBroken, match=rf"1 entries up to entry {at}.* were deleted"):
        await engine.history(since=None, keys=[KEY])


async def test_a_checkpoint_not_made_with_the_key_is_caught(make_engine, db):
    """A writer who edits an entry after the checkpoint and moves the checkpoint past it
    cannot sign the move."""
    engine = make_engine(audit_key=KEY)
    at = await _checkpointed(engine, db)
    await _edit(db, at + 1)
    seq, digest = await Rows(db).audit_head()
    forged = checkpoint_mac(AuditKey("a-key-that-is-not-the-deployments"), seq, digest, 0)
    await Rows(db).forge(AuditCheckpoint, AuditCheckpoint.seq.is_not(None), seq=seq,
                         hash=digest, mac=forged)
    with pytest.raises(ChainBroken, match=r"checkpoint .* not signed with the audit key"):
        await engine.history(since=None, keys=[KEY])


async def test_a_removed_checkpoint_means_a_full_walk(make_engine, db):
    engine = make_engine(audit_key=KEY)
    await _checkpointed(engine, db)
    await _edit(db, 2)
    await Rows(db).remove(AuditCheckpoint, AuditCheckpoint.seq.is_not(None))
    with pytest.raises(ChainBroken, match=r"entry 2 .* was edited"):
        await engine.history(since=None, keys=[KEY])


async def test_without_a_key_no_checkpoint_is_recorded(make_engine, db):
    engine = make_engine()
    await _request(engine, "Refund order A-1001", "approve")
    report = await audit.verify(db)
    assert report.ok
    assert not await record_checkpoint(db, report, [], 0)
    await engine.history(since=None)
    assert await Rows(db).audit_checkpoint() is None
