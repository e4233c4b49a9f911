"""The demo agents do what the task says: the order it names, the amount it names."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from approvald.runtime.engine import Engine
from approvald.runtime.kernel.outcomes import Completed
from approvald.runtime.record.state import AssistantMessage, ToolCall, ToolMessage, UserMessage
from approvald.runtime.runs.demo import refund_script, task_amount, task_order

from tests.conftest import ledger_lines


@pytest.mark.parametrize(("task", "order", "cents"), [
    ("Refund order A-1", "A-1", None),
    ("Refund order A-1001, customer was double charged", "A-1001", None),
    ("Refund order B-22 for $25.50, customer was double charged", "B-22", 2550),
    ("refund $1,250 on ZZ-9", "ZZ-9", 125_000),
    ("Refund 30 USD for order A-3", "A-3", 3000),
    ("Refund order 7007", "7007", None),
    ("Refund order #7007 for $5", "7007", 500),
    ("Refund $0 please", None, None),
    ("no order here", None, None),
])
def test_the_task_names_the_order_and_the_amount(task: str, order: str | None,
                                                 cents: int | None) -> None:
    assert task_order(task) == order
    assert task_amount(task) == cents


def test_refund_order_a1_refunds_a1_with_the_amount_given() -> None:
    task = "Refund order A-1 for $12.50, customer was double charged"
    first = refund_script([UserMessage(content=task)])
    [lookup] = first.tool_calls
    assert (lookup.name, lookup.arguments) == ("lookup_order", {"order_id": "A-1"})
    looked_up = ToolMessage(call_id=lookup.id, name="lookup_order",
                            content={"order_id": "A-1", "duplicate_charge_cents": 4200})
    second = refund_script([UserMessage(content=task),
                            AssistantMessage(content=first.content, tool_calls=[
                                ToolCall(id=lookup.id, name=lookup.name,
                                         arguments=lookup.arguments)]),
                            looked_up])
    [refund] = second.tool_calls
    assert refund.name == "issue_refund"
    assert refund.arguments == {"order_id": "A-1", "amount_cents": 1250,
                                "reason": "duplicate charge"}


def test_a_task_that_names_no_order_asks_for_nothing() -> None:
    reply = refund_script([UserMessage(content="Refund the customer, they were double charged")])
    assert not reply.tool_calls
    assert "names no order" in reply.content


async def test_an_order_the_demo_does_not_hold_is_reported_and_nothing_is_asked(
        make_engine: Callable[..., Engine], ledger_path: Path) -> None:
    """Tried as a new user would: "Refund order 7007" once asked to refund A-1001."""
    engine = make_engine()
    outcome = await engine.run("demo-refund", "Refund order 7007", requested_by="U_DANA")
    assert isinstance(outcome, Completed), outcome
    assert outcome.result is not None
    assert "7007" in outcome.result and "no refund" in outcome.result
    assert [e["tool"] for e in ledger_lines(ledger_path)] == ["lookup_order"]
    assert [e["args"] for e in ledger_lines(ledger_path)] == [{"order_id": "7007"}]
