"""A data-key rotation beside a running ``approvald serve`` (real subprocesses).

Done out of order (the values resealed under a key serve does not hold yet), serve says
so in one line, however often it meets the value (no traceback each poll), leaves the
run as it was, and resumes it once it has the key: after one restart when the keys come
from the environment. With the keys in ``APPROVALD_SECRETS_DIR`` it needs no restart at
all: SIGHUP re-reads them, and so does meeting a value sealed under a key it lacks.
"""

from __future__ import annotations

import re
import signal
from pathlib import Path

import aiohttp
import pytest
from approvald.runtime.record.sealing import DataKey
from approvald.store.db import Database

from tests.acceptance.test_serve_lifecycle import Serve
from tests.helpers import Cli, Rows, make_cli
from tests.integration.slack_harness import wait_for

pytestmark = pytest.mark.slow

KEY_1 = "first-data-key-0123456789abcdef"
KEY_2 = "second-data-key-0123456789abcdef"
KEY_3 = "third-data-key-0123456789abcdef!"
ID_1, ID_2, ID_3 = (DataKey(k).id for k in (KEY_1, KEY_2, KEY_3))
METRIC = re.compile(r"^approvald_data_key_refusals_total (\S+)$", re.M)


async def ok(cli: Cli, *args: str, **env: str) -> str:
    done = await cli.acall(*args, **env)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done.stdout


async def pause_refund(cli: Cli, order: str) -> tuple[str, str]:
    run_id = (await ok(cli, "run", "demo-refund", "--task", f"Refund order {order}",
                       "--requested-by", "U_DANA")).strip()
    listed = await cli.ajson("approvals", "list", "--json")
    [approval] = [a for a in listed if a["run_id"] == run_id]
    return run_id, approval["id"]


async def stored(cli: Cli, query: str, **params: str) -> list[tuple[object, ...]]:
    """Rows as stored (raw SQL: nothing is opened, this process needs no key)."""
    db = Database(cli.db_url)
    try:
        return await Rows(db).select(query, **params)
    finally:
        await db.close()


async def run_status(cli: Cli, run_id: str) -> str:
    [(status,)] = await stored(cli, "SELECT status FROM runs WHERE id = :r", r=run_id)
    return str(status)


async def key_ids_stored(cli: Cli) -> set[str]:
    """The data keys the runs' tasks are sealed under, as stored."""
    return {str(task).split('"$sealed":"', 1)[1][:12]
            for (task,) in await stored(cli, "SELECT task FROM runs")
            if '"$sealed"' in str(task)}


async def refusals(serve: Serve) -> float:
    """What serve's /metrics counts of values it could not open."""
    [port] = re.findall(r"metrics: http://127\.0\.0\.1:(\d+)/metrics", serve.text)
    async with aiohttp.ClientSession() as s, \
            s.get(f"http://127.0.0.1:{port}/metrics") as r:
        found = METRIC.search(await r.text())
    return float(found.group(1)) if found else 0.0


def started(serve: Serve) -> bool:
    if serve.proc.returncode is not None:
        raise AssertionError(f"serve exited with {serve.proc.returncode}:\n{serve.text}")
    return "approvald: serving on" in serve.text


async def test_a_rotation_out_of_order_is_one_line_until_serve_has_the_key(
        db_url: str, tmp_path: Path) -> None:
    cli = make_cli(db_url, tmp_path, in_process=True)  # serve: a process of its own
    cli.env_extra["APPROVALD_DATA_KEY"] = KEY_1
    run_id, approval = await pause_refund(cli, "A-1001")
    serve = await Serve.spawn(cli, APPROVALD_LOG_LEVEL="INFO")
    try:
        await wait_for(lambda: started(serve), within=60, what="serve to start")
        # what the docs used to say: reseal under the new key, tell serve nothing
        await ok(cli, "keys", "reseal", APPROVALD_DATA_KEY=KEY_2, APPROVALD_DATA_OLD_KEYS=KEY_1)
        await ok(cli, "approvals", "approve", approval, "--as", "U_ALICE", "--no-resume",
                 APPROVALD_DATA_KEY=KEY_2)
        # serve meets the run sealed under a key it lacks at each poll (every 0.1 s)...
        await wait_for(lambda: _at_least(serve, 20), within=60,
                       what="serve to meet the resealed run twenty times")
        # ...and says so once, in one line naming the variable and the key it needs
        told = [x for x in serve.lines if ID_2 in x]
        assert len(told) == 1, serve.text
        assert "APPROVALD_DATA_KEY" in told[0] and "Traceback" not in serve.text, serve.text
        assert await run_status(cli, run_id) == "running"  # as it was: not failed
        assert [e for e in cli.ledger_lines() if e["tool"] == "issue_refund"] == []
        serve.proc.send_signal(signal.SIGTERM)
        assert await serve.wait(30) == 0
        # one restart with the new key (the old one retired), and the run goes on
        cli.env_extra.update(APPROVALD_DATA_KEY=KEY_2, APPROVALD_DATA_OLD_KEYS=KEY_1)
        serve = await Serve.spawn(cli, APPROVALD_LOG_LEVEL="INFO")
        await wait_for(lambda: _status_is(cli, run_id, "completed"), within=60,
                       what="the run to complete once serve has the key")
        assert len([e for e in cli.ledger_lines() if e["tool"] == "issue_refund"]) == 1
    finally:
        await serve.kill()


async def _at_least(serve: Serve, n: int) -> bool:
    """Serve counted ``n`` values it could not open, or told of the key twice already."""
    started(serve)
    if len([x for x in serve.lines if ID_2 in x]) > 1:
        return True
    return "metrics: " in serve.text and await refusals(serve) >= n


async def _status_is(cli: Cli, run_id: str, status: str) -> bool:
    return await run_status(cli, run_id) == status


async def test_serve_picks_up_a_rotation_from_its_secrets_directory(
        db_url: str, tmp_path: Path) -> None:
    """The documented order, keys in files: new key current and the old one retired,
    SIGHUP, reseal, drop the old key, SIGHUP. Then a second rotation with no signal at
    all: serve re-reads the files when it meets a value sealed under a key it lacks."""
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "APPROVALD_DATA_KEY").write_text(KEY_1 + "\n")
    cli = make_cli(db_url, tmp_path, in_process=True)  # serve: a process of its own
    cli.env_extra["APPROVALD_SECRETS_DIR"] = str(secrets)
    first, approval_1 = await pause_refund(cli, "A-1001")
    second, approval_2 = await pause_refund(cli, "B-2002")
    serve = await Serve.spawn(cli, APPROVALD_LOG_LEVEL="INFO")
    try:
        await wait_for(lambda: started(serve), within=60, what="serve to start")
        # 1. the new key current, the old one retired; 2. tell serve
        (secrets / "APPROVALD_DATA_KEY").write_text(KEY_2 + "\n")
        (secrets / "APPROVALD_DATA_OLD_KEYS").write_text(KEY_1 + "\n")
        serve.proc.send_signal(signal.SIGHUP)
        await wait_for(lambda: any(f"data key {ID_2} seals" in x and ID_1 in x
                                   for x in serve.lines), within=30,
                       what="serve to say it re-read the keys")
        # 3. reseal; a decision now is carried out by serve under the new key
        await ok(cli, "keys", "reseal")
        assert await key_ids_stored(cli) == {ID_2}
        await ok(cli, "approvals", "approve", approval_1, "--as", "U_ALICE", "--no-resume")
        await wait_for(lambda: _status_is(cli, first, "completed"), within=60,
                       what="the first run to complete")
        # 4. the old key dropped, serve told
        (secrets / "APPROVALD_DATA_OLD_KEYS").unlink()
        serve.proc.send_signal(signal.SIGHUP)
        await wait_for(lambda: any(f"data key {ID_2} seals, none retired" in x
                                   for x in serve.lines), within=30,
                       what="serve to drop the old key")
        assert await key_ids_stored(cli) == {ID_2}
        # a second rotation, and serve is told nothing: it re-reads the directory when it
        # meets the second run sealed under the third key
        (secrets / "APPROVALD_DATA_KEY").write_text(KEY_3 + "\n")
        (secrets / "APPROVALD_DATA_OLD_KEYS").write_text(KEY_2 + "\n")
        await ok(cli, "keys", "reseal")
        assert await key_ids_stored(cli) == {ID_3}
        await ok(cli, "approvals", "approve", approval_2, "--as", "U_ALICE", "--no-resume")
        await wait_for(lambda: _status_is(cli, second, "completed"), within=60,
                       what="the second run to complete without a signal")
        assert len([e for e in cli.ledger_lines() if e["tool"] == "issue_refund"]) == 2
        assert any(f"data keys re-read for a value sealed under data key {ID_3}" in x
                   for x in serve.lines), serve.text
        assert "Traceback" not in serve.text, serve.text
        serve.proc.send_signal(signal.SIGTERM)
        assert await serve.wait(30) == 0
    finally:
        await serve.kill()


async def test_an_empty_key_stops_serve_in_one_line(sqlite_url: str, tmp_path: Path) -> None:
    cli = make_cli(sqlite_url, tmp_path)
    for variable in ("APPROVALD_DATA_KEY", "APPROVALD_AUDIT_KEY"):
        for value in ("", "   ", " " * 20):
            done = await cli.acall("serve", **{variable: value})
            assert done.returncode == 2, (variable, value, done.stderr)
            assert done.stderr == f"approvald: {variable}: is empty: set a key of at least " \
                                  "16 bytes, or unset the variable\n", done.stderr
