"""Rules on arguments through Slack: the three bands of a refund policy, the card naming
the rule that chose its approvers, a quorum of two finance members clicking, and an edit
in the modal that would cross a band refused inline."""

from __future__ import annotations

import json
from pathlib import Path

from approvald.bot.slack import cards
from approvald.runtime.kernel.outcomes import Paused

from tests.integration.slack_harness import CHANNEL, harness, wait_for
from tests.integration.test_slack import _status, _updated_card, assert_valid_blocks, text_of

# S_FINANCE's members come from Slack's user groups (the emulator's: U_BOB, U_CAROL)
RULES = str(Path(__file__).parents[1] / "fixtures" / "refund_rules.toml")
FINANCE = "tools.issue_refund.rules[2]: args.amount_cents > 100000"


async def test_the_three_bands_through_slack(sqlite_url: str, tmp_path: Path) -> None:
    async with harness(sqlite_url, tmp_path, APPROVALD_POLICY_FILE=RULES) as h:
        small = await h.engine.run("demo-refund", "Refund order A-1: $15", requested_by="U_DANA")
        assert small.status == "completed"  # auto: no card
        huge = await h.engine.run("demo-refund", "Refund order B-2: $20,000",
                                  requested_by="U_DANA")
        assert huge.status == "completed"
        assert [r["args"]["amount_cents"] for r in h.refunds()] == [1500]
        paused = await h.pause_refund(task="Refund order C-3: $2,000")
        [aid] = paused.approval_ids
        card = await h.card(aid)
        assert_valid_blocks(card["blocks"])
        shown = "Chosen by policy rule `" + FINANCE.replace(">", "&gt;") + "`"
        assert shown in text_of(card) and "<!subteam^S_FINANCE>" in text_of(card)
        a = await h.approval(aid)
        # a stranger to finance is refused; two finance members (a Slack user group) decide
        await h.slack.click(cards.APPROVE, h.value(a), user_id="U_ALICE", channel_id=CHANNEL,
                            message_ts=a.message_ts)
        await h.slack.click(cards.APPROVE, h.value(a), user_id="U_BOB", channel_id=CHANNEL,
                            message_ts=a.message_ts)
        await wait_for(lambda: _votes(h, aid, 1), what="U_BOB's vote")
        assert (await h.approval(aid)).status == "pending"
        await h.slack.click(cards.APPROVE, h.value(a), user_id="U_CAROL", channel_id=CHANNEL,
                            message_ts=a.message_ts)
        await wait_for(lambda: _status(h, paused.run_id, "completed"), what="completion")
        done = await h.approval(aid)
        assert done.status == "approved" and done.approve_count == 2
        assert [r["args"]["amount_cents"] for r in h.refunds()] == [1500, 200000]
        await wait_for(lambda: _updated_card(h, aid, "Approved"), what="the decided card")


async def _votes(h, approval_id: str, n: int) -> bool:  # type: ignore[no-untyped-def]
    return bool((await h.approval(approval_id)).approve_count == n)


async def test_an_edit_across_a_band_is_refused_in_the_modal(sqlite_url: str,
                                                             tmp_path: Path) -> None:
    async with harness(sqlite_url, tmp_path, APPROVALD_POLICY_FILE=RULES) as h:
        paused: Paused = await h.pause_refund(task="Refund order D-4: $500")
        [aid] = paused.approval_ids
        await h.card(aid)
        a = await h.approval(aid)
        await h.slack.click(cards.EDIT, h.value(a), user_id="U_ALICE", channel_id=CHANNEL,
                            message_ts=a.message_ts)
        await wait_for(lambda: h.emulator.views(callback_id=cards.EDIT_MODAL),
                       what="the edit modal")

        def submit(cents: int):  # type: ignore[no-untyped-def]
            return h.slack.submit_view(
                cards.EDIT_MODAL, {"args": {"args_input": json.dumps(
                    {"order_id": "D-4", "amount_cents": cents, "reason": "duplicate charge"})}},
                user_id="U_ALICE")

        into_auto = await submit(1500)  # $15 would need no approval at all
        assert into_auto.json()["response_action"] == "errors"
        said = into_auto.json()["errors"]["args"]
        assert said.startswith("That edit would put the call under other policy rules")
        assert "runs them with no approval (auto)" in said
        into_forbidden = await submit(2_000_000)
        assert "Refunds over $10,000" in into_forbidden.json()["errors"]["args"]
        into_finance = await submit(200_000)
        assert "policy rule tools.issue_refund.rules[2]" in into_finance.json()["errors"]["args"]
        assert (await h.approval(aid)).status == "pending" and h.refunds() == []
        ok = await submit(30_000)  # within the band: the editor's approval, as before
        assert ok.status == 200
        await wait_for(lambda: _status(h, paused.run_id, "completed"), what="completion")
        assert [r["args"]["amount_cents"] for r in h.refunds()] == [30000]
