"""``approvald trace --format html`` in a real browser (Playwright driving Debian's chromium,
headless, as in test_sandbox_browser.py): the page opens without a console error or a page
error, draws the three lanes with a bar for every model step, tool call and request, and a
script in a denial reason stays text. Screenshots go to ``test-artifacts/trace/`` (the test
prints their paths).

Without chromium (or Playwright) the test is skipped, saying what to install, unless
``APPROVALD_REQUIRE_BROWSER=1`` (CI sets it) makes that a failure.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance.browser_pages import launch, open_clean, playwright
from tests.helpers import make_cli

# each test here starts approvald (or a browser) as a process of its own
pytestmark = pytest.mark.slow

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "trace"


def _traced_run(cli: Any, verdict: str, *extra: str, task: str) -> Path:
    done = cli("run", "demo-refund", "--task", task, "--requested-by", "U_DANA")
    assert done.returncode == 0, done.stderr
    run_id = done.stdout.strip()
    [pending] = cli.json("approvals", "list", "--json")
    cli.advance_time(timedelta(minutes=22))  # within the 30-minute ttl
    cli.ok("approvals", verdict, pending["id"], "--as", "U_ALICE", *extra)
    page = cli.workdir / f"trace-{verdict}.html"
    cli.ok("trace", run_id, "--format", "html", "--output", str(page))
    return page


def test_the_html_trace_opens_cleanly_in_a_browser(sqlite_url: str, tmp_path: Path) -> None:
    sync_playwright = playwright()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    cli = make_cli(sqlite_url, tmp_path, in_process=True)
    approved = _traced_run(cli, "approve", task="Refund order A-1001, double charged")
    denied = _traced_run(cli, "deny", "--reason",
                         "<script>window.pwned = 1</script> <img src=x onerror='window.pwned=2'>",
                         task="Refund order B-7, <script>window.pwned = 3</script>")
    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            # (model steps, tool calls): a denied refund is never run, nor is the email sent
            for name, path, steps, calls in (("approved", approved, 4, 3),
                                             ("denied", denied, 3, 2)):
                page, _ = open_clean(browser, path)
                assert page.locator("svg#swimlane g.lane").evaluate_all(
                    "gs => gs.map(g => g.dataset.lane)") == ["model", "tools", "humans"]
                for lane, kind, n in (("model", "model_step", steps), ("tools", "tool_call", calls),
                                      ("humans", "approval", 1)):
                    bars = page.locator(f'svg#swimlane g.item[data-lane="{lane}"] rect')
                    assert bars.count() == n, (lane, bars.count())
                    assert page.locator(f'#entries tr[data-kind="{kind}"]').count() == n
                    box = bars.first.bounding_box()
                    assert box is not None and box["width"] >= 4 and box["height"] > 0
                # the wait for a human is drawn as long as it was: most of the run
                wait = page.locator('svg#swimlane g.item[data-lane="humans"] rect').first
                box = wait.bounding_box()
                assert box is not None and box["width"] > 500, box
                assert page.evaluate("window.pwned") is None  # agent and reviewer text is data
                assert page.locator("script").count() == 0
                shot = ARTIFACTS / f"trace-{name}.png"
                page.screenshot(path=str(shot), full_page=True)
                print(f"screenshot: {shot}")
                page.close()
            denied_page = denied.read_text()
            assert "&lt;script&gt;window.pwned = 1&lt;/script&gt;" in denied_page
        finally:
            browser.close()
