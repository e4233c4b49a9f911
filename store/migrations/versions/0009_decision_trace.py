"""approvals.decision_trace: the trace context of the span that recorded a decision

With tracing on, a decision stores its span's W3C ``traceparent`` with the request, so a
run resumed by another process (the deciding replica died, or the decision came from a
process that does not advance runs) links its step to the click that resolved the call.
Null when tracing was off, and for every request decided before this migration.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:  # a nullable column: no table rewrite on either database
    op.add_column("approvals", sa.Column("decision_trace", sa.String(length=200),
                                         nullable=True))


def downgrade() -> None:  # in place (SQLite >= 3.35): a rebuilt table would lose its stats
    op.drop_column("approvals", "decision_trace")
