"""Agent releases (issue 38): a version per agent, recorded on each run; a retired release
finishes its runs; an approved call the deployed release cannot run is never executed nor
silently turned into an error; the pre-deploy check says which waiting calls would break."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from approvald.runtime.approvals.decide import Actor
from approvald.runtime.engine import Engine
from approvald.runtime.kernel.errors import ConfigError, DecisionRefused, NotFound
from approvald.runtime.models.scripted import ScriptedModel, reply
from approvald.runtime.policies.policy import PolicyFile
from approvald.runtime.policies.tools import Tool
from approvald.runtime.runs.agent import Agent, Registry
from approvald.runtime.runs.demo import DemoLedger, refund_agent, steps_agent
from approvald.store.db import Database
from approvald.store.models import AuditEntry
from sqlalchemy import select

from tests.conftest import ledger_lines
from tests.helpers import Rows

ALICE = Actor("U_ALICE", "slack")
TASK = "Refund order A-1001, customer was double charged"


def agent(name: str = "a", **kw: Any) -> Agent:
    return Agent(name=name, instructions="Say hi.", model=ScriptedModel.sequence([reply("hi")]),
                 tools=[], **kw)


def without(a: Agent, tool: str, version: str) -> Agent:
    return replace(a, version=version, tools=[t for t in a.tools if t.name != tool])


def test_the_default_version_is_the_digest_of_instructions_and_tools() -> None:
    a = agent()
    assert a.version == a.instructions_version
    assert agent(version="7").version == "7"
    with pytest.raises(ConfigError, match="version"):
        agent(version="x" * 65)


def test_the_digest_is_worked_out_once_and_follows_the_instructions() -> None:
    """Remembered per instructions text (issue 50): the same as working it out anew, and
    a changed text has its own digest."""
    from approvald.runtime.kernel.canonical import canonical_json, sha256_hex

    def fresh(a: Agent) -> str:
        return sha256_hex(canonical_json({
            "instructions": a.instructions,
            "tools": [{"name": s.name, "description": s.description,
                       "parameters": s.parameters} for s in a.tool_specs()]}))[:16]

    a = replace(refund_agent(DemoLedger(None)), version="1")
    first = a.instructions_version
    assert first == fresh(a) and a.instructions_version == first
    a.instructions = a.instructions + " Be brief."
    assert a.instructions_version == fresh(a) != first
    a.instructions = a.instructions[:-len(" Be brief.")]  # an equal text, another object
    assert a.instructions_version == first


def test_one_current_release_per_agent_and_retired_ones_beside_it() -> None:
    with pytest.raises(ConfigError, match="retired=True"):
        Registry([agent(version="1"), agent(version="2")])
    with pytest.raises(ConfigError, match="both version"):
        Registry([agent(version="1"), agent(version="1", retired=True)])
    r = Registry([agent(version="1", retired=True), agent(version="2")])
    assert r.get("a").version == "2" and r.names() == ["a"]
    assert r.version("a", "1") is not None and r.version("a", "3") is None
    only_old = Registry([agent(version="1", retired=True)])
    with pytest.raises(NotFound, match="retired"):
        only_old.get("a")


def test_an_approved_call_that_cannot_run_says_why(ledger_path: Path) -> None:
    a = refund_agent(DemoLedger(str(ledger_path)))
    args = {"order_id": "A-1", "amount_cents": 5, "reason": "x"}
    assert a.cannot_run("issue_refund", args) is None
    gone = without(a, "issue_refund", "2")
    assert gone.cannot_run("issue_refund", args) == (
        "approved call `issue_refund` cannot run on agent demo-refund v2: no such tool")
    why = a.cannot_run("issue_refund", {**args, "amount_cents": "lots"})
    assert why is not None and "amount_cents" in why and "no longer fit" in why


async def paused_run(engine: Engine) -> tuple[str, str]:
    outcome = await engine.run("demo-refund", TASK, requested_by="U_DANA")
    assert outcome.status == "awaiting_approval"
    [aid] = outcome.approval_ids  # type: ignore[attr-defined]
    return outcome.run_id, aid


async def audit_actions(db: Database, run_id: str) -> list[tuple[str, dict[str, Any]]]:
    async def actions(tx):  # type: ignore[no-untyped-def]
        rows = await tx.conn.execute(select(AuditEntry.action, AuditEntry.details)
                                     .where(AuditEntry.run_id == run_id).order_by(AuditEntry.seq))
        return [(r[0], json.loads(r[1]) if isinstance(r[1], str) else r[1]) for r in rows]

    return list(await Rows(db).in_one_read(actions))


async def test_a_removed_tool_asks_and_replan_hands_the_model_the_error(
        make_engine: Callable[..., Engine], db: Database, ledger_path: Path) -> None:
    ledger = DemoLedger(str(ledger_path))
    old = replace(refund_agent(ledger), version="1")
    run_id, aid = await paused_run(make_engine(agents=[old]))
    engine = make_engine(agents=[without(old, "issue_refund", "2")])
    report = await engine.deploy_check()
    assert not report.ok and [f.approval_id for f in report.breaks] == [aid]

    decision = await engine.decide(aid, actor=ALICE, verdict="approve")
    outcome = await engine.advance(decision.approval.run_id)
    assert outcome.status == "needs_attention"
    assert "demo-refund v2: no such tool" in outcome.reason  # type: ignore[attr-defined]
    assert [e["tool"] for e in ledger_lines(ledger_path)] == ["lookup_order"]
    [q] = [a for a in await Rows(db).approvals(run_id) if a.kind == "cannot_run"]
    # a question takes only its own answers, and a call request not this one
    with pytest.raises(DecisionRefused, match="replan"):
        await engine.decide(q.id, actor=ALICE, verdict="approve")
    actions = await audit_actions(db, run_id)
    [(_, details)] = [x for x in actions if x[0] == "not_executed"]
    assert details["reason"].endswith("no such tool") and details["question"] == q.id
    assert (await engine.deploy_check()).ok  # a person answers for it now

    await engine.decide(q.id, actor=ALICE, verdict="replan")
    outcome = await engine.advance(run_id)
    assert outcome.status == "completed"
    state = await engine.state(run_id)
    [seen] = [m.content for m in state.messages
              if getattr(m, "name", None) == "issue_refund" and m.role == "tool"]
    assert seen == {"status": "not_executed", "reason": details["reason"]}
    assert [e["tool"] for e in ledger_lines(ledger_path)] == ["lookup_order"]  # never ran


async def test_abort_cancels_the_run(make_engine: Callable[..., Engine], db: Database,
                                     ledger_path: Path) -> None:
    old = replace(refund_agent(DemoLedger(str(ledger_path))), version="1")
    run_id, aid = await paused_run(make_engine(agents=[old]))
    engine = make_engine(agents=[without(old, "issue_refund", "2")])
    await engine.decide(aid, actor=ALICE, verdict="approve")
    await engine.advance(run_id)
    [q] = [a for a in await Rows(db).approvals(run_id) if a.kind == "cannot_run"]
    await engine.decide(q.id, actor=ALICE, verdict="abort", reason="paid by hand")
    run = await Rows(db).run(run_id)
    assert run is not None and run.status == "cancelled"


async def test_the_retired_release_finishes_its_run_and_a_new_run_uses_the_new_one(
        make_engine: Callable[..., Engine], db: Database, ledger_path: Path) -> None:
    ledger = DemoLedger(str(ledger_path))
    old = replace(refund_agent(ledger), version="1")
    run_id, aid = await paused_run(make_engine(agents=[old]))
    new = without(old, "issue_refund", "2")
    engine = make_engine(agents=[new, replace(old, retired=True)])
    assert (await engine.deploy_check()).ok
    await engine.decide(aid, actor=ALICE, verdict="approve")
    assert (await engine.advance(run_id)).status == "completed"
    assert "issue_refund" in [e["tool"] for e in ledger_lines(ledger_path)]
    fresh = await engine.start_run("demo-refund", TASK, requested_by="U_DANA")
    started = await Rows(db).run(fresh)
    assert started is not None and started.agent_version == "2"


async def test_deploy_check_lists_changed_policy_and_instructions_without_failing(
        make_engine: Callable[..., Engine], db: Database, ledger_path: Path) -> None:
    ledger = DemoLedger(str(ledger_path))
    old = replace(refund_agent(ledger), version="1")
    run_id, aid = await paused_run(make_engine(agents=[old, steps_agent(ledger)]))
    reworded = replace(old, version="2", instructions=old.instructions + " Be brief.")
    report = await make_engine(agents=[reworded]).deploy_check()
    assert report.ok and report.runs_checked == 1
    [change] = report.changes
    assert change.approval_id == aid
    assert change.reason == (
        f"run {run_id} of agent demo-refund started on v1 (definition "
        f"{old.instructions_version}) and goes on with v2 (definition "
        f"{reworded.instructions_version}): the agent's instructions or its tools' names, "
        "descriptions or schemas changed since")
    relaxed = PolicyFile.model_validate({"tools": {"issue_refund": {"policy": "auto"}}})
    auto = make_engine(agents=[reworded], policy=relaxed)
    [change] = (await auto.deploy_check()).changes
    assert "policy band changed" in change.reason and "auto" in change.reason
    gone = await make_engine(agents=[steps_agent(ledger)]).deploy_check()
    [broken] = gone.breaks
    assert broken.run_id == run_id and "unknown agent 'demo-refund'" in broken.reason


async def test_a_tool_only_deploy_is_not_called_an_instructions_change(
        make_engine: Callable[..., Engine], db: Database, ledger_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    """Issue 48 item 7: after a deploy that changed only a tool, the run's warning said
    "started with instructions ff0c…; continuing with 926e…"."""
    old = refund_agent(DemoLedger(str(ledger_path)))
    run_id, aid = await paused_run(make_engine(agents=[old]))
    tools = [Tool(t.fn, name=t.name, description=t.description + " (v2)",
                  permission=t.permission) if t.name == "lookup_order" else t
             for t in old.tools]
    retooled = replace(old, tools=tools, version="")
    assert retooled.instructions == old.instructions
    assert retooled.instructions_version != old.instructions_version
    engine = make_engine(agents=[retooled])
    await engine.decide(aid, actor=ALICE, verdict="approve")
    with caplog.at_level("WARNING", logger="approvald"):
        await engine.advance(run_id)
    [said] = [r.getMessage() for r in caplog.records if run_id in r.getMessage()]
    assert "instructions " not in said.split(":")[0], said
    assert (f"started on definition {old.instructions_version} and goes on with definition "
            f"{retooled.instructions_version}") in said
