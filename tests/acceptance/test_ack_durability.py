"""An acknowledged click is durable (invariant 13): Slack never sees a 200 for a decision a
crash can lose.

A real ``approvald serve`` takes signed Approve clicks while Slack answers its group
lookups slowly; it is SIGKILLed as soon as half the clicks have been acknowledged. Every
click that got its 200 must be in the database, and the runs resume after a restart.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest
from approvald.bot.config import Settings
from approvald.bot.slack import cards, views
from approvald.bot.wiring import build_engine, open_database

from tests.acceptance.test_slack_serve import free_port, setup, start_serve, stop_all
from tests.helpers import Rows, parts
from tests.integration.slack_harness import CHANNEL, harness, wait_for

POLICY = """
[tools.issue_refund]
approvers = ["S_OPS"]
"""


async def _pause_refunds(settings: Settings, n: int) -> list[tuple[str, str]]:
    """``n`` runs waiting for approval: (approval id, the value of its Approve button)."""
    db = await open_database(settings, quiet=True)
    engine = build_engine(settings, db)
    try:
        out = []
        for i in range(n):
            paused = await engine.run("demo-refund", f"Refund order A-{2000 + i}",
                                      requested_by="U_DANA")
            a = await Rows(db).approval(paused.approval_ids[0])
            out.append((a.id, cards.button_value(a.id, _token(engine, a))))
        return out
    finally:
        await engine.aclose()
        await db.close()


def _token(engine, a) -> str | None:  # type: ignore[no-untyped-def]
    """The card's button token (through the engine, which knows what it binds)."""
    return engine.button_token(a)  # type: ignore[no-any-return]


async def _statuses(settings: Settings, ids: list[str]) -> dict[str, str]:
    db = await open_database(settings, quiet=True)
    try:
        async def statuses(tx):  # type: ignore[no-untyped-def]
            return {aid: (await tx.approvals.get(aid)).status for aid in ids}

        return dict(await Rows(db).in_one_read(statuses))
    finally:
        await db.close()


@pytest.mark.slow  # starts a process
async def test_every_acknowledged_click_survives_a_sigkill(db_url: str, tmp_path: Path) -> None:
    emulator, cli = await setup(tmp_path, db_url)
    emulator.add_usergroup("S_OPS", ["U_ALICE"])
    emulator.delay("usergroups.users.list", 0.6)  # a slow Slack: each decision takes a while
    (tmp_path / "policy.toml").write_text(POLICY)
    cli.env_extra["APPROVALD_POLICY_FILE"] = str(tmp_path / "policy.toml")
    settings = Settings(**{k: v for k, v in cli.env().items()
                           if k.startswith(("APPROVALD_", "SLACK_"))})
    port = free_port()
    procs: list[asyncio.subprocess.Process] = []
    try:
        buttons = await _pause_refunds(settings, 10)
        procs.append(await start_serve(cli, port))
        async with emulator.client(f"http://127.0.0.1:{port}/slack/events") as slack:
            clicks = {asyncio.create_task(slack.click(cards.APPROVE, value, user_id="U_ALICE",
                                                      channel_id=CHANNEL)): aid
                      for aid, value in buttons}
            acked: list[str] = []
            waiting = set(clicks)
            while waiting and len(acked) < 5:
                done, waiting = await asyncio.wait(waiting, timeout=20,
                                                   return_when=asyncio.FIRST_COMPLETED)
                assert done, "no click was answered"
                acked += [clicks[t] for t in done if not t.exception() and t.result().status
                          == 200]
            # the kill must land with clicks in flight, or it proves nothing about them
            assert waiting, "every click was answered before the SIGKILL"
            procs[0].send_signal(signal.SIGKILL)  # at once, with clicks still in flight
            assert await procs[0].wait() == -signal.SIGKILL
            await asyncio.gather(*waiting, return_exceptions=True)
        assert len(acked) >= 5
        statuses = await _statuses(settings, [aid for aid, _ in buttons])
        lost = [aid for aid in acked if statuses[aid] != "approved"]
        assert lost == [], f"acknowledged but not recorded: {lost} ({statuses})"

        emulator.delay("usergroups.users.list", 0)
        procs.append(await start_serve(cli, port))  # the decisions resume their runs

        async def resumed() -> bool:
            db = await open_database(settings, quiet=True)
            try:
                async def acked_runs(tx):  # type: ignore[no-untyped-def]
                    return [await tx.runs.get((await tx.approvals.get(aid)).run_id)
                            for aid in acked]

                runs = await Rows(db).in_one_read(acked_runs)
            finally:
                await db.close()
            return all(r.status == "completed" for r in runs)
        await wait_for(resumed, within=60, what="the acknowledged runs to complete")
    finally:
        await stop_all(procs, emulator)


async def test_a_deny_modal_is_acknowledged_only_once_its_decision_is_committed(
        sqlite_url: str, tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY.replace("S_OPS", "S_FINANCE"))  # Bob decides through a group
    async with harness(sqlite_url, tmp_path, APPROVALD_POLICY_FILE=str(policy)) as h:
        paused = await h.pause_refund()
        [aid] = paused.approval_ids
        a = await h.approval(aid)
        await h.card(aid)
        metadata = views.modal_metadata(aid, h.token(a), CHANNEL, a.message_ts)
        await h.slack.click(cards.DENY, h.value(a), user_id="U_BOB", channel_id=CHANNEL,
                            message_ts=a.message_ts)
        await wait_for(lambda: h.emulator.views(callback_id=cards.DENY_MODAL),
                       what="the deny modal")
        parts(h.engine).directory._cache.clear()  # type: ignore[attr-defined]
        h.emulator.delay("usergroups.users.list", 0.4)  # the group lookup is slow now
        resp = await h.slack.submit_view(
            cards.DENY_MODAL, {cards.REASON_BLOCK: {cards.REASON_INPUT: {
                "type": "plain_text_input", "value": "wrong order"}}},
            user_id="U_BOB", private_metadata=metadata)
        assert resp.status == 200
        # no waiting: the 200 came after the commit
        assert (await h.approval(aid)).status == "denied"
