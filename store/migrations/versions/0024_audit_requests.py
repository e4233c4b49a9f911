"""the requests on the record kept folded (issue 51)

* ``audit_requests``: one row per request on the audit record (its first entry's seq), the
  request as folded from its entries so far, MAC'd with the audit key;
* ``audit_fold``: one row, the entry through which they are folded and how many entries
  they fold, MAC'd with the key.

The policy replay and the insights read these rows instead of folding every entry of
their window again, and fold only the entries after ``through`` (see
:mod:`runtime.record.history_fold`). Both start empty: the first read with the audit key
folds the whole chain (as every read did before) and fills them, since the MACs need the
key, which is never in the database.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "audit_requests",
        sa.Column("seq", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("folded", sa.Integer(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("key_id", sa.String(16), nullable=False),
        sa.Column("mac", sa.String(64), nullable=False),
    )
    op.create_table(
        "audit_fold",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("through", sa.Integer(), nullable=False),
        sa.Column("folded", sa.Integer(), nullable=False),
        sa.Column("unkeyed_until", sa.Integer(), nullable=False),
        sa.Column("key_id", sa.String(16), nullable=False),
        sa.Column("mac", sa.String(64), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("audit_fold")
    op.drop_table("audit_requests")
