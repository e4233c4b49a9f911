"""What the runtime reports about itself, for whoever exports it (``bot/metrics.py``
turns it into Prometheus metrics). The runtime only calls these methods; the default
meter drops everything, so the runtime depends on no metrics library.

Events (names are the exporter's contract):

* ``decision(outcome, seconds)``: a decision attempt and how long recording it took;
  ``outcome`` is approved / denied / redirected / voted / edited / ... or
  ``refused:<reason>``;
* ``tool_started(seconds)``: a decided run reached its approved call, this long after
  the decision that resumed it was recorded in this process (click -> tool start);
* ``expired(n)``, ``escalated(n)``, ``reminded(n)``: what an expiry sweep settled;
* ``lease_taken_over(n)``: runs whose previous worker's lease had lapsed (it expired, or
  its owner's process is gone) and that this process took over;
* ``data_key_refused()``: a sealed value this process could not open (it lacks the key,
  or the value does not open under it).
"""

from __future__ import annotations

import time
from collections import OrderedDict


class Meter:
    """Drops everything; subclass and override what you export."""

    def decision(self, outcome: str, seconds: float) -> None:
        pass

    def tool_started(self, seconds: float) -> None:
        pass

    def expired(self, n: int) -> None:
        pass

    def escalated(self, n: int) -> None:
        pass

    def reminded(self, n: int) -> None:
        pass

    def lease_taken_over(self, n: int) -> None:
        pass

    def data_key_refused(self) -> None:
        pass


class DecidedRuns:
    """When each run was decided in this process, until it reaches its call (bounded)."""

    def __init__(self, keep: int = 10_000) -> None:
        self.keep = keep
        self._at: OrderedDict[str, float] = OrderedDict()

    def decided(self, run_id: str) -> None:
        self._at[run_id] = time.monotonic()
        self._at.move_to_end(run_id)
        while len(self._at) > self.keep:
            self._at.popitem(last=False)

    def reached(self, run_id: str) -> float | None:
        """Seconds since the run was decided here, once; None if it was not."""
        at = self._at.pop(run_id, None)
        return None if at is None else time.monotonic() - at

    def forget(self, run_id: str) -> None:
        """The run went on without reaching a decided call (a denial, say): its mark goes,
        or every such run would stay until ``keep`` pushed it out."""
        self._at.pop(run_id, None)

    def __len__(self) -> int:
        return len(self._at)
