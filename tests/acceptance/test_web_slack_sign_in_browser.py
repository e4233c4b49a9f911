"""Sign in with Slack in a real browser at a phone's width (Playwright driving Debian's
chromium, headless): the approver presses "Sign in with Slack" on the review queue's
sign-in page, the emulated Slack's authorize step sends them back, and they approve a
refund on the queue; the run resumes, the refund is issued once, and the decision is
theirs, made on the web. Screenshots under ``test-artifacts/web-review-slack/``. The
walk-through of docs/how-to/web-review.md's "Sign in with Slack".
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.acceptance.browser_pages import LAUNCH, playwright
from tests.acceptance.test_web_review_browser import PHONE, WAIT_MS, _completed
from tests.integration.slack_harness import wait_for
from tests.integration.test_web_slack_sign_in import SLACK
from tests.integration.web_helpers import web_harness

pytestmark = pytest.mark.slow  # a browser: out of the inner loop (-m 'not slow')

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "web-review-slack"


async def test_an_approver_signs_in_with_slack_and_approves_on_a_phone(
        sqlite_url: str, tmp_path: Path) -> None:
    async_playwright = playwright("async")
    from playwright.async_api import expect

    expect.set_options(timeout=WAIT_MS)
    shutil.rmtree(ARTIFACTS, ignore_errors=True)
    ARTIFACTS.mkdir(parents=True)
    async with web_harness(sqlite_url, tmp_path, **SLACK) as (h, url):
        paused = await h.pause_refund()
        [aid] = paused.approval_ids
        h.emulator.openid.sign_in_as("U_ALICE")
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(**LAUNCH)
            try:
                context = await browser.new_context(viewport=PHONE, is_mobile=True,
                                                    has_touch=True)
                page = await context.new_page()
                page.set_default_timeout(WAIT_MS)
                problems: list[str] = []
                page.on("console", lambda m: problems.append(f"{m.type}: {m.text}")
                        if m.type in ("error", "warning") else None)
                await page.goto(f"{url}/review")
                await page.screenshot(path=str(ARTIFACTS / "01-sign-in.png"), full_page=True)
                await page.get_by_role("button", name="Sign in with Slack").click()
                # to Slack's authorize step, back, then on to the queue by itself
                card = page.locator(f"#r-{aid}")
                await expect(card).to_contain_text('"amount_cents": 4200')
                await expect(page.get_by_text("U_ALICE")).to_be_visible()
                await page.screenshot(path=str(ARTIFACTS / "02-queue.png"), full_page=True)
                await card.get_by_role("button", name="Approve").click()
                await expect(page.get_by_text("Approved: the run goes on.")).to_be_visible()
                assert problems == [], problems
            finally:
                await browser.close()
        await wait_for(lambda: _completed(h, paused.run_id), what="the run to complete")
        assert len(h.refunds()) == 1
        a = await h.approval(aid)
        assert a.decided_by == "U_ALICE" and a.decided_via == "web"
        assert [c.method for c in h.emulator.calls() if c.method.startswith("openid.")] == [
            "openid.connect.token", "openid.connect.userInfo"]
