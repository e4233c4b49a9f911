"""standing approvals: "approve this and calls like it for a while"

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from approvald.store.types import UTCDateTime

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "standing_approvals",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("tool", sa.String(length=100), nullable=False),
        sa.Column("scope", sa.Text(), nullable=False),
        sa.Column("rule", sa.Text(), nullable=True),
        sa.Column("approvers", sa.Text(), nullable=False),
        sa.Column("quorum", sa.SmallInteger(), nullable=False),
        sa.Column("allow_self_approval", sa.Boolean(), nullable=False),
        sa.Column("grants", sa.Text(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("granted_on", sa.String(length=32), nullable=False),
        sa.Column("uses", sa.Integer(), nullable=False),
        sa.Column("created_at", UTCDateTime(timezone=True), nullable=False),
        sa.Column("expires_at", UTCDateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", UTCDateTime(timezone=True), nullable=True),
        sa.Column("revoked_by", sa.String(length=200), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_standing_approvals")),
    )
    op.create_index("ix_standing_approvals_tool_status", "standing_approvals",
                    ["tool", "status"])


def downgrade() -> None:
    op.drop_index("ix_standing_approvals_tool_status", table_name="standing_approvals")
    op.drop_table("standing_approvals")
