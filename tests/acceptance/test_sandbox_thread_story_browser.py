"""An on-call engineer answers the ops questions from a run's thread alone (issue 52 items
1-5), in headless chromium against a real ``approvald sandbox``: what is the run doing, on
whom and until when is it waiting, what ran, what failed and why, who decided. For an
approval, a denial, a quorum of two, an escalation on expiry and a redirect; and a crash with
its retry: the sandbox, started with ``APPROVALD_FAILPOINTS=after_intent``, SIGKILLs itself
once the approved refund's intent is recorded, and started again on the same database it
retries the call.

The engineer reads only ``#thread``: the run's parent and its replies. Screenshots of each
thread are kept in ``test-artifacts/sandbox-thread-story/`` and
``test-artifacts/sandbox-crash-story/``.
"""

from __future__ import annotations

import inspect
import re
import signal
from pathlib import Path
from typing import Any

import pytest
from approvald.bot.slack.threads import ThreadFollower

from tests.acceptance.browser_pages import sandbox_page

pytestmark = pytest.mark.slow

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "sandbox-thread-story"
CRASH_ARTIFACTS = ARTIFACTS.with_name("sandbox-crash-story")
WAIT_MS = 60_000
# how long a run thread's claim lasts (the follower's default): one taken by a killed process
# holds the thread until it lapses
CLAIM_TTL_MS = int(inspect.signature(ThreadFollower).parameters["claim_ttl"].default
                   .total_seconds() * 1000)
CARDS = "#pane .msg:has(.b-header)"
POLICY = """
[tools.issue_refund]
approvers = ["U_ALICE", "U_BOB", "U_CAROL"]
ttl = "30m"
on_expire = "escalate"
escalate = [{ approvers = ["U_CFO"], ttl = "1h" }]
risk = "medium"

[[tools.issue_refund.rules]]
when = "args.order_id == 'A-3'"
quorum = 2

[[tools.issue_refund.rules]]
when = "args.order_id == 'A-4'"
ttl = "5s"
reminders = []
"""
UNTIL = r"until \S+ \d+(st|nd|rd|th)?,? .*\d\d?:\d\d|until (Today|Tomorrow|\d{4}-\d\d-\d\d)"


def rx(text: str) -> Any:
    return re.compile(text, re.IGNORECASE | re.DOTALL)


def test_the_ops_questions_answered_from_the_thread_alone(tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    with sandbox_page(tmp_path, ARTIFACTS, WAIT_MS,
                      extra_env={"APPROVALD_POLICY_FILE": str(policy)}) as (sb, page, expect):
        page.goto(sb.url + "?user=U_DANA")
        expect(page.locator("body")).to_have_attribute("data-ready", "1")
        thread = page.locator("#thread-body")

        def act_as(user: str) -> None:
            page.select_option("#user", user)
            expect(page.locator("body")).to_have_attribute("data-user", user)

        def start(order: str) -> Any:
            act_as("U_DANA")
            page.fill("#order", order)
            page.fill("#amount", "")
            page.click("#start button[type=submit]")
            expect(page.locator("#start-result")).to_contain_text(f"Refund order {order},")
            card = page.locator(CARDS, has_text=f'"order_id": "{order}"')
            expect(card).to_contain_text("Approval needed: issue_refund")
            return card

        def open_thread(order: str) -> None:
            parent = page.locator("#pane .msg:not(:has(.b-header))",
                                  has_text=f"Refund order {order},")
            parent.locator("a.replies").click()
            expect(thread).to_contain_text(f"Refund order {order},")

        def shot(name: str) -> None:
            page.screenshot(path=str(ARTIFACTS / f"{name}.png"))

        def the_doing_and_the_wait(order: str, whom: str) -> None:
            """What is it doing; on whom and until when is it waiting."""
            open_thread(order)
            expect(thread).to_contain_text("waiting for approval")
            expect(thread).to_contain_text(rx(r"Step \d"))
            expect(thread).to_contain_text(rx(f"Waiting on {whom}.*to approve issue_refund"))
            expect(thread).to_contain_text(rx(UNTIL))
            expect(thread).to_contain_text(rx(r"Asked .* to approve issue_refund.*until"))
            expect(thread.locator("a", has_text="Open the request").first).to_be_visible()

        def what_ran(words: str) -> None:
            expect(thread).to_contain_text(rx(r"issue_refund succeeded: refund id rf_"))
            expect(thread).to_contain_text(words)
            assert thread.locator("button", has_text="Show JSON").count() >= 2
            assert "{&quot;" not in thread.inner_html() and '{"' not in thread.inner_text()

        # -- an approval ----------------------------------------------------------------
        card = start("A-1")
        the_doing_and_the_wait("A-1", "@Alice")
        act_as("U_ALICE")
        card.locator("button[data-action-id='approvald.approve']").click()
        expect(card.locator(".b-header")).to_contain_text("Approved")
        # who decided
        expect(thread).to_contain_text(rx(r"issue_refund approved by @Alice Approver"))
        what_ran("send_customer_email succeeded (ran without asking")  # what ran, once
        assert thread.inner_text().count("send_customer_email") == 1
        expect(thread).to_contain_text("completed")
        # the JSON, one click away
        thread.locator("button", has_text="Show JSON").nth(1).click()
        modal = page.locator("#modal-layer form.modal, #modal-layer .modal").first
        expect(modal).to_contain_text('"status": "issued"')
        shot("1-approval-and-its-json")
        page.keyboard.press("Escape")
        for close in page.locator("#modal-layer [data-close], #modal-layer .close").all():
            if close.is_visible():
                close.click()
                break

        # -- a denial: what failed and why, who decided; no green check -------------------
        card = start("A-2")
        the_doing_and_the_wait("A-2", "@Alice")
        act_as("U_BOB")
        card.locator("button[data-action-id='approvald.deny']").click()
        modal = page.locator("#modal-layer form.modal")
        modal.locator("textarea").fill("Customer already got store credit")
        modal.locator("[data-submit]").click()
        expect(modal).to_have_count(0)
        expect(thread).to_contain_text(
            rx(r"issue_refund denied by @Bob Finance: Customer already got store credit"))
        expect(thread).to_contain_text("completed, but issue_refund denied and did not run")
        shot("2-denial")

        # -- a quorum of two: each vote ---------------------------------------------------
        card = start("A-3")
        the_doing_and_the_wait("A-3", "@Alice")
        expect(thread).to_contain_text("2 approvals needed")
        act_as("U_BOB")
        card.locator("button[data-action-id='approvald.approve']").click()
        expect(thread).to_contain_text(
            rx(r"@Bob Finance approved issue_refund \(1 of 2 approvals\)"))
        expect(thread).to_contain_text("1 of 2 approvals so far")
        act_as("U_CAROL")
        card.locator("button[data-action-id='approvald.approve']").click()
        expect(thread).to_contain_text(rx(r"issue_refund approved by @Carol Finance \(2 of 2 "
                                          r"approvals: @Bob Finance, @Carol"))
        what_ran("issue_refund succeeded")
        shot("3-quorum")

        # -- an escalation on expiry: to whom, until when, the new request linked -----------
        start("A-4")
        the_doing_and_the_wait("A-4", "@Alice")
        expect(thread).to_contain_text(rx(r"escalated to @Casey"), timeout=WAIT_MS)
        expect(thread.locator("a", has_text="Open the new request")).to_be_visible()
        expect(thread).to_contain_text(rx(r"Waiting on @Casey.*to approve issue_refund"))
        shot("4-escalation")

        # -- a redirect: the new request announced and linked -----------------------------
        card = start("A-5")
        the_doing_and_the_wait("A-5", "@Alice")
        act_as("U_ALICE")
        card.locator("button[data-action-id='approvald.redirect']").click()
        modal = page.locator("#modal-layer form.modal")
        modal.locator("textarea").fill("Refund only $12.50, the duplicate charge")
        modal.locator("[data-submit]").click()
        expect(modal).to_have_count(0)
        expect(thread).to_contain_text(rx(r"issue_refund redirected by @Alice Approver: "
                                          r"Refund only \$12.50"))
        expect(thread).to_contain_text(rx(r"issue_refund redirected by.*Asked .* to approve "
                                          r"issue_refund.*\$12.50"))
        assert thread.locator("a", has_text="Open the request").count() >= 2
        expect(thread).to_contain_text(rx(r"Waiting on .*\$12.50"))
        shot("5-redirect")


def test_a_crash_and_its_retry_told_from_the_thread_alone(tmp_path: Path) -> None:
    """The sandbox dies by SIGKILL right after the approved refund's intent is recorded;
    started again on the same database (without the failpoint), it retries the call. The
    reloaded page's thread tells the retry, that the call ran once, the result and who
    approved; the demo ledger holds the refund once."""
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    with sandbox_page(tmp_path, CRASH_ARTIFACTS, WAIT_MS,
                      extra_env={"APPROVALD_POLICY_FILE": str(policy),
                                 "APPROVALD_FAILPOINTS": "after_intent"}) as (sb, page, expect):
        page.goto(sb.url + "?user=U_DANA")
        expect(page.locator("body")).to_have_attribute("data-ready", "1")
        page.fill("#order", "A-6")
        page.fill("#amount", "")
        page.click("#start button[type=submit]")
        expect(page.locator("#start-result")).to_contain_text("Refund order A-6,")
        card = page.locator(CARDS, has_text='"order_id": "A-6"')
        expect(card).to_contain_text("Approval needed: issue_refund")
        page.select_option("#user", "U_ALICE")
        expect(page.locator("body")).to_have_attribute("data-user", "U_ALICE")
        card.locator("button[data-action-id='approvald.approve']").click()

        # the approved refund's intent is recorded, and the process kills itself
        assert sb.proc is not None
        assert sb.proc.wait(timeout=WAIT_MS / 1000) == -signal.SIGKILL, sb.output()
        assert [e for e in sb.ledger_lines() if e["tool"] == "issue_refund"] == []
        del sb.extra_env["APPROVALD_FAILPOINTS"]
        sb.start()  # the same database and workspace file, a new process and token
        # the open page finds the new token and reloads itself (once): a navigation of the
        # test's own while that reload is under way would be cut off by it
        expect(page.locator('meta[name="approvald-sandbox"]')).to_have_attribute(
            "content", sb.token)

        page.goto(sb.url + "?user=U_DANA")
        expect(page.locator("body")).to_have_attribute("data-ready", "1")
        parent = page.locator("#pane .msg:not(:has(.b-header))", has_text="Refund order A-6,")
        # the killed process may have held the run thread's claim (a turn telling the
        # approval, under way when it died): nobody posts in the thread until that lease
        # lapses, so the replies may come up to a claim's lease after the restart
        parent.locator("a.replies").click(timeout=WAIT_MS + CLAIM_TTL_MS)
        thread = page.locator("#thread-body")
        expect(thread).to_contain_text("Refund order A-6,")
        # what happened: the call was cut off by the crash, retried, and ran once
        expect(thread).to_contain_text(rx(
            r"issue_refund runs again as attempt 2: attempt 1 was cut off before its result "
            r"was recorded, and .*did not happen.*The call ran once\."))
        # the result, and who decided
        expect(thread).to_contain_text(rx(r"issue_refund succeeded on attempt 2: refund id rf_"))
        expect(thread).to_contain_text(rx(r"issue_refund approved by @Alice Approver"))
        expect(thread).to_contain_text("completed")
        text = thread.inner_text()
        assert text.count("runs again as attempt") == 1, text
        assert len(re.findall(r"issue_refund succeeded", text)) == 1, text
        # told in the order it happened: the approval, the retry, the result
        assert (text.index("approved by @Alice") < text.index("runs again as attempt 2")
                < text.index("issue_refund succeeded")), text
        expect(card.locator(".b-header")).to_contain_text("Approved")
        refunds = [e for e in sb.ledger_lines() if e["tool"] == "issue_refund"]
        assert [e["args"]["order_id"] for e in refunds] == ["A-6"]
        page.screenshot(path=str(CRASH_ARTIFACTS / "6-crash-and-retry.png"))
