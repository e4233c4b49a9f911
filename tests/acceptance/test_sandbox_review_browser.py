"""The web review queue from the sandbox page, in a real browser (issue 35): Dana starts a
refund; Alice opens her Mail, follows the request mail's link to the queue, asks for a
sign-in link, follows it from her Mail, signs in and approves on the queue; the card in
#approvals turns Approved and the refund runs once. Screenshots under
``test-artifacts/sandbox-review/``.

Skipped without chromium (or Playwright), unless ``APPROVALD_REQUIRE_BROWSER=1``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.acceptance.browser_pages import sandbox_page
from tests.acceptance.sandbox_proc import wait_until

pytestmark = pytest.mark.slow

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "sandbox-review"
WAIT_MS = 60_000


def test_an_approver_signs_in_from_the_sandbox_mail_and_approves_on_the_queue(
        tmp_path: Path) -> None:
    with sandbox_page(tmp_path, ARTIFACTS, WAIT_MS) as (sb, page, expect):
        page.goto(sb.url + "?user=U_DANA")
        expect(page.locator("body")).to_have_attribute("data-ready", "1")
        page.fill("#order", "A-9")
        page.click("#start button[type=submit]")
        card = page.locator("#pane .msg:has(.b-header)").first
        expect(card).to_contain_text("Approval needed: issue_refund")

        page.select_option("#user", "U_ALICE")
        expect(page.locator("body")).to_have_attribute("data-user", "U_ALICE")
        page.click("#nav-mail")
        expect(page.locator("#title")).to_have_text("Mail to alice@example.com")
        request = page.locator("#pane .msg.mail", has_text="Approval needed").first
        expect(request).to_contain_text('"order_id": "A-9"')
        page.screenshot(path=str(ARTIFACTS / "01-mail.png"))
        with page.expect_popup() as opened:
            request.locator("a[href*='/review/requests/']").click()
        queue = opened.value
        expect(queue.locator("button", has_text="Mail me a sign-in link")).to_be_visible()
        queue.fill("input[type=email]", "alice@example.com")
        queue.click("button:has-text('Mail me a sign-in link')")
        expect(queue.locator(".notice")).to_contain_text("sign-in link is on its way")

        sign_in = page.locator("#pane .msg.mail", has_text="sign-in link").first
        with page.expect_popup() as opened:
            sign_in.locator("a[href*='/review/sign-in/']").click()
        signed = opened.value
        signed.click("button:has-text('Sign in')")
        article = signed.locator("article.card")
        expect(article).to_contain_text("issue_refund")
        expect(article).to_contain_text('"order_id": "A-9"')
        signed.screenshot(path=str(ARTIFACTS / "02-queue.png"))
        article.locator("button.approve").click()
        expect(signed.locator(".notice")).to_contain_text("Approved")
        signed.screenshot(path=str(ARTIFACTS / "03-approved.png"))

        page.bring_to_front()
        page.click("nav a[data-pane='C_APPROVALS']")
        expect(card).to_contain_text("Approved")
        expect(card).to_contain_text("on the web review queue")
        page.screenshot(path=str(ARTIFACTS / "04-card.png"))
        refunds = wait_until(lambda: [e for e in sb.ledger_lines()
                                      if e["tool"] == "issue_refund"], within=60,
                             what="the refund")
        assert [r["args"]["order_id"] for r in refunds] == ["A-9"]
