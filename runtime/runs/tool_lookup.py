"""The tool an approval is about: the run's agent's tool, or, for a call its caller runs
itself (an external request), a :class:`runtime.runs.external.CallerTool` named by its source's
policy name, over the operator's default (edits of it are judged by today's rules)."""

from __future__ import annotations

from approvald.runtime.kernel.errors import NotFound
from approvald.runtime.kernel.ids import is_external
from approvald.runtime.policies.intake import Intake, Source
from approvald.runtime.policies.tools import Tool
from approvald.runtime.runs.agent import Registry
from approvald.runtime.runs.external import CallerTool
from approvald.store.db import Database
from approvald.store.records import ApprovalRecord


class ToolLookup:
    def __init__(self, db: Database, registry: Registry, intake: Intake) -> None:
        self.db = db
        self.registry = registry
        self.intake = intake

    async def __call__(self, a: ApprovalRecord) -> Tool:
        async with self.db.read() as tx:
            run = await tx.runs.get(a.run_id)
            rec = await tx.external.get(a.run_id) if is_external(a.run_id) else None
        if run is None:
            raise NotFound(f"no run {a.run_id}", run_id=a.run_id)
        if is_external(run.id):  # a call its caller runs: no agent defines the tool
            if rec is None:
                raise NotFound(f"no request {run.id}", run_id=run.id)
            source = Source.of_run(run.agent)
            kind, base = self.intake.base(source)
            return CallerTool(rec.tool, source.policy_name(rec.tool), kind, base)
        tool = self.registry.get(run.agent).tool(a.tool)
        if tool is None:
            raise NotFound(f"agent {run.agent!r} no longer defines tool {a.tool!r}",
                           approval_id=a.id, run_id=a.run_id)
        return tool
