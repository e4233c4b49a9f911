"""``serve`` runs on uvloop where it is installed (issue 50): ``APPROVALD_EVENT_LOOP`` is
``auto`` (uvloop if it imports, asyncio's own loop otherwise), ``uvloop`` (or a
configuration error) or ``asyncio``; anything else is a configuration error naming the
variable. The command line's own path is run (``main(["serve"])``), with ``serve`` itself
replaced by a stand-in that says which loop it runs on; the banner names it."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
import uvloop
from approvald.bot import serve as serve_module
from approvald.bot.cli.root import main
from approvald.bot.config import Settings
from approvald.bot.serve import running_loop_name

from tests.integration.test_serve_banner import banner


@pytest.fixture
def loops(monkeypatch: pytest.MonkeyPatch, sqlite_url: str) -> list[str]:
    """The loop each ``serve`` of this test ran on, by name (and its loop's class)."""
    seen: list[str] = []

    async def stand_in(settings: Settings) -> int:
        loop = asyncio.get_running_loop()
        seen.append(f"{running_loop_name()} {type(loop).__module__}.{type(loop).__name__}")
        return 0

    monkeypatch.setattr(serve_module, "serve", stand_in)
    monkeypatch.setenv("APPROVALD_DATABASE_URL", sqlite_url)
    return seen


def test_serve_runs_on_uvloop_where_it_is_installed(loops: list[str]) -> None:
    assert main(["serve"]) == 0
    assert loops == ["uvloop uvloop.Loop"]


def test_the_setting_forces_asyncios_own_loop(loops: list[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("APPROVALD_EVENT_LOOP", "asyncio")
    assert main(["serve"]) == 0
    assert loops == ["asyncio asyncio.unix_events._UnixSelectorEventLoop"]


def test_an_unknown_loop_is_a_configuration_error_naming_the_variable(
        loops: list[str], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("APPROVALD_EVENT_LOOP", "trio")
    assert main(["serve"]) == 2
    assert capsys.readouterr().err.strip() == (
        "approvald: APPROVALD_EVENT_LOOP: Input should be 'auto', 'uvloop' or 'asyncio' "
        "(got 'trio')")
    assert loops == []


def test_without_uvloop_auto_is_asyncio_and_uvloop_is_a_configuration_error(
        loops: list[str], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop: ImportError
    assert main(["serve"]) == 0
    assert loops == ["asyncio asyncio.unix_events._UnixSelectorEventLoop"]
    monkeypatch.setenv("APPROVALD_EVENT_LOOP", "uvloop")
    assert main(["serve"]) == 2
    assert capsys.readouterr().err.startswith(
        "approvald: APPROVALD_EVENT_LOOP: uvloop is not installed for this Python")
    assert len(loops) == 1


def test_serve_starts_on_uvloop_and_its_banner_names_the_loop(sqlite_url: str,
                                                              tmp_path: Path) -> None:
    s = Settings(APPROVALD_DATABASE_URL=sqlite_url, APPROVALD_HOST="127.0.0.1",
                 APPROVALD_PORT="0", APPROVALD_POLL_INTERVAL="600",
                 APPROVALD_METRICS_ADDR="127.0.0.1:0",
                 APPROVALD_DEMO_LEDGER=str(tmp_path / "ledger.jsonl"))
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        _service, text = runner.run(banner(sqlite_url, s))
    assert text.splitlines()[-1] == "event loop: uvloop (APPROVALD_EVENT_LOOP=auto)"
