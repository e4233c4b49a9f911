"""The sandbox does what its tour says, at a desktop's width and a phone's (issue 52 items 6
and 7), in headless chromium against a real ``approvald sandbox``:

* a run started from the page opens its thread beside its card;
* a standing approval is granted from a card: the modal's ``static_select``, its
  ``radio_buttons`` and its ``checkboxes`` render and submit (they were drawn as
  ``[static_select element]``);
* the App Home's batch selection works (its checkboxes were disabled, and *Approve
  selected* did nothing);
* a click that raced another one on the same card is answered as Slack would answer it,
  not refused by the page with ``no such button``;
* the audit chain's head is posted to the audit channel;
* at 390 px the page does not run off the screen: no sideways scroll, the thread covers
  the screen instead of running 351 px past it.

Screenshots of both widths are kept in ``test-artifacts/sandbox-widgets/``.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance.browser_pages import sandbox_page
from tests.acceptance.sandbox_proc import Sandbox, wait_until

pytestmark = pytest.mark.slow

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "sandbox-widgets"
WAIT_MS = 60_000
CARDS = "#pane .msg:has(.b-header)"


def start_refund(page: Any, expect: Any, order: str) -> Any:
    page.fill("#order", order)
    page.fill("#amount", "")
    page.click("#start button[type=submit]")
    expect(page.locator("#start-result")).to_contain_text(f"Refund order {order},")
    card = page.locator(CARDS, has_text=f'"order_id": "{order}"')
    expect(card).to_contain_text("Approval needed: issue_refund")
    return card


def act_as(page: Any, expect: Any, user: str) -> None:
    page.select_option("#user", user)
    expect(page.locator("body")).to_have_attribute("data-user", user)


def sql(sb: Sandbox, query: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(sb.db) as db:
        return db.execute(query).fetchall()


def test_standing_batch_race_thread_and_audit_head_at_a_desktops_width(
        tmp_path: Path) -> None:
    with sandbox_page(tmp_path, ARTIFACTS, WAIT_MS) as (sb, page, expect):
        page.goto(sb.url + "?user=U_DANA")
        expect(page.locator("body")).to_have_attribute("data-ready", "1")

        # -- a run started here: its thread opens beside its card ---------------------------
        first = start_refund(page, expect, "A-1")
        thread = page.locator("#thread")
        expect(thread).to_be_visible()
        expect(page.locator("#thread-body")).to_contain_text("Refund order A-1")
        page.screenshot(path=str(ARTIFACTS / "01-thread-opens-beside-the-card.png"))

        # -- a standing approval from the card: a select, radio buttons, checkboxes ---------
        act_as(page, expect, "U_ALICE")
        first.locator("button[data-action-id='approvald.standing']").click()
        modal = page.locator("#modal-layer form.modal")
        expect(modal).to_contain_text("Standing approval")
        assert modal.locator(".b-unknown").count() == 0
        window = modal.locator("select.b-select")
        expect(window).to_have_value("15m")
        window.select_option("1h")
        modal.locator(".radios input[value='fields']").check()
        modal.locator(".checkboxes input[value='order_id']").check()
        page.screenshot(path=str(ARTIFACTS / "02-standing-modal.png"))
        modal.locator("[data-submit]").click()
        expect(modal).to_have_count(0)
        expect(first.locator(".b-header")).to_contain_text("Approved")
        [(scope,)] = sql(sb, "SELECT scope FROM standing_approvals")
        assert "order_id" in scope and "A-1" in scope, scope
        assert "amount_cents" not in scope, scope  # only the ticked field binds

        # -- the App Home: tick two requests, approve them in one go ----------------------
        act_as(page, expect, "U_DANA")
        start_refund(page, expect, "B-2")
        start_refund(page, expect, "B-3")
        act_as(page, expect, "U_BOB")
        page.click("nav a[data-pane='home']")
        home = page.locator("#pane .home-tab")
        expect(home).to_contain_text("B-2")
        expect(home).to_contain_text("B-3")
        boxes = home.locator(".checkboxes input[type=checkbox]")
        assert boxes.count() >= 2 and all(not boxes.nth(i).is_disabled()
                                           for i in range(boxes.count()))
        for order in ("B-2", "B-3"):  # each request's summary has its "Select" box
            home.locator(".b-section", has_text=f"Order {order} was charged").locator(
                ".checkboxes input").check()
        approve_selected = home.locator("button[data-action-id='approvald.approve_selected']")
        approve_selected.click()
        home.locator("dialog[open] [data-confirm=yes]").click()
        page.click(f"nav a[data-pane='{'C_APPROVALS'}']")
        for order in ("B-2", "B-3"):
            expect(page.locator(CARDS, has_text=f'"order_id": "{order}"').locator(
                ".b-header")).to_contain_text("Approved")
        page.screenshot(path=str(ARTIFACTS / "03-batch-approved.png"))

        # -- two approvers click the same card: the second is answered, not refused ---------
        act_as(page, expect, "U_DANA")
        raced = start_refund(page, expect, "C-4")
        act_as(page, expect, "U_CAROL")
        other_browser = page.context.browser
        assert other_browser is not None
        other = other_browser.new_context(viewport={"width": 1500, "height": 1000}).new_page()
        other.set_default_timeout(WAIT_MS)
        other.goto(sb.url + "?user=U_BOB")
        expect(other.locator("body")).to_have_attribute("data-user", "U_BOB")
        stale = other.locator(CARDS, has_text='"order_id": "C-4"')
        expect(stale.locator("button[data-action-id='approvald.deny']")).to_be_visible()
        # Bob's page stops hearing of changes (as a slow connection would), so it still
        # shows the card with its buttons when Carol's approval has already turned it
        other.route("**/ui/state**", lambda route: route.abort())
        raced.locator("button[data-action-id='approvald.approve']").click()
        raced.locator("dialog[open] [data-confirm=yes]").click()
        expect(raced.locator(".b-header")).to_contain_text("Approved")
        stale.locator("button[data-action-id='approvald.approve']").click()
        with other.expect_response("**/ui/action") as answered:
            stale.locator("dialog[open] [data-confirm=yes]").click()
        assert answered.value.json()["ok"] is True, answered.value.json()  # not "no such button"
        other.unroute("**/ui/state**")
        other.reload()
        expect(other.locator("body")).to_have_attribute("data-user", "U_BOB")
        # the app answered the late click as Slack would carry it: a reply to Bob only
        expect(other.locator("#pane .msg.ephemeral")).to_contain_text(
            "Too late: @Carol Finance already approved this request")
        assert sql(sb, "SELECT COUNT(*) FROM approvals WHERE status = 'approved' AND "
                       "args LIKE '%C-4%'")[0][0] == 1
        other.close()

        # -- the audit chain's head is posted to the audit channel --------------------------
        page.click("nav a[data-pane='C_AUDIT']")
        expect(page.locator("#pane")).to_contain_text("audit")
        heads = wait_until(lambda: sql(sb, "SELECT COUNT(*) FROM outbox WHERE kind = "
                                           "'audit.head' AND status = 'delivered'")[0][0],
                           within=60, what="the audit head posted")
        assert heads >= 1
        expect(page.locator("#pane .msg")).not_to_have_count(0)
        page.screenshot(path=str(ARTIFACTS / "04-audit-head.png"))


def test_at_a_phones_width_nothing_runs_off_the_screen(tmp_path: Path) -> None:
    with sandbox_page(tmp_path, ARTIFACTS / "phone", WAIT_MS) as (sb, page, expect):
        page.set_viewport_size({"width": 390, "height": 844})
        page.goto(sb.url + "?user=U_DANA")
        expect(page.locator("body")).to_have_attribute("data-ready", "1")
        card = start_refund(page, expect, "A-7")
        expect(page.locator("#thread")).to_be_visible()

        def overflow() -> int:
            return int(page.evaluate(
                "() => document.documentElement.scrollWidth - window.innerWidth"))

        def inside(selector: str) -> None:
            box = page.locator(selector).bounding_box()
            assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 390, box

        inside("#thread")
        assert overflow() <= 0
        page.screenshot(path=str(ARTIFACTS / "phone" / "01-thread.png"))
        page.click("#close-thread")
        expect(page.locator("#thread")).to_be_hidden()
        card.scroll_into_view_if_needed()
        inside(CARDS)
        for button in ("approve", "deny", "edit"):
            inside(f"{CARDS} button[data-action-id='approvald.{button}']")
        assert overflow() <= 0
        page.screenshot(path=str(ARTIFACTS / "phone" / "02-card.png"), full_page=True)
        act_as(page, expect, "U_ALICE")
        card.locator("button[data-action-id='approvald.standing']").click()
        modal = page.locator("#modal-layer form.modal")
        expect(modal).to_contain_text("Standing approval")
        inside("#modal-layer form.modal")
        assert overflow() <= 0
        page.screenshot(path=str(ARTIFACTS / "phone" / "03-modal.png"))
