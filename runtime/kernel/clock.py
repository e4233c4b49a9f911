"""The one clock: code asks an injected clock for the time, so tests move time, not sleep."""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Protocol

from approvald.runtime.kernel.errors import ConfigError


class Clock(Protocol):
    """Source of timezone-aware UTC time."""

    def now(self) -> datetime: ...


class SystemClock:
    """Wall-clock UTC time."""

    # ``datetime.now(UTC)`` itself, called from C: no Python call each time it is asked
    # (about a dozen times an approval: issue 50)
    now: Callable[[], datetime] = staticmethod(partial(datetime.now, UTC))


class ManualClock:
    """A clock that only moves when told to; for tests and simulations."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
        if self._now.tzinfo is None:
            raise ValueError("ManualClock needs a timezone-aware start time")

    def now(self) -> datetime:
        return self._now

    def advance(self, delta: timedelta | float) -> datetime:
        """Move time forward by ``delta`` (a timedelta or seconds) and return the new now."""
        step = delta if isinstance(delta, timedelta) else timedelta(seconds=delta)
        if step < timedelta(0):
            raise ValueError("time only moves forward")
        self._now += step
        return self._now

    def set(self, when: datetime) -> None:
        if when.tzinfo is None:
            raise ValueError("needs a timezone-aware time")
        self._now = when


class FileClock:
    """Time read from a file holding an ISO-8601 instant: an injected clock for subprocesses.

    Crash and acceptance tests start real ``approvald`` processes with
    ``APPROVALD_CLOCK_FILE`` pointing at such a file and move time by rewriting it, so
    expiry is tested without sleeping. Without the file, wall-clock time is used.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._cache: tuple[float, datetime] | None = None

    def now(self) -> datetime:
        try:
            mtime = os.stat(self.path).st_mtime_ns
        except FileNotFoundError:
            return datetime.now(UTC)
        if self._cache is None or self._cache[0] != mtime:
            with open(self.path, encoding="utf-8") as fh:
                text = fh.read().strip()
            try:
                when = datetime.fromisoformat(text)
            except ValueError:
                when = None
            if when is None or when.tzinfo is None:
                raise ConfigError(f"APPROVALD_CLOCK_FILE: {self.path} holds {text[:40]!r}, not "
                                  "an ISO-8601 instant with a time zone")
            self._cache = (mtime, when.astimezone(UTC))
        return self._cache[1]
