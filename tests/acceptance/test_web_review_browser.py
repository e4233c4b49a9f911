"""The web review queue in a real browser at a phone's width (Playwright driving Debian's
chromium, headless): an approver asks for a sign-in link, gets it from a real SMTP server
on loopback, opens it, presses Sign in, and approves a refund on the queue page; the run
resumes, the refund is issued once and the Slack card says who approved it. The page
never scrolls sideways at 390 px. Screenshots of each state are saved under
``test-artifacts/web-review/``. This is the walk-through of docs/how-to/web-review.md.

Without chromium (or Playwright) the test is skipped, saying what to install, unless
``APPROVALD_REQUIRE_BROWSER=1`` (CI sets it) makes that a failure.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from approvald.bot.web.auth import sha256

from tests.acceptance.browser_pages import LAUNCH, playwright
from tests.helpers import Rows
from tests.integration.slack_harness import Harness, wait_for
from tests.integration.web_helpers import smtp_server, web_harness

# a browser: out of the inner loop (-m 'not slow')
pytestmark = pytest.mark.slow

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "web-review"
PHONE = {"width": 390, "height": 844}
WAIT_MS = 60_000



async def _completed(h: Harness, run_id: str) -> bool:
    return bool((await h.run(run_id)).status == "completed")


async def _card_says(h: Harness, approval_id: str, word: str) -> bool:
    a = await h.approval(approval_id)
    msg = h.emulator.message(a.channel, a.message_ts)
    return bool(msg and word in json.dumps(msg))


async def test_an_approver_signs_in_by_mail_and_approves_on_a_phone(
        sqlite_url: str, tmp_path: Path) -> None:
    async_playwright = playwright("async")
    from playwright.async_api import expect

    expect.set_options(timeout=WAIT_MS)
    shutil.rmtree(ARTIFACTS, ignore_errors=True)
    ARTIFACTS.mkdir(parents=True)
    async with smtp_server() as (inbox, smtp_port), \
            web_harness(sqlite_url, tmp_path, smtp_port=smtp_port) as (h, url):
        paused = await h.pause_refund()
        [aid] = paused.approval_ids
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(**LAUNCH)
            try:
                context = await browser.new_context(viewport=PHONE, is_mobile=True,
                                                    has_touch=True, device_scale_factor=2)
                page = await context.new_page()
                page.set_default_timeout(WAIT_MS)

                async def shot(n: int, name: str) -> None:
                    await page.screenshot(path=str(ARTIFACTS / f"{n:02d}-{name}.png"),
                                          full_page=True)
                    width = await page.evaluate("document.documentElement.scrollWidth")
                    wide = await page.evaluate(
                        "[...document.querySelectorAll('*')].map(e => [e.tagName, "
                        "e.className, Math.round(e.getBoundingClientRect().width)])"
                        ".filter(x => x[2] > 391).slice(0, 12)")
                    inner = await page.evaluate("[innerWidth, visualViewport.scale]")
                    assert width <= PHONE["width"], \
                        f"{name}: the page scrolls sideways: {width} {inner} {wide}"

                await page.goto(f"{url}/review")
                await shot(1, "sign-in")
                await page.get_by_label("Email address").fill("alice@example.com")
                await page.get_by_role("button", name="Mail me a sign-in link").click()
                await expect(page.get_by_text("a sign-in link is on its way")).to_be_visible()
                link = await inbox.link_for("alice@example.com")
                await page.goto(link)
                await expect(page.get_by_text("as U_ALICE")).to_be_visible()
                await shot(2, "link-opened")
                # opening it signed nobody in
                link_row = await Rows.of(h.engine).sign_in_link(sha256(link.rsplit("/", 1)[1]))
                assert link_row is not None and link_row.used_at is None
                await page.get_by_role("button", name="Sign in").click()
                card = page.locator(f"#r-{aid}")
                await expect(card).to_be_visible()
                await expect(card).to_contain_text("issue_refund")
                await expect(card).to_contain_text('"amount_cents": 4200')
                await expect(card).to_contain_text("goes back to the customer")
                await shot(3, "queue")
                await card.get_by_role("button", name="Approve").click()
                await expect(page.get_by_text("Approved: the run goes on.")).to_be_visible()
                await expect(page.get_by_text("Nothing waits for you.")).to_be_visible()
                await shot(4, "approved")
            finally:
                await browser.close()
        await wait_for(lambda: _completed(h, paused.run_id), what="the run to complete")
        assert len(h.refunds()) == 1
        await wait_for(lambda: _card_says(h, aid, "Approved"), what="the card's update")
        a = await h.approval(aid)
        assert a.decided_by == "U_ALICE" and a.decided_via == "web"
    assert sorted(p.name for p in ARTIFACTS.iterdir()) == [
        "01-sign-in.png", "02-link-opened.png", "03-queue.png", "04-approved.png"]


async def test_slack_down_the_request_is_mailed_and_approved_in_the_browser(
        sqlite_url: str, tmp_path: Path) -> None:
    """Issue 35's walk-through: Slack unreachable; after APPROVALD_MAIL_FALLBACK_AFTER the
    approver gets the request by mail, follows its link in the browser, signs in through
    the emailed single-use link and approves on the queue; the run resumes, the refund is
    issued once, and once Slack is back the card shows the decision, made on the web."""
    import re
    from datetime import UTC, datetime, timedelta

    from approvald.runtime.kernel.clock import ManualClock

    async_playwright = playwright("async")
    from playwright.async_api import expect

    expect.set_options(timeout=WAIT_MS)
    policy = tmp_path / "policy.toml"
    policy.write_text('[tools.issue_refund]\napprovers = ["U_ALICE"]\n')
    clock = ManualClock(datetime.now(UTC))
    async with smtp_server() as (inbox, smtp_port), \
            web_harness(sqlite_url, tmp_path, clock=clock, smtp_port=smtp_port,
                        APPROVALD_MAIL_FALLBACK_AFTER="5m",
                        APPROVALD_POLICY_FILE=str(policy)) as (h, url):
        await h.emulator.down()
        paused = await h.pause_refund()
        [aid] = paused.approval_ids

        async def tried() -> bool:
            [row] = await Rows.of(h.engine).outbox("approval.requested")
            return bool(row.last_error and row.claimed_until is None)

        await wait_for(tried, what="a first try of the card")
        clock.advance(timedelta(minutes=5, seconds=1))
        h.engine.notify_outbox()
        [mail] = await wait_for(lambda: inbox.to("approvals@example.com"),
                                what="the request's mail")
        body = mail.get_body(("plain",))
        assert body is not None
        found = re.search(r"(https?://\S+/review/requests/\w+)", body.get_content())
        assert found and found.group(1) == f"{url}/review/requests/{aid}"
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(**LAUNCH)
            try:
                context = await browser.new_context(viewport=PHONE, is_mobile=True,
                                                    has_touch=True)
                page = await context.new_page()
                page.set_default_timeout(WAIT_MS)
                await page.goto(found.group(1))  # not signed in: the sign-in form
                await page.get_by_label("Email address").fill("alice@example.com")
                await page.get_by_role("button", name="Mail me a sign-in link").click()
                await expect(page.get_by_text("a sign-in link is on its way")).to_be_visible()
                await page.goto(await inbox.link_for("alice@example.com"))
                await page.get_by_role("button", name="Sign in").click()
                await page.goto(found.group(1))
                card = page.locator(f"#r-{aid}")
                await expect(card).to_contain_text('"amount_cents": 4200')
                await card.get_by_role("button", name="Approve").click()
                await expect(page.get_by_text("Approved: the run goes on.")).to_be_visible()
            finally:
                await browser.close()
        await wait_for(lambda: _completed(h, paused.run_id), what="the run to complete")
        assert len(h.refunds()) == 1
        a = await h.approval(aid)
        assert a.decided_by == "U_ALICE" and a.decided_via == "web"
        [approved] = [e for e in await Rows.of(h.engine).audit() if e.action == "approved"]
        assert approved.via == "web"
        await wait_for(lambda: len(inbox.to("approvals@example.com")) == 2,
                       what="the outcome mail")  # (sent before the clock jumps below)

        async def mails_sent() -> bool:
            return all(r.status != "pending" for r in await Rows.of(h.engine).outbox()
                       if r.kind.startswith("mail."))

        await wait_for(mails_sent, what="the drain to mark its mails")
        await h.emulator.up()
        clock.advance(timedelta(minutes=10))
        h.engine.notify_outbox()

        async def card_decided() -> bool:
            a = await h.approval(aid)
            return bool(a.message_ts) and await _card_says(h, aid, "on the web review queue")

        await wait_for(card_decided, what="the card, posted once Slack is back")
        assert len(h.refunds()) == 1
