"""Who waits on this task's writes: the one way scheduling priority reaches the store.

Where a person waits (a click held open until its decision commits, a decided run on its
way to its tool call), :mod:`runtime.kernel.urgency` sets :func:`waiting` around the work done
for them; :meth:`store.db.Database.write` reads :func:`since` and queues the write by it.
The code that decides and executes never passes a priority along: it is the context's
(a ``contextvars`` variable, so it follows the task and the tasks it starts, and ends with
the block that set it). Scheduling only: the order of commits is all it changes.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar

_SINCE: ContextVar[float | None] = ContextVar("approvald_waiting_since", default=None)


# ``since()``: when the person this task's writes are for began waiting (monotonic), or
# None: nobody waits on them (an ordinary write). The variable's own ``get``: asked at
# every write, it calls no Python (issue 50)
since: Callable[[], float | None] = _SINCE.get


class waiting:  # (a context manager, used as the function it was)
    """Inside: writes are for someone who has waited since ``since`` (None: for nobody).
    A class rather than a generator: entered around every decision and every resumed
    run, a generator's context manager costs twice the calls."""

    __slots__ = ("_since", "_token")

    def __init__(self, since: float | None) -> None:
        self._since = since

    def __enter__(self) -> None:
        self._token = _SINCE.set(self._since)

    def __exit__(self, *_exc: object) -> None:
        _SINCE.reset(self._token)
