"""approvals.tool_version, approvals.tool_schema: the identity of the tool a call was asked about

An approval binds the tool's identity, not only its name and arguments (issue 46 item 7):
a request records the version of the tool it was made for (declared with
``@tool(version=...)``, by default a digest of the tool's code) and a digest of its
argument schema. A call whose tool changed identity since is not run: it becomes the
``cannot_run`` question, unless the new release declares the old version compatible.
Null for a caller's request (approvald does not run its code) and for every request made
before this migration (nothing to compare with: they run as they did).

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:  # nullable columns: no table rewrite on either database
    op.add_column("approvals", sa.Column("tool_version", sa.String(length=64), nullable=True))
    op.add_column("approvals", sa.Column("tool_schema", sa.String(length=64), nullable=True))


def downgrade() -> None:  # in place (SQLite >= 3.35): a rebuilt table would lose its stats
    op.drop_column("approvals", "tool_schema")
    op.drop_column("approvals", "tool_version")
