"""the audit chain's verified-through checkpoint (issue 51)

* ``audit_checkpoint``: one row, the entry (seq, MAC) up to which a verify with the audit
  key last passed, MAC'd with that key: later reads of the record check only the entries
  after it (see :mod:`runtime.record.audit_checkpoint`).

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "audit_checkpoint",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.Column("key_id", sa.String(16), nullable=False),
        sa.Column("unkeyed_until", sa.Integer(), nullable=False),
        sa.Column("mac", sa.String(64), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("audit_checkpoint")
