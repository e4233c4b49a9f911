"""waiting is not failing: run waits, attempt owners, delivery deadlines, thread claims, limits

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from approvald.store.types import UTCDateTime

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("wait_until", UTCDateTime(timezone=True),
                                      nullable=True))
        batch_op.add_column(sa.Column("wait_reason", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("failures", sa.Integer(), server_default="0",
                                      nullable=False))
    with op.batch_alter_table("tool_executions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("owner", sa.String(length=200), nullable=True))
        batch_op.add_column(sa.Column("heard_at", UTCDateTime(timezone=True),
                                      nullable=True))
    with op.batch_alter_table("outbox", schema=None) as batch_op:
        batch_op.add_column(sa.Column("give_up_at", UTCDateTime(timezone=True),
                                      nullable=True))
        batch_op.add_column(sa.Column("waits", sa.Integer(), server_default="0",
                                      nullable=False))
    with op.batch_alter_table("run_threads", schema=None) as batch_op:
        batch_op.alter_column("ts", existing_type=sa.String(length=40), nullable=True)
        batch_op.add_column(sa.Column("claimed_by", sa.String(length=200), nullable=True))
        batch_op.add_column(sa.Column("claimed_until", UTCDateTime(timezone=True),
                                      nullable=True))
        batch_op.add_column(sa.Column("next_attempt_at",
                                      UTCDateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("failures", sa.Integer(), server_default="0",
                                      nullable=False))
        batch_op.add_column(sa.Column("reposts", sa.Integer(), server_default="0",
                                      nullable=False))
    op.create_table(
        "limits",
        sa.Column("key", sa.String(length=120), nullable=False),
        sa.Column("tokens", sa.Float(), nullable=False),
        sa.Column("updated_at", UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_limits")),
    )


def downgrade() -> None:
    op.drop_table("limits")
    with op.batch_alter_table("run_threads", schema=None) as batch_op:
        for col in ("reposts", "failures", "next_attempt_at", "claimed_until", "claimed_by"):
            batch_op.drop_column(col)
        batch_op.alter_column("ts", existing_type=sa.String(length=40), nullable=False)
    with op.batch_alter_table("outbox", schema=None) as batch_op:
        batch_op.drop_column("waits")
        batch_op.drop_column("give_up_at")
    with op.batch_alter_table("tool_executions", schema=None) as batch_op:
        batch_op.drop_column("heard_at")
        batch_op.drop_column("owner")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("failures")
        batch_op.drop_column("wait_reason")
        batch_op.drop_column("wait_until")
