"""Secrets sealed at rest (issue 34): the refund agent's card number under a data key.

The card agent of ``test_sensitive_args`` runs approved, edited and denied with
``APPROVALD_DATA_KEY`` set: the database (every row as stored; for SQLite, the file and its
write-ahead log as bytes) holds neither the card number, spaced or not, nor the declared
authorisation code, while the tool receives the real number once per approved call. A
process without the key (or with another) refuses with one line naming
``APPROVALD_DATA_KEY`` and changes nothing (``serve`` refuses to start); ``approvald
keys reseal`` seals everything again under a new key, and a run approved under the old
one then completes.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from approvald.bot.wiring import build_engine, open_database
from approvald.runtime.kernel.errors import ConfigError
from approvald.runtime.record import sealing
from approvald.store.db import Database
from approvald.store.models import Base
from sqlalchemy import text

from tests.helpers import Rows, make_cli, parts
from tests.integration.slack_harness import harness, settings_for, wait_for
from tests.integration.test_sensitive_args import AUTH, CARD, card_agent, ended, walk

KEY_1 = "data-key-one-0123456789abcdef"
KEY_2 = "data-key-two-0123456789abcdef"
SECRETS = (CARD.encode(), CARD.replace(" ", "").encode(), AUTH.encode())


async def stored(db_url: str) -> str:
    """Every row of every table as the database holds it (no column type applied)."""
    db = Database(db_url)
    try:
        async def every_row(tx):  # type: ignore[no-untyped-def]
            out = []
            for table in Base.metadata.sorted_tables:
                rows = await tx.conn.execute(text(f'SELECT * FROM "{table.name}"'))
                out += [f"{table.name}: {json.dumps([str(v) for v in row])}" for row in rows]
            return "\n".join(out)

        return str(await Rows(db).in_one_read(every_row))
    finally:
        await db.close()


def files_hold_secrets(db_url: str) -> list[str]:
    """The SQLite files (database, write-ahead log) that hold a secret, as bytes."""
    if not db_url.startswith("sqlite"):
        return []
    path = Path(db_url.split("///", 1)[1])
    found = []
    for f in (path, path.with_name(path.name + "-wal")):
        if f.exists():
            data = f.read_bytes()
            found += [f"{f.name}: {s!r}" for s in SECRETS if s in data]
    return found


def sealed_under(rows: str) -> set[str]:
    return set(re.findall(r'\$sealed\\*":\\*"([0-9a-f]{12}):', rows))


async def test_a_card_number_is_sealed_at_rest_and_a_lost_key_changes_nothing(
        db_url: str, tmp_path: Path) -> None:
    received: list[dict[str, Any]] = []
    async with harness(db_url, tmp_path, APPROVALD_DATA_KEY=KEY_1) as h:
        parts(h.engine).registry.add(card_agent(received))
        await walk(h, (("A-1", "approve"), ("A-2", "edit"), ("A-3", "deny")))
        waiting = await h.pause_refund(agent="card-refund", task="Refund A-5 please")
        [aid] = waiting.approval_ids
        await h.card(aid)
        # read back through the store: the real arguments, as approved and run
        edited = await h.approval((await h.engine.run_approvals(
            (await h.engine.recent_runs(limit=10))[-2].id))[0].id)
        assert edited.effective_args()["card_number"] == CARD

    real = {"card_number": CARD, "auth": {"code": AUTH}}
    assert received == [{"order_id": "A-1", "amount_cents": 4200, **real},
                        {"order_id": "A-2", "amount_cents": 2000, **real}]
    rows = await stored(db_url)
    leaked = [r for r in rows.splitlines() if any(s.decode() in r for s in SECRETS)]
    assert not leaked, leaked
    assert sealed_under(rows) == {sealing.DataKey(KEY_1).id}
    assert not files_hold_secrets(db_url), files_hold_secrets(db_url)

    # a lost key (or the wrong one): one line naming the variable, and nothing changed
    cli = make_cli(db_url, tmp_path, in_process=True)
    for env in ({}, {"APPROVALD_DATA_KEY": KEY_2}):
        for args in (("approvals", "approve", aid, "--as", "U_ALICE", "--no-resume"),
                     ("approvals", "show", aid)):
            done = await cli.acall(*args, **env)
            assert done.returncode != 0
            assert done.stderr.count("\n") == 1 and "APPROVALD_DATA_KEY" in done.stderr, \
                done.stderr
        assert await stored(db_url) == rows
    # the audit chain records its details masked, in clear: verified and exported
    # without the key (see test_audit_masked)
    for args in (("audit", "verify"), ("audit", "export")):
        done = await cli.acall(*args)
        assert done.returncode == 0, done.stderr
    exported = (await cli.acall("audit", "export")).stdout
    assert "•••• 4242" in exported and CARD not in exported
    rows = await stored(db_url)  # (and nothing else changed)
    # `serve` without the key refuses to start, before it writes anything
    with pytest.raises(ConfigError, match="APPROVALD_DATA_KEY: waiting requests and runs"):
        async with harness(db_url, tmp_path):
            pass
    assert await stored(db_url) == rows
    done = await cli.acall("approvals", "approve", aid, "--as", "U_ALICE", "--no-resume",
                           APPROVALD_DATA_KEY=KEY_1)
    assert done.returncode == 0, done.stderr
    rows = await stored(db_url)
    # the approved run cannot be resumed without the key: refused, and left as it was
    settings = settings_for("http://127.0.0.1:9", db_url, tmp_path / "ledger.jsonl")
    db = await open_database(settings, quiet=True)
    try:
        engine = build_engine(settings, db)
        parts(engine).registry.add(card_agent(received))
        with pytest.raises(ConfigError, match="APPROVALD_DATA_KEY"):
            await engine.advance(waiting.run_id)
    finally:
        await db.close()
    assert await stored(db_url) == rows and len(received) == 2

    # rotation: everything sealed again under the new key, the old one retired
    done = await cli.acall("keys", "reseal", APPROVALD_DATA_KEY=KEY_2,
                           APPROVALD_DATA_OLD_KEYS=KEY_1)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert out.startswith("resealed ") and sealing.DataKey(KEY_2).id in out
    rows = await stored(db_url)
    assert sealed_under(rows) == {sealing.DataKey(KEY_2).id}
    assert not any(s.decode() in rows for s in SECRETS)
    again = await cli.acall("keys", "reseal", APPROVALD_DATA_KEY=KEY_2)
    assert again.stdout.startswith("resealed 0 values"), again.stderr

    # the run paused under the old key completes under the new one alone
    async with harness(db_url, tmp_path, APPROVALD_DATA_KEY=KEY_2) as h:
        parts(h.engine).registry.add(card_agent(received))
        await wait_for(lambda: ended(h, waiting.run_id), what="the old run to end")
        assert (await h.run(waiting.run_id)).status == "completed"
    assert received[-1] == {"order_id": "A-5", "amount_cents": 4200, **real}
    assert len(received) == 3
    rows = await stored(db_url)
    assert not any(s.decode() in rows for s in SECRETS)
    assert not files_hold_secrets(db_url), files_hold_secrets(db_url)


async def test_a_paused_adapters_calls_and_task_are_sealed_beside_its_state(
        make_engine: Any, db_url: str) -> None:
    """Issue 46 item 4: ``adapter_pauses.requests`` held every paused call's exact
    arguments and the task in clear, beside a sealed ``state``."""
    from approvald.runtime.adapters.gate import Call, calls_of, task_of
    from approvald.store import types

    types.set_codec(sealing.Sealer([sealing.DataKey(KEY_1)]))
    engine = make_engine()
    gate = engine.approval_gate(name="support")
    call = Call("call-1", "refund_card", {"card_number": CARD, "auth": {"code": AUTH}})
    rec = await gate.pause("test", "k-1", requested_by="U_DANA", state={"step": 1},
                           calls=[call], task=f"Refund A-1 to {CARD} ({AUTH})")
    # read back through the store: the real calls, to resume with
    assert calls_of(await gate.pause_record(rec.id)) == [call]
    assert task_of(rec) == f"Refund A-1 to {CARD} ({AUTH})"
    rows = await stored(db_url)
    leaked = [r for r in rows.splitlines() if any(s.decode() in r for s in SECRETS)]
    assert not leaked, leaked
    assert not files_hold_secrets(db_url), files_hold_secrets(db_url)
