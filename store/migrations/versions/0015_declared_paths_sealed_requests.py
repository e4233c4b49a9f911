"""declared paths recorded with every call; a paused adapter's calls sealed

* ``tool_executions.sensitive`` and ``external_requests.sensitive``: the JSON list of the
  argument paths the call's policy declared sensitive, resolved once when the call was
  made, so a call nobody was asked about (``auto``, ``notify_after``, a read) is masked
  wherever it is shown later, as a request is by its stored policy. Null for calls made
  before this revision (their declared paths are not known: the detectors still mask).
* ``adapter_pauses.requests`` becomes a sealed column (``SealedText``): it holds the
  paused calls' exact arguments and the task. The SQL type stays ``TEXT``; what changes is
  how values are written. With a data key set, the values already there are sealed here;
  without one they stay as they are (like every sealed column without a key), and
  ``approvald keys reseal`` seals them once a key is set.

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

COLUMN = "adapter_pauses.requests"
_PAUSES = sa.table("adapter_pauses", sa.column("id", sa.String), sa.column("requests", sa.Text))


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
    downgrade: the older schema reads the column as plain text)."""
    codec = types.codec()
    if codec is None:
        return
    conn = op.get_bind()
    for pause_id, stored in conn.execute(sa.select(_PAUSES.c.id, _PAUSES.c.requests)).all():
        opened = codec.open(stored, COLUMN)
        if seal and opened == stored:  # in clear: sealed now
            new = codec.seal(stored, COLUMN)
        elif not seal and opened != stored:
            new = opened
        else:
            continue
        conn.execute(sa.update(_PAUSES).where(_PAUSES.c.id == pause_id).values(requests=new))
