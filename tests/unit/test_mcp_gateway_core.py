"""The MCP gateway's approvald side (bot.mcp.gateway) without MCP: each call an external
request; what runs is what was approved, once; retries join; nothing is run twice."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from approvald.bot.mcp.gateway import Gateway, Ran, Refused
from approvald.runtime.approvals.decide import Actor
from approvald.runtime.engine import Engine
from approvald.runtime.kernel.clock import ManualClock
from approvald.runtime.kernel.errors import DecisionRefused
from approvald.runtime.policies.policy import PolicyFile
from approvald.runtime.record.outbox_kinds import CARD_POST, REQUEST_MAIL, mail_group
from approvald.store.models import Outbox

from tests.helpers import Rows
from tests.integration.slack_harness import wait_for

ALICE = Actor("U_ALICE", "cli:test")
POLICY = PolicyFile.model_validate({"tools": {
    "mcp:t/pay": {"approvers": ["U_ALICE"], "ttl": "30m"}}})
ARGS = {"to": "acct-1", "cents": 500}


class Server:
    """A wrapped server: counts what ran."""

    def __init__(self, *, fail: bool = False) -> None:
        self.ran: list[dict[str, Any]] = []
        self.fail = fail

    async def __call__(self, args: dict[str, Any]) -> Ran[str]:
        self.ran.append(args)
        if self.fail:
            raise ConnectionError("the server went away mid-call")
        return Ran(f"paid {args.get('cents')}", "succeeded", {"paid": args.get("cents")})


def gateway(make_engine: Callable[..., Engine], engine: Engine | None = None) -> Gateway:
    return Gateway(engine or make_engine(policy=POLICY), name="t", requested_by="U_DANA",
                   server="fake-server", heartbeat=0.05)


async def pending(g: Gateway, *, n: int = 1) -> Any:
    async def found() -> Any:
        rows = await Rows.of(g.e).requests(status="pending")
        return rows[0] if len(rows) >= n else None

    return await wait_for(found, what="a pending request")


async def test_a_redirect_is_a_tool_error_with_the_guidance(make_engine) -> None:
    g, server = gateway(make_engine), Server()
    call = asyncio.ensure_future(g.call("pay", ARGS, server))
    a = await pending(g)
    await g.e.decide(a.id, actor=ALICE, verdict="redirect", reason="pay half of it")
    out = await asyncio.wait_for(call, 10)
    assert isinstance(out, Refused) and out.status == "redirected"
    assert "U_ALICE redirected it: pay half of it" in out.message
    assert server.ran == []


async def test_a_call_started_elsewhere_and_never_reported_is_not_run_again(
        make_engine) -> None:
    engine = make_engine(policy=POLICY)
    first, broken = gateway(make_engine, engine), Server(fail=True)
    call = asyncio.ensure_future(first.call("pay", ARGS, broken))
    a = await pending(first)
    await engine.decide(a.id, actor=ALICE, verdict="approve")
    try:
        await asyncio.wait_for(call, 10)
        raise AssertionError("the forward's failure should reach the caller")
    except ConnectionError:
        pass
    assert broken.ran == [ARGS]
    # a new process of the same gateway (nothing in memory) gets the same call again
    again, server = gateway(make_engine, engine), Server()
    out = await asyncio.wait_for(again.call("pay", ARGS, server), 10)
    assert isinstance(out, Refused) and out.status == "unknown"
    assert "never runs such a call again" in out.message and a.run_id in out.message
    assert server.ran == []
    execution = await Rows.of(engine).execution(a.run_id, "call")
    assert execution is not None and execution.status == "started"  # outcome unknown


async def test_an_approval_is_collected_by_a_retry_within_its_window(make_engine) -> None:
    g, server = gateway(make_engine), Server()
    call = asyncio.ensure_future(g.call("pay", ARGS, server))
    a = await pending(g)
    call.cancel()  # the client gave up waiting
    await asyncio.gather(call, return_exceptions=True)
    await g.e.decide(a.id, actor=ALICE, verdict="approve")
    out = await asyncio.wait_for(g.call("pay", ARGS, server), 10)  # its retry
    assert isinstance(out, Ran) and out.value == "paid 500"
    assert server.ran == [ARGS]
    assert len(await Rows.of(g.e).requests()) == 1  # no second request


async def test_an_approval_nobody_collected_in_time_is_not_used_later(
        make_engine, clock: ManualClock) -> None:
    g, server = gateway(make_engine), Server()
    call = asyncio.ensure_future(g.call("pay", ARGS, server))
    a = await pending(g)
    call.cancel()
    await asyncio.gather(call, return_exceptions=True)
    await g.e.decide(a.id, actor=ALICE, verdict="approve")
    clock.advance(timedelta(minutes=31))  # past the request's window
    later = asyncio.ensure_future(g.call("pay", ARGS, server))
    b = await pending(g)
    assert b.run_id != a.run_id and server.ran == []  # asked again
    old = await Rows.of(g.e).run(a.run_id)
    entries = await Rows.of(g.e).audit(run_id=a.run_id)
    assert old is not None and old.status == "cancelled"
    assert (entries[-1].action, entries[-1].actor) == ("cancelled", "system:collection-window")
    await g.e.decide(b.id, actor=ALICE, verdict="deny", reason="not twice")
    out = await asyncio.wait_for(later, 10)
    assert isinstance(out, Refused) and "denied by U_ALICE: not twice" in out.message


async def test_a_tool_the_policy_file_does_not_name_is_asked_about(make_engine) -> None:
    g, server = gateway(make_engine), Server()
    call = asyncio.ensure_future(g.call("delete_everything", {"really": True}, server))
    a = await pending(g)
    assert a.tool == "delete_everything" and server.ran == []
    assert "does not name delete_everything" in json.loads(a.packet)["why"]
    with pytest.raises(DecisionRefused):  # anyone may decide, but not the requester
        await g.e.decide(a.id, actor=Actor("U_DANA", "cli:test"), verdict="approve")
    await g.e.decide(a.id, actor=Actor("U_BOB", "cli:test"), verdict="approve")
    out = await asyncio.wait_for(call, 10)
    assert isinstance(out, Ran) and server.ran == [{"really": True}]


async def test_progress_says_where_the_request_can_be_decided_now(make_engine) -> None:
    """Issue 33 item 6: "waiting for approval in Slack" while nothing was posted to Slack
    (serve without Slack) sent people looking for a card that did not exist. Issue 45 item
    9: where it can be decided comes from the database, never from this process's
    settings, and never "the HTTP API" (which decides nothing)."""
    g, server = gateway(make_engine), Server()
    said: list[str] = []

    async def waiting(doc: dict[str, Any]) -> None:
        said.append(await g.progress(doc))

    async def next_line() -> str:
        n = len(said)
        await wait_for(lambda: len(said) > n, what="another progress line")
        assert "HTTP API" not in said[-1] and "not configured" not in said[-1], said[-1]
        return said[-1]

    async def card_row(status: str) -> None:
        await Rows.of(g.e).forge(Outbox, Outbox.group_key == a.id, Outbox.kind == CARD_POST,
                                 status=status)

    call = asyncio.ensure_future(g.call("pay", ARGS, server, waiting=waiting))
    a = await pending(g)
    line = await next_line()  # nothing has taken its card yet
    assert "in Slack (" not in line and "waits to be posted to Slack" in line, line
    assert f"`approvald approvals approve {a.id} --as U…`" in line
    await card_row("delivered")  # a serve without Slack logged it
    assert "It has no card in Slack" in await next_line()
    await card_row("dead")
    assert "could not be posted to Slack" in await next_line()
    await Rows.of(g.e).card_posted(a.id, channel="C_APPROVALS", ts="1.000001")  # now posted
    line = await next_line()
    assert "It can be decided on its card in Slack (channel C_APPROVALS); from a" in line
    # mailed to its approvers: the web review queue
    await Rows.of(g.e).add_outbox(kind=REQUEST_MAIL, group_key=mail_group(a.id), payload="{}",
                                  now=g.e.now())
    assert "; in the web review queue (it was mailed to its approvers); " in await next_line()
    await g.e.decide(a.id, actor=ALICE, verdict="approve")
    assert isinstance(await call, Ran)


async def test_a_denial_answers_the_call_that_waited_for_it_once(make_engine) -> None:
    """Issue 45 item 7, on the gateway too: a client that gave up waiting and makes the call
    again is told the denial and its reason (not asked again); a later call asks again."""
    g, server = gateway(make_engine), Server()
    out = await g.call("pay", ARGS, server, budget=0)
    a = await pending(g)
    assert isinstance(out, Refused) and out.status == "pending"
    await g.e.decide(a.id, actor=ALICE, verdict="deny", reason="wrong account")
    out = await g.call("pay", ARGS, server, budget=0)
    assert isinstance(out, Refused) and out.status == "denied", out
    assert "wrong account" in out.message and out.request_id == a.run_id
    out = await g.call("pay", ARGS, server, budget=0)
    assert isinstance(out, Refused) and out.status == "pending"
    assert out.request_id != a.run_id and server.ran == []
    refused = [e for e in await Rows.of(g.e).audit(run_id=a.run_id) if e.action == "refused"]
    assert [json.loads(e.details)["reason"] for e in refused] == ["pending"]
