"""What the parts of one process tell each other, as it happens: a run can be advanced, a
request was opened, outbox rows were committed, and a run this process decided was leased
to it. Other processes learn the same facts from the database (by polling, or by
PostgreSQL NOTIFY, which ``serve`` forwards to these signals)."""

from __future__ import annotations

from collections.abc import Callable


class Signals:
    """Listeners by kind; the parts call ``notify_*`` after their transaction committed."""

    def __init__(self) -> None:
        self._ready: list[Callable[[str], None]] = []
        self._opened: list[Callable[[str], None]] = []
        self._outbox: list[Callable[[], None]] = []
        # a worker here that advances a run decided here under the lease the decision took
        self._taker: Callable[[str, str], None] | None = None

    def on_ready(self, fn: Callable[[str], None]) -> None:
        """Call ``fn(run_id)`` when this process learns a run can be advanced."""
        self._ready.append(fn)

    def on_opened(self, fn: Callable[[str], None]) -> None:
        """Call ``fn(approval_id)`` when this process opens an approval request."""
        self._opened.append(fn)

    def on_outbox(self, fn: Callable[[], None]) -> None:
        """Call ``fn()`` when this process has committed outbox rows (deliver them now)."""
        self._outbox.append(fn)

    def take_decided(self, fn: Callable[[str, str], None] | None) -> None:
        """``fn(run_id, lease_id)`` advances a run this process decided, under the lease
        its decision took in the same transaction (a running resume worker registers
        this, and None when it stops)."""
        self._taker = fn

    @property
    def takes_decided(self) -> bool:
        return self._taker is not None

    def notify_ready(self, run_id: str) -> None:
        for fn in self._ready:
            fn(run_id)

    def notify_opened(self, approval_id: str) -> None:
        for fn in self._opened:
            fn(approval_id)

    def notify_outbox(self) -> None:
        for fn in self._outbox:
            fn()

    def decided(self, run_id: str, claim: str | None) -> None:
        """A decision made this run ready: advance it here under ``claim`` (the lease the
        decision took) if a worker takes decided runs, else announce it."""
        if claim is not None and self._taker is not None:
            self._taker(run_id, claim)
        else:
            self.notify_ready(run_id)
