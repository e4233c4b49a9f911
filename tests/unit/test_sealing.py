"""runtime/record/sealing.py: what is sealed, under which key, and what a missing key does."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from approvald.runtime.kernel.errors import ConfigError
from approvald.runtime.record.sealing import (
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

from tests.helpers import START, Rows

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
    async def two_runs(tx):  # type: ignore[no-untyped-def]
        await tx.runs.create(run_id="r1", agent="a", task="Refund A-1 please",
                             requested_by="U_DANA", instructions_version="v", now=START)
        await tx.runs.create(run_id="r2", agent="a", task="to 4242 4242 4242 4242",
                             requested_by="U_DANA", instructions_version="v", now=START)

    with pytest.raises(ConfigError) as e:
        await Rows(db).in_one_write(two_runs)
    assert "APPROVALD_REQUIRE_DATA_KEY" in str(e.value)
    assert await Rows(db).count("runs") == 0


async def test_sealed_columns_are_sealed_in_the_database_and_read_back_clear(
        db: Database) -> None:
    types.set_codec(Sealer([NEW]))

    async def run_and_notice(tx):  # type: ignore[no-untyped-def]
        await tx.runs.create(run_id="r1", agent="a", task="to 4242 4242 4242 4242",
                             requested_by="U_DANA", instructions_version="v", now=START)
        await tx.outbox.add(kind="tool.notice", group_key="r1", payload=ARGS, now=START)

    await Rows(db).in_one_write(run_and_notice)
    [(raw,)] = await Rows(db).select("SELECT task FROM runs")
    [(payload,)] = await Rows(db).select("SELECT payload FROM outbox")
    assert is_sealed(raw) and "4242" not in raw
    assert is_sealed(payload) and "4242" not in payload
    async def run_and_row(tx):  # type: ignore[no-untyped-def]
        return await tx.runs.get("r1"), await tx.outbox.latest("tool.notice")

    run, row = await Rows(db).in_one_read(run_and_row)
    assert run is not None and run.task == "to 4242 4242 4242 4242"
    assert row is not None and row.payload == ARGS


def test_a_value_shaped_like_a_sealed_one_is_sealed_or_refused_never_stored_as_is() -> None:
    forged = '{"$sealed":"000000000000:AAAA"}'
    s = Sealer([OLD])
    assert s.open(s.seal(forged, "approvals.args"), "approvals.args") == forged
    with pytest.raises(ConfigError, match="APPROVALD_DATA_KEY"):
        Sealer().seal(forged, "approvals.args")


async def _runs(db: Database, ids: list[str]) -> None:
    async def runs(tx):  # type: ignore[no-untyped-def]
        for rid in ids:
            await tx.runs.create(run_id=rid, agent="a", task="to 4242 4242 4242 4242",
                                 requested_by="U_DANA", instructions_version="v", now=START)

    await Rows(db).in_one_write(runs)


async def _stored_tasks(db: Database) -> list[str]:
    return [r[0] for r in await Rows(db).select("SELECT task FROM runs ORDER BY id")]


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
    run = await Rows(db).run("r07")
    assert run is not None and run.task == "to 4242 4242 4242 4242"


async def test_the_start_check_finds_a_missing_key_on_any_waiting_run(db: Database) -> None:
    types.set_codec(Sealer([NEW]))
    await _runs(db, [f"r{i:03d}" for i in range(149)])
    types.set_codec(Sealer([OLD]))
    await _runs(db, ["r149"])  # the last of 150 waiting runs, under a key now lost
    with pytest.raises(DataKeyError, match=OLD.id):
        await check(db, Sealer([NEW]))
    await check(db, Sealer([NEW, OLD]))


# -- a rotation beside a running process (issue 46) ---------------------------------------

class Ticks:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_new_ring_is_taken_in_place_and_never_an_empty_one() -> None:
    s = Sealer([OLD])
    sealed_old = s.seal(ARGS, "runs.task")
    assert s.rekey([NEW, OLD]) and not s.rekey([NEW, OLD])
    assert key_id(s.seal(ARGS, "runs.task")) == NEW.id  # the new key seals from now on
    assert s.open(sealed_old, "runs.task") == ARGS  # and the retired one still opens
    assert s.describe() == f"data key {NEW.id} seals, {OLD.id} retired"
    with pytest.raises(ConfigError, match=f"keeping data key {NEW.id}"):
        s.rekey([])  # a sealing process never turns to writing in clear
    assert s.current is NEW


def test_a_value_under_a_key_the_ring_lacks_reads_the_keys_again_at_most_so_often() -> None:
    ticks = Ticks()
    ring: list[DataKey] = [OLD]
    reads: list[float] = []

    def reread() -> list[DataKey]:
        reads.append(ticks.now)
        return list(ring)

    s = Sealer([OLD], reread=reread, reread_every=5.0, monotonic=ticks)
    sealed_new = Sealer([NEW]).seal(ARGS, "runs.task")
    with pytest.raises(DataKeyError) as refused:  # read again: still not there
        s.open(sealed_new, "runs.task")
    assert (refused.value.key_id, refused.value.failure) == (NEW.id, "missing")
    ring[:] = [NEW, OLD]  # the operator puts the new key in place
    ticks.now += 1
    with pytest.raises(DataKeyError):  # too soon to read again: a hot loop reads nothing
        s.open(sealed_new, "runs.task")
    assert reads == [1000.0]
    ticks.now += 5
    assert s.open(sealed_new, "runs.task") == ARGS  # read again, and it opens
    assert reads == [1000.0, 1006.0] and s.current is NEW


def test_a_reread_that_fails_keeps_the_ring() -> None:
    def broken() -> list[DataKey]:
        raise ConfigError("APPROVALD_DATA_KEY: is empty: set a key of at least 16 bytes")

    s = Sealer([OLD], reread=broken)
    with pytest.raises(DataKeyError):
        s.open(Sealer([NEW]).seal(ARGS, "runs.task"), "runs.task")
    assert s.current is OLD


def test_each_refusal_is_counted() -> None:
    s = Sealer([OLD])
    seen: list[str] = []
    s.on_refused = lambda exc: seen.append(exc.failure)
    sealed = Sealer([NEW]).seal(ARGS, "runs.task")
    for _ in range(3):
        with pytest.raises(DataKeyError):
            s.open(sealed, "runs.task")
    assert seen == ["missing"] * 3


def _record(exc: BaseException, msg: str = "polling for ready runs failed; retrying"
            ) -> logging.LogRecord:
    try:
        raise exc
    except BaseException:
        import sys
        return logging.LogRecord("approvald", logging.ERROR, __file__, 1, msg, None,
                                 sys.exc_info())


def test_a_refusal_to_open_is_told_in_one_line_once_a_minute_per_key() -> None:
    from approvald.runtime.record.sealing import OneLineRefusals

    ticks = Ticks()
    f = OneLineRefusals(every=60.0, monotonic=ticks)

    def missing(kid: str) -> DataKeyError:
        return DataKeyError(f"APPROVALD_DATA_KEY: a sealed value (runs.task) needs the data "
                            f"key {kid}", key_id=kid, failure="missing")

    first = _record(missing("k1"))
    assert f.filter(first) and first.exc_info is None and first.exc_text is None
    assert first.getMessage() == ("polling for ready runs failed; retrying: APPROVALD_DATA_KEY"
                                  ": a sealed value (runs.task) needs the data key k1")
    # met again at each poll: held back, however it was raised (from a cause, in a group)
    wrapped = RuntimeError("outbox drain failed")
    wrapped.__cause__ = missing("k1")
    assert not f.filter(_record(wrapped))
    assert not f.filter(_record(ExceptionGroup("tasks", [ValueError(), missing("k1")])))
    other = _record(missing("k2"))  # another key is another failure: told
    assert f.filter(other)
    altered = _record(DataKeyError("APPROVALD_DATA_KEY: does not open under k1", key_id="k1",
                                   failure="altered"))
    assert f.filter(altered)  # and so is another kind
    ticks.now += 61
    again = _record(missing("k1"))
    assert f.filter(again) and again.getMessage().endswith("(2 more like it in the last 61 s)")
    plain = _record(ValueError("a bug"))
    assert f.filter(plain) and plain.exc_info is not None  # everything else as it was


# -- where the keys come from ---------------------------------------------------------------

@pytest.mark.parametrize("variable", ["APPROVALD_DATA_KEY", "APPROVALD_AUDIT_KEY"])
@pytest.mark.parametrize("value", ["", "   ", " " * 24, "\t\n"])
def test_an_empty_key_is_refused_in_one_line_naming_the_variable(
        monkeypatch: pytest.MonkeyPatch, variable: str, value: str) -> None:
    """Set and empty is not "no key" (and 24 spaces are no key at all)."""
    from approvald.bot.config import load_settings

    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError) as refused:
        load_settings()
    assert str(refused.value) == (f"{variable}: is empty: set a key of at least 16 bytes, "
                                  "or unset the variable")


@pytest.mark.parametrize("value", ["", " " * 24])
def test_an_empty_token_secret_is_refused_too(monkeypatch: pytest.MonkeyPatch,
                                              value: str) -> None:
    """APPROVALD_SECRET keys the buttons and the sign-in links: blank is not unset."""
    from approvald.bot.config import load_settings

    monkeypatch.setenv("SLACK_SIGNING_SECRET", "a-slack-signing-secret-0123456789")
    monkeypatch.setenv("APPROVALD_SECRET", value)
    with pytest.raises(ConfigError, match=r"^APPROVALD_SECRET: is empty"):
        load_settings()


def test_keys_come_from_the_secrets_directory_and_are_read_again_from_it(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    from approvald.bot.config import load_settings

    monkeypatch.setenv("APPROVALD_SECRETS_DIR", str(tmp_path))
    (tmp_path / "APPROVALD_DATA_KEY").write_text("old-data-key-0123456789\n")
    sealer = load_settings().sealer()
    assert sealer.current is not None and sealer.current.id == OLD.id
    sealed_new = Sealer([NEW]).seal(ARGS, "runs.task")
    (tmp_path / "APPROVALD_DATA_KEY").write_text("new-data-key-0123456789")
    (tmp_path / "APPROVALD_DATA_OLD_KEYS").write_text("old-data-key-0123456789")
    assert sealer.open(sealed_new, "runs.task") == ARGS  # it read the directory again
    assert [k.id for k in sealer.keys] == [NEW.id, OLD.id]
    # the environment wins over a file, and is what the process started with
    monkeypatch.setenv("APPROVALD_DATA_KEY", "env-data-key-0123456789")
    assert load_settings().data_keys()[0].id == DataKey("env-data-key-0123456789").id


def test_a_secrets_directory_that_is_not_one_is_refused(monkeypatch: pytest.MonkeyPatch,
                                                        tmp_path: Any) -> None:
    from approvald.bot.config import load_settings

    monkeypatch.setenv("APPROVALD_SECRETS_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(ConfigError, match=r"^APPROVALD_SECRETS_DIR: .*nowhere is not a "
                                          r"directory$"):
        load_settings()
    (tmp_path / "APPROVALD_DATA_KEY").write_text("  \n")
    monkeypatch.setenv("APPROVALD_SECRETS_DIR", str(tmp_path))
    with pytest.raises(ConfigError, match=r"^APPROVALD_DATA_KEY: is empty"):
        load_settings()


def test_settings_made_in_code_have_nowhere_to_read_keys_again() -> None:
    from approvald.bot.config import Settings

    assert Settings(APPROVALD_DATA_KEY="old-data-key-0123456789").sealer().reread is None


def test_a_value_in_clear_is_read_and_written_without_the_sealers_helpers() -> None:
    """Every sealed column of every row read goes through the codec (issue 50): a value
    in clear is given back by the column's own processor, with no call of the sealer
    (its opening starts with the sealed prefix the sealer names), and a seal without a
    key asks no helper; sealed values still open, and refuse, as before."""
    import sys
    from collections import Counter

    from approvald.store.types import SealedText
    from sqlalchemy.dialects import sqlite

    def calls(fn: Any) -> tuple[Any, Counter[str]]:
        seen: Counter[str] = Counter()

        def profile(frame: Any, event: str, arg: Any) -> None:
            if event == "call" and frame.f_globals.get("__name__", "").endswith(".sealing"):
                seen[frame.f_code.co_name] += 1

        sys.setprofile(profile)
        try:
            return fn(), seen
        finally:
            sys.setprofile(None)

    column = SealedText("approvals.args")
    result = column.planned_result(sqlite.dialect(), None)
    bind = column.planned_bind(sqlite.dialect())
    assert result is not None and bind is not None
    try:
        for sealer in (Sealer(), Sealer([OLD])):
            types.set_codec(sealer)
            got, seen = calls(lambda: result(DECLARED_ONLY))
            assert got == DECLARED_ONLY and seen == Counter(), seen
            sealed = Sealer([OLD]).seal(ARGS, "approvals.args")
            if sealer.keys:
                assert result(sealed) == ARGS
            else:
                with pytest.raises(DataKeyError):
                    result(sealed)
        types.set_codec(Sealer())
        got, seen = calls(lambda: bind(DECLARED_ONLY))
        assert got == DECLARED_ONLY and seen == Counter({"seal": 1}), seen
        with pytest.raises(ConfigError, match="shaped like a sealed one"):
            bind(Sealer([OLD]).seal(ARGS, "approvals.args"))
        types.set_codec(Sealer([NEW]))
        assert Sealer([NEW]).open(bind(ARGS), "approvals.args") == ARGS
    finally:
        types.set_codec(None)
