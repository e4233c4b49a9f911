"""agent releases: the release of its agent a run started on

* ``runs.agent_version``: ``Agent.version`` when the run started, so a process that
  registers the previous release beside the new one finishes the run on the code it
  started on. Null for runs started before this revision: their release is their
  ``instructions_version`` (the default version is that digest).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:  # a nullable column: no table rewrite on either database
    op.add_column("runs", sa.Column("agent_version", sa.String(length=64), nullable=True))


def downgrade() -> None:
    op.drop_column("runs", "agent_version")
