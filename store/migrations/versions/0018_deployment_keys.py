"""keys a deployment generated for itself

* ``deployment_keys``: a key made once per database where the operator set none (the key
  of the bindings shown outside the database, when no ``APPROVALD_SECRET`` is set), so
  that every process on the database shows the same bindings.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from approvald.store.types import UTCDateTime

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "deployment_keys",
        sa.Column("name", sa.String(length=40), nullable=False),
        sa.Column("secret", sa.String(length=64), nullable=False),
        sa.Column("created_at", UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_deployment_keys")),
    )


def downgrade() -> None:
    op.drop_table("deployment_keys")
