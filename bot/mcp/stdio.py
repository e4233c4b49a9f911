"""The stdio transport of a server ``serve`` or ``mcp-proxy`` starts: the SDK's
:class:`mcp.Client` and its session over the server's pipes, with the SDK's own process
start and stop, and no relay task between the pipes and the session (issue 50).

The SDK's stdio transport (:func:`mcp.client.stdio.stdio_client`) hands each message
through a task and an unbuffered memory stream each way: a forwarded call's request is
handed to a writer task that writes it, and its reply is read by a reader task that hands
it, line by line, to the session's dispatcher, each hand-over a turn of the event loop and
anyio's stream machinery (about a third of the SDK client's Python calls per forwarded
call). Here a message the session sends is written on the server's stdin as it is sent (on
the asyncio writer under anyio's wrapper, :data:`WRITER`, without the wrapper's checkpoint:
a turn of the event loop), and what the server writes on its stdout is parsed as it
arrives and queued for the session's dispatcher, which takes it without waiting when it is
there. The same bytes go over the
pipes (one JSON-RPC message a line, as the SDK writes it); requests are sent as they come
and answered in any order (their JSON-RPC ids), as before.

Kept from the SDK: the process, spawned and stopped by its own functions (its command's
resolution, its environment, its stderr, its shutdown: stdin closed, then terminated, then
killed, with its tree); a line that is not a JSON-RPC message reaches the session as the
SDK's reader gives it (the exception); once the session is gone, what the server still
writes is read and dropped, so that it can exit. The SDK's private names it relies on are
listed in :data:`RELIES_ON`, anyio's in :data:`WRITER` (a test names them);
``APPROVALD_MCP_FAST_PATH=0`` uses the SDK's transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections import deque
from collections.abc import AsyncIterator
from types import TracebackType
from typing import Any, TextIO

import anyio
import mcp.client.stdio as sdk_stdio
from mcp.client.stdio import StdioServerParameters, get_default_environment
from mcp.shared.message import SessionMessage
from mcp_types import jsonrpc_message_adapter

# (where, name): the SDK's private names this module calls
RELIES_ON = (
    ("mcp.client.stdio", "_get_executable_command"),
    ("mcp.client.stdio", "_create_platform_compatible_process"),
    ("mcp.client.stdio", "_stop_server_process"),
)
# anyio's: the asyncio writer its process's stdin wraps, written to directly (its wrapper's
# send ends with a checkpoint: a turn of the event loop and about 40 Python calls per
# message, issue 50); without it, the wrapper's send
WRITER = ("anyio._backends._asyncio.StreamWriterWrapper", "_stream")
READ_AHEAD = 64  # messages parsed and not yet taken by the session, before reading waits
CHUNK = 65536


def missing() -> list[str]:
    """The names of :data:`RELIES_ON` the installed SDK lacks (none: all there)."""
    return [f"{where}.{name}" for where, name in RELIES_ON if not hasattr(sdk_stdio, name)]


def writer_missing() -> bool:
    """Whether anyio's stdin wrapper lacks :data:`WRITER` (then its own send is used)."""
    try:
        from anyio._backends._asyncio import StreamWriterWrapper
    except ImportError:
        return True
    return WRITER[1] not in getattr(StreamWriterWrapper, "__dataclass_fields__", {})


def _writer(stdin: Any) -> asyncio.StreamWriter | None:
    """The asyncio writer under anyio's ``stdin`` (:data:`WRITER`), or None."""
    found = getattr(stdin, WRITER[1], None)
    return found if isinstance(found, asyncio.StreamWriter) else None


class Inbox:
    """What the server wrote, one message (or the error parsing its line) at a time, for
    the session's dispatcher: the SDK's read stream, without a task behind it."""

    def __init__(self) -> None:
        self._items: deque[SessionMessage | Exception] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._room: asyncio.Future[None] | None = None  # the reader, waiting for room
        self._ended = False
        self.closed = False

    def put(self, item: SessionMessage | Exception) -> None:
        if not self.closed:
            self._items.append(item)
            self._wake()

    def end(self) -> None:
        """The server wrote its last: once what is queued is taken, the stream ends."""
        self._ended = True
        self._wake()

    def full(self) -> bool:
        return len(self._items) >= READ_AHEAD

    async def room(self) -> None:
        """Until the session took enough for more to be read (or it is gone)."""
        while self.full() and not self.closed:
            self._room = asyncio.get_running_loop().create_future()
            try:
                await self._room
            finally:
                self._room = None

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def receive(self) -> SessionMessage | Exception:
        while not self._items:
            if self.closed:
                raise anyio.ClosedResourceError
            if self._ended:
                raise anyio.EndOfStream
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        item = self._items.popleft()
        if self._room is not None and not self._room.done() and not self.full():
            self._room.set_result(None)
        return item

    def __aiter__(self) -> Inbox:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    def close(self) -> None:
        self.closed = True
        self._items.clear()
        self._wake()
        if self._room is not None and not self._room.done():
            self._room.set_result(None)

    async def aclose(self) -> None:
        self.close()

    async def __aenter__(self) -> Inbox:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc_val: BaseException | None, exc_tb: TracebackType | None) -> None:
        self.close()


class Outbox:
    """The session's messages, each written on the server's stdin as it is sent (one line
    of JSON, as the SDK's transport writes it): the SDK's write stream, without a task."""

    def __init__(self, stdin: Any, inbox: Inbox, encoding: str, errors: str) -> None:
        self._stdin = stdin
        self._writer = _writer(stdin)
        self._inbox = inbox
        self._encoding = encoding
        self._errors = errors
        self.closed = False

    async def send(self, item: SessionMessage, /) -> None:
        if self.closed:
            raise anyio.ClosedResourceError
        data = (item.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                ).encode(self._encoding, self._errors)
        try:
            if self._writer is None:
                await self._stdin.send(data)
            else:  # written now; waits only while the pipe is full
                self._writer.write(data)
                await self._writer.drain()
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            # the server may still be alive: the session sees its connection end (as the
            # SDK's writer has it) instead of a request waiting for ever
            self.closed = True
            self._inbox.end()
            raise anyio.BrokenResourceError from None

    async def aclose(self) -> None:
        self.closed = True

    async def __aenter__(self) -> Outbox:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc_val: BaseException | None, exc_tb: TracebackType | None) -> None:
        self.closed = True


def parse(line: bytes) -> SessionMessage | Exception:
    """One line the server wrote, as the SDK's reader parses it."""
    try:
        return SessionMessage(jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError as exc:
        sdk_stdio.logger.exception("Failed to parse JSONRPC message from server")
        return exc


async def _read(stdout: Any, inbox: Inbox) -> None:
    """Parse what the server writes into ``inbox``, then (once the session is gone) read
    and drop the rest, until the server closes its stdout."""
    buffer = b""
    with contextlib.suppress(anyio.EndOfStream, anyio.ClosedResourceError,
                             anyio.BrokenResourceError, ConnectionError, OSError):
        while True:
            if inbox.full():
                await inbox.room()
            chunk = await stdout.receive(CHUNK)
            if inbox.closed:
                continue
            *lines, buffer = (buffer + chunk).split(b"\n")
            for line in lines:
                if line.strip():
                    inbox.put(parse(line))
    inbox.end()


@contextlib.asynccontextmanager
async def stdio_transport(server: StdioServerParameters, errlog: TextIO = sys.stderr
                          ) -> AsyncIterator[tuple[Inbox, Outbox]]:
    """``server`` started over stdio, as :func:`mcp.client.stdio.stdio_client` starts and
    stops it: the read and write streams of a :class:`mcp.Client` (a ``Transport``)."""
    command = await sdk_stdio._get_executable_command(server.command)
    process = await sdk_stdio._create_platform_compatible_process(
        command=command, args=server.args, env=get_default_environment() | (server.env or {}),
        errlog=errlog, cwd=server.cwd)
    assert process.stdin is not None and process.stdout is not None
    inbox = Inbox()
    outbox = Outbox(process.stdin, inbox, server.encoding, server.encoding_error_handler)
    async with anyio.create_task_group() as tg:
        tg.start_soon(_read, process.stdout, inbox)
        try:
            yield inbox, outbox
        finally:
            with anyio.CancelScope(shield=True):
                inbox.close()
                outbox.closed = True
                await sdk_stdio._stop_server_process(process)
            tg.cancel_scope.cancel()
