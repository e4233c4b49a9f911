"""What the MCP gateway no longer does per call (issue 50), and what that work gave, which
still holds: a call's arguments are canonicalised and digested once (the call key, its
request's idempotency key and the digest its request, start and audit entries bind are
all made of that one digest), and an auto call (its start recorded with its request) is
forwarded and reported in the task that made its request, registered there so that the
same call made meanwhile joins it. On both dialects."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from approvald.bot.mcp import gateway as gateway_module
from approvald.bot.mcp.gateway import Gateway, Ran
from approvald.runtime import callers
from approvald.runtime.kernel.canonical import call_digest
from approvald.runtime.policies.policy import PolicyFile
from approvald.runtime.runs import external
from approvald.runtime.runs.external import CALL_ID

from tests.helpers import Rows

POLICY = PolicyFile.model_validate({"tools": {"mcp:t/echo": {"policy": "auto"}}})


async def _echo(args: dict[str, Any]) -> Ran[Any]:
    return Ran(f"echo {args}", "succeeded", {"echo": args})


async def _runs(engine: Any) -> set[str]:
    return {r.id for r in await Rows.of(engine).runs(limit=500)
            if r.agent.startswith("external:mcp")}


@pytest.mark.parametrize("bearer", [None, "alice"])
async def test_an_mcp_call_digests_its_arguments_once(make_engine, monkeypatch, bearer) -> None:
    """One auto call: one digest of its arguments (was three: the gateway's call key, the
    request's search for its call's generation, the request's own digest), and every
    record of the call binds that digest, under the key the call's tool and arguments
    (and over HTTP its bearer) make."""
    engine = make_engine(policy=POLICY)
    g = Gateway(engine, name="t", requested_by="U_DANA", server="fake", bearer=bearer)
    assert isinstance(await g.call("echo", {"warm": 1}, _echo), Ran)  # credential kept
    digested: list[tuple[str, Any]] = []

    def counted(tool: str, args: Any) -> str:
        digested.append((tool, args))
        return call_digest(tool, args)

    for module in (gateway_module, callers, external):
        monkeypatch.setattr(module, "call_digest", counted)
    known = await _runs(engine)
    args = {"n": 1, "text": "hi"}
    assert isinstance(await g.call("echo", args, _echo), Ran)
    assert digested == [("echo", args)]
    monkeypatch.undo()
    [rid] = await _runs(engine) - known
    digest = call_digest("echo", args)
    rec = await Rows.of(engine).external(rid)
    assert rec.digest == digest and rec.tool == "echo"
    assert rec.idempotency_key == f"mcp:{g.call_key('echo', dict(args))}:0"
    if bearer is not None:  # another bearer's same call is another call
        other = Gateway(engine, name="t", requested_by="U_DANA", server="fake",
                        bearer="bob")
        assert other.call_key("echo", args) != g.call_key("echo", args)
    done = await Rows.of(engine).execution(rid, CALL_ID)
    assert done.status == "succeeded" and done.args_digest == digest
    entries = await Rows.of(engine).audit(run_id=rid)
    assert [e.action for e in entries] == ["requested", "approved", "executed"]
    assert {e.digest for e in entries} == {digest}
    assert (await Rows.of(engine).verify_audit()).ok


async def test_an_mcp_auto_call_runs_in_the_task_that_made_its_request(make_engine) -> None:
    """The call allowed at once is forwarded and reported by the task that made its
    request (no second task handed it over), registered as running it before it is
    forwarded: the same call made meanwhile joins it, and it runs once."""
    engine = make_engine(policy=POLICY)
    g = Gateway(engine, name="t", requested_by="U_DANA", server="fake")
    assert isinstance(await g.call("echo", {"warm": 1}, _echo), Ran)
    opened = engine.open_request
    made: list[tuple[asyncio.Task[Any] | None, str]] = []
    found = asyncio.Event()  # the second call has found the request, its call running

    async def open_request(token: Any, req: Any, **kw: Any) -> Any:
        doc, new = await opened(token, req, **kw)
        made.append((asyncio.current_task(), str(doc["id"])))
        if len(made) > 1:
            found.set()
        return doc, new

    engine.open_request = open_request  # type: ignore[method-assign]
    ran: list[tuple[asyncio.Task[Any] | None, bool]] = []
    running = asyncio.Event()

    async def server(args: dict[str, Any]) -> Ran[Any]:
        ran.append((asyncio.current_task(), g.running_here(made[0][1])))
        running.set()
        await found.wait()
        return await _echo(args)

    first = asyncio.ensure_future(g.call("echo", {"n": 1}, server))
    await running.wait()
    second = asyncio.ensure_future(g.call("echo", {"n": 1}, server))
    out_a, out_b = await asyncio.gather(first, second)
    assert isinstance(out_a, Ran) and isinstance(out_b, Ran)
    assert out_a.value == out_b.value
    (task, rid), *_ = made
    assert {r for _, r in made} == {rid}  # one request: the second call joined it
    assert ran == [(task, True)]  # forwarded once, by the task that made the request
    assert task is not first  # (that task is the shield's: a client giving up leaves it)
    done = await Rows.of(engine).execution(rid, CALL_ID)
    assert done.status == "succeeded"
    assert (await Rows.of(engine).verify_audit()).ok
