"""the web review queue: anonymous refusals counted, and its tables pruned once expired

* ``web_refusal_counts``: refusals to someone the queue does not know, counted per
  minute, source and reason until the minute is folded into one audit entry per minute
  and source (and the rows deleted), instead of one hash-chained entry per request.
* ``expires_at`` indexed on ``web_links``, ``web_sessions`` and ``web_slack_states``:
  the retention job deletes their expired rows.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from approvald.store.types import UTCDateTime

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

EXPIRING = ("web_links", "web_sessions", "web_slack_states")


def upgrade() -> None:
    op.create_table(
        "web_refusal_counts",
        sa.Column("minute", UTCDateTime(timezone=True), nullable=False),
        sa.Column("source", sa.String(length=64), nullable=False),
        sa.Column("reason", sa.String(length=40), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("minute", "source", "reason",
                                name=op.f("pk_web_refusal_counts")),
    )
    for table in EXPIRING:
        op.create_index(op.f(f"ix_{table}_expires_at"), table, ["expires_at"])


def downgrade() -> None:
    for table in EXPIRING:
        op.drop_index(op.f(f"ix_{table}_expires_at"), table_name=table)
    op.drop_table("web_refusal_counts")
