"""The tests' subprocess ``approvald`` (:class:`tests.helpers.Cli`) is a process forked from
a warm server (tests/zygote.py), not the console script: it must answer as the console
script does, so what a subprocess test proves it still proves."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.helpers import APPROVALD, Cli, make_cli, popen_approvald

pytestmark = pytest.mark.slow  # starts the console script


def both(cli: Cli, *args: str, stdin: str | None = None, **extra: str
         ) -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
    """(warm, cold): the command run by the exe ``Cli`` runs, then by the console script."""
    done = []
    for exe in (cli.executable(args), APPROVALD):
        done.append(subprocess.run([exe, *args], env=cli.env(**extra), cwd=cli.workdir,
                                   input=stdin, capture_output=True, text=True, timeout=120,
                                   check=False))
    return done[0], done[1]


def test_cli_runs_the_warm_approvald_for_every_command(sqlite_url: str,
                                                      tmp_path: Path) -> None:
    cli = make_cli(sqlite_url, tmp_path)
    assert cli.executable(("runs", "list")) != APPROVALD
    assert cli.executable(("serve",)) == cli.executable(("sandbox",)) == \
        cli.executable(("mcp-proxy",)) == cli.executable(("runs", "list"))


def _state(pid: int) -> str:
    """The scheduler's state letter of process ``pid`` (``T``: stopped)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_a_signal_to_a_spawned_warm_command_reaches_the_command_itself(
        sqlite_url: str, tmp_path: Path) -> None:
    """What a test sends a ``serve`` it spawned (SIGTERM, SIGHUP, SIGKILL) goes to the
    command's own process, not to the shim between them: stopped, the command stands still
    (not its shim); killed, it is gone (reaped) by the time ``wait`` returns, as a cold
    one is; its exit status is the one ``wait`` tells."""
    cli = make_cli(sqlite_url, tmp_path)
    proc = popen_approvald(["hook", "claude-code", "--requested-by", "U_SEED"],
                           env=cli.env(), cwd=cli.workdir, text=True,  # it reads its stdin
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert proc.child_pid != proc.pid
        proc.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + 20  # (a signal is delivered when the target next runs)
        while _state(proc.child_pid) != "T":
            assert time.monotonic() < deadline, "the command did not stop"
            time.sleep(0.05)
        assert _state(proc.pid) != "T"
        proc.send_signal(signal.SIGCONT)
        proc.kill()
        assert proc.wait(timeout=30) == -signal.SIGKILL
        assert not Path(f"/proc/{proc.child_pid}").exists()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=30)


def test_the_warm_cli_answers_as_the_console_script_does(sqlite_url: str,
                                                          tmp_path: Path) -> None:
    cli = make_cli(sqlite_url, tmp_path)
    # exit status, output and error: a success, a usage error, a command's own failure
    for args in (("runs", "list", "--limit", "0"), ("no-such-command",),
                 ("runs", "show", "no-such-run"), ("audit", "verify")):
        warm, cold = both(cli, *args)
        assert (warm.returncode, warm.stdout, warm.stderr) == \
            (cold.returncode, cold.stdout, cold.stderr), args
    # standard input: the hook reads its event from it
    event = ('{"session_id": "s", "hook_event_name": "PreToolUse", "tool_name": "Bash", '
             '"tool_input": {"command": "ls"}, "cwd": "/tmp"}')
    warm, cold = both(cli, "hook", "claude-code", "--requested-by", "U_SEED", "--wait", "0",
                      stdin=event)
    assert warm.returncode == cold.returncode == 0, (warm.stderr, cold.stderr)
    decision = '"permissionDecision"'
    assert decision in warm.stdout and \
        warm.stdout.split(decision)[1][:12] == cold.stdout.split(decision)[1][:12]
    # a failpoint armed from the command's own environment: a real SIGKILL of the process
    warm, cold = both(cli, "run", "demo-steps", "--task", "3",
                      APPROVALD_FAILPOINTS="after_intent")
    assert warm.returncode == cold.returncode == -signal.SIGKILL, (warm.stderr, cold.stderr)
    assert warm.stdout.strip() and cold.stdout.strip()  # each printed its run's id first
    # and through Cli itself
    assert cli("run", "demo-steps", "--task", "3",
               failpoints="after_intent").returncode == -signal.SIGKILL
    done = cli("recover")
    assert done.returncode == 0 and "recovered 3 run(s)" in done.stderr, done.stderr


def test_agents_imported_by_one_command_are_not_seen_by_the_next(sqlite_url: str,
                                                                 tmp_path: Path) -> None:
    """A command imports its ``APPROVALD_AGENTS`` from its working directory: in its own
    forked process, so the next command (another directory, the same module name) imports
    its own, as a fresh process would."""
    said = []
    for n, source in ((1, "X = 1\n"), (2, "raise ImportError('the second one')\n"), (1, None)):
        where = tmp_path / f"w{n}"
        where.mkdir(exist_ok=True)
        if source is not None:
            (where / "myagents.py").write_text(source)
        cli = make_cli(sqlite_url, where)
        said.append(cli("run", "demo-steps", "--task", "1", APPROVALD_AGENTS="myagents"))
    assert [d.returncode != 0 for d in said] == [True, True, True]
    assert "defines no Agent" in said[0].stderr, said[0].stderr
    assert "the second one" in said[1].stderr, said[1].stderr
    assert "defines no Agent" in said[2].stderr, said[2].stderr


def test_the_warm_cli_finds_modules_on_its_own_pythonpath(sqlite_url: str,
                                                          tmp_path: Path) -> None:
    """A command's ``PYTHONPATH`` is on its ``sys.path`` (the server was started without
    it), as on the console script's: its agents are found there, not in its directory."""
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "otheragents.py").write_text("X = 1\n")
    cli = make_cli(sqlite_url, tmp_path)
    for extra in ({}, {"PYTHONPATH": str(tmp_path / "elsewhere")}):
        warm, cold = both(cli, "run", "demo-steps", "--task", "1",
                          APPROVALD_AGENTS="otheragents", **extra)
        assert (warm.returncode, warm.stderr) == (cold.returncode, cold.stderr), extra
        said = "defines no Agent" if extra else "cannot import 'otheragents'"
        assert said in warm.stderr, warm.stderr


def test_a_killed_warm_cli_takes_its_command_with_it(sqlite_url: str, tmp_path: Path) -> None:
    """SIGKILL to the process a test started (``Popen.kill``, a ``subprocess.run`` past its
    timeout) ends the command too, as it would the console script: the command holds the
    output pipe, so its end of file says the command is gone."""
    cli = make_cli(sqlite_url, tmp_path)
    event = ('{"hook_event_name": "PreToolUse", "session_id": "s", "cwd": "/srv/other", '
             '"tool_use_id": "toolu_1", "tool_name": "Bash", '
             '"tool_input": {"command": "make release"}}')
    with subprocess.Popen([cli.executable(("hook",)), "hook", "claude-code",
                           "--requested-by", "U_SEED", "--wait", "120"],
                          env=cli.env(), cwd=cli.workdir, stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                          text=True) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(event)
        proc.stdin.close()
        deadline = time.monotonic() + 60
        while not cli.json("approvals", "list", "--json"):  # it waits for a decision
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.1)
        proc.kill()
        assert proc.wait(timeout=10) == -signal.SIGKILL
        out = proc.stdout
        done = threading.Event()
        threading.Thread(target=lambda: (out.read(), done.set()), daemon=True).start()
        assert done.wait(20), "the command outlived the process the test killed"
