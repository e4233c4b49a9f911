"""The MCP fast path's private names (bot/mcp/fastcall.py, issue 50) are there, and the
switch that turns it off reaches the gateways. That it answers as the SDK does is
``tests/integration/test_mcp_fastcall.py``."""

from __future__ import annotations

from importlib.metadata import version
from pathlib import Path

import pytest
from approvald.bot.config import Settings
from approvald.bot.mcp import fastcall
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
