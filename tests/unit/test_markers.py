"""``pytest -m postgres`` selects the tests that reach PostgreSQL (and ``-m sqlite`` the SQLite
ones), however they ask for their database."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def collected(marker: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         "-m", marker, "tests"], cwd=ROOT, text=True, capture_output=True, timeout=300,
        check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return [line for line in done.stdout.splitlines() if "::" in line]


def test_pytest_m_postgres_selects_the_postgresql_tests() -> None:
    tests = collected("postgres")
    assert tests and all("[sqlite" not in t for t in tests)
    # the db_url fixture's postgres param, a test that picks it (indirect), one that asks
    # for pg_url itself, and one marked by hand
    for expected in ("tests/unit/test_gate.py::", "[postgres]",
                     "tests/integration/test_db_reconnect.py::",
                     "tests/integration/test_migrations.py::test_empty_database_upgrades",
                     "tests/acceptance/test_dead_ends.py::test_a_missing_postgresql_database"):
        assert any(expected in t for t in tests), expected
    sqlite = collected("sqlite")
    assert sqlite and all("[postgres" not in t for t in sqlite)
    assert not set(tests) & set(sqlite)
