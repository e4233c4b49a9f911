"""Who waits on this task's writes: the one way scheduling priority reaches the store.

Where a person waits (a click held open until its decision commits, a decided run on its
way to its tool call), :mod:`runtime.kernel.urgency` sets :func:`waiting` around the work done
for them; :meth:`store.db.Database.write` reads :func:`since` and queues the write by it.
The code that decides and executes never passes a priority along: it is the context's
(a ``contextvars`` variable, so it follows the task and the tasks it starts, and ends with
the block that set it). Scheduling only: the order of commits is all it changes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

_SINCE: ContextVar[float | None] = ContextVar("approvald_waiting_since", default=None)


def since() -> float | None:
    """When the person this task's writes are for began waiting (monotonic), or None:
    nobody waits on them (an ordinary write)."""
    return _SINCE.get()


@contextlib.contextmanager
def waiting(since: float | None) -> Iterator[None]:
    """Inside: writes are for someone who has waited since ``since`` (None: for nobody)."""
    token = _SINCE.set(since)
    try:
        yield
    finally:
        _SINCE.reset(token)
