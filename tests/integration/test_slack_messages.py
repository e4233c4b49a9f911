"""What an approver reads in Slack agrees with the record and names people as Slack shows
them (issue 33): a second click by the one who decided says the decision stands and is
audited as a repeat; a refusal says what went wrong once, with mentions, not raw ids."""

from __future__ import annotations

from pathlib import Path

from approvald.bot.slack import cards

from tests.helpers import Rows
from tests.integration.slack_harness import CHANNEL, harness, wait_for


async def _audit(h, approval_id: str) -> list:  # type: ignore[no-untyped-def]
    return [e for e in await Rows.of(h.engine).audit() if e.approval_id == approval_id]


async def _status(h, run_id: str, status: str):  # type: ignore[no-untyped-def]
    run = await h.run(run_id)
    return run if run.status == status else None


async def test_a_second_click_by_the_approver_says_it_stands_as_the_audit_log_does(
        sqlite_url: str, tmp_path: Path) -> None:
    async with harness(sqlite_url, tmp_path) as h:
        paused = await h.pause_refund()
        [aid] = paused.approval_ids
        a = await h.approval(aid)
        value = h.value(a)
        for _ in range(2):
            resp = await h.slack.click(cards.APPROVE, value, user_id="U_ALICE",
                                       channel_id=CHANNEL)
            assert resp.status == 200
        said = await wait_for(lambda: h.emulator.ephemeral(CHANNEL, "U_ALICE"),
                              what="Alice's ephemeral")
        assert said[0]["text"] == "You already approved this request; your decision stands."
        await wait_for(lambda: _status(h, paused.run_id, "completed"), what="completion")
        actions = [e.action for e in await _audit(h, aid)]
        assert "repeated" in actions and "refused" not in actions
        assert len(h.refunds()) == 1


def _policy(tmp_path: Path) -> Path:
    path = tmp_path / "policy.toml"
    path.write_text('[tools.issue_refund]\napprovers = ["U_ALICE", "S_FINANCE"]\nquorum = 2\n')
    return path


async def test_a_refusal_says_what_went_wrong_once_naming_people_as_slack_does(
        sqlite_url: str, tmp_path: Path) -> None:
    async with harness(sqlite_url, tmp_path,
                       APPROVALD_POLICY_FILE=str(_policy(tmp_path))) as h:
        paused = await h.pause_refund()
        [aid] = paused.approval_ids
        a = await h.approval(aid)
        await h.slack.click(cards.APPROVE, h.value(a), user_id="U_MALLORY", channel_id=CHANNEL)
        [said] = await wait_for(lambda: h.emulator.ephemeral(CHANNEL, "U_MALLORY"),
                                what="Mallory's refusal")
        assert said["text"] == ("You're not an approver for this request (its approvers: "
                                "<@U_ALICE>, <!subteam^S_FINANCE>).")
        # a late click names who decided, as a mention, once
        await h.slack.click(cards.APPROVE, h.value(a), user_id="U_ALICE", channel_id=CHANNEL)
        await h.slack.click(cards.APPROVE, h.value(a), user_id="U_BOB", channel_id=CHANNEL)
        await wait_for(lambda: _status(h, paused.run_id, "completed"), what="completion")
        await h.slack.click(cards.APPROVE, h.value(a), user_id="U_CAROL", channel_id=CHANNEL)
        [late] = await wait_for(lambda: h.emulator.ephemeral(CHANNEL, "U_CAROL"),
                                what="Carol's refusal")
        assert late["text"] == "Too late: <@U_BOB> already approved this request."


async def test_votes_an_edit_discarded_name_their_voters_as_mentions(
        sqlite_url: str, tmp_path: Path) -> None:
    import json

    async with harness(sqlite_url, tmp_path,
                       APPROVALD_POLICY_FILE=str(_policy(tmp_path))) as h:
        paused = await h.pause_refund()
        [aid] = paused.approval_ids
        a = await h.approval(aid)
        await h.slack.click(cards.APPROVE, h.value(a), user_id="U_ALICE", channel_id=CHANNEL)
        await wait_for(lambda: _voted(h, aid), what="Alice's vote")
        await h.slack.click(cards.EDIT, h.value(a), user_id="U_BOB", channel_id=CHANNEL)
        await wait_for(lambda: h.emulator.views(callback_id=cards.EDIT_MODAL),
                       what="the edit modal")
        done = await h.slack.submit_view(
            cards.EDIT_MODAL, {"args": {"args_input": json.dumps(
                {"order_id": "A-1001", "amount_cents": 1500, "reason": "partial"})}},
            user_id="U_BOB")
        assert done.status == 200
        said = await wait_for(lambda: h.emulator.ephemeral(CHANNEL, "U_BOB"),
                              what="Bob's reply")
        text = " ".join(m["text"] for m in said)
        assert "<@U_ALICE>" in text and "U_ALICE," not in text.replace("<@U_ALICE>", "")


async def _voted(h, approval_id: str) -> bool:  # type: ignore[no-untyped-def]
    return bool(await Rows.of(h.engine).votes(approval_id))
