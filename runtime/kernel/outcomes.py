"""What advancing a run returned. Control flow, not errors."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime


@dataclass(frozen=True)
class Outcome:
    """Where a run stands after a worker stopped advancing it."""

    run_id: str
    status: str

    @property
    def ok(self) -> bool:
        return True


@dataclass(frozen=True)
class Completed(Outcome):
    result: str | None = None


@dataclass(frozen=True)
class Paused(Outcome):
    """Waiting for humans: the run is durable and no process needs to stay alive."""

    approval_ids: tuple[str, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class NeedsAttention(Outcome):
    call_id: str = ""
    reason: str = ""


@dataclass(frozen=True)
class Failed(Outcome):
    error: str = ""

    @property
    def ok(self) -> bool:
        return False


@dataclass(frozen=True)
class Cancelled(Outcome):
    pass


@dataclass(frozen=True)
class Busy(Outcome):
    """Another worker holds the run's lease; this one backed off."""

    holder: str | None = None


@dataclass(frozen=True)
class Waiting(Outcome):
    """The run waits until ``until`` (a rate limit, an outage, a backoff after an error, a
    slot to free up); it is durable and any process resumes it then."""

    until: datetime | None = None
    reason: str = ""


@dataclass(frozen=True)
class Yielded(Outcome):
    """The worker was asked to stop; the run is left at a clean boundary for anyone to resume."""
