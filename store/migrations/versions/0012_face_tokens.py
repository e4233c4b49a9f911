"""face tokens: a bearer token scoped to one face, its calls made for one person

* ``api_tokens.face``: the one face a token may call (``hook:claude-code`` for
  ``POST /v1/hooks/claude-code``); null for the /v1 API's tokens, which keep their tools.
* ``api_tokens.requested_by``: the Slack user a face token's calls are made for, fixed
  when the token is made (a caller never names its own requester).

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:  # nullable columns: no table rewrite on either database
    op.add_column("api_tokens", sa.Column("face", sa.String(length=100), nullable=True))
    op.add_column("api_tokens", sa.Column("requested_by", sa.String(length=200),
                                          nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("api_tokens") as batch:
        batch.drop_column("requested_by")
        batch.drop_column("face")
