"""Issue 46 item 5, the one window rule: an approval not collected within its request's
window does not let its call run, whichever path comes to collect it three days later
(an agent's resume, the MCP gateway's retry and its Tasks' ``tasks/get``, Claude Code's
hook joining the request, a framework adapter's resume, the HTTP API's poll, start and
report). On both dialects (``make_engine`` takes the ``db`` fixture)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import mcp_types as types
import pytest
from approvald.bot.claude_code import ClaudeCodeHook, HookEvent
from approvald.bot.mcp.gateway import Gateway, Ran, Refused
from approvald.bot.mcp.tasks import TaskIds, Tasks
from approvald.runtime.adapters.gate import Call, CallNotApproved
from approvald.runtime.approvals.decide import Actor
from approvald.runtime.engine import Engine
from approvald.runtime.kernel.clock import ManualClock
from approvald.runtime.policies.intake import Source
from approvald.runtime.policies.policy import PolicyFile
from approvald.runtime.policies.tools import ToolIdentity
from approvald.runtime.requests import api_tokens
from approvald.runtime.runs.external import CALL_ID, ExternalError, NewRequest, Report, current

from tests.conftest import ledger_lines
from tests.helpers import Rows, create_token

ALICE = Actor("U_ALICE", "cli:test")
WINDOW = {"approvers": ["U_ALICE"], "ttl": "30m"}
POLICY = PolicyFile.model_validate({"tools": {
    "mcp:t/pay": WINDOW, "hook:claude-code/Bash": WINDOW, "adapter:ad/pay": WINDOW,
    "api:bot/pay": WINDOW}})
ARGS = {"to": "acct-1", "cents": 500}
LATER = timedelta(days=3)
ACTOR = "system:collection-window"


class Server:
    """A wrapped MCP server (or a caller's own code): counts what ran."""

    def __init__(self) -> None:
        self.ran: list[dict[str, Any]] = []

    async def __call__(self, args: dict[str, Any]) -> Ran[Any]:
        self.ran.append(args)
        result = types.CallToolResult(content=[types.TextContent(type="text", text="paid")])
        return Ran(result, "succeeded", result.model_dump(mode="json", exclude_none=True))

    def forward(self, tool: str) -> Server:  # as bot.mcp.upstream.Upstream gives it
        return self

    def identify(self, tool: str) -> Callable[[], Awaitable[ToolIdentity]]:
        async def identify() -> ToolIdentity:  # its tools never change
            return ToolIdentity("mcp:fake", "fake")
        return identify


async def approve_request(engine: Engine, rid: str) -> str:
    a = current(await Rows.of(engine).approvals(rid))
    assert a is not None and a.status == "pending"
    await engine.decide(a.id, actor=ALICE, verdict="approve")
    return a.id


async def closed_by_the_window(engine: Engine, rid: str) -> None:
    """The request is cancelled, audited as the window's, and nothing started its call."""
    run = await Rows.of(engine).run(rid)
    execution = await Rows.of(engine).execution(rid, CALL_ID)
    entries = await Rows.of(engine).audit(run_id=rid)
    assert run is not None and run.status == "cancelled", run
    assert execution is None
    [closed] = [e for e in entries if e.action == "cancelled"]
    assert closed.actor == ACTOR
    assert json.loads(closed.details)["code"] == "window_closed"


# -- each path: make a request, have it approved, wait three days, collect -----------------
Path = Callable[[Engine, ManualClock], Awaitable[None]]


async def mcp_retry(engine: Engine, clock: ManualClock) -> None:
    g, server = Gateway(engine, name="t", requested_by="U_DANA", server="s"), Server()
    first = await g.call("pay", ARGS, server, budget=0)  # the client gave up waiting
    assert isinstance(first, Refused) and first.request_id is not None
    await approve_request(engine, first.request_id)
    clock.advance(LATER)
    again = await g.call("pay", ARGS, server, budget=0)  # its retry, three days later
    assert isinstance(again, Refused) and again.status == "pending"  # asked afresh
    assert again.request_id != first.request_id and server.ran == []
    await closed_by_the_window(engine, first.request_id)


async def mcp_task_poll(engine: Engine, clock: ManualClock) -> None:
    g, server = Gateway(engine, name="t", requested_by="U_DANA", server="s"), Server()
    made = await g.call("pay", ARGS, server, budget=0)  # a task, answered at once
    assert isinstance(made, Refused) and made.request_id is not None
    tasks, token = Tasks(TaskIds("tasks-secret", "t"), server), await g.token()  # type: ignore[arg-type]
    await approve_request(engine, made.request_id)
    clock.advance(LATER)
    polled = await tasks.state(g, token, made.request_id)  # tasks/get, three days later
    assert polled["status"] == "cancelled" and server.ran == []
    assert "window closed" in polled["statusMessage"]
    await closed_by_the_window(engine, made.request_id)


async def hook_join(engine: Engine, clock: ManualClock) -> None:
    def event(use: str) -> HookEvent:
        return HookEvent.parse(json.dumps({
            "hook_event_name": "PreToolUse", "session_id": "s-1", "cwd": "/srv",
            "tool_name": "Bash", "tool_input": {"command": "make deploy"},
            "tool_use_id": use, "transcript_path": "/tmp/t.jsonl"}))

    first = await ClaudeCodeHook(engine, event("u1"), requested_by="U_DANA") \
        .pre_tool_use(wait=0)
    assert first["hookSpecificOutput"]["permissionDecision"] == "deny"  # still waiting
    [a] = await Rows.of(engine).requests(status="pending")
    await approve_request(engine, a.run_id)
    clock.advance(LATER)
    joined = await ClaudeCodeHook(engine, event("u1"), requested_by="U_DANA") \
        .pre_tool_use(wait=0)  # the same call, joining its request three days later
    assert joined["hookSpecificOutput"]["permissionDecision"] == "deny"
    await closed_by_the_window(engine, a.run_id)


async def adapter_resume(engine: Engine, clock: ManualClock) -> None:
    gate, server = engine.approval_gate(name="ad"), Server()
    call = Call(call_id="c1", tool="pay", args=ARGS)
    doc = await gate.ask(call, key="pause-1", requested_by="U_DANA", framework="test")
    await approve_request(engine, doc["id"])
    clock.advance(LATER)
    with pytest.raises(CallNotApproved, match="cancelled"):
        await gate.execute(call, doc["id"], server)  # the framework resumes its run
    assert server.ran == []
    await closed_by_the_window(engine, doc["id"])


async def _api(engine: Engine, clock: ManualClock) -> tuple[Any, str, str]:
    made = await create_token(engine, api_tokens.WebhookKeys("approvald-test-secret-0123456789"),
                              "bot", created_by="test", via="test", tools="*")
    doc, _ = await engine.open_request(made.record, NewRequest(
        tool="pay", args=ARGS, requested_by="U_DANA"))
    await approve_request(engine, doc["id"])
    clock.advance(LATER)
    return made.record, str(doc["id"]), str(doc["args_digest"])


async def api_poll(engine: Engine, clock: ManualClock) -> None:
    token, rid, _ = await _api(engine, clock)
    doc = await engine.wait_request(token, rid, seconds=0)  # the caller's long poll
    assert doc["status"] == "cancelled" and "window closed" in doc["decision"]["reason"]
    await closed_by_the_window(engine, rid)


async def api_start(engine: Engine, clock: ManualClock) -> None:
    token, rid, digest = await _api(engine, clock)  # it read "approved" three days ago
    with pytest.raises(ExternalError) as refused:
        await engine.start_request(token, rid, args_digest=digest, owner="caller")
    assert refused.value.code == "cancelled"
    await closed_by_the_window(engine, rid)


async def api_report(engine: Engine, clock: ManualClock) -> None:
    token, rid, digest = await _api(engine, clock)
    with pytest.raises(ExternalError) as refused:
        await engine.report_request(token, rid, Report("succeeded", digest))
    assert refused.value.code == "cancelled"
    await closed_by_the_window(engine, rid)


PATHS: dict[str, Path] = {"mcp retry": mcp_retry, "mcp tasks/get": mcp_task_poll,
                          "hook join": hook_join, "adapter resume": adapter_resume,
                          "api poll": api_poll, "api start": api_start,
                          "api report": api_report}


@pytest.mark.parametrize("path", list(PATHS))
async def test_an_approval_not_collected_in_its_window_does_not_run(
        make_engine: Callable[..., Engine], clock: ManualClock, path: str) -> None:
    await PATHS[path](make_engine(policy=POLICY), clock)


async def test_within_its_window_a_task_poll_runs_the_approved_call(
        make_engine: Callable[..., Engine], clock: ManualClock) -> None:
    engine = make_engine(policy=POLICY)
    g, server = Gateway(engine, name="t", requested_by="U_DANA", server="s"), Server()
    made = await g.call("pay", ARGS, server, budget=0)
    assert isinstance(made, Refused) and made.request_id is not None
    await approve_request(engine, made.request_id)
    clock.advance(timedelta(minutes=29))  # the request was made 29 minutes ago
    polled = await Tasks(TaskIds("tasks-secret", "t"), server).state(  # type: ignore[arg-type]
        g, await g.token(), made.request_id)
    assert polled["status"] == "completed" and server.ran == [ARGS]


async def test_an_agents_approved_call_resumed_past_its_window_does_not_run(
        make_engine: Callable[..., Engine], clock: ManualClock, ledger_path: Any) -> None:
    engine = make_engine()
    outcome = await engine.run("demo-refund", "Refund order A-1001, customer was double "
                               "charged", requested_by="U_DANA")
    assert outcome.status == "awaiting_approval"
    [aid] = outcome.approval_ids  # type: ignore[attr-defined]
    await engine.decide(aid, actor=ALICE, verdict="approve")
    clock.advance(LATER)  # no worker took the run for three days
    await engine.advance(outcome.run_id)
    assert "issue_refund" not in [e["tool"] for e in ledger_lines(ledger_path)]
    state = await engine.state(outcome.run_id)
    [seen] = [m.content for m in state.messages
              if getattr(m, "name", None) == "issue_refund" and m.role == "tool"]
    assert seen["status"] == "expired" and "window closed" in seen["reason"]
    entries = await Rows.of(engine).audit(run_id=outcome.run_id)
    [refused] = [e for e in entries if e.action == "refused"]
    assert (refused.actor, refused.approval_id) == (ACTOR, aid)
    assert json.loads(refused.details)["reason"] == "window_closed"
    assert Source.of_run("demo-refund").kind == "agent"
