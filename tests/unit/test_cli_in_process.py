"""``approvald`` run in this process, as the acceptance tests run it: ``main`` returns the
exit code (never raises SystemExit, ``--help`` included) and the runner hands back (exit
code, stdout, stderr) with the environment, the working directory and the logging
configuration exactly as they were before."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from pathlib import Path

import pytest
from approvald.bot.cli import main
from approvald.store.db import Database

from tests.helpers import Rows, make_cli


def test_help_and_usage_errors_return_codes(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["--help"]) == 0
    assert "approvals" in capsys.readouterr().out
    assert main(["frobnicate"]) == 2
    assert "invalid choice: 'frobnicate'" in capsys.readouterr().err


def test_the_runner_scopes_what_a_command_changes(sqlite_url: str, tmp_path: Path) -> None:
    before_env, before_cwd = dict(os.environ), os.getcwd()
    root = logging.getLogger()
    before_log = root.level, list(root.handlers)
    cli = make_cli(sqlite_url, tmp_path, in_process=True)
    done = cli("runs", "list", APPROVALD_SOMETHING_ELSE="x")
    assert (done.returncode, done.stdout, done.stderr) == (0, "no runs\n", "")
    bad = cli("runs", "show", "nope-nope")
    assert bad.returncode == 2 and bad.stderr.startswith("approvald: no run nope-nope")
    assert dict(os.environ) == before_env and os.getcwd() == before_cwd
    assert (root.level, list(root.handlers)) == before_log


@pytest.mark.parametrize("db_url", ["sqlite", "postgres"], indirect=True)
@pytest.mark.parametrize("in_process", [
    pytest.param(True, id="in-process"),
    pytest.param(False, id="subprocess", marks=pytest.mark.slow)])
async def test_a_command_waiting_on_a_lock_held_on_this_loop_lets_the_loop_run(
        db_url: str, db: Database, tmp_path: Path, in_process: bool) -> None:
    """A task of this loop (a ``serve`` mid-transaction) holds the audit head; a command
    that appends to the audit log waits for it. ``await cli.acall`` lets the loop run on,
    the task lets go and the command completes; ``cli(...)`` would stand the loop still
    with the lock held (on PostgreSQL for ever), so it refuses to run on a running loop."""
    cli = make_cli(db_url, tmp_path, in_process=in_process)
    cli.env_extra["APPROVALD_SECRET"] = "approvald-test-secret-0123456789"
    with pytest.raises(AssertionError, match=r"await cli\.acall"):
        cli("tokens", "create", "refused", "--tools", "deploy")
    locked, released = asyncio.Event(), asyncio.Event()

    async def holder() -> None:
        async with Rows(db).audit_head_locked():
            locked.set()
            await asyncio.sleep(0.5)  # the loop runs on meanwhile, or this never lets go
        released.set()

    holding = asyncio.create_task(holder())
    await locked.wait()
    done = await asyncio.wait_for(
        cli.acall("tokens", "create", "ci", "--tools", "deploy"), timeout=60)
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert released.is_set()  # it waited for the lock, and got it once let go
    await holding
    assert (await Rows(db).audit_head())[0] >= 1  # what it appended, after the lock


async def test_what_the_loop_prints_while_a_command_runs_is_not_the_commands_output(
        sqlite_url: str, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """The command's stdout and stderr are its own: a task of the calling loop printing
    (and logging a warning) while the command runs writes where it always does."""
    cli = make_cli(sqlite_url, tmp_path, in_process=True)
    stop = asyncio.Event()

    async def chatter() -> None:
        while not stop.is_set():
            print("loop says hi")
            print("loop warns", file=sys.stderr)
            logging.getLogger("approvald.test").warning("loop logs")
            await asyncio.sleep(0.001)

    talking = asyncio.create_task(chatter())
    try:
        for _ in range(3):
            done = await cli.acall("runs", "list")
            assert (done.returncode, done.stdout, done.stderr) == (0, "no runs\n", "")
    finally:
        stop.set()
        await talking
    seen = capsys.readouterr()
    assert "loop says hi" in seen.out and "loop warns" in seen.err
