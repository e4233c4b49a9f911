"""OpenAI Agents SDK adapter end to end: a real Agent on the SDK's own ScriptedModel (no
network, tracing off) pauses on a needs_approval tool, its RunState is kept in approvald,
the requests are decided in Slack (signed clicks through the emulator against an
in-process serve), the run resumes with approve/reject (an edit runs the edited
arguments), and the refund happens once, even when the resume is repeated.

The SDK comes with the dev extra: missing, this module fails to import (no skip).

Run by ``test_adapter_openai_agents.py`` (which imports this module only when a test runs)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, RunConfig, Runner, RunState, function_tool
from agents.testing import ModelCall, ModelStep, ScriptedModel, assistant_message, function_call
from approvald.runtime.adapters import Waiting
from approvald.runtime.adapters.openai_agents import _APPROVED, OpenAIAgentsAdapter

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

CONFIG = RunConfig(tracing_disabled=True)  # nothing leaves the machine


def respond(call: ModelCall) -> Any:
    """The model, scripted: asks to refund the order named in the prompt, then reports
    what the tool said."""
    items = call.input if isinstance(call.input, list) else \
        [{"role": "user", "content": call.input}]
    outputs = [i for i in items if isinstance(i, dict) and i.get("type") == "function_call_output"]
    if outputs:
        return [assistant_message(f"tool said: {outputs[-1]['output']}")]
    prompt = next(i["content"] for i in items if isinstance(i, dict) and i.get("role") == "user")
    order, cents = str(prompt).split()
    return [function_call("refund_order", {"order": order, "cents": int(cents)},
                          call_id=f"call-{order}")]


def adapter_for(h: Harness, effects: SideEffects) -> OpenAIAgentsAdapter:
    """The agent as a fresh process builds it."""

    @function_tool(needs_approval=True)
    def refund_order(order: str, cents: int) -> str:
        """Refund part of an order."""
        effects.record(order=order, cents=cents)
        return f"refunded {cents} cents on {order}"

    agent = Agent(name="support", instructions="Refund what is asked.", tools=[refund_order],
                  model=ScriptedModel([ModelStep.respond(respond) for _ in range(20)]))
    return OpenAIAgentsAdapter(h.engine.approval_gate(name="support-sdk"), agent,
                               run_config=CONFIG)


async def test_approve_deny_and_edit_in_slack_resume_the_run_once(
        db_url: str, tmp_path: Path) -> None:
    async with adapter_harness(db_url, tmp_path) as (h, effects):
        oa = adapter_for(h, effects)
        paused, denied, edited = await pause_three(oa)
        approve_id = paused.requests["call-A-1"]
        assert isinstance(await oa.resume(paused.pause_id), Waiting)
        # the serialised RunState is kept in approvald's store
        pause = await oa.gate.pause_record(paused.pause_id)
        stored = json.loads(pause.state)["run_state"]
        assert [i.raw_item.call_id for i in  # type: ignore[union-attr]
                (await RunState.from_json(oa.agent, stored)).get_interruptions()] == ["call-A-1"]
        assert effects.all() == []

        await approve_in_slack(h, approve_id)
        await deny_in_slack(h, denied.requests["call-A-2"], "Already refunded by the bank")
        await edit_in_slack(h, edited.requests["call-A-3"], {"order": "A-3", "cents": 2500})

        oa = adapter_for(h, effects)  # a new process
        assert said(await oa.resume(paused.pause_id)) == "tool said: refunded 500 cents on A-1"
        no = said(await oa.resume(denied.pause_id))
        assert json.loads(no.removeprefix("tool said: ")) == {
            "status": "denied", "reason": "Already refunded by the bank", "by": "U_ALICE"}
        # the SDK's approve takes no arguments: the adapter's tool wrapper runs the edit
        assert said(await oa.resume(edited.pause_id)) == "tool said: refunded 2500 cents on A-3"

        # resumed again: the recorded outcome, nothing runs
        assert said(await oa.resume(paused.pause_id)) == "tool said: refunded 500 cents on A-1"
        # the run resumed again from the stored RunState (as after a crash before the
        # pause recorded its outcome): the recorded result is reused, the tool not run
        state = await RunState.from_json(oa.agent, stored)
        [item] = state.get_interruptions()
        state.approve(item)
        token = _APPROVED.set({"call-A-1": approve_id})
        try:
            again = await Runner.run(oa.agent, state, run_config=CONFIG)
        finally:
            _APPROVED.reset(token)
        assert again.final_output == "tool said: refunded 500 cents on A-1"

        assert effects.all() == [{"order": "A-1", "cents": 500},
                                 {"order": "A-3", "cents": 2500}]
        actions = await audit_actions(h, approve_id)
        assert [a["action"] for a in actions] == ["requested", "approved", "executed"]
        assert actions[0]["actor"] == "agent:external:adapter.support-sdk"
        assert actions[1]["actor"] == "U_ALICE"
        assert actions[2]["details"]["args"] == {"order": "A-1", "cents": 500}
        assert actions[2]["details"]["result"] == "refunded 500 cents on A-1"
        edit_actions = await audit_actions(h, edited.requests["call-A-3"])
        assert edit_actions[-1]["details"]["args"] == {"order": "A-3", "cents": 2500}


async def test_an_interruption_the_adapter_cannot_serve_is_refused(
        db_url: str, tmp_path: Path) -> None:
    """A tool of another agent (reached by handoff, say) is not wrapped: the adapter says
    so instead of approving a call it could not run once."""
    from approvald.runtime.kernel.errors import ApprovaldError

    async with adapter_harness(db_url, tmp_path) as (h, effects):
        oa = adapter_for(h, effects)
        oa.wrapped.clear()  # as if refund_order were not the adapter's to run
        with pytest.raises(ApprovaldError, match="not a function tool"):
            await oa.run("A-1 500", conversation="c-x", requested_by="U_DANA")
