"""the web review queue's Sign in with Slack: the single-use ``state`` of each sign-in

* ``web_slack_states``: one row per sign-in with Slack begun in a browser. Only the
  SHA-256 of its ``state`` and the SHA-256 of the browser cookie it is bound to are
  stored; ``used_at`` is set once, by compare-and-set, when Slack sends the browser back.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from approvald.store.types import UTCDateTime

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "web_slack_states",
        sa.Column("id_hash", sa.String(length=64), nullable=False),
        sa.Column("browser_hash", sa.String(length=64), nullable=False),
        sa.Column("created_at", UTCDateTime(timezone=True), nullable=False),
        sa.Column("expires_at", UTCDateTime(timezone=True), nullable=False),
        sa.Column("used_at", UTCDateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id_hash", name=op.f("pk_web_slack_states")),
    )


def downgrade() -> None:
    op.drop_table("web_slack_states")
