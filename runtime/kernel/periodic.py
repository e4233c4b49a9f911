"""The one background-loop shape: do the work, then wait for a wake-up, a timeout or stop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger("approvald")


async def repeat(work: Callable[[], Awaitable[object]], *, stop: asyncio.Event, every: float,
                 what: str, wake: asyncio.Event | None = None, settle: float = 0.0) -> None:
    """Call ``work`` until ``stop`` is set: every ``every`` seconds, and at once when
    ``wake`` is set (after ``settle`` seconds, so a burst is handled as one batch).

    A failure is logged and retried on the next round; it never ends the loop. A wake-up
    that arrives while ``work`` runs is kept, so nothing waits a whole period for it.
    """
    while not stop.is_set():
        if wake is not None:
            wake.clear()
        try:
            await work()
        except Exception:
            log.exception("%s failed; retrying", what)
        waiters = [asyncio.ensure_future(stop.wait())]
        if wake is not None:
            waiters.append(asyncio.ensure_future(wake.wait()))
        try:
            await asyncio.wait(waiters, timeout=every, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waiters:
                w.cancel()
            await asyncio.gather(*waiters, return_exceptions=True)
        if wake is not None and wake.is_set() and settle and not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=settle)
