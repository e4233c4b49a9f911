"""The insights as a read model for the faces (issue 51): what the App Home and the web
review queue show an operator, the same figures and suggestions as ``approvald insights``.

Only the deployment's operators (``APPROVALD_OPERATORS``: Slack user ids) see them: who
is asked how often and who denies what is the operator's business, not every approver's.
The record is read from the verified audit chain (from its checkpoint, see
:mod:`runtime.record.audit_checkpoint`) and kept for ``max_age`` by the injected clock, so a
tab opened again and again does not read the chain again each time.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from approvald.runtime.insights import Insights
from approvald.runtime.kernel.clock import Clock
from approvald.runtime.record.history import ChainBroken, History

DEFAULT_WINDOW = timedelta(days=30)
DEFAULT_MAX_AGE = timedelta(minutes=5)


@dataclass(frozen=True)
class OperatorInsights:
    """What an operator's views draw: the insights of the window as of ``at``, or why the
    record was not read (``broken``: the audit chain does not verify)."""

    at: datetime
    window: str
    insights: Insights | None
    broken: list[str] = field(default_factory=list)


class InsightsBoard:
    """Computes the operators' insights, at most once per ``max_age``."""

    def __init__(self, clock: Clock, operators: Collection[str],
                 read: Callable[[timedelta], Awaitable[History]],
                 figure: Callable[[History, str], Insights], *,
                 window: timedelta = DEFAULT_WINDOW,
                 max_age: timedelta = DEFAULT_MAX_AGE) -> None:
        self.clock = clock
        self.operators = frozenset(operators)
        self._read = read
        self._figure = figure
        self.window = window
        self.max_age = max_age
        self._last: OperatorInsights | None = None

    def is_operator(self, viewer: str) -> bool:
        return viewer in self.operators

    async def for_viewer(self, viewer: str) -> OperatorInsights | None:
        """The insights, for an operator; None for anyone else."""
        if not self.is_operator(viewer):
            return None
        now = self.clock.now()
        last = self._last
        if last is not None and now - last.at < self.max_age:
            return last
        days = self.window / timedelta(days=1)
        window = f"{days:g} days"
        try:
            history = await self._read(self.window)
        except ChainBroken as exc:
            found = OperatorInsights(now, window, None, list(exc.problems))
        else:
            found = OperatorInsights(now, window, self._figure(history, window))
        self._last = found
        return found
