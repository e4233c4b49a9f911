"""The sandbox page in a real browser (Playwright driving Debian's chromium, headless).

A newcomer's first hour, clicked through: start a refund from the page, see its card; a
stranger's Approve and the requester's own Approve are refused (each sees why, nobody
else does); an approver denies with a reason and the agent re-plans in the thread; a
second refund is edited, first to an invalid amount (the modal shows the error inline),
then to a valid one, and the edited amount is what gets refunded. Then the sandbox
restarts under the open page, which reloads itself for the new start's token and works
on. A screenshot of each state is saved under ``test-artifacts/sandbox/``.

Without chromium (or Playwright) the test is skipped, saying what to install, unless
``APPROVALD_REQUIRE_BROWSER=1`` (CI sets it) makes that a failure.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance.browser_pages import (
    LAUNCH,
    emoji_font_installed,
    playwright,
    sandbox_page,
)
from tests.acceptance.sandbox_proc import Sandbox, wait_until

# processes, browsers or hundreds of schedules: out of the inner loop (-m 'not slow')
pytestmark = pytest.mark.slow

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "sandbox"
WAIT_MS = 60_000  # what the page must show within, on a loaded 2-core CI machine



def test_a_newcomer_clicks_through_refusals_a_denial_and_an_edit(tmp_path: Path) -> None:
    with sandbox_page(tmp_path, ARTIFACTS, WAIT_MS) as (sb, page, expect):
        _click_through(page, expect, sb)


def _click_through(page: Any, expect: Any, sb: Sandbox) -> None:
    step = iter(range(1, 100))

    def shot(name: str) -> None:
        page.screenshot(path=str(ARTIFACTS / f"{next(step):02d}-{name}.png"))
        _every_emoji_is_drawn_or_told(page)

    def act_as(user: str) -> None:
        page.select_option("#user", user)
        # the page has been drawn for them (their replies shown, the others' not)
        expect(page.locator("body")).to_have_attribute("data-user", user)

    page.goto(sb.url + "?user=U_DANA")
    expect(page.locator("body")).to_have_attribute("data-ready", "1")
    expect(page.locator("#title")).to_have_text("#approvals")
    cards = page.locator("#pane .msg:has(.b-header)")
    refusals = page.locator("#pane .msg.ephemeral")

    # -- Dana starts a refund of order A-1 from the page, and its card appears ---------------
    page.fill("#order", "A-1")
    page.fill("#amount", "")
    page.click("#start button[type=submit]")
    expect(page.locator("#start-result")).to_contain_text("Refund order A-1,")
    first = cards.nth(0)
    expect(first).to_contain_text("Approval needed: issue_refund")
    expect(first).to_contain_text('"order_id": "A-1"')
    expect(first).to_contain_text('"amount_cents": 4200')
    expect(first.locator("[data-action-id='approvald.approve']")).to_be_visible()
    shot("card")

    def approve(card: Any) -> None:
        card.locator("button[data-action-id='approvald.approve']").click()
        dialog = card.locator("dialog[open]")  # high risk: Slack's confirm dialog first
        expect(dialog).to_contain_text("Approve a high-risk call?")
        dialog.locator("[data-confirm=yes]").click()

    # -- a stranger is refused, and only they see why -----------------------------------------
    act_as("U_EVE")
    approve(first)
    expect(refusals).to_have_count(1)
    expect(refusals.first).to_contain_text("not an approver")
    expect(refusals.first).to_contain_text("Only visible to you")
    shot("stranger-refused")

    # -- so is the requester (self-approval), who does not see Eve's reply ------------------------
    act_as("U_DANA")
    expect(refusals).to_have_count(0)
    approve(first)
    expect(refusals).to_have_count(1)
    expect(refusals.first).to_contain_text("You started this run")
    expect(first.locator("[data-action-id='approvald.approve']")).to_be_visible()  # unchanged
    shot("requester-refused")

    # -- an approver denies with a reason; the card turns, the agent re-plans in the thread ----
    act_as("U_ALICE")
    first.locator("button[data-action-id='approvald.deny']").click()
    modal = page.locator("#modal-layer form.modal")
    expect(modal).to_contain_text("Deny request")
    modal.locator("[data-submit]").click()  # no reason yet: the modal says so inline
    expect(modal.locator(".input-error")).to_contain_text("reason")
    shot("deny-needs-a-reason")
    modal.locator("textarea").fill("Customer already got store credit for <this>")
    modal.locator("[data-submit]").click()
    expect(modal).to_have_count(0)
    expect(first.locator(".b-header")).to_contain_text("Denied")
    expect(first.locator("button[data-action-id]")).to_have_count(0)
    shot("denied")
    # the run's thread: its parent in the channel, "N replies" (the card links to it too,
    # once the thread exists when the card is drawn)
    page.locator("#pane .msg:not(:has(.b-header))", has_text="Refund order A-1,") \
        .locator("a.replies").click()
    thread = page.locator("#thread-body")
    expect(thread).to_contain_text("I did not issue the refund")
    expect(thread).to_contain_text("Customer already got store credit for <this>")
    shot("denied-thread")
    page.click("#close-thread")

    # -- a second refund: an edit to an invalid amount is refused inline, a valid one runs -----
    act_as("U_DANA")
    page.fill("#order", "A-2")
    page.fill("#amount", "30")
    page.click("#start button[type=submit]")
    second = cards.nth(1)
    expect(second).to_contain_text("Approval needed: issue_refund")
    expect(second).to_contain_text('"amount_cents": 3000')
    run_parent = page.locator("#pane .msg:not(:has(.b-header))", has_text="Refund order A-2")
    run_parent.locator("a.replies").click()
    expect(thread).to_contain_text(re.compile("Asked .* to approve issue_refund"))
    second.scroll_into_view_if_needed()
    shot("second-card-and-its-thread")  # the README's screenshot (docs/sandbox.png)
    act_as("U_BOB")  # in @finance, the approvers' group
    second.locator("button[data-action-id='approvald.edit']").click()
    expect(modal).to_contain_text("Edit arguments")
    editor = modal.locator("textarea[name='args/args_input']")  # beside the edit's reason
    expect(editor).to_have_value(re.compile(r'"amount_cents": 3000'))
    editor.fill(json.dumps({"order_id": "A-2", "amount_cents": "lots",
                            "reason": "duplicate charge"}))
    modal.locator("[data-submit]").click()
    expect(modal.locator(".input-error")).to_contain_text("amount_cents")
    expect(editor).to_have_value(re.compile("lots"))  # what was typed stays
    shot("edit-invalid")
    editor.fill(json.dumps({"order_id": "A-2", "amount_cents": 1250,
                            "reason": "duplicate charge"}, indent=2))
    modal.locator("[data-submit]").click()
    expect(modal).to_have_count(0)
    expect(second.locator(".b-header")).to_contain_text("Approved")
    expect(run_parent).to_contain_text("of $12.50 for order A-2 was issued")
    expect(thread).to_contain_text("of $12.50 for order A-2 was issued")
    shot("edited-and-refunded")

    def refunds() -> list[dict[str, Any]]:
        return [e for e in sb.ledger_lines() if e["tool"] == "issue_refund"]
    done = wait_until(refunds, within=30, what="the refund in the demo ledger")
    assert [e["args"] for e in done] == [{"order_id": "A-2", "amount_cents": 1250,
                                           "reason": "duplicate charge"}]
    looked_up = [e["args"]["order_id"] for e in sb.ledger_lines() if e["tool"] == "lookup_order"]
    assert looked_up == ["A-1", "A-2"]

    # -- the sandbox restarts under the open page: its token is new, the page reloads for it --
    assert sb.stop() == 0
    first_token = sb.token
    sb.start()
    assert sb.token and sb.token != first_token
    expect(page.locator('meta[name="approvald-sandbox"]')).to_have_attribute(
        "content", sb.token)
    expect(page.locator("body")).to_have_attribute("data-ready", "1")
    page.fill("#order", "A-3")
    page.click("#start button[type=submit]")
    expect(page.locator("#start-result")).to_contain_text("Refund order A-3")
    expect(cards.nth(2)).to_contain_text('"order_id": "A-3"')

    # -- an approver redirects it with guidance; the card says so (its emoji drawn) ------------
    act_as("U_ALICE")
    cards.nth(2).locator("button[data-action-id='approvald.redirect']").click()
    expect(modal).to_contain_text("Redirect the agent")
    modal.locator("textarea").fill("refund only $20")
    modal.locator("[data-submit]").click()
    expect(modal).to_have_count(0)
    expect(cards.nth(2)).to_contain_text("Redirected by")
    shot("redirected")


def _every_emoji_is_drawn_or_told(page: Any) -> None:
    """Issue 33: what the page shows has no raw ``:code:`` and no empty glyph box: every
    emoji is one a font here draws, or is shown as its meaning in words."""
    text = page.locator("#pane").inner_text()
    assert not re.search(r":[a-z_+-][a-z0-9_+-]*:", text), text
    shown = page.evaluate("""() => Array.from(document.querySelectorAll('.emoji'), (e) =>
        [e.textContent, canDraw(e.textContent), getComputedStyle(e).fontSize,
         getComputedStyle(e, '::after').content])""")
    boxes = [s for s in shown if not s[1] and not (s[2] == "0px" and s[3].startswith('"['))]
    assert not boxes, boxes


def test_a_modal_stays_with_its_page_and_no_emoji_is_an_empty_box(tmp_path: Path) -> None:
    """Issue 33 item 5: a modal left open in one browser session does not come back in a
    new one (a modal belongs to the client it was opened in); every emoji on the page is
    drawn, or shown as its meaning in words, never as a raw ``:code:`` or an empty box."""
    sync_playwright = playwright()
    from playwright.sync_api import expect

    expect.set_options(timeout=WAIT_MS)
    sb = Sandbox(tmp_path)
    try:
        sb.start()
        with sync_playwright() as pw:
            browser = pw.chromium.launch(**LAUNCH)
            try:
                first = browser.new_context(viewport={"width": 1500, "height": 1000}).new_page()
                first.set_default_timeout(WAIT_MS)
                first.goto(sb.url + "?user=U_DANA")
                expect(first.locator("body")).to_have_attribute("data-ready", "1")
                first.fill("#order", "A-7")
                first.click("#start button[type=submit]")
                card = first.locator("#pane .msg:has(.b-header)").first
                expect(card).to_contain_text("Approval needed: issue_refund")
                first.select_option("#user", "U_ALICE")
                expect(first.locator("body")).to_have_attribute("data-user", "U_ALICE")
                card.locator("button[data-action-id='approvald.deny']").click()
                expect(first.locator("#modal-layer form.modal")).to_contain_text("Deny request")

                # a new browser session for the same person: no modal over its page
                second = browser.new_context(viewport={"width": 1500, "height": 1000}).new_page()
                second.set_default_timeout(WAIT_MS)
                second.goto(sb.url + "?user=U_ALICE")
                expect(second.locator("body")).to_have_attribute("data-user", "U_ALICE")
                expect(second.locator("#pane .msg:has(.b-header)").first).to_contain_text(
                    "Approval needed: issue_refund")
                expect(second.locator("#modal-layer")).to_be_hidden()
                second.locator("#pane .msg:has(.b-header)").first.locator(
                    "button[data-action-id='approvald.approve']").click()  # not blocked
                expect(second.locator("dialog[open]")).to_contain_text("high-risk")
                second.locator("dialog[open] [data-confirm=no]").click()
                expect(first.locator("#modal-layer form.modal")).to_contain_text(
                    "Deny request")  # still open where it was opened

                # emoji: none left as a code; where no font draws them, their words
                text = second.locator("body").inner_text()
                assert not re.search(r":[a-z_+-][a-z0-9_+-]*:", text), text
                assert second.locator("#pane .emoji").count() > 0
                # the page's check tells a glyph a font here draws from one none does (a
                # machine set up as the README says has the emoji font; one without it gets
                # the words, checked below either way)
                assert second.evaluate(
                    "() => [canDraw('\u2705'), canDraw('\\u{F0000}')]") == [
                    emoji_font_installed(), False]
                second.goto(sb.url + "?user=U_ALICE&emoji=text")  # as on a machine without
                expect(second.locator("body")).to_have_attribute("data-user", "U_ALICE")
                expect(second.locator("#pane .msg:has(.b-header)").first).to_be_visible()
                shown = second.evaluate("""() => Array.from(document.querySelectorAll(
                    '#pane .emoji'), (e) => [getComputedStyle(e).fontSize,
                    getComputedStyle(e, '::after').content])""")
                assert shown and all(size == "0px" and words.startswith('"[')
                                     for size, words in shown), shown
                second.screenshot(path=str(tmp_path / "emoji-as-text.png"))
            finally:
                browser.close()
        assert sb.stop() == 0
    finally:
        sb.close()
