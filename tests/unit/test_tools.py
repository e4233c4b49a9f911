"""Tool definitions: schemas from type hints, validation, context injection."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import pytest
from approvald.runtime.kernel.clock import ManualClock
from approvald.runtime.kernel.errors import ConfigError, InvalidArguments
from approvald.runtime.policies.tools import ToolContext, tool
from pydantic import BaseModel, Field


@tool(permission="execute")
async def transfer(ctx: ToolContext, account: str, cents: int, memo: str = "") -> dict[str, object]:
    """Move money between accounts."""
    return {"key": ctx.idempotency_key, "account": account, "cents": cents, "memo": memo}


class Ticket(BaseModel):
    title: str = Field(max_length=80)
    priority: Literal["low", "high"] = "low"


@tool(permission="draft")
async def open_ticket(ticket: Ticket) -> str:
    """Open a ticket."""
    return f"{ticket.priority}:{ticket.title}"


def test_schema_from_type_hints_and_defaults() -> None:
    schema = transfer.json_schema()
    assert schema["required"] == ["account", "cents"]
    assert schema["properties"]["cents"]["type"] == "integer"
    assert schema["additionalProperties"] is False
    assert transfer.description == "Move money between accounts."
    assert transfer.policy == "approve_before"  # execute tools need approval by default
    assert open_ticket.policy == "auto"


def test_validation_normalizes_and_refuses() -> None:
    assert transfer.validate({"account": "A", "cents": 5}) == {"account": "A", "cents": 5,
                                                               "memo": ""}
    with pytest.raises(InvalidArguments) as err:
        transfer.validate({"account": "A", "cents": "five", "extra": 1})
    assert {tuple(e["loc"]) for e in err.value.errors} == {("cents",), ("extra",)}
    with pytest.raises(InvalidArguments):
        transfer.validate(["A", 5])


async def test_pydantic_model_parameter_and_context() -> None:
    assert open_ticket.json_schema()["properties"]["priority"]["enum"] == ["low", "high"]
    ctx = ToolContext(run_id="r", call_id="c", idempotency_key="r:c", requested_by="U",
                      agent="a", clock=ManualClock())
    args = open_ticket.validate({"title": "printer on fire", "priority": "high"})
    assert await open_ticket.invoke(ctx, args) == "high:printer on fire"
    out = await transfer.invoke(ctx, transfer.validate({"account": "A", "cents": 1}))
    assert out["key"] == "r:c"


def test_definition_errors_are_clear() -> None:
    def sync_tool(x: int) -> int:
        return x

    with pytest.raises(ConfigError, match="must be an async function"):
        tool(sync_tool)  # type: ignore[arg-type]

    async def untyped(x):  # type: ignore[no-untyped-def]
        return x

    with pytest.raises(ConfigError, match="needs a type hint"):
        tool(untyped)


@tool(permission="execute")
async def pay(invoice: Annotated[str, Field(pattern=r"^INV-\d+$")],
              cents: Annotated[int, Field(gt=0, le=500_000)]) -> str:
    """Pay an invoice."""
    return invoice


def test_constraints_written_with_annotated_are_kept() -> None:
    """``Annotated[int, Field(le=...)]`` once lost its constraint: the schema shown to the
    model and approvers, and the validation of proposed and edited arguments, dropped it."""
    props = pay.json_schema()["properties"]
    assert props["cents"]["exclusiveMinimum"] == 0 and props["cents"]["maximum"] == 500_000
    assert props["invoice"]["pattern"] == r"^INV-\d+$"
    assert pay.validate({"invoice": "INV-7", "cents": 100}) == {"invoice": "INV-7", "cents": 100}
    for bad in ({"invoice": "INV-7", "cents": 500_001}, {"invoice": "INV-7", "cents": 0},
                {"invoice": "7", "cents": 100}):
        with pytest.raises(InvalidArguments):
            pay.validate(bad)


def test_a_tool_defined_again_reuses_what_its_definition_determines(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """An agent built again (per request, per test's engine) makes no pydantic model, reads
    no source and works out no JSON schema again: its tools' are those of the first."""
    import inspect

    from approvald.runtime.policies import tools
    from approvald.runtime.runs.demo import DemoLedger, refund_agent

    made: list[str] = []
    read: list[object] = []
    create, source = tools.create_model, inspect.getsource
    monkeypatch.setattr(tools, "create_model", lambda *a, **k: made.append(a[0])
                        or create(*a, **k))
    monkeypatch.setattr(inspect, "getsource", lambda fn: read.append(fn) or source(fn))
    ledger = DemoLedger(str(tmp_path / "ledger.jsonl"))
    first = refund_agent(ledger)
    made.clear()
    read.clear()
    again = refund_agent(ledger)
    assert (made, read) == ([], [])
    for old, new in zip(first.tools, again.tools, strict=True):
        assert new is not old and new.args_model is old.args_model
        assert new.identity() == old.identity() and new.version == old.version
        assert new.json_schema() == old.json_schema()
        assert new.json_schema() is not new.json_schema()  # each caller's own copy
    assert again.version == first.version


def test_the_same_code_with_other_types_or_defaults_is_another_tool() -> None:
    def made(kind: type, default: object) -> Any:
        async def count(n: Any = default) -> Any:
            return n
        count.__annotations__ = {"n": kind}
        return tool(count)

    ints, strs, other = made(int, 1), made(str, "1"), made(int, 2)
    assert (ints.validate({}), strs.validate({}), other.validate({})) == (
        {"n": 1}, {"n": "1"}, {"n": 2})
    assert strs.validate({"n": "x"}) == {"n": "x"}
    with pytest.raises(InvalidArguments):
        ints.validate({"n": "x"})
    assert len({id(t.args_model) for t in (ints, strs, other)}) == 3
    assert made(int, 1).args_model is ints.args_model


def test_a_full_cache_of_definitions_drops_its_oldest_only(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The cache of what definitions determine is bounded; once full, a new definition
    drops the oldest one, not everything kept (which would make a process that defines
    more tools than the bound work every one out again, in turn)."""
    from approvald.runtime.policies import tools

    monkeypatch.setattr(tools, "_KNOWN_MAX", 4)
    monkeypatch.setattr(tools, "_MODELS", {})

    def made(default: int) -> Any:
        async def count(n: int = default) -> int:
            return n
        return tool(count)

    first = [made(k) for k in range(1, 6)]  # one more than the bound
    assert len(tools._MODELS) == 4
    assert made(1).args_model is not first[0].args_model  # the oldest, dropped
    # the others stay (the first made again is now the newest: the second is dropped)
    assert [made(k).args_model is first[k - 1].args_model for k in (3, 4, 5)] == [
        True, True, True]
    assert len(tools._MODELS) == 4
