"""SQLite: tell the query planner how approvals are spread (sqlite_stat1)

Without statistics SQLite guesses that an equality on the first column of any index
selects about as many rows as any other, and for "this run's pending requests" it picked
an index led by ``status``: the decision's wake of its run (``RunsRepo.wake_if_idle``)
then read every pending request in the database, ~1,100 VM instructions with 200 of
them against ~100 with one (issue 14's benchmarks). The rows below say what is true of
every approvald database: a run has a handful of requests, a status has many. Real
statistics (``ANALYZE``, ``PRAGMA optimize``) replace them, and rows already there are
kept. PostgreSQL keeps its own statistics; nothing changes there.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

# (index, stat): rows in the table, then rows per distinct value of each leading prefix
STATS = (
    ("ix_approvals_run_id_call_id", "100000 4 1"),
    ("ix_approvals_status_expires_at", "100000 20000 2"),
    ("ix_approvals_status_next_reminder_at", "100000 20000 2"),
)


def upgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    op.execute("ANALYZE sqlite_schema")  # creates sqlite_stat1 if it is not there yet
    for index, stat in STATS:
        op.get_bind().execute(sa.text(
            "INSERT INTO sqlite_stat1 (tbl, idx, stat) SELECT 'approvals', :idx, :stat "
            "WHERE NOT EXISTS (SELECT 1 FROM sqlite_stat1 WHERE idx = :idx)"),
            {"idx": index, "stat": stat})
    op.execute("ANALYZE sqlite_schema")  # this connection plans with them from now on


def downgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    for index, stat in STATS:
        op.get_bind().execute(sa.text(
            "DELETE FROM sqlite_stat1 WHERE idx = :idx AND stat = :stat"),
            {"idx": index, "stat": stat})
    op.execute("ANALYZE sqlite_schema")
