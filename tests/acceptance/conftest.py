"""What the acceptance tests share: ``cli``, the ``approvald`` command on the test's SQLite
database, run in this process (``cli.spawn`` and calls with a failpoint, whose process must
outlive the call or die, still run subprocesses), and waiting for what another process does
in its own time."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from tests.helpers import Cli, make_cli

T = TypeVar("T")


@pytest.fixture
def cli(sqlite_url: str, tmp_path: Path) -> Cli:
    """``approvald`` on a migrated SQLite database, its clock file at ``START``."""
    return make_cli(sqlite_url, tmp_path, in_process=True)


def wait_until(check: Callable[[], T | None], *, within: float, what: str) -> T:
    """Poll ``check`` until it returns something truthy; fail naming ``what`` after
    ``within`` seconds. (Waiting for a condition, not sleeping as an assertion.)"""
    deadline = time.monotonic() + within
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within:g} s waiting for {what}")
        time.sleep(0.05)
