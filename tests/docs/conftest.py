"""The docs tests' summary: which examples of the docs ran, and which the pages say not to
run (and why), printed at the end of the session."""

from __future__ import annotations

from typing import Any

from tests.docs.examples import LOG


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if LOG:
        terminalreporter.section("docs examples")
        for line in LOG:
            terminalreporter.write_line(line)
