"""the web review queue: single-use sign-in links and sessions, both stored hashed

* ``web_links``: a sign-in link mailed to an approver. Only the SHA-256 of its token is
  stored (the token itself is derived from the row's id and the deployment's secret when
  the mail is sent); ``used_at`` is set once, by compare-and-set.
* ``web_sessions``: a signed-in browser. Only the SHA-256 of the session id is stored.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from approvald.store.types import UTCDateTime

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "web_links",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("user_id", sa.String(length=200), nullable=False),
        sa.Column("email", sa.String(length=320), nullable=False),
        sa.Column("created_at", UTCDateTime(timezone=True), nullable=False),
        sa.Column("expires_at", UTCDateTime(timezone=True), nullable=False),
        sa.Column("used_at", UTCDateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_web_links")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_web_links_token_hash")),
    )
    op.create_index(op.f("ix_web_links_user_id"), "web_links", ["user_id"])
    op.create_table(
        "web_sessions",
        sa.Column("id_hash", sa.String(length=64), nullable=False),
        sa.Column("user_id", sa.String(length=200), nullable=False),
        sa.Column("created_at", UTCDateTime(timezone=True), nullable=False),
        sa.Column("expires_at", UTCDateTime(timezone=True), nullable=False),
        sa.Column("ended_at", UTCDateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id_hash", name=op.f("pk_web_sessions")),
    )


def downgrade() -> None:
    op.drop_table("web_sessions")
    op.drop_index(op.f("ix_web_links_user_id"), table_name="web_links")
    op.drop_table("web_links")
