"""a request's tool name and policy name are text: a gateway's read is named by its URI

An MCP gateway's resource read is a request named ``resource:<URI>`` (and its policy name
``mcp:<gateway>/resource:<URI>``); the URI is the caller's, and a server's template takes
values of any length, so a name of 100 characters refused URIs longer than about 90 on
PostgreSQL. Every column that holds such a name becomes text: ``tool_executions.tool``,
``approvals.tool``, ``external_requests.tool`` and ``policy_name``,
``standing_approvals.tool`` and ``subject``. The intake bounds a name (2,048 bytes, within
a PostgreSQL index entry: standing approvals are indexed by tool and by subject).

SQLite enforces no length: only the declared types are rewritten (one schema on both), in
its schema table, as SQLite documents for a change that leaves every stored row as it is
(VARCHAR and TEXT have the same affinity). No table is rebuilt, so the rows that reference
them and the query planner's statistics (``sqlite_stat1``, see 0008) stay as they are.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

COLUMNS = (("tool_executions", "tool", 100, False), ("approvals", "tool", 100, False),
           ("external_requests", "tool", 100, False),
           ("external_requests", "policy_name", 100, True),
           ("standing_approvals", "tool", 100, False),
           ("standing_approvals", "subject", 300, True))


def _sqlite_declare(old: str, new: str) -> None:
    bind = op.get_bind()
    version = bind.execute(sa.text("PRAGMA schema_version")).scalar_one()
    bind.execute(sa.text("PRAGMA writable_schema = ON"))
    for table, column, length, _ in COLUMNS:
        # a column after a tab, as SQLAlchemy writes CREATE TABLE, or after ", " as
        # SQLite appends one ALTER TABLE ADD COLUMN added (standing_approvals.subject)
        for lead in ("\t", ", "):
            before, after = (f"{lead}{column} {t.format(length)}" for t in (old, new))
            bind.execute(sa.text("UPDATE sqlite_master SET sql = replace(sql, :b, :a) "
                                 "WHERE type = 'table' AND name = :table"),
                         {"b": before, "a": after, "table": table})
    bind.execute(sa.text(f"PRAGMA schema_version = {int(version) + 1}"))
    bind.execute(sa.text("PRAGMA writable_schema = OFF"))


def upgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        _sqlite_declare("VARCHAR({})", "TEXT")
        return
    for table, column, length, nullable in COLUMNS:
        op.alter_column(table, column, type_=sa.Text(), existing_type=sa.String(length),
                        existing_nullable=nullable)


def downgrade() -> None:  # a longer name than the old column holds is cut to fit
    for table, column, length, _ in COLUMNS:
        op.execute(sa.text(f"UPDATE {table} SET {column} = substr({column}, 1, {length}) "
                           f"WHERE length({column}) > {length}"))
    if op.get_bind().dialect.name == "sqlite":
        _sqlite_declare("TEXT", "VARCHAR({})")
        return
    for table, column, length, nullable in COLUMNS:
        op.alter_column(table, column, type_=sa.String(length), existing_type=sa.Text(),
                        existing_nullable=nullable)
