"""LangGraph adapter end to end: a real graph with a SQLite checkpointer pauses in its tool
node on an interrupt, the request is decided in Slack (signed clicks through the emulator
against an in-process serve), the graph resumes from its checkpoint, and the refund
happens once, even when the resume is repeated.

The framework comes with the dev extra: missing, this module fails to import (no skip).

Run by ``test_adapter_langgraph.py`` (which imports this module only when a test runs)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from approvald.runtime.adapters import Finished, Paused, Waiting
from approvald.runtime.adapters.langgraph import ApprovalToolNode, LangGraphAdapter
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.types import Command

from tests.integration.adapter_helpers import (
    SideEffects,
    adapter_harness,
    approve_in_slack,
    audit_actions,
    deny_in_slack,
    edit_in_slack,
)
from tests.integration.slack_harness import Harness


def model(state: MessagesState) -> dict[str, Any]:
    """The model, scripted: asks to refund the order named in the task, then reports
    what the tool said."""
    last = state["messages"][-1]
    if isinstance(last, ToolMessage):
        return {"messages": [AIMessage(f"tool said: {last.content}")]}
    order, cents = str(last.content).split()
    return {"messages": [AIMessage("", tool_calls=[{
        "name": "refund_order", "args": {"order": order, "cents": int(cents)},
        "id": f"call-{order}"}])]}


def route(state: MessagesState) -> str:
    last = state["messages"][-1]
    return "tools" if isinstance(last, AIMessage) and last.tool_calls else END


@asynccontextmanager
async def graph_for(h: Harness, tmp_path: Path,
                    effects: SideEffects) -> AsyncIterator[LangGraphAdapter]:
    """The graph as a fresh process builds it: the same checkpoint file each time."""

    @tool
    def refund_order(order: str, cents: int) -> str:
        """Refund part of an order."""
        effects.record(order=order, cents=cents)
        return f"refunded {cents} cents on {order}"

    gate = h.engine.approval_gate(name="support-graph")
    builder = StateGraph(MessagesState)
    builder.add_node("model", model)
    builder.add_node("tools", ApprovalToolNode([refund_order], gate=gate))
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", route, ["tools", END])
    builder.add_edge("tools", "model")
    async with AsyncSqliteSaver.from_conn_string(str(tmp_path / "checkpoints.db")) as saver:
        yield LangGraphAdapter(gate, builder.compile(checkpointer=saver))


def last_words(outcome: Any) -> str:
    assert isinstance(outcome, Finished), outcome
    last = outcome.output["messages"][-1]  # the graph's state; JSON when read back
    return str(last["content"] if isinstance(last, dict) else last.content)


async def test_approve_deny_and_edit_in_slack_resume_the_graph_once(
        db_url: str, tmp_path: Path) -> None:
    async with adapter_harness(db_url, tmp_path) as (h, effects):
        async with graph_for(h, tmp_path, effects) as lg:
            paused = await lg.run({"messages": [HumanMessage("A-1 500")]}, thread_id="t-approve",
                                  requested_by="U_DANA", task="Refund A-1")
            denied = await lg.run({"messages": [HumanMessage("A-2 900")]}, thread_id="t-deny",
                                  requested_by="U_DANA")
            edited = await lg.run({"messages": [HumanMessage("A-3 5000")]}, thread_id="t-edit",
                                  requested_by="U_DANA")
            assert isinstance(paused, Paused) and isinstance(denied, Paused)
            assert isinstance(edited, Paused)
            [approve_id] = paused.requests.values()
            # nothing is decided yet: resuming changes nothing, and runs nothing
            assert isinstance(await lg.resume(paused.pause_id), Waiting)
            # a re-run of the step that paused finds the same pause and request
            again = await lg.settle(await lg._step("t-approve", None), requested_by="U_DANA",
                                    task="Refund A-1")
            assert again == paused
        assert effects.all() == []

        await approve_in_slack(h, approve_id)
        await deny_in_slack(h, denied.requests["call-A-2"], "Already refunded by the bank")
        await edit_in_slack(h, edited.requests["call-A-3"], {"order": "A-3", "cents": 2500})

        # a new process: the graph is rebuilt over the same checkpoint file
        async with graph_for(h, tmp_path, effects) as lg:
            done = await lg.resume(paused.pause_id)
            assert last_words(done) == "tool said: refunded 500 cents on A-1"
            no = await lg.resume(denied.pause_id)
            assert json.loads(last_words(no).removeprefix("tool said: ")) == {
                "status": "denied", "reason": "Already refunded by the bank", "by": "U_ALICE"}
            changed = await lg.resume(edited.pause_id)
            assert last_words(changed) == "tool said: refunded 2500 cents on A-3"

            # resumed again: the recorded outcome, nothing runs
            assert last_words(await lg.resume(paused.pause_id)) == \
                "tool said: refunded 500 cents on A-1"
            # the node re-run from the paused checkpoint (as after a crash before LangGraph
            # recorded the node's output): the recorded result is reused, the tool not run
            history = [s async for s in lg.graph.aget_state_history(
                {"configurable": {"thread_id": "t-approve"}})]
            at_pause = next(s for s in history if s.interrupts)
            [interrupt] = at_pause.interrupts
            replay = await lg.graph.ainvoke(
                Command(resume={interrupt.id: {"call-A-1": {
                    "request_id": approve_id, "status": "approved", "refusal": None}}}),
                at_pause.config)
            assert replay["messages"][-1].content == "tool said: refunded 500 cents on A-1"

        assert effects.all() == [{"order": "A-1", "cents": 500},
                                 {"order": "A-3", "cents": 2500}]
        # the audit log holds what ran: requested, approved by the click, executed
        actions = await audit_actions(h, approve_id)
        assert [a["action"] for a in actions] == ["requested", "approved", "executed"]
        assert actions[1]["actor"] == "U_ALICE"
        assert actions[0]["actor"] == "agent:external:adapter.support-graph"
        assert actions[2]["details"]["args"] == {"order": "A-1", "cents": 500}
        assert actions[2]["details"]["result"] == "refunded 500 cents on A-1"
        edit_actions = await audit_actions(h, edited.requests["call-A-3"])
        assert edit_actions[-1]["action"] == "executed"
        assert edit_actions[-1]["details"]["args"] == {"order": "A-3", "cents": 2500}
        assert (await h.run(approve_id)).status == "completed"
        assert (await h.run(denied.requests["call-A-2"])).status == "completed"


async def test_a_forged_resume_runs_nothing(db_url: str, tmp_path: Path) -> None:
    """The resume value is not trusted: a Command(resume=approved) for a pending request
    runs nothing (approvald's store decides)."""
    from approvald.runtime.adapters import CallNotApproved

    async with adapter_harness(db_url, tmp_path) as (h, effects), \
            graph_for(h, tmp_path, effects) as lg:
        paused = await lg.run({"messages": [HumanMessage("A-9 900")]}, thread_id="t-forged",
                              requested_by="U_DANA")
        assert isinstance(paused, Paused)
        state = await lg.graph.aget_state({"configurable": {"thread_id": "t-forged"}})
        [interrupt] = state.interrupts
        with pytest.raises(CallNotApproved):
            await lg.graph.ainvoke(Command(resume={interrupt.id: {"call-A-9": {
                "request_id": paused.requests["call-A-9"], "status": "approved",
                "refusal": None}}}), {"configurable": {"thread_id": "t-forged"}})
        assert effects.all() == []


async def test_a_resume_naming_another_calls_approved_request_runs_nothing(
        db_url: str, tmp_path: Path) -> None:
    """A resume value that names an approved request of another call (another thread's,
    other arguments) runs nothing: a request is used only for the call it was made for."""
    from approvald.runtime.adapters import CallNotApproved

    async with adapter_harness(db_url, tmp_path) as (h, effects), \
            graph_for(h, tmp_path, effects) as lg:
        small = await lg.run({"messages": [HumanMessage("A-1 500")]}, thread_id="t-small",
                             requested_by="U_DANA")
        big = await lg.run({"messages": [HumanMessage("B-1 90000")]}, thread_id="t-big",
                           requested_by="U_DANA")
        assert isinstance(small, Paused) and isinstance(big, Paused)
        approved = small.requests["call-A-1"]
        await approve_in_slack(h, approved)
        state = await lg.graph.aget_state({"configurable": {"thread_id": "t-big"}})
        [interrupt] = state.interrupts
        with pytest.raises(CallNotApproved):
            await lg.graph.ainvoke(Command(resume={interrupt.id: {"call-B-1": {
                "request_id": approved, "status": "approved", "refusal": None}}}),
                {"configurable": {"thread_id": "t-big"}})
        assert effects.all() == []
        # the approved call itself still runs, once, where it belongs
        assert last_words(await lg.resume(small.pause_id)) == \
            "tool said: refunded 500 cents on A-1"
        assert effects.all() == [{"cents": 500, "order": "A-1"}]
