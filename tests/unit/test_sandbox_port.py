"""The sandbox test harness keeps its port across restarts (tests/acceptance/sandbox_proc.py).

A restarted ``approvald sandbox`` listens on the port of its first start (the open page and
the test's URLs name it). Picked with a bind to port 0 and let go, that port was free for
anyone while the sandbox was down: under ``-n auto`` another worker's server, or an outgoing
connection's own port, could take it before the restart bound it again. The harness now
holds it from the ``Sandbox``'s creation to its ``close()``; the emulator (aiohttp, as the
sandbox process serves it) still listens there, start after start.
"""

from __future__ import annotations

import errno
import socket
from pathlib import Path

from approvald.bot.sandbox import SlackEmulator

from tests.acceptance.sandbox_proc import Sandbox


def _plain_bind(port: int) -> OSError | None:
    with socket.socket() as other:
        try:
            other.bind(("127.0.0.1", port))
        except OSError as exc:
            return exc
    return None


def _refused(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == errno.ECONNREFUSED


async def test_the_port_is_held_between_starts_and_served_at_each(tmp_path: Path) -> None:
    sb = Sandbox(tmp_path)
    try:
        for _ in range(2):  # the first start and a restart
            # down: nobody else gets the port, and nobody answers on it
            refused = _plain_bind(sb.port)
            assert refused is not None and refused.errno == errno.EADDRINUSE
            for _ in range(200):
                with socket.socket() as other:
                    other.bind(("127.0.0.1", 0))
                    assert other.getsockname()[1] != sb.port
            assert _refused(sb.port)
            # up: the sandbox's server listens on it
            emulator = SlackEmulator()
            url = await emulator.start("127.0.0.1", sb.port)
            try:
                assert url == f"{sb.url}api/"
                assert not _refused(sb.port)
            finally:
                await emulator.stop()
    finally:
        sb.close()
    assert sb.held.fileno() == -1  # let go at close()
