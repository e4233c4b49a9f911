"""The MCP gateway's way back for a 2025-11-25 client's replies (bot/mcp/relay.py): the
session id it gives at initialize carries what the client declared, and a reply POST is
taken only for a request written for the same bearer token."""

from __future__ import annotations

import mcp_types as types
from approvald.bot.mcp.relay import MAX_SESSION, BackChannel, Session


def test_a_session_id_carries_the_clients_capabilities_and_nothing_else_is_one() -> None:
    caps = types.ClientCapabilities(sampling=types.SamplingCapability(),
                                    roots=types.RootsCapability(list_changed=True))
    said = Session(caps).encode()
    assert said is not None and said.isascii() and " " not in said
    back = Session.decode(said)
    assert back is not None and back.capabilities == caps
    for other in (None, "", "abc", "ad1.!!!", "ad1." + "e30" * 2000, "ad1.bm90IGpzb24"):
        assert Session.decode(other) is None, other
    assert len(said) <= MAX_SESSION


async def test_a_reply_is_taken_only_for_its_own_token_and_only_once() -> None:
    back = BackChannel()
    rid, future = back.open("tok_dana")
    reply = {"jsonrpc": "2.0", "id": rid, "result": {"action": "decline"}}
    assert not back.deliver("tok_eve", reply)  # someone else's token: not this reply
    assert not back.deliver("tok_dana", {"jsonrpc": "2.0", "id": "other", "result": {}})
    assert not back.deliver("tok_dana", {"jsonrpc": "2.0", "id": rid, "method": "ping"})
    assert not future.done()
    assert back.deliver("tok_dana", [reply])
    assert future.result() == reply
    assert not back.deliver("tok_dana", reply)  # answered: no longer waiting
    assert back.waiting == {}
