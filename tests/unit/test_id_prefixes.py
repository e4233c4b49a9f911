"""Naming a run, a request or a standing approval by an id prefix, the same way everywhere
(issue 36, defect 15): the full id or an unambiguous prefix of at least 6 characters works;
an unknown id, a prefix too short, or one several records share is a clear error and a
non-zero exit, never an empty answer. The CLI runs in-process, as a user's command does.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from approvald.bot.cli import main
from approvald.runtime.approvals.decide import Actor
from approvald.runtime.kernel.ids import new_id
from approvald.runtime.policies.scope import scope_for

from tests.helpers import Rows

RUN_A, RUN_B = "abc123" + "a" * 26, "abc123" + "b" * 26
REQ_A, REQ_B = "def456" + "a" * 26, "def456" + "b" * 26
STAND_A, STAND_B = "fed789" + "a" * 26, "fed789" + "b" * 26
ALICE = Actor("U_ALICE", "slack")


def ids(*chosen: str) -> Callable[[], str]:
    """An id source handing out ``chosen`` first, then random ids as usual."""
    queue = iter(chosen)
    return lambda: next(queue, None) or new_id()


@pytest.fixture
def cli(db_url: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> Iterator[Callable[..., Any]]:
    """``await cli(*argv)`` -> (exit code, stdout, stderr) of ``approvald argv`` run in this
    process (in a thread: the command runs its own event loop) on the test's database."""
    import os

    for name in list(os.environ):
        if name.startswith(("APPROVALD_", "SLACK_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("APPROVALD_DATABASE_URL", db_url)
    loggers = {n: logging.getLogger(n).level
               for n in ("approvald.outcomes", "alembic", "apscheduler")}

    async def run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = await asyncio.to_thread(main, list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    yield run
    for name, level in loggers.items():  # what the command set for itself
        logging.getLogger(name).setLevel(level)


async def two_runs(make_engine, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Two paused refund runs whose ids share the prefix abc123, with requests whose ids
    share def456."""
    monkeypatch.setattr("approvald.runtime.engine.new_id", ids(RUN_A, RUN_B))
    monkeypatch.setattr("approvald.runtime.requests.gate.new_id", ids(REQ_A, REQ_B))
    engine = make_engine()
    for task in ("Refund order A-1001", "Refund order B-2002"):
        await engine.run("demo-refund", task, requested_by="U_DANA")
    return engine


def run_ids(jsonl: str) -> set[str]:
    return {json.loads(line)["run_id"] for line in jsonl.splitlines()}


async def test_audit_export_takes_a_run_as_every_other_command_does(make_engine, monkeypatch,
                                                                     cli):
    await two_runs(make_engine, monkeypatch)

    code, full, _ = await cli("audit", "export", "--run", RUN_A)
    assert code == 0 and run_ids(full) == {RUN_A}
    code, by_prefix, _ = await cli("audit", "export", "--run", RUN_A[:8])
    assert code == 0 and by_prefix == full
    code, as_csv, _ = await cli("audit", "export", "--run", RUN_A[:8], "--format", "csv")
    assert code == 0 and len(as_csv.splitlines()) == 1 + len(full.splitlines())

    code, out, err = await cli("audit", "export", "--run", "0" * 32)
    assert (code, out) == (2, "") and f"no run {'0' * 32}" in err
    code, out, err = await cli("audit", "export", "--run", "abc123")
    assert (code, out) == (2, "")
    assert "ambiguous" in err and RUN_A in err and RUN_B in err
    code, out, err = await cli("audit", "export", "--run", "abc12")
    assert (code, out) == (2, "") and "give at least 6 characters" in err
    code, out, err = await cli("audit", "export", "--run", "")
    assert (code, out) == (2, "") and "give at least 6 characters" in err


async def test_runs_are_named_alike_by_every_command(make_engine, monkeypatch, cli):
    await two_runs(make_engine, monkeypatch)
    for argv in (("runs", "show"), ("trace",), ("approvals", "list", "--run")):
        code, out, err = await cli(*argv, "abc123")
        assert (code, out) == (2, ""), argv
        assert "ambiguous" in err and RUN_A in err and RUN_B in err, argv
        code, out, err = await cli(*argv, "abc12")
        assert code == 2 and "give at least 6 characters" in err, argv
        code, out, err = await cli(*argv, "f" * 32)
        assert code == 2 and f"no run {'f' * 32}" in err, argv
    code, out, _ = await cli("approvals", "list", "--ids", "--run", RUN_B[:8])
    assert code == 0 and out.split() == [REQ_B]


async def test_an_ambiguous_request_or_standing_prefix_says_so(make_engine, monkeypatch, db,
                                                                cli):
    engine = await two_runs(make_engine, monkeypatch)
    monkeypatch.setattr("approvald.runtime.approvals.standing.new_id", ids(STAND_A, STAND_B))
    for request_id in (REQ_A, REQ_B):
        a = await Rows(db).approval(request_id)
        await engine.grant_standing(a.id, actor=ALICE, window=timedelta(minutes=30),
                                    scope=scope_for(a, "exact"))

    for argv, prefix, both in ((("approvals", "show"), "def456", (REQ_A, REQ_B)),
                               (("standing", "show"), "fed789", (STAND_A, STAND_B))):
        code, out, err = await cli(*argv, prefix)
        assert (code, out) == (2, ""), argv
        assert "ambiguous" in err and all(i in err for i in both), (argv, err)
        code, out, _ = await cli(*argv, both[1][:8], "--json")
        assert code == 0 and json.loads(out)["id"] == both[1], argv
        code, out, err = await cli(*argv, prefix[:5])
        assert code == 2 and "give at least 6 characters" in err, argv


async def test_a_prefix_too_short_says_so_and_not_that_nothing_exists(make_engine,
                                                                      monkeypatch, db, cli):
    """``approvald trace f228`` for the only run (issue 33): the prefix is too short to
    trust, and the error says that, first, for every command and every kind of id; the
    commands' help names the same minimum."""
    from approvald.runtime.kernel.prefix import MIN_PREFIX

    engine = await two_runs(make_engine, monkeypatch)
    monkeypatch.setattr("approvald.runtime.approvals.standing.new_id", ids(STAND_A))
    a = await Rows(db).approval(REQ_A)
    await engine.grant_standing(a.id, actor=ALICE, window=timedelta(minutes=30),
                                scope=scope_for(a, "exact"))
    short = {"run": RUN_A[:4], "approval": REQ_A[:4], "standing approval": STAND_A[:4]}
    for kind, argv in (
            ("run", ("trace", short["run"])), ("run", ("runs", "show", short["run"])),
            ("run", ("runs", "cancel", short["run"])),
            ("run", ("approvals", "list", "--run", short["run"])),
            ("run", ("audit", "export", "--run", short["run"])),
            ("approval", ("approvals", "show", short["approval"])),
            ("approval", ("approvals", "approve", short["approval"], "--as", "U_ALICE")),
            ("approval", ("approvals", "redirect", short["approval"], "--as", "U_ALICE",
                          "--guidance", "not now")),
            ("standing approval", ("standing", "show", short["standing approval"])),
            ("standing approval", ("standing", "revoke", short["standing approval"],
                                   "--as", "U_ALICE"))):
        code, out, err = await cli(*argv)
        assert (code, out) == (2, ""), (argv, out, err)
        article = "an" if kind == "approval" else "a"
        assert err.startswith(f"approvald: {short[kind]} is too short to name {article} "
                              f"{kind}: give at least {MIN_PREFIX} characters of its id"), \
            (argv, err)
        assert "no " + kind not in err, (argv, err)
    for argv in (("runs", "show", "-h"), ("trace", "-h"), ("approvals", "show", "-h"),
                 ("approvals", "approve", "-h"), ("standing", "revoke", "-h"),
                 ("audit", "export", "-h"), ("approvals", "list", "-h")):
        code, out, _ = await cli(*argv)
        assert code == 0 and f"unique prefix of {MIN_PREFIX}+" in " ".join(out.split()), argv
