"""CI runs the suite the way the README says, and both record the slowest tests (issue 47):
the options live in one place, pyproject.toml's ``addopts``."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_ci_and_the_readme_run_the_same_command_that_lists_the_slowest_tests() -> None:
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]
    addopts = options["ini_options"]["addopts"].split()
    assert any(re.fullmatch(r"--durations=[1-9][0-9]*", o) for o in addopts), addopts
    # the README's test command is a bare `pytest`, and so is CI's first (whole-suite) run
    readme = (ROOT / "README.md").read_text()
    assert "pip install -e '.[dev]' && pytest\n" in readme
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert "pytest" in ci
    assert "--durations" in readme and "--durations" not in " ".join(ci)
