"""OpenAI Agents SDK: tools with ``needs_approval`` pause the run; its ``RunState`` is kept
in approvald; a decision resumes it with ``state.approve`` / ``state.reject``.

Drive the agent through :class:`OpenAIAgentsAdapter`:

1. A run that ends on interruptions (``ToolApprovalItem``) is paused: its serialised
   ``RunState`` (``to_json()``) is stored in approvald (``adapter_pauses``), then one
   request per call is made, keyed by the conversation and the call id.
2. Once every call is decided, :meth:`OpenAIAgentsAdapter.resume` rebuilds the state
   (``RunState.from_json``), approves or rejects each interruption (a rejection's message
   is the refusal the model reads) and runs on.

The SDK's ``approve`` takes no arguments, so the adapter wraps each function tool of the
agent that may need approval: when the SDK invokes an approved call, the wrapper runs it
through :meth:`ApprovalGate.execute` with approvald's *effective* arguments (an approver's
edit, if any), once; a second resume from the same state reuses the recorded result. The
model's transcript still shows the arguments it proposed. Interruptions the wrapper cannot
serve (hosted, MCP or shell tools, tools of another agent) are refused with a clear error.
"""

from __future__ import annotations

import contextvars
import dataclasses
import json
from typing import Any

from agents import Agent, FunctionTool, RunConfig, Runner, RunState
from agents.tool_context import ToolContext
from approvald.runtime.adapters.base import Adapter, Finished, Paused, Step
from approvald.runtime.adapters.gate import ApprovalGate, Call, Decision
from approvald.runtime.kernel.canonical import sha256_hex
from approvald.runtime.kernel.errors import ApprovaldError
from approvald.store.repos.adapters import AdapterPauseRecord

# the approvald request of each approved call of the resume in progress, by call id
_APPROVED: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
    "approvald_openai_agents_approved", default=None)


class OpenAIAgentsAdapter(Adapter):
    """Drive an Agents SDK agent whose risky function tools have ``needs_approval``.
    ``run_config`` and ``context`` go to every ``Runner.run``."""

    framework = "openai-agents"

    def __init__(self, gate: ApprovalGate, agent: Agent[Any], *,
                 run_config: RunConfig | None = None, context: Any = None) -> None:
        super().__init__(gate)
        self.wrapped: set[str] = set()
        self.agent = agent.clone(tools=[self._wrap(t) for t in agent.tools])
        self.run_config = run_config
        self.context = context

    def _wrap(self, tool: Any) -> Any:
        if not isinstance(tool, FunctionTool) or tool.needs_approval is False:
            return tool
        original = tool.on_invoke_tool
        gate = self.gate

        async def invoke(ctx: ToolContext[Any], input_json: str) -> Any:
            request_id = (_APPROVED.get() or {}).get(ctx.tool_call_id)
            if request_id is None:  # no approvald request covers it (needs_approval said no)
                return await original(ctx, input_json)

            async def run(effective: dict[str, Any]) -> Any:
                return await original(ctx, json.dumps(effective))

            call = Call(call_id=str(ctx.tool_call_id), tool=tool.name,
                        args=json.loads(input_json or "{}"))
            return (await gate.execute(call, request_id, run)).result

        self.wrapped.add(tool.name)
        return dataclasses.replace(tool, on_invoke_tool=invoke)

    async def run(self, agent_input: Any, *, conversation: str, requested_by: str,
                  task: str | None = None) -> Paused | Finished:
        """Run the agent: :class:`Finished` with its final output, or :class:`Paused` on
        approvald requests. ``conversation`` names this run stably."""
        result = await Runner.run(self.agent, agent_input, run_config=self.run_config,
                                  context=self.context)
        return await self.settle(self._step(conversation, result), requested_by=requested_by,
                                 task=task)

    def _step(self, conversation: str, result: Any) -> Step:
        items = list(result.interruptions)
        if not items:
            return Step(output=result.final_output)
        calls = []
        for item in items:
            raw = item.raw_item
            kind = raw.get("type") if isinstance(raw, dict) else getattr(raw, "type", None)
            if kind != "function_call" or item.agent is not self.agent \
                    or item.tool_name not in self.wrapped:
                raise ApprovaldError(
                    f"{item.tool_name or kind} needs approval, but it is not a function tool "
                    f"of agent {self.agent.name!r} that the approvald adapter wraps (hosted, "
                    "MCP and shell tools, and other agents' tools, are not supported)")
            calls.append(Call(call_id=str(raw.call_id), tool=str(item.tool_name),
                              args=json.loads(raw.arguments or "{}")))
        ids = ",".join(sorted(c.call_id for c in calls))
        return Step(calls=calls,
                    state={"conversation": conversation,
                           "run_state": result.to_state().to_json()},
                    key=f"{sha256_hex(conversation)[:32]}:{sha256_hex(ids)[:32]}")

    async def _go_on(self, pause: AdapterPauseRecord, state: Any,
                     decisions: dict[str, Decision]) -> Step:
        run_state: RunState[Any, Agent[Any]] = await RunState.from_json(
            self.agent, state["run_state"], context_override=self.context)
        for item in run_state.get_interruptions():
            d = decisions[str(item.raw_item.call_id)]  # type: ignore[union-attr]
            if d.approved:
                run_state.approve(item)
            else:
                run_state.reject(item, rejection_message=d.refusal_text())
        approved = {cid: d.request_id for cid, d in decisions.items() if d.approved}
        token = _APPROVED.set(approved)
        try:
            result = await Runner.run(self.agent, run_state, run_config=self.run_config,
                                      context=self.context)
        finally:
            _APPROVED.reset(token)
        return self._step(str(state["conversation"]), result)
