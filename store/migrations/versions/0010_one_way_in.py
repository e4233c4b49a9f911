"""one way in: token scopes, standing approvals bound to a source and a policy, the policy
in force

* ``api_tokens.tools``: the tools a token may ask about (a JSON list of names or globs);
  null for tokens made before scopes, which may ask about any tool, as they always could.
* ``standing_approvals.subject``: the source and tool it covers (``agent:NAME/TOOL``,
  ``api:TOKEN/TOOL``, ...), and ``policy_digest``: the digest of the resolved policy of
  the request it was granted on. Rows made before this revision have neither and so cover
  nothing from now on (standing approvals last at most eight hours).
* ``policy_in_force``: one row, the digest of the policy file the last process loaded, so
  that a process that loads a different one records the change in the audit log.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from approvald.store.types import UTCDateTime

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:  # nullable columns: no table rewrite on either database
    op.add_column("api_tokens", sa.Column("tools", sa.Text(), nullable=True))
    op.add_column("standing_approvals", sa.Column("subject", sa.String(length=300),
                                                  nullable=True))
    op.add_column("standing_approvals", sa.Column("policy_digest", sa.String(length=64),
                                                  nullable=True))
    op.create_index("ix_standing_approvals_subject_status", "standing_approvals",
                    ["subject", "status"])
    op.create_table(
        "policy_in_force",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("loaded_at", UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_policy_in_force")),
    )


def downgrade() -> None:
    op.drop_table("policy_in_force")
    op.drop_index("ix_standing_approvals_subject_status", table_name="standing_approvals")
    op.drop_column("standing_approvals", "policy_digest")
    op.drop_column("standing_approvals", "subject")
    op.drop_column("api_tokens", "tools")
