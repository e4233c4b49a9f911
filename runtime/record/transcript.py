"""Turning stored events into a :class:`RunState` and messages into stored events.

A tool result that the execution ledger already holds is stored as a reference, not a
second copy: the bytes a step writes stay at one copy of its payload.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from approvald.runtime.kernel.canonical import compact_json
from approvald.runtime.record.ledger import observation_of
from approvald.runtime.record.state import (
    SCHEMA_VERSION,
    AssistantMessage,
    RunState,
    ToolMessage,
    UserMessage,
    upgrade_part,
)
from approvald.store.jsontext import loads
from approvald.store.records import EventRecord, ExecutionRecord, RunRecord

Message = UserMessage | AssistantMessage | ToolMessage
LEDGER_REF = "ledger"


def encode(msg: Message, *, ledger_ref: bool = False) -> tuple[int, str]:
    """A message as a stored event ``(schema_version, body)``."""
    if isinstance(msg, ToolMessage) and ledger_ref:
        body: dict[str, Any] = {"role": "tool", "call_id": msg.call_id, "name": msg.name,
                                "content_ref": LEDGER_REF}
    else:
        body = msg.model_dump(mode="json")
        if isinstance(msg, AssistantMessage):  # omit empty parts: they are the defaults
            if not msg.tool_calls:
                body.pop("tool_calls")
            if msg.content is None:
                body.pop("content")
            if msg.meta is None:
                body.pop("meta")
            else:  # token counts and cost only where the model reported them
                body["meta"] = {k: v for k, v in body["meta"].items() if v is not None}
    return SCHEMA_VERSION, compact_json(body)


def decode(ev: EventRecord, executions: Mapping[str, ExecutionRecord]) -> Message:
    body: dict[str, Any] = loads(ev.body)
    if body.pop("content_ref", None) == LEDGER_REF:
        rec = executions.get(body["call_id"])
        body["content"] = (observation_of(rec) if rec is not None
                           else {"status": "error", "error": "ledger entry missing"})
    return upgrade_part(ev.v, body)


def build_state(run: RunRecord, events: Sequence[EventRecord],
                executions: Mapping[str, ExecutionRecord]) -> RunState:
    return RunState(
        run_id=run.id, agent=run.agent, status=run.status,
        step=run.step, task=run.task, requested_by=run.requested_by,
        instructions_version=run.instructions_version, created_at=run.created_at,
        result=run.result, error=run.error, cancel_requested=run.cancel_requested,
        messages=[decode(e, executions) for e in events],
    )
