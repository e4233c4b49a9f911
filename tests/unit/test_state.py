"""Run state is versioned: old versions upgrade on load, newer or unknown ones are refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from approvald.runtime.kernel.errors import StateVersionError
from approvald.runtime.record.state import (
    SCHEMA_VERSION,
    AssistantMessage,
    RunState,
    ToolMessage,
    upgrade_part,
)
from approvald.store.db import Database
from approvald.store.models import RunEvent
from sqlalchemy import insert, select

from tests.helpers import Rows

FIXTURE = Path(__file__).parent.parent / "fixtures" / "state_v1.json"


def test_v1_document_loads_and_upgrades() -> None:
    doc = json.loads(FIXTURE.read_text())
    assert doc["schema_version"] == 1
    state = RunState.from_document(doc)
    assert state.schema_version == SCHEMA_VERSION
    call = state.messages[1]
    assert isinstance(call, AssistantMessage)
    assert call.tool_calls[0].arguments == {"order_id": "A-1001"}
    result = state.messages[2]
    assert isinstance(result, ToolMessage)
    assert result.content == {"order_id": "A-1001", "duplicate_charge_cents": 4200}
    # the upgraded state knows which call still waits for a result
    assert [c.name for c in state.unresolved_calls()] == ["issue_refund"]
    # and round-trips at the current version
    again = RunState.from_document(state.to_document())
    assert again == state


def test_future_version_is_refused_with_a_clear_error() -> None:
    doc = json.loads(FIXTURE.read_text())
    doc["schema_version"] = SCHEMA_VERSION + 1
    with pytest.raises(StateVersionError, match=r"newer than this approvald supports"):
        RunState.from_document(doc)


@pytest.mark.parametrize("bad", [0, -1, "2", None, True])
def test_unknown_version_is_refused(bad: object) -> None:
    doc = json.loads(FIXTURE.read_text())
    doc["schema_version"] = bad
    with pytest.raises(StateVersionError):
        RunState.from_document(doc)


def test_unknown_fields_are_refused_not_ignored() -> None:
    with pytest.raises(ValueError, match="extra"):
        upgrade_part(SCHEMA_VERSION, {"role": "user", "content": "x", "surprise": 1})


async def test_v1_events_in_the_database_load_through_the_engine(make_engine, db: Database):
    """Events written by an older version are upgraded when a run is loaded."""
    engine = make_engine()
    run_id = await engine.start_run("demo-refund", "Refund order A-1001", requested_by="U_DANA")
    doc = json.loads(FIXTURE.read_text())

    async def written(tx):  # type: ignore[no-untyped-def]
        await tx.conn.execute(insert(RunEvent), [
            {"run_id": run_id, "seq": i + 1, "step": 1, "v": 1, "body": json.dumps(m)}
            for i, m in enumerate(doc["messages"][1:3])
        ])
        await tx.runs.update(run_id, next_seq=3, step=1)

    await Rows(db).in_one_write(written)
    state = await engine.state(run_id)
    assert isinstance(state.messages[1], AssistantMessage)
    assert state.messages[1].tool_calls[0].arguments == {"order_id": "A-1001"}
    assert state.messages[2].content["duplicate_charge_cents"] == 4200  # type: ignore[union-attr]
    async def stored_versions(tx):  # type: ignore[no-untyped-def]
        return [v for (v,) in await tx.conn.execute(
            select(RunEvent.v).where(RunEvent.run_id == run_id).order_by(RunEvent.seq))]

    versions = await Rows(db).in_one_read(stored_versions)
    assert versions == [SCHEMA_VERSION, 1, 1]  # stored bytes are never rewritten


async def test_future_event_version_refuses_to_load(make_engine, db: Database):
    engine = make_engine()
    run_id = await engine.start_run("demo-steps", "3", requested_by="U1")
    await Rows(db).insert(RunEvent.__table__, [
        {"run_id": run_id, "seq": 1, "step": 1, "v": 99,
         "body": json.dumps({"role": "user", "content": "from the future"})}])
    with pytest.raises(StateVersionError, match="99"):
        await engine.state(run_id)
    # a worker does not spin on it: it backs off, then hands the run to a person
    outcome = await engine.advance(run_id)
    assert outcome.status == "running" and "newer than this approvald" in outcome.reason
