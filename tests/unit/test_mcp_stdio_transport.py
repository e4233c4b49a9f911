"""serve's stdio transport to a gateway's server (bot/mcp/stdio.py, issue 50): the SDK's
session over the server's pipes without the SDK transport's relay tasks. Calls made at once
on the one session are each answered with their own result (JSON-RPC ids); what the server
writes is parsed line by line however its chunks fall, a line that is not JSON-RPC reaching
the session as the SDK's reader gives it; the session's reading is bounded; a pipe that
breaks ends the session's reading instead of leaving a call waiting; the server is stopped
when the session ends."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import anyio
import mcp.client.stdio as sdk_stdio
import pytest
from approvald.bot.mcp import stdio
from approvald.bot.mcp.stdio import Inbox, Outbox, stdio_transport
from mcp import Client, StdioServerParameters
from mcp.shared.message import SessionMessage
from mcp_types import JSONRPCRequest, JSONRPCResponse

from tests.helpers import MCP_SERVER


def line(i: int) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": i, "result": {"n": i}}).encode() + b"\n"


class Chunks:
    """A server's stdout, as the chunks given (then its end)."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks
        self.read = 0

    async def receive(self, max_bytes: int = 65536) -> bytes:
        await asyncio.sleep(0)
        if self.read == len(self.chunks):
            raise anyio.EndOfStream
        self.read += 1
        return self.chunks[self.read - 1]


@pytest.mark.slow  # the fixture server is a process of its own
async def test_calls_made_at_once_on_the_session_each_get_their_own_result(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[Any] = []
    spawn = sdk_stdio._create_platform_compatible_process

    async def spawned(*args: Any, **kwargs: Any) -> Any:
        started.append(await spawn(*args, **kwargs))
        return started[-1]

    monkeypatch.setattr(sdk_stdio, "_create_platform_compatible_process", spawned)
    server = StdioServerParameters(command=sys.executable, args=[str(MCP_SERVER)], env={
        **os.environ, "MCP_FIXTURE_LEDGER": str(tmp_path / "ledger.jsonl")})
    async with Client(stdio_transport(server), cache=None) as client:
        results = await asyncio.gather(*(client.session.call_tool("echo", {"text": f"t{i}"})
                                         for i in range(40)))
        assert [r.content[0].text for r in results] == [f"t{i}" for i in range(40)]
        assert not any(r.is_error for r in results)
        inbox = client.session._dispatcher._read_stream  # type: ignore[attr-defined]
        assert isinstance(inbox, Inbox)  # this transport's, not the SDK's
        [process] = started
        assert process.returncode is None
    assert process.returncode is not None  # the session ended: the server was stopped


async def test_lines_are_parsed_however_their_chunks_fall_and_a_bad_one_is_passed_on() -> None:
    inbox = Inbox()
    raw = line(1) + b"not json\n" + b"\n" + line(2) + line(3)
    # split mid-line, mid-message, and one chunk holding several lines
    chunks = [raw[:7], raw[7:30], raw[30:31], raw[31:]]
    await stdio._read(Chunks(chunks), inbox)
    got: list[Any] = [item async for item in inbox]
    assert len(got) == 4
    first, bad, second, third = got
    assert isinstance(bad, Exception)
    for item, i in ((first, 1), (second, 2), (third, 3)):
        assert isinstance(item, SessionMessage) and isinstance(item.message, JSONRPCResponse)
        assert item.message.id == i and item.message.result == {"n": i}


async def test_reading_waits_while_the_session_has_not_taken_what_was_read() -> None:
    inbox = Inbox()
    stdout = Chunks([line(i) for i in range(stdio.READ_AHEAD + 20)])
    reading = asyncio.ensure_future(stdio._read(stdout, inbox))
    for _ in range(200):
        await asyncio.sleep(0)
    assert stdout.read == stdio.READ_AHEAD  # no more read than the session may take
    assert not reading.done()
    taken = [await inbox.receive() for _ in range(30)]
    for _ in range(200):
        await asyncio.sleep(0)
    assert stdout.read == stdio.READ_AHEAD + 20
    taken += [item async for item in inbox]
    await reading
    assert [t.message.id for t in taken if isinstance(t, SessionMessage)] == \
        list(range(stdio.READ_AHEAD + 20))


async def _all(inbox: Inbox) -> list[Any]:
    return [item async for item in inbox]


class BrokenPipe:
    async def send(self, data: bytes) -> None:
        raise anyio.BrokenResourceError


async def test_a_broken_pipe_ends_the_sessions_reading() -> None:
    inbox = Inbox()
    outbox = Outbox(BrokenPipe(), inbox, "utf-8", "strict")
    with pytest.raises(anyio.BrokenResourceError):
        await outbox.send(SessionMessage(JSONRPCRequest(jsonrpc="2.0", id=1, method="ping")))
    # the session's read loop ends (its waiters told the connection closed)
    assert await asyncio.wait_for(_all(inbox), 5) == []
    with pytest.raises(anyio.ClosedResourceError):
        await outbox.send(SessionMessage(JSONRPCRequest(jsonrpc="2.0", id=2, method="ping")))


async def test_a_message_is_written_as_the_sdks_transport_writes_it() -> None:
    written: list[bytes] = []

    class Pipe:
        async def send(self, data: bytes) -> None:
            written.append(data)

    message = JSONRPCRequest(jsonrpc="2.0", id=5, method="tools/call",
                             params={"name": "echo", "arguments": {"text": "é"}})
    await Outbox(Pipe(), Inbox(), "utf-8", "strict").send(SessionMessage(message))
    assert written == [(message.model_dump_json(by_alias=True, exclude_unset=True)
                        + "\n").encode()]


async def test_a_message_is_written_on_the_servers_stdin_without_a_turn_of_the_event_loop(
        ) -> None:
    """anyio's stdin wrapper ends its send with a checkpoint (a turn of the event loop, and
    about 40 Python calls, per message); written on the asyncio writer under it, a message
    is written at once, and a broken pipe still ends the session's reading."""
    from anyio._backends._asyncio import StreamWriterWrapper

    loop = asyncio.get_running_loop()
    r, w = os.pipe()
    reading = os.fdopen(r, "rb", buffering=0)
    transport, protocol = await loop.connect_write_pipe(
        lambda: asyncio.streams.FlowControlMixin(loop=loop), os.fdopen(w, "wb", buffering=0))
    stdin = StreamWriterWrapper(asyncio.StreamWriter(transport, protocol, None, loop))
    inbox = Inbox()
    outbox = Outbox(stdin, inbox, "utf-8", "strict")
    message = JSONRPCRequest(jsonrpc="2.0", id=1, method="ping")
    sending = outbox.send(SessionMessage(message))
    with pytest.raises(StopIteration):  # done at its first step: it never waited
        sending.send(None)
    assert reading.read(4096) == (message.model_dump_json(by_alias=True, exclude_unset=True)
                                  + "\n").encode()
    reading.close()  # the server gone: its pipe broke
    with pytest.raises(anyio.BrokenResourceError):
        for i in range(2, 100):
            await outbox.send(SessionMessage(JSONRPCRequest(jsonrpc="2.0", id=i,
                                                            method="ping")))
    assert await asyncio.wait_for(_all(inbox), 5) == []
    transport.close()
