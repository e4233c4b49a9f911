"""``approvald eval``: a dataset of journeys run and scored, as the command line starts it
(the evals face is put together here, beside :mod:`bot.eval_report`, its report page; no
face imports another)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from approvald.bot.evals.dataset import Dataset, load_dataset
from approvald.bot.evals.evaluate import Report, evaluate, table
from approvald.runtime import Agent, PolicyFile
from approvald.store.db import Database

__all__ = ["load_dataset", "run_dataset", "table"]


async def run_dataset(dataset: Dataset, *, agents: Sequence[Agent],
                      databases: Callable[[], Awaitable[Database]], policy: PolicyFile,
                      ledger_path: str, agent_modules: str) -> Report:
    """``dataset`` run and scored, every journey on a database ``databases`` makes."""
    return await evaluate(dataset, agents=agents, databases=databases, policy=policy,
                          ledger_path=ledger_path, agent_modules=agent_modules)
