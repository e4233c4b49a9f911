"""Opening a self-contained HTML file (a trace, an eval report) in headless chromium and
holding it to a clean load: no console error or warning, no page error, no request for
anything but the file itself."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.acceptance.test_sandbox_browser import CHROMIUM


def launch(pw: Any) -> Any:
    return pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                              args=["--no-sandbox", "--disable-gpu"])


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
