"""The root of approvald's error hierarchy lives at the bottom layer so every layer can use it.

:mod:`runtime.kernel.errors` re-exports these and adds the runtime's own.
"""

from __future__ import annotations

from typing import Any


class ApprovaldError(Exception):
    """Root of approvald's errors. ``str(err)`` is a one-line, user-facing message."""

    def __init__(
        self,
        message: str,
        *,
        run_id: str | None = None,
        approval_id: str | None = None,
        **fields: Any,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.run_id = run_id
        self.approval_id = approval_id
        self.fields = fields

    def __str__(self) -> str:
        return self.message


class ConfigError(ApprovaldError):
    """A setting, policy file or agent definition is missing or malformed."""


class SchemaOutOfDate(ApprovaldError):
    """The database schema is older or newer than this code's migrations."""


class KeyTaken(Exception):
    """A request answered at once was not inserted, in the statement that chains its audit
    entries: its token has a request under its idempotency key, or the token was revoked
    meanwhile (the transaction rolls back; the caller tells which)."""


class NothingWritten(Exception):
    """A write sent alone (one statement, in autocommit: ``Database.write_one``) found that
    what it was written under no longer holds (the chain's head it guessed moved, a key
    taken, a token revoked, a kept call reported) and wrote nothing at all: the statement
    failed whole, or was never sent. The caller writes it again as a transaction
    (``Database.transact_one`` does)."""
