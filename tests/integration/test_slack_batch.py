"""Batch decisions from the App Home and /approvals over real signed HTTP: ticked
checkboxes arrive as ``block_actions`` state, each request is decided on its own, and the
redrawn list says what became of each."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from approvald.bot.slack import cards, views
from approvald.bot.slack import texts as T
from approvald.runtime.approvals.decide import Actor
from approvald.runtime.record.state import ToolMessage

from tests.helpers import Rows
from tests.integration.slack_harness import CHANNEL, Harness, harness, wait_for
from tests.integration.test_slack import assert_valid_blocks


def dump(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


async def pause_many(h: Harness, n: int) -> list[str]:
    """``n`` demo-refund runs by U_DANA, each for its own order, waiting for approval; their
    request ids, oldest first."""
    ids = []
    for i in range(n):
        paused = await h.pause_refund(task=f"Refund order A-{2001 + i}, double charged")
        ids += paused.approval_ids
    return ids


async def open_home(h: Harness, user: str) -> dict[str, Any]:
    before = h.emulator.home_view(user)
    await h.slack.event({"type": "app_home_opened", "user": user, "channel": f"D_{user}",
                         "tab": "home"})
    home = await wait_for(lambda: _newer(h.emulator.home_view(user), before),
                          what="the App Home")
    assert_valid_blocks(home["blocks"])
    return home


def _newer(view: dict[str, Any] | None, before: dict[str, Any] | None) -> dict[str, Any] | None:
    if view is None or (before is not None and view["hash"] == before["hash"]):
        return None
    return view


def checkbox_values(blocks: list[dict[str, Any]]) -> dict[str, str]:
    """approval id -> the value of its checkbox, as drawn."""
    out = {}
    for b in blocks:
        el = b.get("accessory") or {}
        if el.get("type") == "checkboxes":
            [option] = el["options"]
            out[cards.parse_value(option["value"])[0]] = option["value"]
    return out


async def press(h: Harness, action_id: str, user: str, home: dict[str, Any],
                ticked: list[str]) -> dict[str, Any]:
    """Press a batch button on ``home`` with ``ticked`` checkbox values; the Home as the
    app redraws it afterwards."""
    state = h.slack.ticked(home["blocks"], ticked)
    resp = await h.slack.click(action_id, None, user_id=user, view_id=home["id"], state=state)
    assert resp.status == 200 and resp.body in ("", "{}")
    if action_id == cards.DENY_SELECTED:
        return {}
    redrawn = await wait_for(lambda: _with_results(h, user, home), what="the redrawn Home")
    assert_valid_blocks(redrawn["blocks"])
    assert len(redrawn["blocks"]) <= 100
    return redrawn


def _with_results(h: Harness, user: str, before: dict[str, Any]) -> dict[str, Any] | None:
    view = _newer(h.emulator.home_view(user), before)
    return view if view and T.HOME_TITLE in dump(view["blocks"][0]) else None


async def statuses(h: Harness, ids: list[str]) -> list[tuple[str, str | None]]:
    return [((a := await h.approval(i)).status, a.decided_by) for i in ids]


async def test_approve_selected_from_the_home_some_decided_elsewhere_a_moment_before(
        sqlite_url: str, tmp_path: Path) -> None:
    async with harness(sqlite_url, tmp_path) as h:
        ids = await pause_many(h, 20)
        home = await open_home(h, "U_ALICE")
        drawn = checkbox_values(home["blocks"])
        assert list(drawn) == ids  # all 20, oldest first, one checkbox each
        headers = [b["text"]["text"] for b in home["blocks"] if b["type"] == "header"]
        assert "issue_refund · 20 waiting" in headers
        selected = ids[:15]
        # a moment before the click, U_BOB decides two of them on their cards
        await h.engine.decide(selected[3], actor=Actor("U_BOB", "slack"), verdict="approve")
        await h.engine.decide(selected[7], actor=Actor("U_BOB", "slack"), verdict="deny",
                              reason="duplicate of an earlier refund")
        redrawn = await press(h, cards.APPROVE_SELECTED, "U_ALICE", home,
                              [drawn[i] for i in selected])

        mine = [i for i in selected if i not in (selected[3], selected[7])]
        assert await statuses(h, mine) == [("approved", "U_ALICE")] * 13
        assert await statuses(h, [selected[3], selected[7]]) == [("approved", "U_BOB"),
                                                                ("denied", "U_BOB")]
        assert (await h.approval(selected[7])).reason == "duplicate of an earlier refund"
        assert await statuses(h, ids[15:]) == [("pending", None)] * 5
        for i in ids[15:]:
            assert await Rows.of(h.engine).votes(i) == []
        for i in (selected[3], selected[7]):
            assert "U_ALICE" not in [v.actor for v in await Rows.of(h.engine).votes(i)]
        entries = [e for e in await Rows.of(h.engine).audit()]
        by_alice = {(e.approval_id, e.action) for e in entries if e.actor == "U_ALICE"}
        assert by_alice == {(i, "approved") for i in mine} | {
            (selected[3], "refused"), (selected[7], "refused")}
        # one batch, and who U_ALICE was as Slack's signed payload named her then, on each
        marks = {(d.get("batch"), d.get("actor_name")) for e in entries
                 if e.actor == "U_ALICE" and e.action == "approved"
                 for d in [json.loads(e.details)]}
        [(batch, name)] = marks
        assert batch and name, marks
        report = await Rows.of(h.engine).verify_audit()
        assert report.ok, report.problems

        # the redrawn Home: what happened on top, the 5 left below with their checkboxes
        text = dump(redrawn["blocks"])
        assert ":white_check_mark: 13 approved" in text and ":warning: 2 refused" in text
        for i in mine:
            assert f"Approved `issue_refund` `{i[:8]}`" in text
        assert f"Refused `issue_refund` `{selected[3][:8]}`" in text
        # who decided, as a mention, once (not again in the runtime's message, by raw id)
        assert T.REFUSAL_NOT_PENDING_BY["approved"].format(who="<@U_BOB>") in text
        assert T.REFUSAL_NOT_PENDING_BY["denied"].format(who="<@U_BOB>") in text
        assert "by U_BOB" not in text
        assert list(checkbox_values(redrawn["blocks"])) == ids[15:]

        # the engine resumed every approved run, as for single clicks: 13 + U_BOB's refund
        await wait_for(lambda: len(h.refunds()) == 14, what="the approved refunds to run")
        ran = [(await h.approval(i)).args_value()["order_id"] for i in [*mine, selected[3]]]
        assert sorted(r["args"]["order_id"] for r in h.refunds()) == sorted(ran)
        # and each card was updated through the outbox
        for i in mine[:3]:
            await wait_for(lambda i=i: _card_says(h, i, "Approved"), what="the card update")


async def _card_says(h: Harness, approval_id: str, word: str) -> bool:
    a = await h.approval(approval_id)
    msg = h.emulator.message(a.channel, a.message_ts) if a.message_ts else None
    return bool(msg and word in dump(msg) and not any(
        b["type"] == "actions" for b in msg["blocks"]))


async def test_a_request_edited_after_the_home_was_drawn_is_refused_as_stale(
        sqlite_url: str, tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text('[tools.issue_refund]\nedits = "propose"\n')
    async with harness(sqlite_url, tmp_path, APPROVALD_POLICY_FILE=str(policy)) as h:
        ids = await pause_many(h, 3)
        home = await open_home(h, "U_ALICE")
        drawn = checkbox_values(home["blocks"])
        edited = ids[1]
        before = await h.approval(edited)
        new_args = {**before.args_value(), "amount_cents": 99_00}
        await h.engine.decide(edited, actor=Actor("U_BOB", "slack"), verdict="edit",
                              args=new_args)
        redrawn = await press(h, cards.APPROVE_SELECTED, "U_ALICE", home, list(drawn.values()))

        assert await statuses(h, [ids[0], ids[2]]) == [("approved", "U_ALICE")] * 2
        a = await h.approval(edited)
        assert a.status == "pending" and a.effective_args() == new_args
        assert "U_ALICE" not in [v.actor for v in await Rows.of(h.engine).votes(edited)]
        text = dump(redrawn["blocks"])
        assert f"Refused `issue_refund` `{edited[:8]}`" in text
        assert T.REFUSAL["stale_card"] in text
        # redrawn with the edited arguments, under a new token
        again = checkbox_values(redrawn["blocks"])
        assert list(again) == [edited] and again[edited] != drawn[edited]
        assert again[edited] == h.value(a) and "9900" in text
        assert (await Rows.of(h.engine).verify_audit()).ok


async def test_deny_selected_asks_one_reason_in_a_modal(sqlite_url: str, tmp_path: Path) -> None:
    async with harness(sqlite_url, tmp_path) as h:
        ids = await pause_many(h, 3)
        home = await open_home(h, "U_ALICE")
        drawn = checkbox_values(home["blocks"])
        ticked = [drawn[ids[0]], drawn[ids[2]]]
        await press(h, cards.DENY_SELECTED, "U_ALICE", home, ticked)
        [modal] = await wait_for(
            lambda: h.emulator.views(user_id="U_ALICE", callback_id=cards.DENY_SELECTED_MODAL),
            what="the deny modal")
        assert_valid_blocks(modal["blocks"])
        boxes = [b for b in modal["blocks"] if b["type"] == "input"
                 and b["element"]["type"] == "checkboxes"]
        assert [o["value"] for b in boxes for o in b["element"]["initial_options"]] == ticked
        assert "issue_refund" in dump(boxes) and "A-2001" in dump(boxes)

        def values(reason: str, chosen: list[str]) -> dict[str, dict[str, Any]]:
            return {**h.slack.ticked(modal["blocks"], chosen),
                    cards.REASON_BLOCK: {cards.REASON_INPUT: reason}}

        empty = await h.slack.submit_view(cards.DENY_SELECTED_MODAL, values("  ", ticked),
                                          user_id="U_ALICE")
        assert empty.json()["response_action"] == "errors"
        assert set(empty.json()["errors"]) == {cards.REASON_BLOCK}
        none = await h.slack.submit_view(cards.DENY_SELECTED_MODAL, values("dupes", []),
                                         user_id="U_ALICE")
        assert set(none.json()["errors"]) == {views.BATCH_FIRST_BLOCK}
        assert await statuses(h, ids) == [("pending", None)] * 3

        done = await h.slack.submit_view(cards.DENY_SELECTED_MODAL,
                                         values("Customer already refunded <!channel>", ticked),
                                         user_id="U_ALICE")
        assert done.status == 200 and done.body in ("", "{}")
        redrawn = await wait_for(lambda: _with_results(h, "U_ALICE", home),
                                 what="the Home with the results")
        assert_valid_blocks(redrawn["blocks"])
        assert ":no_entry_sign: 2 denied" in dump(redrawn["blocks"])
        assert await statuses(h, ids) == [("denied", "U_ALICE"), ("pending", None),
                                          ("denied", "U_ALICE")]
        a = await h.approval(ids[0])
        assert a.reason == "Customer already refunded <!channel>"
        run_id = a.run_id
        await wait_for(lambda: _completed(h, run_id), what="the denied run to re-plan")
        state = await h.engine.state(run_id)
        result = next(m for m in state.messages
                      if isinstance(m, ToolMessage) and m.name == "issue_refund")
        assert result.content["status"] == "denied" and result.content["by"] == "U_ALICE"
        assert h.refunds() == []


async def _completed(h: Harness, run_id: str) -> bool:
    return (await h.run(run_id)).status == "completed"


async def test_nothing_selected_changes_nothing(sqlite_url: str, tmp_path: Path) -> None:
    async with harness(sqlite_url, tmp_path) as h:
        ids = await pause_many(h, 2)
        home = await open_home(h, "U_ALICE")
        redrawn = await press(h, cards.APPROVE_SELECTED, "U_ALICE", home, [])
        assert T.BATCH_NOTHING in dump(redrawn["blocks"])
        await press(h, cards.DENY_SELECTED, "U_ALICE", redrawn, [])  # no modal either
        again = await wait_for(lambda: _with_results(h, "U_ALICE", redrawn),
                               what="the Home again")
        assert T.BATCH_NOTHING in dump(again["blocks"])
        assert not h.emulator.views(callback_id=cards.DENY_SELECTED_MODAL)
        assert await statuses(h, ids) == [("pending", None)] * 2


async def test_a_stranger_ticking_requests_changes_nothing(sqlite_url: str,
                                                          tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text('[tools.issue_refund]\napprovers = ["U_ALICE"]\n')
    async with harness(sqlite_url, tmp_path, APPROVALD_POLICY_FILE=str(policy)) as h:
        ids = await pause_many(h, 2)
        alice = await open_home(h, "U_ALICE")
        mallory = await open_home(h, "U_MALLORY")
        assert checkbox_values(mallory["blocks"]) == {}
        # Mallory's Home never showed them; a forged selection in her state is still refused
        state = h.slack.ticked(alice["blocks"], list(checkbox_values(alice["blocks"]).values()))
        await h.slack.click(cards.APPROVE_SELECTED, None, user_id="U_MALLORY",
                            view_id=mallory["id"], state=state)
        redrawn = await wait_for(lambda: _with_results(h, "U_MALLORY", mallory),
                                 what="Mallory's Home")
        assert T.REFUSAL_NOT_AUTHORIZED_WHO.format(who="<@U_ALICE>") in dump(redrawn["blocks"])
        assert await statuses(h, ids) == [("pending", None)] * 2


async def test_approve_selected_from_the_slash_command(sqlite_url: str, tmp_path: Path) -> None:
    async with harness(sqlite_url, tmp_path) as h:
        ids = await pause_many(h, 3)
        await h.slack.slash("/approvals", "", user_id="U_ALICE", channel_id=CHANNEL)
        [answer] = await wait_for(lambda: h.emulator.responses(), what="the list")
        listing = answer.body
        assert_valid_blocks(listing["blocks"])
        drawn = checkbox_values(listing["blocks"])
        assert list(drawn) == ids
        [message] = h.emulator.ephemeral(CHANNEL, "U_ALICE")
        container = {"type": "message", "message_ts": message["ts"], "channel_id": CHANNEL,
                     "is_ephemeral": True}
        state = h.slack.ticked(listing["blocks"], [drawn[ids[0]], drawn[ids[1]]])
        resp = await h.slack.click(cards.APPROVE_SELECTED, None, user_id="U_ALICE",
                                   channel_id=CHANNEL, message=message, container=container,
                                   state=state)
        assert resp.status == 200
        posts = await wait_for(lambda: h.emulator.responses()[1:], what="the redrawn list")
        redrawn = posts[-1].body
        assert redrawn["replace_original"] is True
        assert_valid_blocks(redrawn["blocks"])
        assert len(redrawn["blocks"]) <= 50
        assert ":white_check_mark: 2 approved" in dump(redrawn["blocks"])
        assert list(checkbox_values(redrawn["blocks"])) == [ids[2]]
        assert await statuses(h, ids) == [("approved", "U_ALICE"), ("approved", "U_ALICE"),
                                          ("pending", None)]


async def test_the_home_with_150_pending_stays_within_100_blocks(sqlite_url: str,
                                                                tmp_path: Path) -> None:
    async with harness(sqlite_url, tmp_path) as h:
        ids = await pause_many(h, 150)
        home = await open_home(h, "U_ALICE")  # the emulator refuses over 100 blocks
        assert len(home["blocks"]) <= 100
        shown = list(checkbox_values(home["blocks"]))
        assert shown == ids[:len(shown)] and len(shown) >= 30  # the oldest that fit
        text = dump(home["blocks"])
        assert f"Showing the oldest {len(shown)} of 150" in text
        assert "approvald approvals list --limit 150" in text
        assert "issue_refund · 150 waiting" in text
