"""A malformed HTTP request to one of serve's listeners is the client's error: it is
answered 400 and logged as one line, never as a traceback (issue 48 item 10: a NUL in a
header logged aiohttp's "Error handling request" with a full traceback)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from approvald.bot.config import Settings
from approvald.bot.serve import Service
from approvald.store.db import Database


async def raw(port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        return await asyncio.wait_for(reader.read(4096), 30)
    finally:
        writer.close()
        await writer.wait_closed()


@pytest.mark.parametrize("request_bytes", [
    b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n",
    b"GET /healthz HTTP/1.1\r\nHost: x\r\nBad Header Name: 1\r\n\r\n",
    b"NOT-A-REQUEST\r\n\r\n",
], ids=["nul-in-header", "space-in-name", "no-request-line"])
async def test_a_malformed_request_is_a_400_and_one_log_line(
        sqlite_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture,
        request_bytes: bytes) -> None:
    settings = Settings(APPROVALD_DATABASE_URL=sqlite_url, APPROVALD_HOST="127.0.0.1",
                        APPROVALD_PORT="0", APPROVALD_POLL_INTERVAL="600",
                        APPROVALD_METRICS_ADDR="off",
                        APPROVALD_DEMO_LEDGER=str(tmp_path / "ledger.jsonl"))
    db = Database(sqlite_url)
    service = Service(settings, db)
    try:
        await service.start()
        assert service.ops_port
        with caplog.at_level(logging.INFO):
            answer = await raw(service.ops_port, request_bytes)
            assert answer.startswith(b"HTTP/1.") and b" 400 " in answer.split(b"\r\n")[0]
            ok = await raw(service.ops_port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n"
                                             b"Connection: close\r\n\r\n")
            assert b" 200 " in ok.split(b"\r\n")[0]  # the listener serves on
    finally:
        await service.stop()
        await db.close()
    said = [r for r in caplog.records if r.name == "aiohttp.server"]
    assert [(r.levelno, r.exc_info) for r in said] == [(logging.INFO, None)] * len(said), said
    for record in said:
        assert "a malformed HTTP request, answered 400" in record.getMessage()
        assert "\n" not in record.getMessage()
