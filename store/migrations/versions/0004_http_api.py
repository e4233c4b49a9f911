"""the HTTP API: bearer tokens (stored hashed) and requests for calls their callers run

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-10
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from approvald.store.types import UTCDateTime

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=60), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("webhook_url", sa.Text(), nullable=True),
        sa.Column("created_at", UTCDateTime(timezone=True), nullable=False),
        sa.Column("created_by", sa.String(length=200), nullable=False),
        sa.Column("revoked_at", UTCDateTime(timezone=True), nullable=True),
        sa.Column("revoked_by", sa.String(length=200), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_tokens")),
        sa.UniqueConstraint("name", name=op.f("uq_api_tokens_name")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_api_tokens_token_hash")),
    )
    op.create_table(
        "external_requests",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("token_id", sa.String(length=32), nullable=False),
        sa.Column("idempotency_key", sa.String(length=200), nullable=True),
        sa.Column("fingerprint", sa.String(length=64), nullable=False),
        sa.Column("tool", sa.String(length=100), nullable=False),
        sa.Column("args", sa.Text(), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("policy_name", sa.String(length=100), nullable=True),
        sa.Column("kind", sa.String(length=20), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("webhook_url", sa.Text(), nullable=True),
        sa.Column("decided_approval", sa.String(length=32), nullable=True),
        sa.Column("result_digest", sa.String(length=64), nullable=True),
        sa.Column("reported_at", UTCDateTime(timezone=True), nullable=True),
        sa.Column("created_at", UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["id"], ["runs.id"], name=op.f("fk_external_requests_id_runs")),
        sa.ForeignKeyConstraint(["token_id"], ["api_tokens.id"],
                                name=op.f("fk_external_requests_token_id_api_tokens")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_external_requests")),
        sa.UniqueConstraint("token_id", "idempotency_key",
                            name=op.f("uq_external_requests_token_id_idempotency_key")),
    )


def downgrade() -> None:
    op.drop_table("external_requests")
    op.drop_table("api_tokens")
