"""What the MCP gateway takes from the SDK as it is (issue 50): the fast path's private
names (bot/mcp/fastcall.py) are there, and the switch that turns it off reaches the
gateways (that it answers as the SDK does is ``tests/integration/test_mcp_fastcall.py``);
the HTTP client a session with a Streamable HTTP server gets is the SDK's own default."""

from __future__ import annotations

from importlib.metadata import version
from pathlib import Path

import httpx2
import pytest
from approvald.bot.config import Settings
from approvald.bot.mcp import fastcall, stdio
from approvald.bot.mcp.upstream import http_client
from approvald.bot.serve import _mcp_gateways


def test_every_private_name_relied_on_is_there() -> None:
    assert fastcall.RELIES_ON
    gone = fastcall.missing()
    assert not gone, (f"mcp {version('mcp')} lacks {', '.join(gone)}, which "
                      "bot/mcp/fastcall.py relies on: adapt it to this release (or bound mcp "
                      "below it in pyproject.toml); APPROVALD_MCP_FAST_PATH=0 runs without it")


@pytest.mark.parametrize(("raw", "on"), [(None, True), ("1", True), ("0", False)])
def test_the_switch_reaches_every_gateway(tmp_path: Path, raw: str | None, on: bool) -> None:
    (tmp_path / "gateways.toml").write_text('[gateways.a]\ncommand = ["x"]\n\n'
                                            '[gateways.b]\nurl = "http://127.0.0.1:1/mcp"\n')
    extra = {} if raw is None else {"APPROVALD_MCP_FAST_PATH": raw}
    settings = Settings(APPROVALD_MCP_GATEWAYS_FILE=str(tmp_path / "gateways.toml"), **extra)
    made = _mcp_gateways(settings, engine=None)  # type: ignore[arg-type]
    assert made is not None
    assert [g.fast_path for g in made.gateways.values()] == [on, on]


async def test_a_sessions_http_client_is_the_sdks_default_with_a_kept_tls_context() -> None:
    from mcp.shared._httpx_utils import create_mcp_http_client

    tls = httpx2.create_ssl_context()
    async with http_client(tls) as ours, create_mcp_http_client() as sdk:
        assert ours.timeout == sdk.timeout
        assert ours.follow_redirects == sdk.follow_redirects
        assert dict(ours.headers) == dict(sdk.headers)
        assert ours.trust_env == sdk.trust_env


def test_every_private_name_the_stdio_transport_calls_is_there() -> None:
    assert stdio.RELIES_ON
    assert not stdio.writer_missing(), (
        f"anyio {version('anyio')}'s process stdin no longer wraps its asyncio writer as "
        f"{'.'.join(stdio.WRITER)}: bot/mcp/stdio.py writes through the wrapper's send "
        "(a turn of the event loop more per message); adapt it to this release")
    gone = stdio.missing()
    assert not gone, (f"mcp {version('mcp')} lacks {', '.join(gone)}, which "
                      "bot/mcp/stdio.py relies on: adapt it to this release (or bound mcp "
                      "below it in pyproject.toml); APPROVALD_MCP_FAST_PATH=0 runs without it")
