"""LangGraph: an ``interrupt()`` in a tool node becomes approvald requests; a decision
resumes the graph from its checkpointer with ``Command(resume=...)``.

Put :class:`ApprovalToolNode` where a graph runs its model's tool calls (compiled with a
checkpointer), and drive the graph through :class:`LangGraphAdapter`:

1. The node interrupts with the calls it would make (``interrupt()`` raises; LangGraph
   checkpoints the thread). The adapter reads the interrupt from the thread's state,
   records the pause (the thread id and the interrupt ids) and only then asks approvald:
   a card per call.
2. :meth:`LangGraphAdapter.resume` waits for every decision, then resumes the thread with
   ``Command(resume={interrupt id: decisions})``. LangGraph re-runs the node from its
   start; ``interrupt()`` now returns the decisions. An approved call runs through
   :meth:`ApprovalGate.execute` with its effective (possibly edited) arguments, once: a
   node re-run after a crash reuses the recorded result. A denied, redirected, expired or
   forbidden call returns the refusal to the model as the call's tool message.

The resume value is not trusted: whether a call runs is read from approvald's store.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from typing import Any

from approvald.runtime.adapters.base import Adapter, Finished, Paused, Step
from approvald.runtime.adapters.gate import ApprovalGate, Call, Decision, jsonable
from approvald.runtime.kernel.canonical import sha256_hex
from approvald.store.repos.adapters import AdapterPauseRecord
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import BaseTool
from langgraph.pregel import Pregel
from langgraph.types import Command, interrupt

MARK = "approvald"  # the key of an interrupt value this adapter made


def _content(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(jsonable(value), ensure_ascii=False)


class ApprovalToolNode:
    """A graph node that runs the last AI message's tool calls, gated ones only as
    approvald decides. ``gated``: the names of tools that need a decision (default: all)."""

    def __init__(self, tools: Sequence[BaseTool], *, gate: ApprovalGate,
                 gated: Collection[str] | None = None, messages_key: str = "messages") -> None:
        self.tools = {t.name: t for t in tools}
        self.gate = gate
        self.gated = set(self.tools) if gated is None else set(gated)
        self.messages_key = messages_key

    async def __call__(self, state: dict[str, Any]) -> dict[str, Any]:
        message = state[self.messages_key][-1]
        if not isinstance(message, AIMessage):
            raise TypeError(f"{type(self).__name__} runs the tool calls of an AI message, "
                            f"not of {type(message).__name__}")
        calls = list(message.tool_calls)
        asked = [{"call_id": c["id"], "tool": c["name"], "args": c["args"]}
                 for c in calls if c["name"] in self.gated]
        # LangGraph runs this node again from the top on resume; interrupt() then returns
        # the resume value instead of raising
        answers: dict[str, Any] = interrupt({MARK: asked}) if asked else {}
        out = []
        for c in calls:
            call_id = str(c["id"])
            tool = self.tools.get(c["name"])
            if tool is None:
                out.append(ToolMessage(f"Error: no tool named {c['name']}",
                                       tool_call_id=call_id, status="error"))
                continue
            if c["name"] not in self.gated:
                out.append(await self._run(tool, call_id, None, c["args"]))
                continue
            answer = answers.get(call_id) or {}
            if answer.get("status") != "approved":
                out.append(ToolMessage(answer.get("refusal") or json.dumps({"status": "denied"}),
                                       name=tool.name, tool_call_id=call_id))
                continue
            out.append(await self._run(tool, call_id, str(answer["request_id"]), c["args"]))
        return {self.messages_key: out}

    async def _run(self, tool: BaseTool, call_id: str, request_id: str | None,
                   args: dict[str, Any]) -> ToolMessage:
        async def invoke(run_args: dict[str, Any]) -> Any:
            return await tool.ainvoke(run_args)

        try:
            if request_id is None:
                result = await invoke(args)
            else:
                # the resume value names the request; execute checks it is this call's
                call = Call(call_id=call_id, tool=tool.name, args=dict(args))
                result = (await self.gate.execute(call, request_id, invoke)).result
        except Exception as exc:
            from approvald.runtime.adapters.gate import CallNotApproved, CallOutcomeUnknown

            if isinstance(exc, CallNotApproved | CallOutcomeUnknown):
                raise  # not the model's business: a person must look
            return ToolMessage(f"Error: {type(exc).__name__}: {exc}", name=tool.name,
                               tool_call_id=call_id, status="error")
        return ToolMessage(_content(result), name=tool.name, tool_call_id=call_id)


class LangGraphAdapter(Adapter):
    """Drive a compiled graph (with a checkpointer) whose tool node is an
    :class:`ApprovalToolNode`; the thread's checkpoint is the state resumed from, and the
    pause records the thread id and the interrupts it waits on."""

    framework = "langgraph"

    def __init__(self, gate: ApprovalGate, graph: Pregel[Any, Any, Any, Any]) -> None:
        super().__init__(gate)
        self.graph = graph

    async def run(self, graph_input: Any, *, thread_id: str, requested_by: str,
                  task: str | None = None) -> Paused | Finished:
        """Invoke the graph on ``thread_id``: :class:`Finished` with its final state, or
        :class:`Paused` on approvald requests."""
        result = await self.graph.ainvoke(graph_input, _config(thread_id))
        return await self.settle(await self._step(thread_id, result),
                                 requested_by=requested_by, task=task)

    async def _step(self, thread_id: str, result: Any) -> Step:
        snapshot = await self.graph.aget_state(_config(thread_id))
        ours = [i for i in snapshot.interrupts
                if isinstance(i.value, dict) and MARK in i.value]
        if not ours:
            return Step(output=result)
        calls = [Call(call_id=str(c["call_id"]), tool=str(c["tool"]), args=dict(c["args"]))
                 for i in ours for c in i.value[MARK]]
        ids = sorted(i.id for i in ours)
        state = {"thread_id": thread_id,
                 "interrupts": {i.id: [str(c["call_id"]) for c in i.value[MARK]] for i in ours}}
        key = f"{sha256_hex(thread_id)[:32]}:{sha256_hex(','.join(ids))[:32]}"
        return Step(calls=calls, state=state, key=key)

    async def _go_on(self, pause: AdapterPauseRecord, state: Any,
                     decisions: dict[str, Decision]) -> Step:
        resume = {iid: {cid: _answer(decisions[cid]) for cid in cids}
                  for iid, cids in state["interrupts"].items()}
        thread_id = str(state["thread_id"])
        result = await self.graph.ainvoke(Command(resume=resume), _config(thread_id))
        return await self._step(thread_id, result)


def _config(thread_id: str) -> Any:
    return {"configurable": {"thread_id": thread_id}}


def _answer(d: Decision) -> dict[str, Any]:
    return {"request_id": d.request_id, "status": d.status,
            "refusal": None if d.approved else d.refusal_text()}
