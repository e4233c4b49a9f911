"""An UPDATE inside a statement of several writes sets what it names, whichever path runs
it: SQLAlchemy's own execution (``APPROVALD_DB_FAST_PATH=0``) compiles with the execution
parameters' names and gives every UPDATE, one in a CTE too, a ``SET`` for each parameter
named like one of its table's columns (``store.repos.base.pinned``)."""

from __future__ import annotations

from approvald.store.models import Run, ToolExecution
from approvald.store.repos.base import pinned
from sqlalchemy import bindparam, select, update
from sqlalchemy.dialects import postgresql


def _set_clause(values: dict) -> str:
    x = ToolExecution.__table__
    ex = (update(x).where(x.c.call_id == bindparam("x_cid"))
          .values(values).returning(x.c.call_id).cte("ex"))
    stmt = select(Run.__table__.c.id).add_cte(ex)
    # the parameters of the run's own writes in the same statement: "step", "owner"
    sql = str(stmt.compile(dialect=postgresql.asyncpg.dialect(),
                           column_keys=["x_cid", "x_status", "step", "owner", "rid"]))
    return sql.split("UPDATE tool_executions SET ", 1)[1].split(" WHERE ", 1)[0]


def test_an_update_in_a_cte_sets_columns_named_by_other_writes_parameters_unless_pinned():
    named = {"status": bindparam("x_status")}
    assert "step=" in _set_clause(named) and "owner=" in _set_clause(named)  # the hazard
    pinned_set = _set_clause(pinned(ToolExecution.__table__, named))
    assert "step=tool_executions.step" in pinned_set
    assert "owner=tool_executions.owner" in pinned_set
    assert "status=$" in pinned_set
    assert "call_id=" not in pinned_set and "run_id=" not in pinned_set  # its key: never set
