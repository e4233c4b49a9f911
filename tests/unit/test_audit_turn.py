"""One process's chainings at once (issue 50): each works out its rows as it arrives,
chained to the head the chaining before it is about to leave, so the turn the next one
waits for is held for the statement's round trip alone; when that chaining leaves another
head, the rows are chained again to the head it left. PostgreSQL only: on SQLite the
database's write lock lets one write transaction at a time reach its chaining."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest
from approvald.runtime.record import audit
from approvald.runtime.record.audit import AuditKey
from approvald.store.repos.audit import AuditRepo

KEY = AuditKey("turn-test-key-0123456789")
NOW = datetime(2026, 12, 6, 9, 0, tzinfo=UTC)


async def _append(db: Any, trail: audit.AuditTrail, run_id: str) -> None:
    async with db.write() as tx:
        trail.record(tx, at=NOW, action="requested", actor="U_DANA", via="cli",
                     run_id=run_id)


async def _until(check: Any, what: str) -> None:
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
    await _append(db, trail, "first")  # the head known
    hashed: list[int] = []
    entry_hash = audit.entry_hash

    def counted(*a: Any, **kw: Any) -> str:
        hashed.append(kw["seq"])
        return entry_hash(*a, **kw)

    monkeypatch.setattr(audit, "entry_hash", counted)
    sent, release, guesses = _held_first_statement(monkeypatch, fail=False)
    a = asyncio.create_task(_append(db, trail, "a"))
    await sent.wait()
    b = asyncio.create_task(_append(db, trail, "b"))
    # b's entry is hashed, chained after a's, while a's statement is still in flight
    await _until(lambda: hashed == [2, 3], f"b's rows not worked out ahead: {hashed}")
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
    await _append(db, trail, "first")
    reads = []
    lock_head = AuditRepo.lock_head

    async def counted(self: AuditRepo) -> Any:
        reads.append(1)
        return await lock_head(self)

    monkeypatch.setattr(AuditRepo, "lock_head", counted)
    sent, release, guesses = _held_first_statement(monkeypatch, fail=True)
    a = asyncio.create_task(_append(db, trail, "a"))
    await sent.wait()
    b = asyncio.create_task(_append(db, trail, "b"))
    await asyncio.sleep(0.1)
    release.set()
    with pytest.raises(RuntimeError):
        await a
    await b
    assert guesses == [1] and len(reads) == 1  # b: the head read, no guess of a's rows
    report = await audit.verify(db, keys=[KEY])
    assert report.ok, report.problems
    assert report.entries == 2
    async with db.read() as tx:
        assert [r.run_id async for r in tx.audit.iterate()] == ["first", "b"]
