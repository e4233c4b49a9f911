"""approvals by the time they were asked: the queue's head and the newest, read by an index

* ``ix_approvals_requested_at_id``: the newest requests (an approver's Home reads its
  recent decisions among them) and the oldest of all, in ``approvals list --all``;
* ``ix_approvals_status_requested_at_id``: the oldest requests of a status (``approvals
  list``, pending by default), in order, without sorting every one of them.

Without them PostgreSQL read the whole table for each (``bench_history.py``'s plans): a
deployment's approvals grow with its history, not only with what waits.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-06
"""

from __future__ import annotations

from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("approvals") as batch:
        batch.create_index("ix_approvals_requested_at_id", ["requested_at", "id"])
        batch.create_index("ix_approvals_status_requested_at_id",
                           ["status", "requested_at", "id"])


def downgrade() -> None:
    with op.batch_alter_table("approvals") as batch:
        batch.drop_index("ix_approvals_status_requested_at_id")
        batch.drop_index("ix_approvals_requested_at_id")
