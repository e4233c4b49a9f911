"""framework adapters: the state a paused LangGraph, Pydantic AI or OpenAI Agents run
resumes from, beside the external requests it waits for

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-20
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from approvald.store.types import UTCDateTime

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "adapter_pauses",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("framework", sa.String(length=32), nullable=False),
        sa.Column("key", sa.String(length=200), nullable=False),
        sa.Column("requested_by", sa.String(length=200), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("requests", sa.Text(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("outcome", sa.Text(), nullable=True),
        sa.Column("created_at", UTCDateTime(timezone=True), nullable=False),
        sa.Column("resumed_at", UTCDateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_adapter_pauses")),
        sa.UniqueConstraint("framework", "key", name=op.f("uq_adapter_pauses_framework_key")),
    )
    op.create_index("ix_adapter_pauses_status", "adapter_pauses", ["status"])


def downgrade() -> None:
    op.drop_index("ix_adapter_pauses_status", table_name="adapter_pauses")
    op.drop_table("adapter_pauses")
