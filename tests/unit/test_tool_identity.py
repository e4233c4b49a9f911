"""Issue 46 item 7: an approval binds the tool's identity (name, schema and version), not
only its name and arguments. ``pay(amount=500)`` approved on release 1, whose code reads
cents, ran on release 2, whose schema is the same but whose code reads dollars: 50,000
cents paid, no question asked. A call whose tool changed identity is the ``cannot_run``
question, unless the new release declares the approved version compatible; the pre-deploy
check lists it first."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from approvald.runtime.approvals.decide import Actor
from approvald.runtime.engine import Engine
from approvald.runtime.kernel.errors import ConfigError
from approvald.runtime.models.scripted import ScriptedModel, reply
from approvald.runtime.policies.tools import Tool, ToolIdentity, code_version, tool
from approvald.runtime.runs.agent import Agent
from approvald.store.db import Database

from tests.helpers import Rows

ALICE = Actor("U_ALICE", "slack")
PAID: list[int] = []  # cents that left the account


@tool(permission="execute")
async def pay_in_cents(amount: int) -> str:
    """Pay an amount."""
    PAID.append(amount)
    return f"paid {amount} cents"


@tool(permission="execute")
async def pay_in_dollars(amount: int) -> str:
    """Pay an amount."""
    PAID.append(amount * 100)
    return f"paid {amount} dollars"


def release(pay: Tool, version: str) -> Agent:
    named = Tool(pay.fn, name="pay", description="Pay an amount.", permission="execute",
                 version=None if pay.version.startswith("code:") else pay.version,
                 compatible=pay.compatible)
    return Agent(name="payer", instructions="Pay what you are asked to.", version=version,
                 model=ScriptedModel.sequence([reply(None, ("pay", {"amount": 500})),
                                               reply("done", turn=1)]),
                 tools=[named])


async def approved_on_release_1(make_engine: Callable[..., Engine], pay: Tool) -> tuple[
        str, str]:
    PAID.clear()
    outcome = await make_engine(agents=[release(pay, "1")]).run(
        "payer", "pay 500", requested_by="U_DANA")
    assert outcome.status == "awaiting_approval"
    [aid] = outcome.approval_ids  # type: ignore[attr-defined]
    return outcome.run_id, aid


async def test_a_changed_tool_does_not_run_an_old_approval(
        make_engine: Callable[..., Engine], db: Database) -> None:
    run_id, aid = await approved_on_release_1(make_engine, pay_in_cents)
    v2 = make_engine(agents=[release(pay_in_dollars, "2")])
    assert v2.agent("payer").tool("pay").json_schema() == \
        release(pay_in_cents, "1").tool("pay").json_schema()  # the same schema
    report = await v2.deploy_check()  # listed before the deploy
    [broken] = report.breaks
    assert broken.approval_id == aid and "changed since it was asked about" in broken.reason
    await v2.decide(aid, actor=ALICE, verdict="approve")
    outcome = await v2.advance(run_id)
    assert outcome.status == "needs_attention" and PAID == []
    [q] = [a for a in await Rows(db).approvals(run_id) if a.kind == "cannot_run"]
    assert "changed since it was asked about" in json.loads(q.packet)["reason"]
    await v2.decide(q.id, actor=ALICE, verdict="replan")
    assert (await v2.advance(run_id)).status == "completed" and PAID == []


async def test_a_release_that_declares_the_version_compatible_runs_it(
        make_engine: Callable[..., Engine], db: Database) -> None:
    one = Tool(pay_in_cents.fn, permission="execute", version="1")
    run_id, aid = await approved_on_release_1(make_engine, one)
    two = Tool(pay_in_cents.fn, permission="execute", version="2", compatible=["1"])
    v2 = make_engine(agents=[release(two, "2")])
    assert (await v2.deploy_check()).ok
    await v2.decide(aid, actor=ALICE, verdict="approve")
    assert (await v2.advance(run_id)).status == "completed" and PAID == [500]


async def test_the_same_code_in_another_process_is_the_same_tool(
        make_engine: Callable[..., Engine]) -> None:
    run_id, aid = await approved_on_release_1(make_engine, pay_in_cents)
    again = make_engine(agents=[release(pay_in_cents, "1")])  # a restart, same code
    await again.decide(aid, actor=ALICE, verdict="approve")
    assert (await again.advance(run_id)).status == "completed" and PAID == [500]


def test_identity_is_version_and_schema() -> None:
    cents, dollars = pay_in_cents.identity(), pay_in_dollars.identity()
    assert cents.schema == dollars.schema and cents.version != dollars.version
    assert cents.version == code_version(pay_in_cents.fn)
    assert pay_in_dollars.changed_since(cents) is not None
    assert pay_in_cents.changed_since(cents) is None
    assert pay_in_cents.changed_since(None) is None  # a request from before identities
    same_version = ToolIdentity(cents.version, "0" * 16)
    assert "schema changed under the same version" in (
        pay_in_cents.changed_since(same_version) or "")
    with pytest.raises(ConfigError, match="version"):
        Tool(pay_in_cents.fn, version="")
    with pytest.raises(ConfigError, match="compatible"):
        Tool(pay_in_cents.fn, version="2", compatible=["x" * 65])


def test_a_tool_without_source_has_a_stable_version_of_its_code() -> None:
    def made(body: str) -> Any:
        scope: dict[str, Any] = {}
        exec(f"async def pay(amount: int) -> int:\n    return {body}\n", scope)  # no file
        return scope["pay"]

    first, same, other = made("amount"), made("amount"), made("amount * 100")
    assert code_version(first) == code_version(same) != code_version(other)
    assert code_version(first).startswith("code:")
