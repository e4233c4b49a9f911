"""the run-thread follower's poll reads what can be behind, by index (issue 50)

* ``ix_runs_updated_at_agent``: the runs updated since the follower began, among them those
  still without a thread;
* ``ix_run_threads_unsettled`` (partial): the threads still unposted or not yet told a
  final status, the only ones that can be behind (a run in a final status never moves).

Without them every poll (every half second, on every replica) read every run in history
with its thread and an audit probe: milliseconds per poll at a few thousand runs, and each
reader connection's page cache filled with the whole table.

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None

UNSETTLED = "ts IS NULL OR posted_status NOT IN ('completed', 'failed', 'cancelled')"


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.create_index("ix_runs_updated_at_agent", ["updated_at", "agent"])
    op.create_index("ix_run_threads_unsettled", "run_threads", ["run_id"],
                    sqlite_where=sa.text(UNSETTLED), postgresql_where=sa.text(UNSETTLED))


def downgrade() -> None:
    op.drop_index("ix_run_threads_unsettled", table_name="run_threads")
    with op.batch_alter_table("runs") as batch:
        batch.drop_index("ix_runs_updated_at_agent")
