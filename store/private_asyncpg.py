"""Every use of asyncpg's private internals, in one place (issue 37).

One: a pooled connection's checkout check (``store/liveness.py``) replaces a connection
left inside a transaction nobody tracks (a cancellation SQLAlchemy did not see:
``tests/integration/test_db_cancel.py``). Besides asyncpg's public
``is_in_transaction()`` it looks at asyncpg's own record of a transaction it started
(``Connection._top_xact``).

Read with a default: were the name gone, the check would fall back to the public one
alone. ``tests/unit/test_private_apis.py`` fails on an asyncpg without it, so the gap is
seen before a release ships. asyncpg is optional (the ``postgres`` extra); versions: see
pyproject.toml.
"""

from __future__ import annotations

from importlib.metadata import version
from typing import Any

RELIES_ON: tuple[tuple[str, str], ...] = (("asyncpg.connection.Connection", "_top_xact"),)


def dependency() -> str:
    """The dependency this module reaches into, with its installed version."""
    return f"asyncpg {version('asyncpg')}"


def missing() -> list[str]:
    """The names of :data:`RELIES_ON` the installed asyncpg lacks (none: all there)."""
    from asyncpg.connection import Connection  # type: ignore[import-untyped]

    return [f"{what}.{name}" for what, name in RELIES_ON if not hasattr(Connection, name)]


def untracked_transaction(driver: Any) -> bool:
    """Whether asyncpg holds a transaction object on ``driver`` (an asyncpg connection)."""
    return getattr(driver, "_top_xact", None) is not None
