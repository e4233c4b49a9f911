"""run threads tell a run's audit entries: who was asked, reminded, escalated to, who voted

* ``run_threads.told_audit``: the audit log's seq up to which the run's entries are told
  in its thread (requests, reminders, escalations, votes, decisions, executions, retries).
  Threads that exist already start at the log's head: their past is not told again.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("run_threads") as batch:
        batch.add_column(sa.Column("told_audit", sa.Integer(), nullable=False,
                                   server_default="0"))
    op.execute("UPDATE run_threads SET told_audit = "
               "(SELECT COALESCE(MAX(seq), 0) FROM audit_log)")


def downgrade() -> None:
    with op.batch_alter_table("run_threads") as batch:
        batch.drop_column("told_audit")
