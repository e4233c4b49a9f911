"""declared paths recorded with every call; a paused adapter's calls sealed

* ``tool_executions.sensitive`` and ``external_requests.sensitive``: the JSON list of the
  argument paths the call's policy declared sensitive, resolved once when the call was
  made, so a call nobody was asked about (``auto``, ``notify_after``, a read) is masked
  wherever it is shown later, as a request is by its stored policy. Null for calls made
  before this revision (their declared paths are not known: the detectors still mask).
* Columns that hold what callers send become sealed (``SealedText``; see
  ``store/caller_data.py``): ``adapter_pauses.requests`` (the paused calls' exact
  arguments and the task), and those that hold errors, which may quote them:
  ``runs.wait_reason``, ``outbox.last_error``, ``approvals.reason``. The SQL type stays
  ``TEXT``; what changes is how values are written. With a data key set, the values
  already in the first three (few rows: paused adapters, waiting runs, failing
  deliveries) are sealed here; without one they stay as they are (like every sealed
  column without a key). ``approvald keys reseal`` seals the rest (``approvals.reason``
  of requests decided before, in batches, beside a running ``serve``).

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-08
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from approvald.store import types

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

# (table, its key, column): sealed here when a data key is set
REWRITTEN = (("adapter_pauses", "id", "requests"), ("runs", "id", "wait_reason"),
             ("outbox", "id", "last_error"))


def upgrade() -> None:  # nullable columns: no table rewrite on either database
    op.add_column("tool_executions", sa.Column("sensitive", sa.Text(), nullable=True))
    op.add_column("external_requests", sa.Column("sensitive", sa.Text(), nullable=True))
    _rewrite(seal=True)


def downgrade() -> None:
    _rewrite(seal=False)
    op.drop_column("external_requests", "sensitive")
    op.drop_column("tool_executions", "sensitive")


def _rewrite(*, seal: bool) -> None:
    """Seal the values stored in clear (``seal``), or open the sealed ones back (a
    downgrade: the older schema reads these columns as plain text)."""
    codec = types.codec()
    if codec is None:
        return
    conn = op.get_bind()
    for name, key, column in REWRITTEN:
        table = sa.table(name, sa.column(key), sa.column(column, sa.Text))
        where = f"{name}.{column}"
        rows = conn.execute(sa.select(table.c[key], table.c[column])
                            .where(table.c[column].is_not(None))).all()
        for row_key, stored in rows:
            opened = codec.open(stored, where)
            if seal and opened == stored:  # in clear: sealed now
                new = codec.seal(stored, where)
            elif not seal and opened != stored:
                new = opened
            else:
                continue
            conn.execute(sa.update(table).where(table.c[key] == row_key)
                         .values({column: new}))
