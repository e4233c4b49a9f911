"""``approvald`` run in this process, as the acceptance tests run it: ``main`` returns the
exit code (never raises SystemExit, ``--help`` included) and the runner hands back (exit
code, stdout, stderr) with the environment, the working directory and the logging
configuration exactly as they were before."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from approvald.bot.cli import main

from tests.helpers import make_cli


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
