"""the audit chain's head carries its entry's time (issue 50)

* ``audit_head.at``: the time of the entry the head names, moved with it. A chaining
  whose guessed head was moved by another process gets the head from the statement that
  missed, which waited for that head's lock: on PostgreSQL its snapshot does not see the
  other process's entry, but it sees the head row as that process left it, time included,
  so the entries are chained after it (times never run back) without reading anything
  again. Filled on upgrade from the entry the head names.

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from approvald.store.types import UTCDateTime

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("audit_head", schema=None) as batch_op:
        batch_op.add_column(sa.Column("at", UTCDateTime(timezone=True), nullable=True))
    op.execute("UPDATE audit_head SET at = (SELECT audit_log.at FROM audit_log "
               "WHERE audit_log.seq = audit_head.seq)")


def downgrade() -> None:
    with op.batch_alter_table("audit_head", schema=None) as batch_op:
        batch_op.drop_column("at")
