"""The requests on the record kept folded (issue 51): a read takes the kept requests,
each checked against its MAC and their total against the MAC'd fold row, folds only the
entries after them, and gives what a fold of every entry gives. A kept request edited,
deleted or put back to an older state is caught, reported, and never used."""

from __future__ import annotations

import json

from approvald.runtime.approvals.decide import Actor
from approvald.runtime.record.audit import AuditKey
from approvald.store.models import AuditEntry, AuditFold, AuditRequest

from tests.helpers import Rows

KEY = AuditKey("audit-key-kept-in-a-vault-0123456789")


def _summary(history) -> list[tuple[str, str, str | None, str | None]]:
    return [(r.tool, r.outcome, r.decided_by, r.reason) for r in history.requests]


def _refunds(history) -> list[tuple[str, str | None]]:
    return [(r.outcome, r.decided_by) for r in history.requests if r.tool == "issue_refund"]


async def _kept_of(db, history, approval_id: str) -> tuple[int, int, str, str, str]:
    """The kept row of the request ``approval_id`` asked."""
    seq = next(r.seq for r in history.requests if r.key == approval_id)
    return next(k for k in await Rows(db).kept_requests() if k[0] == seq)


async def _decide(engine, approval_id: str, verdict: str) -> None:
    await engine.decide(approval_id, actor=Actor("U_ALICE", "slack"), verdict=verdict,
                        reason="no" if verdict == "deny" else None)


async def _history(engine):
    """Three requests (approved, denied, one left waiting), read once: kept."""
    runs = [await engine.run("demo-refund", f"Refund order A-{i}", requested_by="U_DANA")
            for i in range(3)]
    for run, verdict in zip(runs[:2], ("approve", "deny"), strict=True):
        await _decide(engine, run.approval_ids[0], verdict)
        await engine.advance(run.run_id)
    first = await engine.history(since=None, keys=[KEY])
    assert not first.problems
    return runs, first


async def test_a_read_keeps_the_requests_and_the_next_takes_them_and_folds_only_the_rest(
        make_engine, db):
    engine = make_engine(audit_key=KEY)
    runs, first = await _history(engine)
    kept = await Rows(db).kept_requests()
    assert [seq for seq, *_ in kept] == [r.seq for r in first.requests]
    fold = await Rows(db).audit_fold()
    assert fold[0] == first.head[0] and fold[1] == sum(n for _, n, *_ in kept)
    # the waiting request is decided after the keep: the next read folds that entry in
    await _decide(engine, runs[2].approval_ids[0], "approve")
    again = await engine.history(since=None, keys=[KEY])
    full = await engine.history(since=None, keys=[KEY], full=True)
    assert not again.problems and _summary(again) == _summary(full)
    assert _refunds(again) == [("approved", "U_ALICE"), ("denied", "U_ALICE"),
                               ("approved", "U_ALICE")]
    assert [r.args for r in again.requests] == [r.args for r in full.requests]
    # its request and its decision
    assert (await _kept_of(db, again, runs[2].approval_ids[0]))[1] == 2
    # the entries before the keep are not read again: one changed by hand there (which a
    # full read catches) does not reach the record; the kept fold does
    denial = await Rows(db).value(AuditEntry.seq, AuditEntry.action == "denied")
    await Rows(db).forge(AuditEntry, AuditEntry.seq == denial, actor="U_MALLORY")
    kept_read = await engine.history(since=None, keys=[KEY])
    assert _refunds(kept_read) == _refunds(again)


async def test_a_kept_request_edited_by_hand_is_caught_and_never_used(make_engine, db):
    engine = make_engine(audit_key=KEY)
    runs, first = await _history(engine)
    seq, _, state, *_ = await _kept_of(db, first, runs[1].approval_ids[0])  # the denied one
    forged = json.loads(state)
    assert forged[12] == "denied"
    forged[12], forged[16] = "approved", None
    await Rows(db).forge(AuditRequest, AuditRequest.seq == seq, state=json.dumps(forged))
    caught = await engine.history(since=None, keys=[KEY])
    assert len(caught.problems) == 1 and "do not match their MAC" in caught.problems[0]
    assert f"entry {seq}" in caught.problems[0]
    assert _summary(caught) == _summary(first)  # folded from the entries: still denied
    assert _refunds(caught)[1] == ("denied", "U_ALICE")
    # kept anew from the entries: the next read is clean
    assert not (await engine.history(since=None, keys=[KEY])).problems


async def test_a_kept_request_put_back_or_deleted_is_caught(make_engine, db):
    engine = make_engine(audit_key=KEY)
    runs, first = await _history(engine)
    # waiting, as kept then: a valid MAC
    older = await _kept_of(db, first, runs[2].approval_ids[0])
    await _decide(engine, runs[2].approval_ids[0], "deny")
    decided = await engine.history(since=None, keys=[KEY])
    assert _refunds(decided)[2] == ("denied", "U_ALICE")
    seq, folded, state, _, mac = older
    await Rows(db).forge(AuditRequest, AuditRequest.seq == seq, folded=folded, state=state,
                         mac=mac)
    caught = await engine.history(since=None, keys=[KEY])
    assert len(caught.problems) == 1 and "deleted or put back" in caught.problems[0]
    assert _summary(caught) == _summary(decided)
    await Rows(db).remove(AuditRequest, AuditRequest.seq == seq)
    caught = await engine.history(since=None, keys=[KEY])
    assert "deleted or put back" in caught.problems[0]
    assert _summary(caught) == _summary(decided)
    # the fold row forged (its count raised to match) is not signed with the key
    await Rows(db).forge(AuditFold, AuditFold.id == 1, folded=1)
    caught = await engine.history(since=None, keys=[KEY])
    assert "fold row is not signed" in caught.problems[0]
    await Rows(db).remove(AuditFold, AuditFold.id == 1)
    caught = await engine.history(since=None, keys=[KEY])
    assert "fold row is missing" in caught.problems[0]
    assert _summary(caught) == _summary(decided)


async def test_an_existing_record_is_kept_on_its_first_read_and_a_window_is_cut_from_it(
        make_engine, db, clock):
    from datetime import timedelta

    engine = make_engine(audit_key=KEY)
    run = await engine.run("demo-refund", "Refund order A-1", requested_by="U_DANA")
    await _decide(engine, run.approval_ids[0], "approve")
    clock.advance(timedelta(days=2))
    later = await engine.run("demo-refund", "Refund order B-2", requested_by="U_DANA")
    await _decide(engine, later.approval_ids[0], "deny")
    assert await Rows(db).kept_requests() == [] and await Rows(db).audit_fold() is None
    # the first read (no checkpoint, nothing kept, as after migration 0024) walks it all
    first = await engine.history(since=None, keys=[KEY])
    assert not first.problems
    assert len(await Rows(db).kept_requests()) == len(first.requests) >= 2
    window = await engine.history(since=timedelta(days=1), keys=[KEY])
    full = await engine.history(since=timedelta(days=1), keys=[KEY], full=True)
    assert _summary(window) == _summary(full)
    assert _refunds(window) == [("denied", "U_ALICE")]
    assert _refunds(await engine.history(since=None, keys=[KEY])) == [
        ("approved", "U_ALICE"), ("denied", "U_ALICE")]


async def test_two_reads_keeping_at_once_leave_one_keep(make_engine, db):
    from approvald.runtime.record.history import _Builder
    from approvald.runtime.record.history_fold import Kept, keep

    engine = make_engine(audit_key=KEY)
    await _history(engine)
    before = (await Rows(db).kept_requests(), await Rows(db).audit_fold())
    # a read that found nothing kept (a moment ago) keeps its fold after this one did:
    # the fold row is not where it found it, so nothing of it is written
    assert not await keep(db, KEY, 0, _Builder(), Kept(was=None), before[1][0] + 1)
    assert (await Rows(db).kept_requests(), await Rows(db).audit_fold()) == before


async def test_the_operators_board_logs_a_kept_request_edited_by_hand(make_engine, db, caplog):
    engine = make_engine(audit_key=KEY, operators=("U_BOB",))
    runs, first = await _history(engine)
    seq, _, state, *_ = await _kept_of(db, first, runs[1].approval_ids[0])
    await Rows(db).forge(AuditRequest, AuditRequest.seq == seq,
                         state=state.replace('"denied"', '"approved"'))
    with caplog.at_level("WARNING", logger="approvald.engine"):
        shown = await engine.operator_insights("U_BOB")
    assert shown is not None and shown.insights is not None
    assert [r.getMessage() for r in caplog.records if "kept request" in r.getMessage()] == [
        f"audit log: 1 kept request(s) do not match their MAC (first at entry {seq}): "
        "edited outside approvald; the record was folded from the audit entries instead"]
