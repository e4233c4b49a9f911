"""Pydantic AI: ``DeferredToolRequests`` become approvald requests; decisions come back as
``DeferredToolResults``.

Declare the gated tools with ``requires_approval=True`` (or raise ``ApprovalRequired``
from a tool) and drive the agent through :class:`PydanticAIAdapter`:

1. A run that ends on approvals (its output is ``DeferredToolRequests``) is paused: the
   agent's whole message history is stored in approvald (``adapter_pauses``), then one
   request per call is made, keyed by the conversation and the tool call id.
2. Once every call is decided, :meth:`PydanticAIAdapter.resume` runs the agent again on
   the stored history with ``DeferredToolResults``: approve is ``ToolApproved`` with
   ``override_args`` set to the approved (effective) arguments, so an approver's edit is
   what runs; deny, redirect, expiry and a forbidden call are ``ToolDenied`` whose message
   is the refusal the model reads. The approved call runs inside the adapter's capability
   (``wrap_tool_execute``) through :meth:`ApprovalGate.execute`, so it runs once: a second
   resume from the same history reuses the recorded result.

Deferred *external* calls (``CallDeferred``) are not approvals: a run that defers one is
refused with a clear error rather than half-answered.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from approvald.runtime.adapters.base import Adapter, Finished, Paused, Step
from approvald.runtime.adapters.gate import ApprovalGate, Call, Decision
from approvald.runtime.kernel.canonical import sha256_hex
from approvald.runtime.kernel.errors import ApprovaldError
from approvald.store.repos.adapters import AdapterPauseRecord
from pydantic_ai import Agent, RunContext
from pydantic_ai.capabilities import AbstractCapability, WrapToolExecuteHandler
from pydantic_ai.messages import ModelMessagesTypeAdapter, ToolCallPart
from pydantic_ai.tools import (
    DeferredToolRequests,
    DeferredToolResults,
    ToolApproved,
    ToolDefinition,
    ToolDenied,
)

META = "approvald_request"  # the tool call metadata naming the call's approvald request


class ApprovaldCapability(AbstractCapability[Any]):
    """Runs a call approved through approvald at most once, and reports its result."""

    def __init__(self, gate: ApprovalGate) -> None:
        self.gate = gate

    async def wrap_tool_execute(self, ctx: RunContext[Any], *, call: ToolCallPart,
                                tool_def: ToolDefinition, args: Any,
                                handler: WrapToolExecuteHandler) -> Any:
        meta = ctx.tool_call_metadata or {}
        request_id = meta.get(META) if ctx.tool_call_approved else None
        if request_id is None:  # not a call approvald was asked about
            return await handler(args)

        async def run(_effective: dict[str, Any]) -> Any:
            # ``args`` are the effective arguments: they came in as override_args
            return await handler(args)

        ran = Call(call_id=call.tool_call_id, tool=call.tool_name, args=call.args_as_dict())
        return (await self.gate.execute(ran, str(request_id), run)).result


class PydanticAIAdapter(Adapter):
    """Drive a Pydantic AI agent whose risky tools need approval. ``run_kwargs`` go to
    every ``agent.run`` (``deps``, ``model``, ``model_settings``, ...)."""

    framework = "pydantic-ai"

    def __init__(self, gate: ApprovalGate, agent: Agent[Any, Any], **run_kwargs: Any) -> None:
        super().__init__(gate)
        self.agent = agent
        self.run_kwargs = run_kwargs
        self.capability = ApprovaldCapability(gate)

    def _output_type(self) -> Any:
        declared = self.agent.output_type
        kinds = list(declared) if isinstance(declared, Sequence) and \
            not isinstance(declared, str) else [declared]
        return kinds if DeferredToolRequests in kinds else [*kinds, DeferredToolRequests]

    async def run(self, prompt: str, *, conversation: str, requested_by: str,
                  task: str | None = None) -> Paused | Finished:
        """Run the agent on ``prompt``: :class:`Finished` with its output, or
        :class:`Paused` on approvald requests. ``conversation`` names this run stably
        (a re-run of it after a crash finds the pause and requests it made)."""
        result = await self.agent.run(prompt, output_type=self._output_type(),
                                      capabilities=[self.capability], **self.run_kwargs)
        return await self.settle(_step(conversation, result), requested_by=requested_by,
                                 task=task)

    async def _go_on(self, pause: AdapterPauseRecord, state: Any,
                     decisions: dict[str, Decision]) -> Step:
        history = ModelMessagesTypeAdapter.validate_python(state["messages"])
        results = DeferredToolResults(
            approvals={cid: ToolApproved(override_args=d.effective_args) if d.approved
                       else ToolDenied(d.refusal_text()) for cid, d in decisions.items()},
            metadata={cid: {META: d.request_id} for cid, d in decisions.items()
                      if d.approved})
        result = await self.agent.run(message_history=history, deferred_tool_results=results,
                                      output_type=self._output_type(),
                                      capabilities=[self.capability], **self.run_kwargs)
        return _step(str(state["conversation"]), result)


def _step(conversation: str, result: Any) -> Step:
    out = result.output
    if not isinstance(out, DeferredToolRequests):
        return Step(output=out)
    if out.calls:
        names = ", ".join(sorted({c.tool_name for c in out.calls}))
        raise ApprovaldError(f"the agent deferred calls for external execution ({names}): "
                             "the approvald adapter answers approvals only "
                             "(requires_approval / ApprovalRequired)")
    calls = [Call(call_id=p.tool_call_id, tool=p.tool_name, args=p.args_as_dict())
             for p in out.approvals]
    messages = json.loads(ModelMessagesTypeAdapter.dump_json(result.all_messages()))
    ids = ",".join(sorted(c.call_id for c in calls))
    return Step(calls=calls, state={"conversation": conversation, "messages": messages},
                key=f"{sha256_hex(conversation)[:32]}:{sha256_hex(ids)[:32]}")
