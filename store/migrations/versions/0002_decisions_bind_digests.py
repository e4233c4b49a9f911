"""decisions bind digests: votes per digest, editor, cancel requester, keyed audit

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from approvald.store.types import UTCDateTime

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # a vote counts for the exact arguments it was cast on: (approval, actor, digest)
    with op.batch_alter_table("approval_votes", schema=None, recreate="always") as batch_op:
        batch_op.drop_constraint("pk_approval_votes", type_="primary")
        batch_op.create_primary_key("pk_approval_votes", ["approval_id", "actor", "digest"])
    with op.batch_alter_table("approvals", schema=None) as batch_op:
        batch_op.add_column(sa.Column("edited_by", sa.String(length=200), nullable=True))
        batch_op.add_column(sa.Column("edited_at", UTCDateTime(timezone=True),
                                      nullable=True))
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("cancel_requested_by", sa.String(length=200),
                                      nullable=True))
        batch_op.add_column(sa.Column("cancel_reason", sa.Text(), nullable=True))
    with op.batch_alter_table("audit_log", schema=None) as batch_op:
        batch_op.add_column(sa.Column("key_id", sa.String(length=16), server_default="",
                                      nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("audit_log", schema=None) as batch_op:
        batch_op.drop_column("key_id")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("cancel_reason")
        batch_op.drop_column("cancel_requested_by")
    with op.batch_alter_table("approvals", schema=None) as batch_op:
        batch_op.drop_column("edited_at")
        batch_op.drop_column("edited_by")
    with op.batch_alter_table("approval_votes", schema=None, recreate="always") as batch_op:
        batch_op.drop_constraint("pk_approval_votes", type_="primary")
        batch_op.create_primary_key("pk_approval_votes", ["approval_id", "actor"])
