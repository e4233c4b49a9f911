"""The demo agents do what the task says: the order it names, the amount it names."""

from __future__ import annotations

import pytest
from approvald.runtime.demo import refund_script, task_amount, task_order
from approvald.runtime.state import AssistantMessage, ToolCall, ToolMessage, UserMessage


@pytest.mark.parametrize(("task", "order", "cents"), [
    ("Refund order A-1", "A-1", None),
    ("Refund order A-1001, customer was double charged", "A-1001", None),
    ("Refund order B-22 for $25.50, customer was double charged", "B-22", 2550),
    ("refund $1,250 on ZZ-9", "ZZ-9", 125_000),
    ("Refund 30 USD for order A-3", "A-3", 3000),
    ("Refund $0 please", "A-1001", None),
    ("no order here", "A-1001", None),
])
def test_the_task_names_the_order_and_the_amount(task: str, order: str, cents: int | None) -> None:
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
