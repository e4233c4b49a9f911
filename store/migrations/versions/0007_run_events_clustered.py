"""run_events on SQLite: a table clustered on its primary key (WITHOUT ROWID)

A rowid table keeps each event twice in effect: the row, and again its key (run_id, seq)
in the primary key's own index. That index was ~120 bytes of every agent step, about a
tenth of the database (bench_checkpoint.py). Clustered on (run_id, seq), the key is
stored once and a run's transcript is read in one range of the table. PostgreSQL has no
such table kind; its schema is unchanged.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def _rebuild(*, with_rowid: bool) -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    op.create_table(
        "run_events_rebuilt",
        sa.Column("run_id", sa.String(length=32), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("v", sa.SmallInteger(), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_run_events_run_id_runs")),
        sa.PrimaryKeyConstraint("run_id", "seq", name=op.f("pk_run_events")),
        sqlite_with_rowid=with_rowid,
    )
    op.execute("INSERT INTO run_events_rebuilt (run_id, seq, step, v, body) "
               "SELECT run_id, seq, step, v, body FROM run_events")
    op.drop_table("run_events")
    op.rename_table("run_events_rebuilt", "run_events")


def upgrade() -> None:
    _rebuild(with_rowid=False)


def downgrade() -> None:
    _rebuild(with_rowid=True)
