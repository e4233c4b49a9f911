"""``pytest -m postgres`` selects the tests that reach PostgreSQL (and ``-m sqlite`` the SQLite
ones), however they ask for their database.

The suite is collected in this process (``pytest.main`` with ``--collect-only``, as
``pytest -m ... --collect-only`` would, without xdist): no interpreter to start, and the
test modules this process has imported already are not imported again."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


class Selected:
    """A plugin that keeps the node ids of the items left after ``-m``'s deselection."""

    def __init__(self) -> None:
        self.ids: list[str] = []

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.ids = [item.nodeid for item in session.items]


def collected(marker: str) -> list[str]:
    selected = Selected()
    code = pytest.main(
        ["--collect-only", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "-n", "0",
         "--rootdir", str(ROOT), "-c", str(ROOT / "pyproject.toml"), "-m", marker,
         str(ROOT / "tests")], plugins=[selected])
    assert code == pytest.ExitCode.OK, code
    return selected.ids  # relative to the root: tests/unit/test_gate.py::...


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


def test_a_test_not_marked_slow_cannot_start_a_process() -> None:
    """The inner loop (``-m "not slow"``) stays in this process: conftest refuses a process
    to a test without the mark, naming the test and the command."""
    with pytest.raises(AssertionError, match=r"test_markers\.py::test_a_test_not_marked_slow"
                       r".* starts a process \(\['true'\]\) but is not marked slow"):
        subprocess.run(["true"], check=True)


@pytest.mark.slow
def test_a_slow_test_may_start_one() -> None:
    assert subprocess.run(["true"], check=False).returncode == 0


class SlowFlags:
    """A plugin that keeps, in collection order, whether each item is marked slow."""

    def __init__(self) -> None:
        self.flags: list[bool] = []

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.flags = [item.get_closest_marker("slow") is not None for item in session.items]


def test_the_slow_tests_are_collected_first() -> None:
    order = SlowFlags()
    code = pytest.main(
        ["--collect-only", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "-n", "0",
         "--rootdir", str(ROOT), "-c", str(ROOT / "pyproject.toml"),
         str(ROOT / "tests" / "acceptance")], plugins=[order])
    assert code == pytest.ExitCode.OK, code
    assert True in order.flags and False in order.flags
    assert order.flags == sorted(order.flags, reverse=True)  # every slow one before the rest
