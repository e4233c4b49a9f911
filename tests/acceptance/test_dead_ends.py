"""The first hour's dead ends (issue 10), each tried as a new user would: real ``approvald``
processes, started from directories of their own."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import textwrap
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from approvald.runtime.engine import assemble
from approvald.runtime.kernel.clock import ManualClock
from approvald.runtime.runs.agent import Registry
from approvald.runtime.runs.demo import DemoLedger, refund_agent
from approvald.store.db import Database

from tests.conftest import SIGNER
from tests.helpers import APPROVALD, START, Cli, Rows, run_in_process


def env_of(**extra: str) -> dict[str, str]:
    """The environment of a new user's shell: no approvald or Slack settings."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("APPROVALD_", "SLACK_")) and k != "PYTHONPATH"}
    env["APPROVALD_LOG_LEVEL"] = "WARNING"
    env.update(extra)
    return env


def approvald(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return run_in_process(list(args), cwd=cwd, env=env)


# -- the default database is one per user ----------------------------------------------------

def test_the_default_database_is_the_same_from_every_directory(tmp_path: Path) -> None:
    data = tmp_path / "xdg-data"
    env = env_of(HOME=str(tmp_path / "home"), XDG_DATA_HOME=str(data),
                 APPROVALD_DEMO_LEDGER=str(tmp_path / "ledger.jsonl"))
    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir()
    there.mkdir()
    started = approvald("run", "demo-refund", "--task", "Refund order A-1", "--requested-by",
                        "U_DANA", cwd=here, env=env)
    assert started.returncode == 0, started.stderr
    expected = data / "approvald" / "approvald.db"
    assert expected.is_file()
    # the notice names the file itself, absolutely, once: when it is created
    assert f"approvald: created database {expected} " in started.stderr
    listed = approvald("approvals", "list", "--ids", cwd=there, env=env)
    assert listed.returncode == 0, listed.stderr
    assert len(listed.stdout.split()) == 1
    assert "created database" not in listed.stderr
    assert not list(here.iterdir()) and not list(there.iterdir())


def test_a_database_url_still_decides(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'mine.db'}"
    env = env_of(HOME=str(tmp_path / "home"), XDG_DATA_HOME=str(tmp_path / "xdg-data"),
                 APPROVALD_DATABASE_URL=url)
    done = approvald("runs", "list", cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    assert f"approvald: created database {tmp_path / 'mine.db'} " in done.stderr
    assert not (tmp_path / "xdg-data").exists()


# -- APPROVALD_AGENTS from the current directory, and a model failure said once --------------

AGENTS = textwrap.dedent('''
    from approvald.runtime.runs.agent import Agent
    from approvald.runtime.kernel.errors import ModelError
    from approvald.runtime.models import ScriptedModel, reply


    class Refusing:
        async def complete(self, *, instructions, messages, tools):
            raise ModelError("the provider refused the request: context too long")


    greeter = Agent(name="greeter", instructions="Say hello.",
                    model=ScriptedModel.sequence([reply("hello from myagents.py")]), tools=[])
    refused = Agent(name="refused", instructions="Fail.", model=Refusing(), tools=[])
''')


@pytest.fixture
def project(tmp_path: Path, sqlite_url: str) -> tuple[Path, dict[str, str]]:
    """A directory with ``myagents.py`` in it, as the README's "Defining an agent" has it."""
    workdir = tmp_path / "project"
    workdir.mkdir()
    (workdir / "myagents.py").write_text(AGENTS)
    return workdir, env_of(APPROVALD_AGENTS="myagents", APPROVALD_DATABASE_URL=sqlite_url)


def test_agents_module_in_the_current_directory_is_found(
        project: tuple[Path, dict[str, str]]) -> None:
    workdir, env = project
    done = approvald("run", "greeter", "--task", "hi", cwd=workdir, env=env)
    assert done.returncode == 0, done.stderr
    assert "completed: hello from myagents.py" in done.stderr


def test_a_model_failure_is_said_once(project: tuple[Path, dict[str, str]]) -> None:
    workdir, env = project
    env["PYTHONPATH"] = str(workdir)  # this test is about the failure, not the import
    done = approvald("run", "refused", "--task", "hi", cwd=workdir, env=env)
    assert done.returncode == 1, done.stderr
    assert done.stderr.count("context too long") == 1, done.stderr
    assert "failed: model error: the provider refused the request" in done.stderr


# -- approvals list: oldest first, says when it is cut, quiet on a closed pipe ---------------

PENDING = 105


@pytest.fixture(scope="module")
def pending_template(tmp_path_factory: pytest.TempPathFactory,
                     sqlite_template: Path) -> tuple[Path, list[str]]:
    """A database holding ``PENDING`` refund requests, a second apart, and their ids, oldest
    first: made once a module (an xdist worker), copied for each test that reads them (eleven
    tests made the same 105 runs, about 1 s of CPU each)."""
    path = tmp_path_factory.mktemp("many-pending") / "approvald.db"
    shutil.copy(sqlite_template, path)

    async def make() -> list[str]:
        db = Database(f"sqlite+aiosqlite:///{path}")
        clock = ManualClock(START)
        engine = assemble(db, Registry([refund_agent(DemoLedger(str(path.with_name(
            "ledger.jsonl"))))]), clock=clock, signer=SIGNER)
        ids = []
        try:
            for n in range(PENDING):
                run_id = await engine.start_run("demo-refund", f"Refund order A-{n}",
                                                requested_by="U_DANA")
                await engine.advance(run_id)
                [approval] = await Rows(db).approvals(run_id)
                ids.append(approval.id)
                clock.advance(timedelta(seconds=1))
        finally:
            await engine.aclose()
            await db.close()
        return ids

    return path, asyncio.run(make())


@pytest.fixture
def many_pending(cli: Cli, pending_template: tuple[Path, list[str]]) -> list[str]:
    """``PENDING`` refund requests, a second apart, in ``cli``'s database and demo ledger
    (copies of :func:`pending_template`'s); their ids, oldest first."""
    path, ids = pending_template
    shutil.copy(path, cli.db_url.removeprefix("sqlite+aiosqlite:///"))
    shutil.copy(path.with_name("ledger.jsonl"), cli.ledger)
    return list(ids)


@pytest.mark.slow  # starts a process
def test_approvals_list_is_oldest_first_and_says_when_it_is_cut(
        cli: Cli, many_pending: list[str]) -> None:
    done = cli("approvals", "list", "--ids")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == many_pending[:100]
    assert done.stderr.strip() == ("approvald: showing the oldest 100 of 105 pending "
                                   "approvals; --limit N shows more")
    done = cli("approvals", "list", "--ids", "--limit", "200")
    assert done.stdout.split() == many_pending and done.stderr == ""
    assert [a["id"] for a in cli.json("approvals", "list", "--json", "--limit", "3")] \
        == many_pending[:3]
    # the README's quick start: the first line is the oldest request
    head = subprocess.run(["bash", "-c", f"'{APPROVALD}' approvals list --ids | head -1"],
                          env=cli.env(), cwd=cli.workdir, text=True, capture_output=True,
                          timeout=60, check=False)
    assert head.stdout.strip() == many_pending[0]
    assert "internal error" not in head.stderr and "Error" not in head.stderr


@pytest.fixture
def closed_pipe() -> Iterator[int]:
    """The write end of a pipe whose reader is gone before anything is written."""
    read, write = os.pipe()
    os.close(read)
    yield write
    os.close(write)


@pytest.mark.parametrize("args", [
    ["approvals", "list", "--ids"],
    ["approvals", "list", "--json"],
    ["approvals", "list"],
    ["runs", "list"],
    ["runs", "list", "--json"],
    ["audit", "export"],
    ["audit", "verify"],
    ["outbox", "list"],
    ["db", "upgrade"],
    ["approvals", "--help"],
])
@pytest.mark.slow  # starts a process
def test_a_closed_pipe_ends_quietly(cli: Cli, many_pending: list[str], closed_pipe: int,
                                    args: list[str]) -> None:
    done = subprocess.run([APPROVALD, *args], env=cli.env(), cwd=cli.workdir,
                          stdout=closed_pipe, stderr=subprocess.PIPE, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert "rror" not in done.stderr and "Traceback" not in done.stderr, done.stderr


@pytest.mark.slow  # starts a process
def test_a_decision_whose_output_pipe_is_closed_still_completes(
        cli: Cli, closed_pipe: int) -> None:
    started = cli("run", "demo-refund", "--task", "Refund order A-1", "--requested-by",
                  "U_DANA")
    assert started.returncode == 0, started.stderr
    [approval] = cli.json("approvals", "list", "--json")
    done = subprocess.run([APPROVALD, "approvals", "approve", approval["id"], "--as",
                           "U_ALICE"], env=cli.env(), cwd=cli.workdir, stdout=closed_pipe,
                          stderr=subprocess.PIPE, text=True, timeout=60, check=False)
    assert (done.returncode, done.stderr) == (0, "")
    run = cli.json("runs", "show", approval["run_id"], "--json")
    assert run["status"] == "completed"


# -- one line, never "internal error" --------------------------------------------------------

@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port something else listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


SERVE = {"SLACK_BOT_TOKEN": "xoxb-1", "SLACK_SIGNING_SECRET": "s" * 32,
         "APPROVALD_CHANNEL": "C1", "SLACK_API_URL": "http://127.0.0.1:1/api/",
         "APPROVALD_HOST": "127.0.0.1"}


@pytest.mark.parametrize("args,env,message", [
    (["runs", "list"], {"APPROVALD_DATABASE_URL": "postgresql://postgres@127.0.0.1:1/x"},
     "APPROVALD_DATABASE_URL: cannot open postgresql+asyncpg://postgres@127.0.0.1:1/x: "),
    (["runs", "list"], {"APPROVALD_DATABASE_URL": "sqlite:////nonexistent/approvald/x.db"},
     "APPROVALD_DATABASE_URL: directory /nonexistent/approvald does not exist"),
    # serve and sandbox run as processes of their own (OWN_PROCESS in tests/helpers.py)
    pytest.param(["serve"], {**SERVE, "APPROVALD_PORT": "{taken}"},
                 "APPROVALD_HOST/APPROVALD_PORT: cannot listen on 127.0.0.1:{taken}: "
                 "Address already in use", marks=pytest.mark.slow),
    pytest.param(["sandbox", "--port", "{taken}"], {}, "address already in use",
                 marks=pytest.mark.slow),
    pytest.param(["sandbox", "--port", "99999"], {},
                 "argument --port: must be a port from 0 to 65535", marks=pytest.mark.slow),
    (["approvals", "list", "--limit", "-1"], {},
     "argument --limit: must be a whole number of 1 or more (got '-1')"),
    (["runs", "list", "--limit", "-5"], {}, "argument --limit: must be a whole number"),
    (["outbox", "list", "--limit", "0"], {}, "argument --limit: must be a whole number"),
    (["run", "demo-refund", "--task", "x", "--wait", "-1"], {}, "argument --wait: must be"),
    (["runs", "list"], {"APPROVALD_CLOCK_FILE": "{clock:yesterday}"},
     "APPROVALD_CLOCK_FILE: {workdir}/bad-clock holds 'yesterday', not an ISO-8601 instant"),
    (["runs", "list"], {"APPROVALD_CLOCK_FILE": "{clock:2026-06-01T09:00:00}"},
     "not an ISO-8601 instant with a time zone"),
    (["runs", "list"], {"APPROVALD_FAILPOINTS": "after_intent@two"},
     "APPROVALD_FAILPOINTS: 'after_intent@two': the count after @ must be a whole number"),
    (["runs", "list"], {"APPROVALD_FAILPOINTS": "after_intnet"},
     "APPROVALD_FAILPOINTS: unknown failpoint 'after_intnet' (known: mid_model_call, "),
], ids=["pg-unreachable", "sqlite-dir-missing", "serve-port-in-use", "sandbox-port-in-use",
        "port-out-of-range", "negative-limit", "negative-runs-limit", "zero-outbox-limit",
        "negative-wait", "clock-file-garbage", "clock-file-naive", "failpoints-malformed",
        "failpoint-unknown"])
def test_what_a_user_can_get_wrong_is_one_line(cli: Cli, taken_port: int, args: list[str],
                                               env: dict[str, str], message: str) -> None:
    def fill(text: str) -> str:
        if text.startswith("{clock:"):
            path = cli.workdir / "bad-clock"
            path.write_text(text.removeprefix("{clock:").removesuffix("}"))
            return str(path)
        return text.replace("{taken}", str(taken_port)).replace("{workdir}",
                                                                 str(cli.workdir))

    done = cli(*[fill(a) for a in args], **{k: fill(v) for k, v in env.items()})
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and fill(message) in lines[0], done.stderr
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr


@pytest.mark.postgres
def test_a_missing_postgresql_database_is_one_line(cli: Cli, pg_url: str | None) -> None:
    if pg_url is None:
        pytest.skip("PostgreSQL is not reachable (set APPROVALD_TEST_PG_URL)")
    missing = pg_url.rsplit("/", 1)[0] + "/approvald_no_such_database"
    done = cli("runs", "list", APPROVALD_DATABASE_URL=missing)
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0] == ("approvald: APPROVALD_DATABASE_URL: cannot open "
                        f"{missing}: database \"approvald_no_such_database\" does not exist")
