"""The hook's process answers once, in time (:mod:`approvald.bot.hooks.process`): the
decision if it comes first, else the fallback at the deadline, given by a watchdog that
ends the process whatever its main thread is stuck in (issue 45, item 1)."""

from __future__ import annotations

import io
import subprocess
import sys
import threading
import time

import pytest
from approvald.bot.cli import main
from approvald.bot.hooks.process import Answer, TooLarge, read_event

STUCK = """
import sys, threading, time
from approvald.bot.hooks.process import Answer
answer = Answer(deadline=time.monotonic() + 0.5, fallback='{"said": "fallback"}')
answer.watch(own_process=True)
if sys.argv[1] == "answered":
    answer.give('{"said": "decision"}', code=0)
# stuck, as a statement waiting in the database driver's thread leaves the process
threading.Event().wait()
"""


def test_the_answer_is_given_once() -> None:
    out = io.StringIO()
    answer = Answer(deadline=time.monotonic() + 60, fallback="{}")
    assert answer.give('{"a": 1}', stream=out)
    assert not answer.give('{"a": 2}', stream=out)
    assert out.getvalue() == '{"a": 1}\n'
    assert answer.deadline <= time.monotonic() + 1.0  # what is left is to tidy up
    answer.sooner(time.monotonic() + 30)  # never later than it is
    assert answer.deadline <= time.monotonic() + 1.0


def test_the_event_is_read_as_bytes_up_to_its_cap() -> None:
    assert read_event(io.BytesIO("é".encode())) == b"\xc3\xa9"
    with pytest.raises(TooLarge, match="larger than 1000000 bytes"):
        read_event(io.BytesIO(b"x" * 1_000_001))


def test_called_by_a_program_the_hook_never_ends_its_process(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """``main([...])`` on the main thread (a program's call, not the console script's):
    the decision, and no watchdog left behind to end the caller's process."""
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"{not json")))
    before = {t.name for t in threading.enumerate()}
    assert main(["hook", "claude-code", "--requested-by", "U_DANA", "--wait", "0"]) == 0
    assert '"permissionDecision": "deny"' in capsys.readouterr().out
    assert "hook watchdog" not in {t.name for t in threading.enumerate()} - before


@pytest.mark.slow  # a process of its own: the watchdog ends it
@pytest.mark.parametrize("case, said", [("stuck", '{"said": "fallback"}'),
                                        ("answered", '{"said": "decision"}')])
def test_the_watchdog_ends_a_stuck_process_with_one_answer(case: str, said: str) -> None:
    done = subprocess.run([sys.executable, "-c", STUCK, case], capture_output=True,
                          text=True, timeout=60, check=False)
    assert (done.returncode, done.stdout) == (0, said + "\n"), done.stderr
