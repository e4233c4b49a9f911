"""Pydantic AI adapter end to end: a real Agent with a FunctionModel (Pydantic AI's own
test model) ends on DeferredToolRequests, the requests are decided in Slack (signed clicks
through the emulator against an in-process serve), the agent resumes from the message
history kept in approvald with DeferredToolResults, and the refund happens once, even
when the resume is repeated.

The framework comes with the dev extra: missing, this module fails to import (no skip).

Run by ``test_adapter_pydantic_ai.py`` (which imports this module only when a test runs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from approvald.runtime.adapters import Paused, Waiting
from approvald.runtime.adapters.pydantic_ai import META, PydanticAIAdapter
from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import DeferredToolResults, ToolApproved

from tests.helpers import Rows
from tests.integration.adapter_helpers import (
    SideEffects,
    adapter_harness,
    approve_in_slack,
    audit_actions,
    deny_in_slack,
    edit_in_slack,
    pause_three,
    said,
)
from tests.integration.slack_harness import Harness


def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """The model, scripted: asks to refund the order named in the prompt, then reports
    what the tool said."""
    parts = messages[-1].parts
    for p in parts:
        if isinstance(p, ToolReturnPart):
            return ModelResponse(parts=[TextPart(f"tool said: {p.model_response_str()}")])
    prompt = next(p for p in parts if isinstance(p, UserPromptPart))
    order, cents = str(prompt.content).split()
    return ModelResponse(parts=[ToolCallPart("refund_order", {"order": order, "cents": int(cents)},
                                             tool_call_id=f"call-{order}")])


def adapter_for(h: Harness, effects: SideEffects, *, crash: bool = False) -> PydanticAIAdapter:
    """The agent as a fresh process builds it (``crash``: one that dies mid-call)."""
    agent = Agent(FunctionModel(model), output_type=str)

    @agent.tool_plain(requires_approval=True)
    def refund_order(order: str, cents: int) -> str:
        """Refund part of an order."""
        if crash:
            raise Crash  # after the intent was committed, before any result
        effects.record(order=order, cents=cents)
        return f"refunded {cents} cents on {order}"

    return PydanticAIAdapter(h.engine.approval_gate(name="support-agent"), agent)


class Crash(BaseException):
    """The process dying mid-call (nothing catches it)."""


async def test_approve_deny_and_edit_in_slack_resume_the_agent_once(
        db_url: str, tmp_path: Path) -> None:
    async with adapter_harness(db_url, tmp_path) as (h, effects):
        pa = adapter_for(h, effects)
        paused, denied, edited = await pause_three(pa)
        approve_id = paused.requests["call-A-1"]
        assert isinstance(await pa.resume(paused.pause_id), Waiting)
        # the message history is kept in approvald's store, with the pending call in it
        pause = await pa.gate.pause_record(paused.pause_id)
        history = ModelMessagesTypeAdapter.validate_python(json.loads(pause.state)["messages"])
        assert isinstance(history[-1].parts[0], ToolCallPart)
        assert effects.all() == []

        await approve_in_slack(h, approve_id)
        await deny_in_slack(h, denied.requests["call-A-2"], "Already refunded by the bank")
        await edit_in_slack(h, edited.requests["call-A-3"], {"order": "A-3", "cents": 2500})

        pa = adapter_for(h, effects)  # a new process
        assert said(await pa.resume(paused.pause_id)) == "tool said: refunded 500 cents on A-1"
        no = said(await pa.resume(denied.pause_id))
        assert json.loads(no.removeprefix("tool said: ")) == {
            "status": "denied", "reason": "Already refunded by the bank", "by": "U_ALICE"}
        assert said(await pa.resume(edited.pause_id)) == "tool said: refunded 2500 cents on A-3"

        # resumed again: the recorded outcome, nothing runs
        assert said(await pa.resume(paused.pause_id)) == "tool said: refunded 500 cents on A-1"
        # the agent resumed again from the stored history (as after a crash before the
        # pause recorded its outcome): the recorded result is reused, the tool not run
        again = await pa.agent.run(
            message_history=history, capabilities=[pa.capability],
            deferred_tool_results=DeferredToolResults(
                approvals={"call-A-1": ToolApproved(override_args={"order": "A-1",
                                                                   "cents": 500})},
                metadata={"call-A-1": {META: approve_id}}))
        assert again.output == "tool said: refunded 500 cents on A-1"

        assert effects.all() == [{"order": "A-1", "cents": 500},
                                 {"order": "A-3", "cents": 2500}]
        actions = await audit_actions(h, approve_id)
        assert [a["action"] for a in actions] == ["requested", "approved", "executed"]
        assert actions[0]["actor"] == "agent:external:adapter.support-agent"
        assert actions[1]["actor"] == "U_ALICE"
        assert actions[2]["details"]["args"] == {"order": "A-1", "cents": 500}
        assert actions[2]["details"]["result"] == "refunded 500 cents on A-1"
        edit_actions = await audit_actions(h, edited.requests["call-A-3"])
        assert edit_actions[-1]["details"]["args"] == {"order": "A-3", "cents": 2500}


async def test_a_call_cut_short_is_never_run_again_and_auto_runs_without_a_card(
        db_url: str, tmp_path: Path) -> None:
    from approvald.runtime.adapters import CallOutcomeUnknown

    async with adapter_harness(db_url, tmp_path) as (h, effects):
        # the policy's auto band answers at once: no pause, no card, the call runs once
        pa = adapter_for(h, effects)
        small = await pa.run("A-5 80", conversation="c-auto", requested_by="U_DANA")
        assert said(small) == "tool said: refunded 80 cents on A-5"
        assert effects.all() == [{"order": "A-5", "cents": 80}]

        paused = await pa.run("A-6 700", conversation="c-crash", requested_by="U_DANA")
        assert isinstance(paused, Paused)
        request_id = paused.requests["call-A-6"]
        await approve_in_slack(h, request_id)
        with pytest.raises(Crash):
            await adapter_for(h, effects, crash=True).resume(paused.pause_id)
        # the next process resumes: the call may have happened, so it is not run again
        pa = adapter_for(h, effects)
        with pytest.raises(CallOutcomeUnknown, match=request_id):
            await pa.resume(paused.pause_id)
        assert effects.all() == [{"order": "A-5", "cents": 80}]
        started = await Rows.of(h.engine).execution(request_id, "call")
        assert started is not None and started.status == "started"


async def test_a_finished_outcome_names_the_same_pause_on_every_resume(
        db_url: str, tmp_path: Path) -> None:
    """The first resume and every repeat answer the same :class:`Finished`, naming the
    pause it went on from (the shared driver: every adapter alike); a run that never
    waited for a person names the pause the policy answered at once, which resumes to the
    same outcome."""
    from approvald.runtime.adapters import Finished

    async with adapter_harness(db_url, tmp_path) as (h, effects):
        pa = adapter_for(h, effects)
        paused = await pa.run("A-7 700", conversation="c-twice", requested_by="U_DANA")
        assert isinstance(paused, Paused)
        await approve_in_slack(h, paused.requests["call-A-7"])
        first = await pa.resume(paused.pause_id)
        assert first == Finished("tool said: refunded 700 cents on A-7", paused.pause_id)
        assert await adapter_for(h, effects).resume(paused.pause_id) == first
        assert await pa.wait_and_resume(paused.pause_id, seconds=0) == first

        auto = await pa.run("A-8 80", conversation="c-auto-twice", requested_by="U_DANA")
        assert isinstance(auto, Finished) and auto.pause_id is not None
        assert await pa.resume(auto.pause_id) == auto
        assert effects.all() == [{"order": "A-7", "cents": 700}, {"order": "A-8", "cents": 80}]
