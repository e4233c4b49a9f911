"""The command hook as a process that always answers in time (standard library only).

An :class:`Answer` is the one thing the process says: the decision the hook reached, or,
if it has not reached one when its deadline comes, the fail-closed fallback. Its
watchdog is a thread that does not depend on the event loop or on anything the main
thread is blocked in (a SQLite call waiting out a lock in aiosqlite's thread, a
connection that never answers, a close that hangs at exit, a migration check at start):
at the deadline it writes the fallback to the process's stdout or stderr file descriptor
and ends the process with ``os._exit``. Once an answer is given, the rest of the work
(closing connections) has :data:`LINGER` seconds before the watchdog ends the process,
with the answer already out.

The hard stop applies only to a hook that owns its process (run as the console script
runs it, on the main thread); called in-process by a program or a test, the same code
relies on its asyncio deadline alone and never ends the caller's process.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import BinaryIO, TextIO

from approvald.bot.claude_code_contract import MAX_EVENT

LINGER = 1.0  # seconds the process may take to tidy up once it has answered


class Answer:
    """What the process says, once: ``give`` the decision, or at ``deadline`` (a
    ``time.monotonic`` value) the watchdog gives the fallback and ends the process."""

    def __init__(self, *, deadline: float, fallback: str, code: int = 0,
                 to_stderr: bool = False) -> None:
        self.deadline = deadline
        self.fallback, self.code, self.to_stderr = fallback, code, to_stderr
        self.given = False
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._dog: threading.Thread | None = None

    def otherwise(self, fallback: str, *, code: int, to_stderr: bool = False) -> None:
        """What to say if the deadline comes first (once the event's kind is known)."""
        with self._lock:
            self.fallback, self.code, self.to_stderr = fallback, code, to_stderr

    def sooner(self, deadline: float) -> None:
        """Bring the deadline forward (never back)."""
        with self._changed:
            self.deadline = min(self.deadline, deadline)
            self._changed.notify_all()

    def give(self, text: str, *, stream: TextIO | None = None, code: int = 0) -> bool:
        """Say ``text`` (nothing, for an event that prints nothing) on ``stream`` (stdout),
        unless the fallback was said already; then the process has :data:`LINGER` seconds
        left, and exits ``code`` if it takes longer. False if it came too late."""
        with self._changed:
            if self.given:
                return False
            out = stream or sys.stdout
            if text:
                out.write(text + "\n")
            out.flush()
            self.given, self.code = True, code
            self.deadline = min(self.deadline, time.monotonic() + LINGER)
            self._changed.notify_all()
            return True

    def watch(self, *, own_process: bool) -> None:
        """Start the watchdog, when this process is the hook's own: ``own_process`` (run
        as the console script, not called by a program or a test) and on its main thread."""
        if not own_process or threading.current_thread() is not threading.main_thread():
            return
        self._dog = threading.Thread(target=self._watch, name="hook watchdog", daemon=True)
        self._dog.start()

    def _watch(self) -> None:
        with self._changed:
            while (left := self.deadline - time.monotonic()) > 0:
                self._changed.wait(left)
            if not self.given:
                self.given = True
                fd = 2 if self.to_stderr else 1
                _write_all(fd, (self.fallback + "\n").encode("ascii", "backslashreplace"))
            code = self.code
        os._exit(code)


def _write_all(fd: int, data: bytes) -> None:
    try:
        while data:
            data = data[os.write(fd, data):]
    except OSError:  # nobody reads it any more: nothing else to do
        pass


class TooLarge(ValueError):
    """The event on stdin is over :data:`MAX_EVENT` bytes."""


def read_event(stream: BinaryIO | None = None) -> bytes:
    """The event's bytes from ``stream`` (stdin's), at most :data:`MAX_EVENT` of them;
    decoding is the caller's (UTF-8, whatever the locale says)."""
    source = stream or sys.stdin.buffer
    data = source.read(MAX_EVENT + 1)
    if len(data) > MAX_EVENT:
        raise TooLarge(f"the event is larger than {MAX_EVENT} bytes")
    return data
