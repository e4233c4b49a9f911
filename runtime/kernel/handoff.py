"""The run rows decisions in this process leased, handed to the runner that advances the
run under that lease: it starts from the row the decision's own statement returned
instead of reading the run again (issue 50).

A row is handed once, and only while it can still be the run as it stands: the lease it
was returned with is this process's, and little time has passed since (less than half a
lease by this process's clock, the one the decision stamped the row's ``updated_at``
with). Past that the lease may have lapsed and the run moved on elsewhere, and the runner
reads it as it did before. Everything the runner then writes is fenced by the lease all
the same (the call's intent, every checkpoint), so a row handed here can at worst cost a
step that does not commit, never a call run twice.
"""

from __future__ import annotations

from collections import OrderedDict
from datetime import datetime, timedelta

from approvald.store.records import RunRecord


class LeasedRuns:
    """Run rows by the lease id a decision leased them under (bounded: a lease given back
    unused, say, is forgotten in time)."""

    def __init__(self, keep: int = 1024) -> None:
        self.keep = keep
        self._rows: OrderedDict[str, RunRecord] = OrderedDict()

    def put(self, claim: str, run: RunRecord) -> None:
        self._rows[claim] = run
        while len(self._rows) > self.keep:
            self._rows.popitem(last=False)

    def take(self, claim: str, *, now: datetime, fresh_for: timedelta) -> RunRecord | None:
        """The row leased under ``claim``, once, if it was leased less than ``fresh_for``
        ago and under that lease; else None (read the run)."""
        run = self._rows.pop(claim, None)
        if run is None or run.lease_owner != claim or run.status != "running" \
                or now - run.updated_at >= fresh_for:
            return None
        return run
