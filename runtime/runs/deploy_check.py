"""The pre-deploy check: which waiting work would the agents about to be deployed strand?

A run's state survives a deploy, but its pending and approved calls were made for the
release it started on. Given the registry a new release would load, :func:`deploy_check`
lists every call of a run that has not ended (awaiting approval, needing attention, or
running, waiting included) that is still to run: pending requests and approved calls not
yet executed. A call *breaks* when the release the run would go on with could not run it:
the agent is gone or only retired releases of it remain, the tool is gone, or the tool's
schema no longer accepts the exact arguments (approved or asked for), or the tool is not
the one the call was asked about (its version or schema changed, and the new release does
not declare the approved version compatible: ``@tool(version=..., compatible=[...])``).
A call is *changed*
when it would run but under something else than it was asked under: the policy now puts
it in another band, or the agent's instructions changed. Breaks fail the check; changes
are listed for a person to read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from approvald.runtime.kernel.errors import NotFound
from approvald.runtime.policies.intake import Source
from approvald.runtime.policies.policy import ApprovalPolicy
from approvald.runtime.policies.tools import asked_identity
from approvald.runtime.runs.agent import Agent, Registry, definition_changed, run_version
from approvald.store.db import Database
from approvald.store.records import ApprovalRecord, ExecutionRecord, RunRecord

UNENDED = ("awaiting_approval", "needs_attention", "running")


@dataclass(frozen=True)
class Finding:
    """One call of a waiting run and what the new release would make of it."""

    run_id: str
    agent: str
    version: str  # the release the run started on
    approval_id: str
    call_id: str
    tool: str
    status: str  # the request's: pending, or approved (not yet run)
    breaks: bool  # the new release could not run it
    reason: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class DeployReport:
    findings: list[Finding] = field(default_factory=list)
    runs_checked: int = 0
    calls_checked: int = 0

    @property
    def breaks(self) -> list[Finding]:
        return [f for f in self.findings if f.breaks]

    @property
    def changes(self) -> list[Finding]:
        return [f for f in self.findings if not f.breaks]

    @property
    def ok(self) -> bool:
        return not self.breaks

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "runs_checked": self.runs_checked,
                "calls_checked": self.calls_checked,
                "breaks": [f.to_json() for f in self.breaks],
                "changes": [f.to_json() for f in self.changes]}


def calls_to_check(approvals: Sequence[ApprovalRecord],
                   executions: dict[str, ExecutionRecord]) -> list[ApprovalRecord]:
    """The requests of a run whose call is still to run: pending ones, and approved ones
    with no finished execution and no "cannot run" question about them yet (a person
    already answers for those)."""
    asked = {a.call_id for a in approvals if a.kind == "cannot_run"}
    out: list[ApprovalRecord] = []
    for a in approvals:
        if a.kind != "tool_call" or a.call_id in asked:
            continue
        done = executions.get(a.call_id)
        if a.status == "pending" or (a.status == "approved" and (
                done is None or done.status not in ("succeeded", "failed"))):
            out.append(a)
    return out


def judge(run: RunRecord, a: ApprovalRecord, registry: Registry) -> Finding | None:
    """What the release ``run`` would go on with under ``registry`` makes of ``a``'s call."""
    version = run_version(run)

    def finding(breaks: bool, reason: str) -> Finding:
        return Finding(run_id=run.id, agent=run.agent, version=version, approval_id=a.id,
                       call_id=a.call_id, tool=a.tool, status=a.status, breaks=breaks,
                       reason=reason)

    own = registry.version(run.agent, version)
    if own is not None:  # its own release is registered: the run finishes on it, on the
        # tools it registers now (changed under the same release name: asked about)
        why = own.cannot_run(a.tool, a.effective_args(), asked_identity(a))
        if why is None:
            return None
        return finding(True, why.replace("approved call", "pending call", 1)
                       if a.status == "pending" else why)
    try:
        agent: Agent = registry.get(run.agent)
    except NotFound as exc:
        return finding(True, f"{a.status} call `{a.tool}` cannot run: {exc}")
    why = agent.cannot_run(a.tool, a.effective_args(), asked_identity(a))
    if why is not None:
        if a.status == "pending":
            why = why.replace("approved call", "pending call", 1)
        return finding(True, why)
    tool = agent.tool(a.tool)
    assert tool is not None
    stored = ApprovalPolicy.from_snapshot(a.policy)
    name = Source.of_run(agent.name).policy_name(tool.name)
    now = registry.policy.for_call(name, tool.policy, tool.approval, a.effective_args())
    if now.kind != "approve_before":
        return finding(False, f"policy band changed: `{a.tool}` is now {now.kind} (the "
                              "stored request still decides this call)")
    if (now.approval.rule or None) != (stored.rule or None):
        return finding(False, f"policy band changed: `{a.tool}` now falls under "
                              f"{now.approval.rule or 'its own policy'}, not "
                              f"{stored.rule or 'its own policy'} (the stored request still "
                              "decides this call)")
    if agent.instructions_version != run.instructions_version:
        return finding(False, definition_changed(run, agent))
    return None


async def deploy_check(db: Database, registry: Registry) -> DeployReport:
    """Every waiting call that the agents in ``registry`` would strand or change."""
    report = DeployReport()
    async with db.read() as tx:
        runs = await tx.runs.with_status(UNENDED)
    for run in runs:
        async with db.read() as tx:
            approvals = await tx.approvals.for_run(run.id)
            executions = await tx.executions.for_run(run.id)
        report.runs_checked += 1
        for a in calls_to_check(approvals, executions):
            report.calls_checked += 1
            found = judge(run, a, registry)
            if found is not None:
                report.findings.append(found)
    return report
