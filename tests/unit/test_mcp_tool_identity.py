"""An MCP gateway's approval binds the upstream tool's identity (issue 46 item 7): which
fields of a ``tools/list`` entry it covers, and the gateway's collection (a retry's, a
Tasks poll's: :meth:`Gateway.collect`) refusing an approval given for another identity."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import mcp_types as types
import pytest
from approvald.bot.mcp.gateway import Gateway, Ran, Refused
from approvald.bot.mcp.upstream import identity
from approvald.runtime.engine import Engine
from approvald.runtime.kernel import binding
from approvald.runtime.policies.tools import GONE, ToolIdentity
from approvald.runtime.record.audit import export_row

from tests.helpers import Rows
from tests.unit.test_mcp_gateway_core import ALICE, ARGS, Server, gateway, pending

SCHEMA = {"type": "object", "properties": {"to": {"type": "string"},
                                           "cents": {"type": "integer"}},
          "required": ["to", "cents"]}


def tool(**changes: Any) -> types.Tool:
    fields: dict[str, Any] = {"name": "pay", "description": "Pay someone.",
                              "input_schema": SCHEMA}
    return types.Tool(**{**fields, **changes})


def test_what_an_upstream_tools_identity_covers() -> None:
    base = identity(tool())
    assert base.version.startswith("mcp:") and len(base.version) <= 64
    assert len(base.schema) == 64 and base == identity(tool())
    # what the tool does, takes and gives back, as a model, an approver or a rule reads it
    schema2 = {**SCHEMA, "properties": {**SCHEMA["properties"], "cents": {
        "type": "integer", "description": "whole dollars"}}}
    moved = identity(tool(input_schema=schema2))
    assert moved.schema != base.schema and moved.version != base.version
    for changed in (tool(description="Pay someone, in dollars."), tool(title="Pay (v2)"),
                    tool(output_schema={"type": "object"}),
                    tool(annotations=types.ToolAnnotations(read_only_hint=True)),
                    tool(name="pay2")):
        other = identity(changed)
        assert other.version != base.version, changed
        if changed.name == "pay":
            assert other.schema == base.schema  # only the input schema's digest is its schema
    # presentation and transport change nothing a call does
    assert identity(tool(icons=[types.Icon(src="https://example.org/i.png")])) == base
    assert identity(tool(_meta={"x": 1})) == base
    assert GONE not in (base, moved)


async def _approved(g: Gateway, asked: ToolIdentity) -> tuple[Any, dict[str, Any]]:
    """A call of pay asked about under ``asked``, approved, nobody having collected it."""
    g.identities["pay"] = asked
    server = Server()
    call = asyncio.ensure_future(g.call("pay", ARGS, server))
    a = await pending(g)
    assert (a.tool_version, a.tool_schema) == (asked.version, asked.schema)
    call.cancel()  # the client gave up waiting (a Tasks client polls instead)
    await asyncio.gather(call, return_exceptions=True)
    await g.e.decide(a.id, actor=ALICE, verdict="approve")
    doc = await g.e.request_document(await g.token(), a.run_id)
    assert doc["status"] == "approved"
    return a, doc


def _now(value: ToolIdentity) -> Callable[[], Any]:
    async def identify() -> ToolIdentity:
        return value
    return identify


async def test_an_unchanged_tool_runs_its_approved_call_once(make_engine) -> None:
    g = gateway(make_engine)
    v1 = identity(tool())
    _, doc = await _approved(g, v1)
    server = Server()
    out = await g.collect(await g.token(), "pay", doc, server, _now(identity(tool())))
    assert isinstance(out, Ran) and server.ran == [ARGS]
    again = await g.collect(await g.token(), "pay", doc, server, _now(v1))
    assert isinstance(again, Ran) and server.ran == [ARGS]  # joined: run once


@pytest.mark.parametrize("now", ["schema", "description", "gone"])
async def test_an_approval_of_a_tool_since_changed_is_refused_and_asked_afresh(
        make_engine, now: str) -> None:
    engine: Engine = make_engine()
    g = gateway(make_engine, engine)
    v1 = identity(tool())
    current = {"schema": identity(tool(input_schema={**SCHEMA, "required": ["to"]})),
               "description": identity(tool(description="Pay, in dollars.")),
               "gone": GONE}[now]
    a, doc = await _approved(g, v1)
    server = Server()
    # collected as a Tasks poll collects it (tasks/get): refused, nothing run
    out = await g.collect(await g.token(), "pay", doc, server, _now(current))
    assert isinstance(out, Refused) and out.status == "cancelled" and server.ran == []
    assert "changed the tool since the call was approved" in out.message
    assert {"schema": "input schema", "description": "definition",
            "gone": "no longer offered"}[now] in out.message
    assert "asked afresh" in out.message
    # the request is over, cancelled; its document says why
    doc2 = await g.e.request_document(await g.token(), a.run_id)
    assert doc2["status"] == "cancelled" and "changed since" in doc2["decision"]["reason"]
    entries = await Rows.of(g.e).audit(run_id=a.run_id)
    closed = [e for e in entries if e.action == "cancelled"]
    assert [(e.actor, json.loads(e.details)["code"]) for e in closed] == \
        [("system:tool-identity", "tool_changed")]
    exported = export_row(closed[0])["details"]
    assert exported["approved_identity"] == binding.shown(v1.digest())
    assert exported["current_identity"] == binding.shown(current.digest())
    assert v1.digest() not in json.dumps(exported) and v1.schema not in json.dumps(exported)
    # a retry of the same call collects nothing: it is asked afresh, about the tool now
    if current != GONE:
        g.identities["pay"] = current
    later = asyncio.ensure_future(g.call("pay", ARGS, server, identify=_now(current)))
    b = await pending(g)
    assert b.run_id != a.run_id and server.ran == []
    if current != GONE:
        assert (b.tool_version, b.tool_schema) == (current.version, current.schema)
        await g.e.decide(b.id, actor=ALICE, verdict="approve")
        ran = await asyncio.wait_for(later, 10)
        assert isinstance(ran, Ran) and server.ran == [ARGS]
    else:
        later.cancel()
        await asyncio.gather(later, return_exceptions=True)
