"""``pytest -m postgres`` selects the tests that reach PostgreSQL (and ``-m sqlite`` the SQLite
ones), however they ask for their database.

The suite is collected in this process (``pytest.main`` with ``--collect-only``, as
``pytest -m ... --collect-only`` would, without xdist), once for this module's tests (a
collection of the whole suite costs a worker 5-10 s): no interpreter to start, and the
test modules this process has imported already are not imported again."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


# the collection both tests below read: one xdist worker runs them, so it is made once
pytestmark = pytest.mark.xdist_group("markers")


class Selected:
    """A plugin that keeps what ``-m`` made of the suite: the node ids of the items it left,
    and the names of the marks each item carried when it judged them (``pytest_deselected``
    is called with the items it leaves out as it leaves them out); and, in collection
    order, the node id of every item and whether it is marked slow, as the suite's
    conftest sorted them, before ``-m`` left any out (its hook is called before this
    plugin's, this one's before pytest's own, which deselects: later registered, earlier
    called)."""

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.marks: dict[str, set[str]] = {}
        self.order: list[tuple[str, bool]] = []
        self.deselected = 0

    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        self.order = [(item.nodeid, item.get_closest_marker("slow") is not None)
                      for item in items]

    def pytest_deselected(self, items: list[pytest.Item]) -> None:
        self.deselected += len(items)
        self.marks.update((item.nodeid, {m.name for m in item.iter_markers()})
                          for item in items)

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.ids = [item.nodeid for item in session.items]
        self.marks.update((item.nodeid, {m.name for m in item.iter_markers()})
                          for item in session.items)

    def marked(self, name: str) -> list[str]:
        """The items ``-m NAME`` selects: those that carry the mark ``name``."""
        return [node for node, marks in self.marks.items() if name in marks]


def collected(marker: str) -> Selected:
    selected = Selected()
    # (pytest's unraisableexception plugin collects the garbage of this process, a worker's
    # whole heap, three times as the collection ends: 0.4-0.9 s, for nothing collecting does)
    code = pytest.main(
        ["--collect-only", "-q", "-p", "no:cacheprovider", "-p", "no:unraisableexception",
         "-o", "addopts=", "-n", "0",
         "--rootdir", str(ROOT), "-c", str(ROOT / "pyproject.toml"), "-m", marker,
         str(ROOT / "tests")], plugins=[selected])
    assert code == pytest.ExitCode.OK, code
    # its order was read before ``-m`` left any out: every item of the suite is in it
    assert len(selected.order) == len(selected.ids) + selected.deselected > len(selected.ids)
    return selected  # node ids relative to the root: tests/unit/test_gate.py::...


@pytest.fixture(scope="module")
def postgres_run() -> Selected:
    """The suite collected with ``-m postgres`` (the two tests below read it)."""
    return collected("postgres")


def test_pytest_m_postgres_selects_the_postgresql_tests(postgres_run: Selected) -> None:
    """One collection of the suite (about 3 s of CPU, once): what ``-m postgres`` selects,
    and what ``-m sqlite`` would, read from the marks the items carried as ``-m`` judged
    them."""
    run = postgres_run
    tests = run.ids
    assert tests and all("[sqlite" not in t for t in tests)
    # the db_url fixture's postgres param, a test that picks it (indirect), one that asks
    # for pg_url itself, and one marked by hand
    for expected in ("tests/unit/test_gate.py::", "[postgres]",
                     "tests/integration/test_db_reconnect.py::",
                     "tests/integration/test_migrations.py::test_empty_database_upgrades",
                     "tests/acceptance/test_dead_ends.py::test_a_missing_postgresql_database"):
        assert any(expected in t for t in tests), expected
    assert sorted(tests) == sorted(run.marked("postgres"))  # -m judged by the marks read
    sqlite = run.marked("sqlite")
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


def test_the_slow_tests_are_collected_first(postgres_run: Selected) -> None:
    """In the order the suite's conftest gives the items (the collection above, before
    ``-m`` left any out): every slow test before the rest, in tests/acceptance (where
    both are) and in the whole suite."""
    acceptance = [slow for node, slow in postgres_run.order
                  if node.startswith("tests/acceptance/")]
    for flags in (acceptance, [slow for _, slow in postgres_run.order]):
        assert True in flags and False in flags
        assert flags == sorted(flags, reverse=True)  # every slow one before the rest
