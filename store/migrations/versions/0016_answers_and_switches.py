"""a decided request answers the call that waited for it; faces switched off and on

* ``external_requests.answered_at``: when a call of the face that made the request was
  first told that it ended without its call running (denied, expired, forbidden...). A
  call made again before that is the one the decision answers; one made after it is
  asked about again.
* ``face_switches``: one row per face and form (``hook:claude-code``, ``command`` or
  ``http``) the operator switched off (``approvald hook disable``); ``hook enable``
  deletes it.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from approvald.store.types import UTCDateTime

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:  # a nullable column: no table rewrite on either database
    op.add_column("external_requests",
                  sa.Column("answered_at", UTCDateTime(timezone=True), nullable=True))
    op.create_table(
        "face_switches",
        sa.Column("face", sa.String(length=100), nullable=False),
        sa.Column("form", sa.String(length=20), nullable=False),
        sa.Column("off_at", UTCDateTime(timezone=True), nullable=False),
        sa.Column("off_by", sa.String(length=200), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("face", "form", name=op.f("pk_face_switches")),
    )


def downgrade() -> None:
    op.drop_table("face_switches")
    with op.batch_alter_table("external_requests") as batch:
        batch.drop_column("answered_at")
