"""Apply the shipped alembic migrations to a database, programmatically.

Every command that touches the database calls :func:`ensure_schema` first: an empty or
older database is upgraded (and the caller told so), a database newer than this code is
refused. On PostgreSQL an advisory lock keeps replicas starting together from racing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from approvald.store.db import Database
from approvald.store.errors import SchemaOutOfDate
from sqlalchemy import inspect, text
from sqlalchemy.engine import Connection

if TYPE_CHECKING:
    from alembic.config import Config

_HERE = Path(__file__).resolve().parent
_LOCK_KEY = 0x617070726F76  # "approv"


def alembic_config() -> Config:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(_HERE / "migrations"))
    return cfg


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


@dataclass(frozen=True)
class UpgradeResult:
    before: str | None
    after: str

    @property
    def changed(self) -> bool:
        return self.before != self.after


def _current(conn: Connection) -> str | None:
    if not inspect(conn).has_table("alembic_version"):
        return None
    row = conn.execute(text("SELECT version_num FROM alembic_version")).first()
    return None if row is None else str(row[0])


def _upgrade(conn: Connection) -> UpgradeResult:
    from alembic import command
    from alembic.script import ScriptDirectory

    known = {s.revision for s in ScriptDirectory.from_config(alembic_config()).walk_revisions()}
    before = _current(conn)
    if before is not None and before not in known:
        raise SchemaOutOfDate(
            f"the database is at schema revision {before}, which this approvald does not know "
            "(it was written by a newer version); upgrade approvald"
        )
    if before != head_revision():
        cfg = alembic_config()
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")
    return UpgradeResult(before=before, after=head_revision())


# the newest revision this code ships; a test keeps it equal to alembic's head
HEAD = "0026"


async def upgrade(db: Database) -> UpgradeResult:
    """Bring the schema to the newest revision; idempotent and safe to race."""
    async with db.connection() as conn:
        # fast path without importing alembic: already at head
        current = await conn.run_sync(_current)
        await conn.commit()
        if current == HEAD:
            return UpgradeResult(before=current, after=current)
        if db.dialect == "postgresql":
            await conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": _LOCK_KEY})
            await conn.commit()
        try:
            result: UpgradeResult = await conn.run_sync(_upgrade)
            await conn.commit()
        finally:
            if db.dialect == "postgresql":
                await conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _LOCK_KEY})
                await conn.commit()
    return result


async def current_revision(db: Database) -> str | None:
    async with db.connection() as conn:
        rev: str | None = await conn.run_sync(_current)
        return rev


def compare(conn: Connection) -> list[Any]:
    """Differences between the live schema and the models (empty when they agree)."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext
    from approvald.store.models import Base

    ctx = MigrationContext.configure(conn, opts={"compare_type": True})
    diffs: list[Any] = compare_metadata(ctx, Base.metadata)
    return diffs
