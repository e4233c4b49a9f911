"""The audit chain records the masked form and the digest (issue 34).

The card agent of ``test_sensitive_args`` runs approved, edited and denied under a data
key: the audit log's rows, as the database holds them, hold no digit run of the card nor
the declared authorisation code, and are not sealed, so ``audit verify`` and ``audit
export`` (masked) need no data key. ``audit export --reveal`` needs it (without it: one
line, nothing audited); with it, each request's arguments are shown as its sealed request
holds them, and the reveal is audited. Entries written sealed before the chain was masked
still verify and export with the key, and ``keys reseal`` moves them to the new key
without touching the masked ones.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from approvald.runtime.record import sealing
from approvald.store.db import Database
from sqlalchemy import text

from tests.helpers import Rows, make_cli, parts
from tests.integration.slack_harness import harness, wait_for
from tests.integration.test_sealed_at_rest import KEY_1, KEY_2, sealed_under
from tests.integration.test_sensitive_args import (
    AUTH,
    CARD,
    card_agent,
    ended,
    leaks,
    walk,
)


async def audit_rows(db_url: str) -> list[tuple[int, str]]:
    """(seq, details) of every audit entry as the database holds it."""
    db = Database(db_url)
    try:
        rows = await Rows(db).select("SELECT seq, details FROM audit_log ORDER BY seq")
        return [(int(r[0]), str(r[1])) for r in rows]
    finally:
        await db.close()


def _lines(out: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in out.splitlines()]


async def test_the_audit_log_holds_no_secret_and_verifies_without_the_data_key(
        db_url: str, tmp_path: Path) -> None:
    received: list[dict[str, Any]] = []
    async with harness(db_url, tmp_path, APPROVALD_DATA_KEY=KEY_1) as h:
        parts(h.engine).registry.add(card_agent(received))
        runs = await walk(h, (("A-1", "standing"), ("A-2", "edit"), ("A-3", "deny")))
        # the standing approval, its scope recorded masked, covers the same call again
        again = await h.engine.run("card-refund", "Refund A-1 please", requested_by="U_DANA")
        await wait_for(lambda: ended(h, again.run_id), what="the covered run to end")
        assert (await h.run(again.run_id)).status == "completed"
    assert len(received) == 3

    rows = await audit_rows(db_url)
    actions = {json.loads(d).get("tool") for _, d in rows}
    assert "refund_card" in actions  # the details are JSON in clear: not sealed
    assert not sealed_under("\n".join(d for _, d in rows))
    assert not leaks([d for _, d in rows]), leaks([d for _, d in rows])
    assert not any(AUTH in d for _, d in rows)
    # what was masked is named, with the digest of its real value
    requested = [json.loads(d) for _, d in rows if '"requested"' in d or '"kind"' in d]
    assert any(set(r.get("masked", {})) >= {"args"} for r in requested)

    cli = make_cli(db_url, tmp_path, in_process=True)
    verified = await cli.acall("audit", "verify")  # no data key
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "chain intact" in verified.stdout
    assert "1 calls that standing approvals let run were each covered" in verified.stdout
    exported = await cli.aok("audit", "export")
    assert "•••• 4242" in exported and not leaks(exported), leaks(exported)

    # revealing needs the key: without it one line, and nothing audited
    refused = await cli.acall("audit", "export", "--reveal")
    assert refused.returncode != 0 and refused.stderr.count("\n") == 1, refused.stderr
    assert "APPROVALD_DATA_KEY" in refused.stderr
    assert not any(e["action"] == "revealed" for e in _lines(await cli.aok("audit", "export")))

    done = await cli.acall("audit", "export", "--reveal", APPROVALD_DATA_KEY=KEY_1)
    assert done.returncode == 0, done.stderr
    shown = _lines(done.stdout)
    real = {"card_number": CARD, "auth": {"code": AUTH}}
    by_run = {how: [e for e in shown if e["run_id"] == rid] for how, rid in runs.items()}
    for how, amount in (("standing", 4200), ("edit", 2000), ("deny", 4200)):
        [asked] = [e for e in by_run[how] if e["action"] == "requested"]
        assert asked["args"] == {"order_id": asked["args"]["order_id"],
                                 "amount_cents": 4200, **real}
        decided = {"standing": "approved", "edit": "approved", "deny": "denied"}[how]
        [verdict] = [e for e in by_run[how] if e["action"] == decided]
        assert verdict["args"]["amount_cents"] == amount
        assert verdict["args"]["card_number"] == CARD
    [edit] = [e for e in by_run["edit"] if e["action"] == "edited"]
    assert edit["args"]["card_number"] == CARD and edit["args"]["amount_cents"] == 2000
    assert edit["details"]["original_args"]["card_number"] == CARD
    # a result is not a request's arguments: it stays masked
    [ran] = [e for e in by_run["standing"] if e["action"] == "executed"]
    assert ran["args"]["card_number"] == CARD and CARD not in json.dumps(ran["details"]["result"])
    [entry] = [e for e in _lines(await cli.aok("audit", "export")) if e["action"] == "revealed"]
    assert entry["actor"].startswith("cli:") and entry["details"]["what"] == "audit export"
    assert (await cli.acall("audit", "verify")).returncode == 0


async def test_entries_sealed_before_the_masking_verify_and_reseal_with_the_key(
        db_url: str, tmp_path: Path) -> None:
    received: list[dict[str, Any]] = []
    async with harness(db_url, tmp_path, APPROVALD_DATA_KEY=KEY_1) as h:
        parts(h.engine).registry.add(card_agent(received))
        await walk(h, (("A-1", "approve"),))
    # the first entries as an older approvald wrote them: their details sealed whole
    # (the MAC covers the text inside, so the chain still holds)
    old = sealing.Sealer([sealing.DataKey(KEY_1)])
    rows = await audit_rows(db_url)
    legacy = rows[:3]
    db = Database(db_url)
    try:
        async def sealed_whole(tx):  # type: ignore[no-untyped-def]
            for seq, details in legacy:
                await tx.conn.execute(text("UPDATE audit_log SET details = :d WHERE seq = :s"),
                                      {"d": old.seal(details, "audit_log.details"), "s": seq})

        await Rows(db).in_one_write(sealed_whole)
    finally:
        await db.close()

    cli = make_cli(db_url, tmp_path, in_process=True)
    for args in (("audit", "verify"), ("audit", "export")):
        done = await cli.acall(*args)
        assert done.returncode != 0 and done.stderr.count("\n") == 1, done.stderr
        assert "APPROVALD_DATA_KEY" in done.stderr
        done = await cli.acall(*args, APPROVALD_DATA_KEY=KEY_1)
        assert done.returncode == 0, done.stdout + done.stderr
    assert not leaks((await cli.acall("audit", "export", APPROVALD_DATA_KEY=KEY_1)).stdout)

    # rotation: the sealed entries move to the new key; the masked ones stay in clear
    done = await cli.acall("keys", "reseal", APPROVALD_DATA_KEY=KEY_2,
                           APPROVALD_DATA_OLD_KEYS=KEY_1)
    assert done.returncode == 0, done.stderr
    after = await audit_rows(db_url)
    kid = sealing.DataKey(KEY_2).id
    assert [sealing.key_id(d) for _, d in after[:3]] == [kid] * 3
    assert after[3:len(rows)] == rows[3:]
    assert (await cli.acall("audit", "verify", APPROVALD_DATA_KEY=KEY_2)).returncode == 0
    # the reseal is itself audited: by whom, under which key, how many values where
    done = await cli.acall("audit", "export", APPROVALD_DATA_KEY=KEY_2)
    [entry] = [e for e in _lines(done.stdout) if e["action"] == "resealed"]
    assert entry["actor"].startswith("cli:") and entry["via"] == "cli"
    assert entry["details"]["key"] == kid
    assert entry["details"]["retired"] == [sealing.DataKey(KEY_1).id]
    tables = entry["details"]["tables"]
    assert tables["audit_log"] == 3 and tables["approvals"] >= 1 and tables["runs"] >= 1
    again = await cli.acall("keys", "reseal", "--batch", "2", APPROVALD_DATA_KEY=KEY_2)
    assert again.stdout.startswith("resealed 0 values"), again.stderr
