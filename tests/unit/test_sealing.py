"""runtime/sealing.py: what is sealed, under which key, and what a missing key does."""

from __future__ import annotations

import logging

import pytest
from approvald.runtime.errors import ConfigError
from approvald.runtime.sealing import (
    DataKey,
    DataKeyError,
    Sealer,
    check,
    is_sealed,
    key_id,
    reseal,
)
from approvald.store import types
from approvald.store.db import Database
from sqlalchemy import text

from tests.helpers import START

OLD, NEW = DataKey("old-data-key-0123456789"), DataKey("new-data-key-0123456789")
ARGS = '{"card_number": "4242 4242 4242 4242", "auth": {"code": "AUTH-ZQX-7731"}}'
DECLARED_ONLY = '{"code": "AUTH-ZQX-7731"}'  # no detector knows it: sealed by its column


def test_a_call_column_is_sealed_whole_and_opens_back_exactly() -> None:
    s = Sealer([OLD])
    for value in (ARGS, DECLARED_ONLY):
        sealed = s.seal(value, "approvals.args")
        assert is_sealed(sealed) and key_id(sealed) == OLD.id
        assert "4242" not in sealed and "ZQX" not in sealed
        assert s.open(sealed, "approvals.args") == value
        assert s.seal(value, "approvals.args") != sealed  # a fresh nonce each time


def test_every_value_of_a_sealed_column_is_sealed_with_a_key() -> None:
    s = Sealer([OLD])
    for column in ("runs.task", "approvals.packet", "run_events.body"):
        sealed = s.seal("Refund A-1 please", column)
        assert is_sealed(sealed) and s.open(sealed, column) == "Refund A-1 please"


def test_a_moved_or_altered_value_does_not_open() -> None:
    s = Sealer([OLD])
    sealed = s.seal(ARGS, "approvals.args")
    with pytest.raises(ConfigError, match="APPROVALD_DATA_KEY"):
        s.open(sealed, "approvals.edited_args")  # the column is bound in
    token = sealed[-10]
    altered = sealed[:-10] + ("A" if token != "A" else "B") + sealed[-9:]
    with pytest.raises(ConfigError, match="APPROVALD_DATA_KEY"):
        s.open(altered, "approvals.args")


def test_a_lost_key_is_refused_in_one_line_naming_the_variable() -> None:
    sealed = Sealer([OLD]).seal(ARGS, "run_events.body")
    for sealer in (Sealer(), Sealer([NEW])):
        with pytest.raises(ConfigError) as e:
            sealer.open(sealed, "run_events.body")
        assert "APPROVALD_DATA_KEY" in str(e.value) and "\n" not in str(e.value)
        assert "4242" not in str(e.value)


def test_a_retired_key_opens_and_reseal_moves_values_to_the_current_key() -> None:
    sealed = Sealer([OLD]).seal(ARGS, "approvals.args")
    rotated = Sealer([NEW, OLD])
    assert rotated.open(sealed, "approvals.args") == ARGS
    again = rotated.reseal(sealed, "approvals.args")
    assert key_id(again) == NEW.id and Sealer([NEW]).open(again, "approvals.args") == ARGS
    assert rotated.reseal(again, "approvals.args") == again  # nothing to do: not rewritten
    assert key_id(rotated.reseal(ARGS, "approvals.args")) == NEW.id  # clear: sealed now
    with pytest.raises(ConfigError, match="APPROVALD_DATA_KEY"):
        Sealer().reseal(sealed, "approvals.args")


def test_without_a_key_values_are_stored_as_given_with_one_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    s = Sealer()
    assert s.seal(ARGS, "run_events.body") == ARGS  # not looked into: a step's path
    assert not caplog.records
    assert s.seal(ARGS, "approvals.args") == ARGS
    assert s.seal(ARGS, "approvals.args") == ARGS
    warned = [r.getMessage() for r in caplog.records if "APPROVALD_DATA_KEY" in r.getMessage()]
    assert len(warned) == 1 and "4242" not in warned[0]


def test_a_short_key_is_refused() -> None:
    with pytest.raises(ConfigError, match="APPROVALD_DATA_KEY"):
        DataKey("short")


async def test_required_key_refuses_a_secret_in_clear_and_writes_nothing(
        db: Database) -> None:
    types.set_codec(Sealer(require=True))
    with pytest.raises(ConfigError) as e:
        async with db.write() as tx:
            await tx.runs.create(run_id="r1", agent="a", task="Refund A-1 please",
                                 requested_by="U_DANA", instructions_version="v", now=START)
            await tx.runs.create(run_id="r2", agent="a", task="to 4242 4242 4242 4242",
                                 requested_by="U_DANA", instructions_version="v", now=START)
    assert "APPROVALD_REQUIRE_DATA_KEY" in str(e.value)
    async with db.connection() as conn:
        assert (await conn.execute(text("SELECT count(*) FROM runs"))).scalar_one() == 0


async def test_sealed_columns_are_sealed_in_the_database_and_read_back_clear(
        db: Database) -> None:
    types.set_codec(Sealer([NEW]))
    async with db.write() as tx:
        await tx.runs.create(run_id="r1", agent="a", task="to 4242 4242 4242 4242",
                             requested_by="U_DANA", instructions_version="v", now=START)
        await tx.outbox.add(kind="tool.notice", group_key="r1", payload=ARGS, now=START)
    async with db.connection() as conn:
        raw = (await conn.execute(text("SELECT task FROM runs"))).scalar_one()
        payload = (await conn.execute(text("SELECT payload FROM outbox"))).scalar_one()
    assert is_sealed(raw) and "4242" not in raw
    assert is_sealed(payload) and "4242" not in payload
    async with db.read() as tx:
        run = await tx.runs.get("r1")
        row = await tx.outbox.latest("tool.notice")
    assert run is not None and run.task == "to 4242 4242 4242 4242"
    assert row is not None and row.payload == ARGS


def test_a_value_shaped_like_a_sealed_one_is_sealed_or_refused_never_stored_as_is() -> None:
    forged = '{"$sealed":"000000000000:AAAA"}'
    s = Sealer([OLD])
    assert s.open(s.seal(forged, "approvals.args"), "approvals.args") == forged
    with pytest.raises(ConfigError, match="APPROVALD_DATA_KEY"):
        Sealer().seal(forged, "approvals.args")


async def _runs(db: Database, ids: list[str]) -> None:
    async with db.write() as tx:
        for rid in ids:
            await tx.runs.create(run_id=rid, agent="a", task="to 4242 4242 4242 4242",
                                 requested_by="U_DANA", instructions_version="v", now=START)


async def _stored_tasks(db: Database) -> list[str]:
    async with db.connection() as conn:
        return [r[0] for r in await conn.execute(text("SELECT task FROM runs ORDER BY id"))]


async def test_reseal_rewrites_more_rows_than_a_batch_and_a_rerun_has_nothing_left(
        db: Database) -> None:
    types.set_codec(Sealer([OLD]))
    await _runs(db, [f"r{i:02d}" for i in range(8)])
    types.set_codec(None)
    await _runs(db, ["r99"])  # stored in clear, before there was a key
    rotated = Sealer([NEW, OLD])
    types.set_codec(rotated)
    assert await reseal(db, rotated, batch=3) == {"runs": 9}
    assert {key_id(t) for t in await _stored_tasks(db)} == {NEW.id}
    assert await reseal(db, rotated, batch=3) == {}  # safe to rerun: nothing to do
    async with db.read() as tx:
        run = await tx.runs.get("r07")
    assert run is not None and run.task == "to 4242 4242 4242 4242"


async def test_the_start_check_finds_a_missing_key_on_any_waiting_run(db: Database) -> None:
    types.set_codec(Sealer([NEW]))
    await _runs(db, [f"r{i:03d}" for i in range(149)])
    types.set_codec(Sealer([OLD]))
    await _runs(db, ["r149"])  # the last of 150 waiting runs, under a key now lost
    with pytest.raises(DataKeyError, match=OLD.id):
        await check(db, Sealer([NEW]))
    await check(db, Sealer([NEW, OLD]))
