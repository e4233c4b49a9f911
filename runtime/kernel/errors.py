"""One root for every real failure approvald raises.

Control flow (a run pausing for approval, a lease held elsewhere) is returned as values
(see :mod:`runtime.kernel.outcomes`), never raised. What is raised here is a genuine error, with
structured fields so callers can report it in one line.
"""

from __future__ import annotations

from enum import StrEnum
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


class Refusal(StrEnum):
    """Why a decision was refused: a stable code (the audit log's ``refused`` entries, the
    CLI's exit status, the replies people read, all key on it)."""

    NOT_PENDING = "not_pending"  # decided, expired and swept, superseded or cancelled
    EXPIRED = "expired"  # past its expiry, whether or not a sweep has run
    BAD_TOKEN = "bad_token"  # a button that belongs to no live request
    STALE_CARD = "stale_card"  # drawn for arguments since edited (or --digest names those)
    UNKNOWN_DIGEST = "unknown_digest"  # --digest names no version of the arguments
    NOT_AUTHORIZED = "not_authorized"  # not one of the request's approvers
    SELF_APPROVAL = "self_approval"  # the requester, where the policy does not allow it
    DIRECTORY_UNAVAILABLE = "directory_unavailable"  # group membership could not be read
    ALREADY_VOTED = "already_voted"  # the same approver, on the same arguments
    OWN_EDIT = "own_edit"  # a proposer approving their own proposal (edits = "propose")
    UNCHANGED = "unchanged"  # an edit to the arguments as they stand
    INVALID_ARGUMENTS = "invalid_arguments"  # an edit the tool's schema refuses
    RULE_CHANGED = "rule_changed"  # an edit into another rule's band
    REASON_REQUIRED = "reason_required"  # a denial (or an abort) without a reason
    REASON_TOO_LONG = "reason_too_long"
    GUIDANCE_REQUIRED = "guidance_required"  # a redirect without guidance
    GUIDANCE_TOO_LONG = "guidance_too_long"
    WRONG_KIND = "wrong_kind"  # a verdict that does not answer this kind of request


class DecisionRefused(ApprovaldError):
    """A decision on an approval was refused; ``reason`` says why (:class:`Refusal`)."""

    def __init__(self, message: str, *, reason: Refusal, status: str | None = None,
                 **kw: Any) -> None:
        super().__init__(message, **kw)
        self.reason = reason
        self.status = status


class AuditChainBroken(ApprovaldError):
    """The audit log's hash chain does not verify."""
