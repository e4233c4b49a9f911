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
    Waiting makes no task per round: one task for the loop's life rings ``wake`` when
    ``stop`` is set, and each round waits on one event under a timeout (a round woken by
    every click made three tasks, each cancelled after).
    """
    bell = wake if wake is not None else stop
    ringer = asyncio.ensure_future(_ring(stop, wake)) if wake is not None else None
    try:
        while not stop.is_set():
            if wake is not None:
                wake.clear()
            try:
                await work()
            except Exception:
                log.exception("%s failed; retrying", what)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(every):
                    await bell.wait()
            if wake is not None and wake.is_set() and settle and not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(settle):
                        await stop.wait()
    finally:
        if ringer is not None:
            ringer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ringer


async def _ring(stop: asyncio.Event, wake: asyncio.Event) -> None:
    """Set ``wake`` once ``stop`` is set: a round waiting on ``wake`` then ends at once."""
    await stop.wait()
    wake.set()
