"""Shared fixtures: real databases (a SQLite file per test; PostgreSQL when reachable).

Store and runtime tests take the ``db_url`` fixture, which is parametrized over both
dialects, so the same suite runs against SQLite and PostgreSQL. PostgreSQL tests use a
database created for this session; set APPROVALD_REQUIRE_PG=1 (CI does) to make an
unreachable server a failure instead of a skip.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from approvald.runtime.engine import Engine, EngineConfig, assemble
from approvald.runtime.kernel import failpoints
from approvald.runtime.kernel.clock import ManualClock
from approvald.runtime.kernel.ids import TokenSigner
from approvald.runtime.kernel.urgency import Urgency
from approvald.runtime.policies.directory import Directory
from approvald.runtime.policies.policy import PolicyFile
from approvald.runtime.record.audit import AuditKey
from approvald.runtime.record.tracing import Tracer
from approvald.runtime.runs.agent import Agent, Registry
from approvald.runtime.runs.demo import DemoLedger, refund_agent, steps_agent
from approvald.store import migrate, types
from approvald.store.db import Database
from hypothesis import settings as hypothesis_settings
from slack_sdk.http_retry.handler import default_interval_calculator
from slack_sdk.http_retry.jitter import Jitter

# model-based tests: a few hundred schedules in CI; `--hypothesis-profile=long` for 10,000
hypothesis_settings.register_profile("ci", max_examples=150)
hypothesis_settings.register_profile("long", max_examples=10_000)

PG_ADMIN_URL = os.environ.get("APPROVALD_TEST_PG_URL",
                              "postgresql://postgres@127.0.0.1:5432/test")
# every table the migrations make but alembic's own, emptied before each test that uses the
# session's PostgreSQL database, rows that refer to others first; then every sequence starts
# again (tests/integration/test_pg_reset.py checks that the list names them all, in an order
# that deletes). DELETE, not TRUNCATE: on tables of a few rows TRUNCATE costs ~100 ms (it
# makes new files for fifteen tables and their indexes), DELETE under 1 ms.
TABLES = ("approval_votes", "approvals", "audit_log", "audit_head", "audit_checkpoint",
          "audit_requests", "audit_fold",
          "limits", "outbox", "external_requests", "api_tokens", "standing_approvals",
          "adapter_pauses",
          "run_threads", "run_events", "tool_executions", "runs", "policy_in_force",
          "web_links", "web_sessions", "web_slack_states", "face_switches",
          "web_refusal_counts", "deployment_keys")
RESET = "; ".join([*(f"DELETE FROM {table}" for table in TABLES),
                   "SELECT setval(oid, 1, false) FROM pg_class WHERE relkind = 'S'"])
# under pytest-xdist each worker has a database of its own (gw0, gw1, ...)
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "main")


async def _pg_admin(sql: str) -> None:
    import asyncpg  # type: ignore[import-untyped]

    conn = await asyncpg.connect(PG_ADMIN_URL.replace("+asyncpg", ""), timeout=5)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


async def reset_pg(url: str, kept: Kept | None = None) -> None:
    """Empty a migrated test database and restart its sequences (``RESET``); with ``kept``
    (:func:`keep_pg`), then put back the rows and sequences it holds."""
    import asyncpg

    conn = await asyncpg.connect(url.replace("+asyncpg", ""), timeout=5)
    try:
        await conn.execute(RESET)
        for table, rows in kept.rows if kept is not None else ():
            await conn.execute(f"INSERT INTO {table} SELECT * FROM "
                               f"json_populate_recordset(NULL::{table}, $1::json)", rows)
        for sequence, value in kept.sequences if kept is not None else ():
            await conn.execute("SELECT setval($1::regclass, $2)", sequence, value)
    finally:
        await conn.close()


@dataclass(frozen=True)
class Kept:
    """A test database's rows (each non-empty table's as JSON, the tables in an order that
    inserts them: ``TABLES`` reversed) and the sequences' last values, as :func:`keep_pg`
    read them in one snapshot."""

    rows: tuple[tuple[str, str], ...]
    sequences: tuple[tuple[str, int], ...]


async def keep_pg(url: str) -> Kept:
    """What ``reset_pg(url, kept)`` puts back: every row of every table and where every
    sequence is (a state many tests start from, made once: restoring it is one round trip
    a table, making it again was several transactions of the runtime's)."""
    import asyncpg

    conn = await asyncpg.connect(url.replace("+asyncpg", ""), timeout=5)
    try:
        async with conn.transaction(isolation="repeatable_read", readonly=True):
            rows = [(table, await conn.fetchval(f"SELECT json_agg(t) FROM {table} t"))
                    for table in reversed(TABLES)]
            sequences = await conn.fetch(
                "SELECT format('%I.%I', schemaname, sequencename), last_value "
                "FROM pg_sequences WHERE last_value IS NOT NULL")
    finally:
        await conn.close()
    return Kept(tuple((t, r) for t, r in rows if r is not None),
                tuple((str(n), int(v)) for n, v in sequences))


# -- no silent skips ---------------------------------------------------------------------
# CI (.ci/run) sets APPROVALD_SKIP_ALLOWLIST_ENFORCE=1: then a run that skipped any test for a
# reason not listed here fails, naming the tests. Each entry is the start of a skip reason
# and why CI may skip it. No skip is allowed: CI has PostgreSQL (APPROVALD_REQUIRE_PG=1),
# chromium (APPROVALD_REQUIRE_BROWSER=1), Claude Code (APPROVALD_REQUIRE_CLAUDE_CODE=1), the
# MCP conformance suite (APPROVALD_REQUIRE_CONFORMANCE=1) and every framework of the dev
# extra, so a skip there means a test did not run that should have. (An expected failure
# counts as a skip: "xfail: " and its reason.)
SKIP_ALLOWLIST: dict[str, str] = {}


def _skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    if hasattr(report, "wasxfail"):
        return f"xfail: {report.wasxfail}"
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def unlisted_skips(skipped: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The (node id, reason) pairs whose reason starts with no SKIP_ALLOWLIST entry."""
    return [(node, reason) for node, reason in skipped
            if not any(reason.startswith(allowed) for allowed in SKIP_ALLOWLIST)]


class SkipAudit:
    """Gathers the skips where reports are gathered (the xdist controller, or the only
    process) and fails the session on one outside SKIP_ALLOWLIST."""

    def __init__(self) -> None:
        self.skipped: list[tuple[str, str]] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.skipped:
            self.skipped.append((report.nodeid, _skip_reason(report)))

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.skipped:
            self.skipped.append((report.nodeid, _skip_reason(report)))

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        unlisted = unlisted_skips(self.skipped)
        if not unlisted:
            return
        lines = "\n".join(f"  {node}: {reason}" for node, reason in unlisted)
        session.config.get_terminal_writer().line(
            f"\nAPPROVALD_SKIP_ALLOWLIST_ENFORCE=1: {len(unlisted)} test(s) skipped for a "
            f"reason not in SKIP_ALLOWLIST (tests/conftest.py):\n{lines}", red=True)
        if session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: two workers a core, up to two more than the cores, for the fast tier
    (``-m "not slow"``) and the whole suite alike. A worker spends about half its time
    waiting (PostgreSQL round trips, a served process's answer, an injected clock's poll),
    so on two cores more workers than cores keep them busy; but each worker also pays its
    own start, collection and cold caches (about 5 s of CPU), so more than two a core
    costs more than it gains: on this project's 2-core machine, quiet, the fast tier took
    107-115 s with four workers and 118-119 s with six, one run after the other
    (2026-12-07; 171-186 s of CPU against 201-206 s). Bounded, so a machine with many
    cores does not open a test database per worker beyond what PostgreSQL admits."""
    cores = os.cpu_count() or 1
    return max(1, min(2 * cores, cores + 2))


def pytest_configure(config: pytest.Config) -> None:
    if (os.environ.get("APPROVALD_SKIP_ALLOWLIST_ENFORCE") == "1"
            and not hasattr(config, "workerinput")):  # an xdist worker: its controller judges
        config.pluginmanager.register(SkipAudit(), "approvald-skip-audit")


@pytest.hookimpl(tryfirst=True)  # before xdist's, which starts the workers
def pytest_sessionstart(session: pytest.Session) -> None:
    """The xdist controller compiles what the workers will import, once, before it starts
    them (tests/__init__.py keeps the compiled modules): with nothing compiled yet (a fresh
    clone, a changed module) each worker compiled all of it, about 10 s of CPU a worker;
    with everything compiled this reads the headers, a fraction of a second."""
    config = session.config
    if (hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None)
            or sys.dont_write_bytecode):
        return
    import compileall

    root = Path(__file__).resolve().parents[1]
    tests = root / "tests"
    asked = {tests if tests.is_relative_to(path) else path
             for arg in config.args
             if (path := (config.invocation_params.dir / arg.split("::")[0]).resolve())
             .is_relative_to(root)}  # the tests asked for, under tests/
    rewritten: list[Path] = []
    for where in [root / "bot", root / "runtime", root / "store",
                  *sorted(p for p in asked if p.is_relative_to(tests))]:
        for path in sorted(where.rglob("*.py")) if where.is_dir() else [where]:
            if "node_modules" in path.parts or path.suffix != ".py" or not path.exists():
                continue
            if path.name == "conftest.py" or path.name.startswith("test_"):
                rewritten.append(path)  # pytest's assertion rewriting compiles these
            else:
                compileall.compile_file(str(path), quiet=2)
    if config.getoption("assertmode") == "rewrite":
        _rewrite_once(config, rewritten)


def _rewrite_once(config: pytest.Config, paths: list[Path]) -> None:
    """What pytest's import hook does with a test module, without running it: rewrite its
    asserts and keep the result where the hook looks first. Its helpers are not public:
    changed in a later pytest, the workers do it themselves as before."""
    try:
        from _pytest.assertion import rewrite

        state = config.stash[rewrite.assertstate_key]
        for path in paths:
            pyc = rewrite.get_cache_dir(path) / (path.name[:-3] + rewrite.PYC_TAIL)
            if rewrite._read_pyc(path, pyc) is None and rewrite.try_makedirs(pyc.parent):
                try:
                    source_hash, code = rewrite._rewrite_test(path, config)
                except (SyntaxError, ValueError, OSError):
                    continue  # its worker's collection reports it
                rewrite._write_pyc(state, code, source_hash, pyc)
    except (ImportError, AttributeError, KeyError, TypeError):
        return


# -- the inner loop runs in this process -------------------------------------------------
# `pytest -m "not slow"` answers in two to three minutes because none of its tests starts a
# process: an approvald, a browser or a shell costs a second or more of two shared cores.
# A test that must (a SIGKILL, a server's lifecycle, a closed pipe, a real browser) carries
# the ``slow`` mark; one that starts a process without it fails, saying so.
_SPAWN = subprocess.Popen.__init__
_in_process_only: list[str] = []  # the node id of the running test when it is not slow


def _popen_init(self: subprocess.Popen[Any], *args: Any, **kwargs: Any) -> None:
    if _in_process_only:
        command = args[0] if args else kwargs.get("args")
        raise AssertionError(
            f"{_in_process_only[0]} starts a process ({str(command)[:120]}) but is not marked "
            "slow: mark it @pytest.mark.slow, or run what it tests in this process")
    _SPAWN(self, *args, **kwargs)


subprocess.Popen.__init__ = _popen_init  # type: ignore[method-assign]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    if item.get_closest_marker("slow") is None:
        _in_process_only.append(item.nodeid)
    try:
        return (yield)
    finally:
        _in_process_only.clear()


@pytest.fixture(autouse=True)
def disarm_failpoints() -> Iterator[None]:
    """No failpoint armed by a test outlives it."""
    yield
    failpoints.arm("")


# pytest's own, set to each phase of the running test
_ENV_OWN = frozenset({"PYTEST_CURRENT_TEST"})


@pytest.fixture(autouse=True)
def environ_unchanged() -> Iterator[None]:
    """No test leaves ``os.environ`` changed (``monkeypatch.setenv`` undoes itself before
    this looks): a change is undone here and fails the test, naming the variables."""
    before = {k: v for k, v in os.environ.items() if k not in _ENV_OWN}
    yield
    after = {k: v for k, v in os.environ.items() if k not in _ENV_OWN}
    if after == before:
        return
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    for key in changed:
        if key in before:
            os.environ[key] = before[key]
        else:
            del os.environ[key]
    pytest.fail(f"the test left os.environ changed: {', '.join(changed)} (use monkeypatch)",
                pytrace=False)


@pytest.fixture(scope="session", autouse=True)
def user_data_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """No test (nor any ``approvald`` it starts) touches the real per-user database: the
    default one resolves under a temporary ``XDG_DATA_HOME``."""
    home = tmp_path_factory.mktemp("xdg-data")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_DATA_HOME", str(home))
        yield home


@pytest.fixture(scope="session", autouse=True)
def metrics_on_any_port() -> Iterator[None]:
    """Every ``serve`` a test starts in-process serves /metrics on a port of its own
    choosing, not the default one tests (and other checkouts) would fight over."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("APPROVALD_METRICS_ADDR", "127.0.0.1:0")
        yield


class _NoJitter(Jitter):
    def recalculate(self, duration: float) -> float:
        return duration


@pytest.fixture(scope="session", autouse=True)
def slack_retries_at_once() -> Iterator[None]:
    """A Slack client the product makes (slack_sdk's default retry handlers) retries a
    refused connection at once, not after slack_sdk's 0.5-1.5 s of real backoff: a test
    that takes the emulator down waited that out on every try of a card (10 s of one
    test's 11). The retry itself is still made; the handlers a test builds are its own."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(default_interval_calculator, "backoff_factor", 0.0)
        mp.setattr(default_interval_calculator, "jitter", _NoJitter())
        yield


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that reaches PostgreSQL ``postgres`` (and SQLite ones ``sqlite``), so
    ``pytest -m postgres`` selects them: the ``db_url`` params carry their marks, but a test
    that picks its dialect (``indirect`` params) or asks for ``pg_url`` itself does not.
    Then put the slow tests first."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        dialect = callspec.params.get("db_url") if callspec is not None else None
        if dialect in ("sqlite", "postgres"):
            item.add_marker(dialect)
        if "pg_url" in getattr(item, "fixturenames", ()):
            item.add_marker("postgres")
    # the long tests first: started last, a minute-long one kept a worker busy after the
    # other had run out of work (the longest-first rule of scheduling); a stable sort, so
    # every xdist worker collects the same order
    items.sort(key=_longest_first)
    config = getattr(items[0], "config", None) if items else None
    group_ids(items, loadgroup=bool(getattr(getattr(config, "option", None), "loadgroup", False)))


def group_ids(items: list[pytest.Item], *, loadgroup: bool) -> None:
    """``--dist loadgroup`` in an xdist worker: each test marked ``xdist_group`` gets its
    group's name after an ``@`` in its node id, which is how the controller sends the
    group's tests to one worker. pytest-xdist (3.8) does it itself by setting
    ``item._nodeid``, which pytest 9 no longer reads (the id is ``item._id``): the ids
    stayed plain and every group's tests were spread over the workers, each importing
    the framework an adapter's tests import, or building the wheel, again. Done here as
    xdist would, once (an id that has its ``@`` is left alone)."""
    if not loadgroup:
        return
    from _pytest.nodeid import coerce_node_id

    for item in items:
        names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                        for m in item.iter_markers("xdist_group")})
        if names and item.nodeid.rfind("@") <= item.nodeid.rfind("]"):
            item._id = coerce_node_id(f"{item.nodeid}@{'_'.join(names)}")


def _longest_first(item: pytest.Item) -> tuple[bool, float]:
    """Slow tests first, and among them the ones given a longer timeout than the suite's
    (the model-based test, the whole eval dataset: minutes each) before the rest."""
    timeout = item.get_closest_marker("timeout")
    limit = float(timeout.args[0]) if timeout is not None and timeout.args else 0.0
    return item.get_closest_marker("slow") is None, -limit


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str | None]:
    """A migrated PostgreSQL database for this session (this xdist worker's own), or None
    when the server is unreachable and APPROVALD_REQUIRE_PG is not set."""
    name = f"approvald_test_{WORKER}_{uuid.uuid4().hex[:10]}"
    try:
        asyncio.run(_pg_admin(f'CREATE DATABASE "{name}"'))
        # a commit here need not wait for its WAL to reach the disk (what synchronous_commit
        # buys is surviving a crash of the server's machine, which no test makes): under
        # load a write transaction's commit took 10-11 ms waiting for the flush, 2-4 ms not
        asyncio.run(_pg_admin(f'ALTER DATABASE "{name}" SET synchronous_commit = off'))
    except Exception as exc:  # server absent: skip or fail, as configured
        if os.environ.get("APPROVALD_REQUIRE_PG") == "1":
            raise RuntimeError(f"PostgreSQL required but unreachable: {exc}") from exc
        yield None
        return
    base = PG_ADMIN_URL.rsplit("/", 1)[0]
    url = f"{base}/{name}".replace("postgresql://", "postgresql+asyncpg://")

    async def upgrade() -> None:
        db = Database(url)
        await migrate.upgrade(db)
        await db.close()

    asyncio.run(upgrade())
    yield url
    asyncio.run(_pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture
def pg_url(pg_database: str | None) -> str | None:
    """The session's PostgreSQL database, emptied for this test (None: unreachable)."""
    if pg_database is not None:
        asyncio.run(reset_pg(pg_database))
    return pg_database


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("template") / "template.db"

    async def upgrade() -> None:
        db = Database(f"sqlite+aiosqlite:///{path}")
        await migrate.upgrade(db)
        await db.close()

    asyncio.run(upgrade())
    return path


@pytest.fixture(params=[pytest.param("sqlite", marks=pytest.mark.sqlite),
                        pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path, sqlite_template: Path) -> str:
    """A migrated, empty database of each dialect."""
    if request.param == "sqlite":
        path = tmp_path / "approvald.db"
        shutil.copy(sqlite_template, path)
        return f"sqlite+aiosqlite:///{path}"
    url = request.getfixturevalue("pg_url")  # emptied for this test
    if url is None:
        pytest.skip("PostgreSQL is not reachable (set APPROVALD_TEST_PG_URL)")
    return str(url)


@pytest.fixture
def sqlite_url(tmp_path: Path, sqlite_template: Path) -> str:
    path = tmp_path / "approvald.db"
    shutil.copy(sqlite_template, path)
    return f"sqlite+aiosqlite:///{path}"


@pytest.fixture
async def db(db_url: str) -> AsyncIterator[Database]:
    # the injected clock governs leases too, so tests can move time across them; the
    # database's own lease clock (PostgreSQL's default) has a test of its own
    database = Database(db_url, server_time=False)
    yield database
    await database.close()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def ledger_path(tmp_path: Path) -> Path:
    return tmp_path / "ledger.jsonl"


def ledger_lines(path: Path) -> list[dict[str, Any]]:
    import json

    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


SIGNER = TokenSigner("test-secret-0123456789abcdef")


@pytest.fixture
def make_engine(db: Database, clock: ManualClock, ledger_path: Path) -> Callable[..., Engine]:
    """Build an engine over the test database; extra agents/policy/config as keywords."""

    def make(*, agents: list[Agent] | None = None, policy: PolicyFile | None = None,
             owner: str | None = None, audit_key: AuditKey | None = None,
             directory: Directory | None = None, tracer: Tracer | None = None,
             urgency: Urgency | None = None, **config: Any) -> Engine:
        ledger = DemoLedger(str(ledger_path))
        registry = Registry(agents if agents is not None
                            else [refund_agent(ledger), steps_agent(ledger)], policy=policy)
        return assemble(db, registry, clock=clock, config=EngineConfig(**config), owner=owner,
                        signer=SIGNER, audit_key=audit_key, directory=directory,
                        tracer=tracer, urgency=urgency)

    return make


@pytest.fixture(autouse=True)
def _no_sealer_left_behind() -> Iterator[None]:
    """How sensitive columns are sealed is process-wide (the settings of the last database
    opened): a test's keys end with it."""
    yield
    types.set_codec(None)
