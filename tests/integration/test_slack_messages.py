"""What an approver reads in Slack agrees with the record and names people as Slack shows
them (issue 33): a second click by the one who decided says the decision stands and is
audited as a repeat; a refusal says what went wrong once, with mentions, not raw ids."""

from __future__ import annotations

from pathlib import Path

from approvald.bot.slack import cards

from tests.integration.slack_harness import CHANNEL, harness, wait_for


async def _audit(h, approval_id: str) -> list:  # type: ignore[no-untyped-def]
    async with h.engine.db.read() as tx:
        return [e for e in await tx.audit.query() if e.approval_id == approval_id]


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
