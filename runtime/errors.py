"""One root for every real failure approvald raises.

Control flow (a run pausing for approval, a lease held elsewhere) is returned as values
(see :mod:`runtime.outcomes`), never raised. What is raised here is a genuine error, with
structured fields so callers can report it in one line.
"""

from __future__ import annotations

from typing import Any

from approvald.store.errors import ApprovaldError, ConfigError, SchemaOutOfDate

__all__ = [
    "ApprovaldError", "AuditChainBroken", "ConfigError", "DecisionRefused", "DigestMismatch",
    "InvalidArguments", "LeaseLost", "ModelError", "ModelUnavailable", "NotFound",
    "PayloadTooLarge",
    "SchemaOutOfDate", "StateVersionError",
]


class NotFound(ApprovaldError):
    """An id (run, approval, agent) names nothing that exists."""


class StateVersionError(ApprovaldError):
    """Stored state has a schema version this code cannot read."""


class PayloadTooLarge(ApprovaldError):
    """A payload (tool arguments, tool result, task) exceeds the configured cap."""


class InvalidArguments(ApprovaldError):
    """Tool arguments fail the tool's schema."""

    def __init__(self, message: str, *, errors: list[dict[str, Any]], **kw: Any) -> None:
        super().__init__(message, **kw)
        self.errors = errors


class ModelError(ApprovaldError):
    """The model provider failed or answered something that is not a valid reply."""


class ModelUnavailable(ModelError):
    """The provider is busy or down (a rate limit, 5xx, a timeout): the run waits and tries
    again, ``retry_after`` seconds from now when the provider said so. Waiting is not
    failing (invariant 14)."""

    def __init__(self, message: str, *, retry_after: float | None = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.retry_after = retry_after


class LeaseLost(ApprovaldError):
    """Another worker took this run's lease; the current worker must stop writing."""


class DigestMismatch(ApprovaldError):
    """The call about to execute is not the call that was approved."""


class DecisionRefused(ApprovaldError):
    """A decision on an approval was refused; ``reason`` is a stable machine code.

    Codes: ``not_pending`` (decided, expired, superseded, cancelled), ``bad_token``,
    ``not_authorized``, ``self_approval``, ``already_voted``, ``invalid_arguments``,
    ``wrong_kind``.
    """

    def __init__(self, message: str, *, reason: str, status: str | None = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.reason = reason
        self.status = status


class AuditChainBroken(ApprovaldError):
    """The audit log's hash chain does not verify."""
