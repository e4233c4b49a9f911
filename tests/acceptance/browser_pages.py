"""The browser tests' one way to headless chromium: where it is, how it is launched, what a
machine without it is told (skip, or fail under ``APPROVALD_REQUIRE_BROWSER=1``); and opening
a self-contained HTML file (a trace, an eval report) held to a clean load: no console error
or warning, no page error, no request for anything but the file itself."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance.sandbox_proc import Sandbox

CHROMIUM = os.environ.get("APPROVALD_CHROMIUM", "/usr/bin/chromium")
LAUNCH = {"executable_path": CHROMIUM, "headless": True,
          "args": ["--no-sandbox", "--disable-gpu"]}


def _need(reason: str) -> None:
    if os.environ.get("APPROVALD_REQUIRE_BROWSER") == "1":
        pytest.fail(f"APPROVALD_REQUIRE_BROWSER=1 but {reason}")
    pytest.skip(reason)


def playwright(api: str = "sync") -> Any:
    """``sync_playwright`` (or ``async_playwright`` for ``api="async"``), or the test is
    skipped saying what to install."""
    try:
        if api == "async":
            from playwright.async_api import async_playwright as entry
        else:
            from playwright.sync_api import sync_playwright as entry
    except ImportError:
        _need("Playwright is not installed (pip install -e '.[dev]')")
    if not (os.path.exists(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        _need(f"no chromium at {CHROMIUM} (apt-get install -y chromium)")
    return entry


def emoji_font_installed() -> bool:
    """Whether fontconfig knows a colour emoji font (Debian's fonts-noto-color-emoji, which
    the README names beside chromium): the sandbox page draws emoji with it, and shows their
    meaning in words on a machine without one."""
    fc_list = shutil.which("fc-list")
    if fc_list is None:
        return False
    found = subprocess.run([fc_list, ":charset=2705", "family"], capture_output=True,
                           text=True, timeout=30, check=False)
    return "emoji" in found.stdout.lower()


def launch(pw: Any) -> Any:
    return pw.chromium.launch(**LAUNCH)


def open_clean(browser: Any, path: Path) -> tuple[Any, list[str]]:
    """A new 1400x900 page showing ``path``, asserted to have loaded cleanly, and the list
    that keeps collecting its problems (to assert again after clicking around)."""
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    problems: list[str] = []
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}")
            if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
    page.on("request", lambda r: problems.append(f"request: {r.url}")
            if not r.url.startswith("file:") else None)
    page.goto(path.as_uri())
    page.wait_for_load_state("load")
    assert problems == [], problems
    return page, problems


@contextmanager
def sandbox_page(tmp_path: Path, artifacts: Path, wait_ms: int = 60_000,
                 extra_env: dict[str, str] | None = None
                 ) -> Iterator[tuple[Sandbox, Any, Any]]:
    """A sandbox started in ``tmp_path`` and a desktop-sized chromium page (``expect``
    waiting ``wait_ms``), ``artifacts`` emptied for the screenshots: (sandbox, page,
    expect). The sandbox must stop cleanly after the body."""
    sync_playwright = playwright()
    from playwright.sync_api import expect

    expect.set_options(timeout=wait_ms)
    shutil.rmtree(artifacts, ignore_errors=True)
    artifacts.mkdir(parents=True)
    sb = Sandbox(tmp_path, extra_env=extra_env)
    try:
        sb.start()
        with sync_playwright() as pw:
            browser = pw.chromium.launch(**LAUNCH)
            try:
                page = browser.new_page(viewport={"width": 1500, "height": 1000})
                page.set_default_timeout(wait_ms)
                yield sb, page, expect
            finally:
                browser.close()
        assert sb.stop() == 0
    finally:
        sb.close()
