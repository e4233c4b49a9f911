"""Standing approvals through Slack over real signed HTTP: "Approve, and calls like this…" on a
card opens a modal (window, scope, condition); submitting approves the request and grants
the standing approval; matching calls then run without a card, their run threads naming it;
the App Home lists live ones with Revoke and, for a quorum tool, Grant too. Time moves only
through the injected clock."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from approvald.bot.slack import cards, views
from approvald.bot.slack import texts as T
from approvald.runtime.approvals.decide import Actor
from approvald.runtime.kernel.clock import ManualClock
from approvald.runtime.kernel.outcomes import Completed, Paused

from tests.helpers import Rows, opened_by_faces, parts
from tests.integration.slack_harness import CHANNEL, Harness, harness, wait_for
from tests.integration.test_slack import assert_valid_blocks

UP_TO_50 = 'args.order_id == "A-1001" && args.amount_cents <= 5000'


def dump(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def policy(tmp_path: Path, body: str) -> str:
    path = tmp_path / "policy.toml"
    path.write_text(f"[tools.issue_refund]\n{body}")
    return str(path)


def buttons_of(blocks: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out = {}
    for b in blocks:
        for e in [*(b.get("elements") or [] if b["type"] == "actions" else []),
                  b.get("accessory") or {}]:
            if e.get("type") == "button":
                out.setdefault(e["action_id"], e)
    return out


def refund(amount: str) -> str:
    return f"Refund order A-1001: {amount}"


async def ask(h: Harness, amount: str) -> Completed | Paused:
    outcome = await h.engine.run("demo-refund", refund(amount), requested_by="U_DANA")
    assert isinstance(outcome, Completed | Paused), outcome
    return outcome


async def open_modal(h: Harness, a: Any, user: str = "U_ALICE") -> dict[str, Any]:
    """Click "Approve, and calls like this…" on ``a``'s card as ``user``; the modal."""
    before = len(h.emulator.views(callback_id=cards.STANDING_MODAL))
    await h.card(a.id)
    card = await h.card(a.id)
    button = buttons_of(card["blocks"])[cards.STANDING]
    assert button["value"] == h.value(a) and button["text"]["text"] == T.BUTTON_STANDING
    resp = await h.slack.click(cards.STANDING, button["value"], user_id=user,
                               channel_id=CHANNEL, message_ts=a.message_ts)
    assert resp.status == 200
    found = await wait_for(
        lambda: len(h.emulator.views(callback_id=cards.STANDING_MODAL)) > before,
        what="the standing approval modal")
    assert found
    view = h.emulator.views(callback_id=cards.STANDING_MODAL)[-1]
    assert_valid_blocks(view["blocks"])
    return view


async def submit(h: Harness, view: dict[str, Any], user: str = "U_ALICE",
                 **changes: Any) -> dict[str, Any]:
    """Submit ``view`` with its inputs as drawn except ``changes`` (window=, scope=,
    fields=, when=); the app's answer ({} when it closed the modal)."""
    blocks = {"window": cards.WINDOW_BLOCK, "scope": cards.SCOPE_BLOCK,
              "fields": cards.FIELDS_BLOCK, "when": cards.WHEN_BLOCK}
    state = h.slack.filled(view["blocks"], {blocks[k]: v for k, v in changes.items()})
    resp = await h.slack.submit_view(cards.STANDING_MODAL, state, user_id=user,
                                     view_id=view["id"])
    assert resp.status == 200
    return resp.json() if resp.body.strip() else {}


def element(view: dict[str, Any], block_id: str) -> dict[str, Any]:
    [block] = [b for b in view["blocks"] if b.get("block_id") == block_id]
    return dict(block["element"])


async def standing(h: Harness) -> list[Any]:
    return await h.engine.standing_grants(live_only=False)


async def card_says(h: Harness, approval_id: str, *words: str) -> dict[str, Any] | None:
    a = await h.approval(approval_id)
    msg = h.emulator.message(a.channel, a.message_ts) if a.message_ts else None
    return msg if msg and all(w in dump(msg) for w in words) else None


async def thread_has(h: Harness, run_id: str, text: str) -> bool:
    thread = await Rows.of(h.engine).thread(run_id)
    if thread is None:
        return False
    return any(text in dump(m) for m in h.emulator.thread(thread.channel, thread.ts))


async def open_home(h: Harness, user: str) -> dict[str, Any]:
    before = h.emulator.home_view(user)
    await h.slack.event({"type": "app_home_opened", "user": user, "channel": f"D_{user}",
                         "tab": "home"})
    return await redrawn_home(h, user, before)


async def redrawn_home(h: Harness, user: str, before: dict[str, Any] | None) -> dict[str, Any]:
    def newer() -> dict[str, Any] | None:
        view = h.emulator.home_view(user)
        if view is None or (before is not None and view["hash"] == before["hash"]):
            return None
        return view
    home = await wait_for(newer, what=f"{user}'s App Home")
    assert_valid_blocks(home["blocks"])
    assert len(home["blocks"]) <= 100
    return home


async def press(h: Harness, action_id: str, standing_id: str, user: str,
                home: dict[str, Any]) -> dict[str, Any]:
    """Press a standing approval's button on ``home`` as ``user``; the Home drawn after."""
    resp = await h.slack.click(action_id, standing_id, user_id=user, view_id=home["id"])
    assert resp.status == 200 and resp.body in ("", "{}")
    return await redrawn_home(h, user, home)


def cards_posted(h: Harness) -> int:
    return len(h.emulator.messages(CHANNEL))


async def test_the_issue_scenario_through_slack(db_url: str, tmp_path: Path) -> None:
    clock = ManualClock(datetime.now(UTC) + timedelta(days=1))
    file = policy(tmp_path, 'approvers = ["U_ALICE", "U_BOB", "U_CAROL"]\n')
    async with harness(db_url, tmp_path, clock=clock, APPROVALD_POLICY_FILE=file) as h:
        first = await h.pause_refund()
        a = await h.approval(first.approval_ids[0])
        view = await open_modal(h, a)
        # the modal: windows within max_standing (default 1 h), the three scopes, the call's
        # argument names, and a condition drawn from its arguments
        window = element(view, cards.WINDOW_BLOCK)
        assert window["type"] == "static_select"
        assert [o["value"] for o in window["options"]] == ["15m", "30m", "1h"]
        assert [o["text"]["text"] for o in window["options"]] == ["15 min", "30 min", "1 h"]
        scope = element(view, cards.SCOPE_BLOCK)
        assert [o["value"] for o in scope["options"]] == ["exact", "fields", "condition"]
        assert [o["text"]["text"] for o in scope["options"]] == [
            T.SCOPE_EXACT, T.SCOPE_FIELDS, T.SCOPE_CONDITION]
        assert scope["initial_option"]["value"] == "exact"
        fields = element(view, cards.FIELDS_BLOCK)
        assert [o["value"] for o in fields["options"]] == ["order_id", "amount_cents", "reason"]
        when = element(view, cards.WHEN_BLOCK)
        assert when["initial_value"] == 'args.order_id == "A-1001" && args.amount_cents <= 4200'
        assert "same approvers and quorum" in dump(view) and "revoke" in dump(view)

        # grant "refunds of order A-1001 up to $50 for 30 minutes"
        assert await submit(h, view, window="30m", scope="condition", when=UP_TO_50) == {}
        [s] = await standing(h)
        assert (s.status, s.grants_value(), s.quorum, s.granted_on) == (
            "active", ["U_ALICE"], 1, a.id)
        assert s.expires_at - s.created_at == timedelta(minutes=30)
        a = await h.approval(a.id)
        assert (a.status, a.decided_by, a.decided_via) == ("approved", "U_ALICE", "slack")
        # the card updates as for an approval, and says what was granted
        card = await wait_for(lambda: card_says(h, a.id, "Standing approval", s.id),
                              what="the card to tell the standing approval")
        assert_valid_blocks(card["blocks"])
        assert not [b for b in card["blocks"] if b["type"] == "actions"]
        text = dump(card)
        assert "*Approved* by <@U_ALICE>" in text and "for 30m" in text
        assert "calls where `args.order_id == \\\"A-1001\\\" &amp;&amp; args.amount_cents " \
               "&lt;= 5000`" in text
        assert "run without a card until" in text
        await wait_for(lambda: len(h.refunds()) == 1, what="the granting request's refund")

        # three matching calls run without cards; their run threads say what allowed them
        posted = cards_posted(h)
        for amount in ("$20", "$45", "$50"):
            done = await ask(h, amount)
            assert isinstance(done, Completed), done
            [used] = [x for x in await Rows.of(h.engine).approvals(done.run_id)
                      if x.tool == "issue_refund"]
            assert (used.decided_via, used.decided_by) == ("standing", f"standing:{s.id}")
            await wait_for(lambda run=done.run_id: thread_has(
                h, run, f"approved by a standing approval: `{s.id}`, granted by "
                        "<@U_ALICE>; nobody was asked"), what="the run thread naming it")
        assert cards_posted(h) == posted  # no new card
        assert [r["args"]["amount_cents"] for r in h.refunds()] == [4200, 2000, 4500, 5000]
        # a fourth, for $60, is outside the scope: it gets a card
        over = await ask(h, "$60")
        assert isinstance(over, Paused)
        await h.card(over.approval_ids[0])
        assert cards_posted(h) == posted + 1

        # the App Home lists it for an approver, with Revoke (confirmed)
        home = await open_home(h, "U_BOB")
        text = dump(home["blocks"])
        assert T.HOME_STANDING_TITLE in text and s.id in text and "3 use(s)" in text
        assert "grants 1/1 (<@U_ALICE>)" in text
        revoke = buttons_of(home["blocks"])[cards.STANDING_REVOKE]
        assert revoke["value"] == s.id and revoke["confirm"]["confirm"]["text"] == "Revoke"
        assert cards.STANDING_GRANT not in buttons_of(home["blocks"])  # active: none needed

        # a stranger's Home does not list it; their forged Revoke is refused, nothing changes
        stranger = await open_home(h, "U_MALLORY")
        assert s.id not in dump(stranger["blocks"])
        refused = await press(h, cards.STANDING_REVOKE, s.id, "U_MALLORY", stranger)
        assert "Nothing changed" in dump(refused["blocks"][:3])
        assert T.STANDING_REFUSAL["not_authorized"] in dump(refused["blocks"][:3])
        assert (await h.engine.standing_grant(s.id)).status == "active"
        still = await ask(h, "$10")
        assert isinstance(still, Completed)

        # revoked from the Home: the next match gets a card again
        after = await press(h, cards.STANDING_REVOKE, s.id, "U_BOB", home)
        assert "You revoked standing approval" in dump(after["blocks"][:3])
        assert cards.STANDING_REVOKE not in buttons_of(after["blocks"])
        got = await h.engine.standing_grant(s.id)
        assert (got.status, got.revoked_by, got.uses) == ("revoked", "U_BOB", 4)
        asks = await ask(h, "$20")
        assert isinstance(asks, Paused)
        await h.card(asks.approval_ids[0])
        await wait_for(lambda: card_says(h, a.id, "Revoked by <@U_BOB>"),
                       what="the granting card to tell the revocation")

        entries = [e for e in await Rows.of(h.engine).audit()]
        assert [(e.action, e.actor) for e in entries if e.action.startswith("standing_")] == [
            ("standing_granted", "U_ALICE"), ("standing_revoked", "U_BOB")]
        uses = [e for e in entries if e.actor == f"standing:{s.id}"]
        assert len(uses) == 4 and all(
            json.loads(e.details)["standing_approval"] == s.id for e in uses)
        # who the user ids were, as Slack's signed payloads named them at the time: the
        # grant's and the revocation's entries, and each use names its granter
        grant, revoke = [json.loads(e.details) for e in entries
                         if e.action.startswith("standing_")]
        assert grant["actor_name"] and revoke["actor_name"], (grant, revoke)
        for e in uses:
            assert json.loads(e.details)["granted_by_names"] == {
                "U_ALICE": grant["actor_name"]}
        report = await Rows.of(h.engine).verify_audit()
        assert report.ok, report.problems


async def test_a_quorum_2_tool_needs_a_second_grant_from_the_home(sqlite_url: str,
                                                                  tmp_path: Path) -> None:
    clock = ManualClock(datetime.now(UTC) + timedelta(days=1))
    file = policy(tmp_path, 'approvers = ["U_ALICE", "U_BOB", "U_CAROL"]\nquorum = 2\n')
    async with harness(sqlite_url, tmp_path, clock=clock, APPROVALD_POLICY_FILE=file) as h:
        first = await h.pause_refund()
        a = await h.approval(first.approval_ids[0])
        view = await open_modal(h, a)
        assert "2 approvals: it covers nothing until 1 more approver(s) grant it" in dump(view)
        assert await submit(h, view, window="1h", scope="condition", when=UP_TO_50) == {}
        [s] = await standing(h)
        assert (s.status, s.grants_value(), s.quorum) == ("proposed", ["U_ALICE"], 2)
        a = await h.approval(a.id)
        assert (a.status, a.approve_count) == ("pending", 1)
        # the card, still live, says 1 of 2 grants; the granter is told the same
        card = await wait_for(lambda: card_says(h, a.id, s.id, "*1 of 2 grants*"),
                              what="the card to tell the proposed standing approval")
        assert_valid_blocks(card["blocks"])
        assert cards.APPROVE in buttons_of(card["blocks"])
        [said] = await wait_for(lambda: h.emulator.ephemeral(CHANNEL, "U_ALICE"),
                                what="the granter's reply")
        assert "1 of 2 grants" in said["text"] and s.id in said["text"]

        # one grant covers nothing: a matching call gets a card
        asks = await ask(h, "$20")
        assert isinstance(asks, Paused)

        # the granter's Home offers no Grant too; another approver's does
        mine = await open_home(h, "U_ALICE")
        assert cards.STANDING_GRANT not in buttons_of(mine["blocks"])
        assert buttons_of(mine["blocks"])[cards.STANDING_REVOKE]["value"] == s.id
        home = await open_home(h, "U_CAROL")
        assert "grants 1/2 (<@U_ALICE>)" in dump(home["blocks"])
        grant = buttons_of(home["blocks"])[cards.STANDING_GRANT]
        assert grant["value"] == s.id and "confirm" in grant
        after = await press(h, cards.STANDING_GRANT, s.id, "U_CAROL", home)
        assert "2 of 2 grants, so it is active" in dump(after["blocks"][:3])
        assert cards.STANDING_GRANT not in buttons_of(after["blocks"])
        assert "grants 2/2 (<@U_ALICE>, <@U_CAROL>)" in dump(after["blocks"])
        got = await h.engine.standing_grant(s.id)
        assert (got.status, got.grants_value()) == ("active", ["U_ALICE", "U_CAROL"])
        await wait_for(lambda: card_says(h, a.id, s.id, "*2 of 2 grants*"),
                       what="the card to tell the second grant")

        # now matching calls skip the card
        posted = cards_posted(h)
        done = await ask(h, "$45")
        assert isinstance(done, Completed), done
        await wait_for(lambda: thread_has(
            h, done.run_id, f"standing approval: `{s.id}`, granted by <@U_ALICE>, "
                            "<@U_CAROL>; nobody was asked"), what="the run thread naming it")
        # after the window (moved on the injected clock), a matching call asks again
        clock.advance(timedelta(hours=1, minutes=1))
        late = await ask(h, "$45")
        assert isinstance(late, Paused)
        await h.card(late.approval_ids[0])
        assert cards_posted(h) == posted + 1
        assert (await h.engine.standing_grant(s.id)).uses == 1


async def test_what_the_modal_refuses_changes_nothing(sqlite_url: str, tmp_path: Path) -> None:
    clock = ManualClock(datetime.now(UTC) + timedelta(days=1))
    file = policy(tmp_path, 'approvers = ["U_ALICE", "U_BOB"]\nmax_standing = "30m"\n'
                            '[[tools.issue_refund.rules]]\nwhen = "args.amount_cents > 10000"\n'
                            'max_standing = "0"\n')
    async with harness(sqlite_url, tmp_path, clock=clock, APPROVALD_POLICY_FILE=file) as h:
        first = await h.pause_refund()
        a = await h.approval(first.approval_ids[0])
        view = await open_modal(h, a)
        assert [o["value"] for o in element(view, cards.WINDOW_BLOCK)["options"]] == [
            "15m", "30m"]

        async def refused(block: str, **changes: Any) -> str:
            answer = await submit(h, view, **changes)
            assert answer["response_action"] == "errors", answer
            assert list(answer["errors"]) == [block], answer
            assert (await h.approval(a.id)).status == "pending"
            assert await standing(h) == []
            return str(answer["errors"][block])

        # a window the tool's max_standing does not allow (a forged option)
        assert "not allowed" in await refused(cards.WINDOW_BLOCK, window="1h")
        assert "asked: 1h" in await refused(cards.WINDOW_BLOCK, window="1h")
        assert T.MODAL_STANDING_NO_WINDOW == await refused(cards.WINDOW_BLOCK, window="9h")
        # a scope that does not cover this request, or is not CEL, or names nothing
        assert "does not cover" in await refused(
            cards.WHEN_BLOCK, scope="condition", when="args.amount_cents <= 100")
        assert "not a valid CEL expression" in await refused(
            cards.WHEN_BLOCK, scope="condition", when="args.amount_cents <=")
        assert "unknown name" in await refused(cards.WHEN_BLOCK, scope="condition",
                                               when="amount_cents <= 5000")
        assert T.MODAL_STANDING_NO_WHEN == await refused(cards.WHEN_BLOCK, scope="condition",
                                                         when="  ")
        assert T.MODAL_STANDING_NO_FIELDS == await refused(cards.FIELDS_BLOCK, scope="fields",
                                                           fields=[])
        assert "no argument nope" in await refused(cards.FIELDS_BLOCK, scope="fields",
                                                   fields=["nope"])
        # a stranger, and the requester, replaying the modal's submission
        answer = await submit(h, view, user="U_MALLORY")
        assert "not an approver" in answer["errors"][cards.WINDOW_BLOCK]
        answer = await submit(h, view, user="U_DANA")
        assert "started this run" in answer["errors"][cards.WINDOW_BLOCK]
        assert (await h.approval(a.id)).status == "pending" and await standing(h) == []
        # nor can they open it: an ephemeral refusal, no modal
        for user, says in (("U_MALLORY", "not an approver"), ("U_DANA", "started this run")):
            await h.slack.click(cards.STANDING, h.value(a), user_id=user, channel_id=CHANNEL,
                                message_ts=a.message_ts)
            [reply] = await wait_for(lambda user=user: h.emulator.ephemeral(CHANNEL, user),
                                     what="the refusal")
            assert says in reply["text"]
        assert h.emulator.views(user_id="U_MALLORY", callback_id=cards.STANDING_MODAL) == []

        # the same values for chosen arguments: granted
        assert await submit(h, view, window="15m", scope="fields",
                            fields=["order_id"]) == {}
        [s] = await standing(h)
        assert s.scope_value() == {"kind": "fields", "digest": None,
                                   "values": {"order_id": "A-1001"}, "when": None}
        await wait_for(lambda: card_says(h, a.id, s.id, "calls with `order_id` = "
                                         "`\\\"A-1001\\\"`", "for 15m"),
                       what="the card to tell the fields scope")

        # a card drawn before someone else decided: the modal's submission is refused
        second = await h.pause_refund(task="Refund order B-2002: $10")
        b = await h.approval(second.approval_ids[0])
        late = await open_modal(h, b)
        await h.engine.decide(b.id, actor=Actor("U_BOB", "slack"), verdict="approve")
        answer = await submit(h, late)
        assert "already approved" in answer["errors"][cards.WINDOW_BLOCK]
        assert len(await standing(h)) == 1

        # max_standing = "0" (here by a rule on the arguments): no button, and a forged
        # submission is refused
        off = await h.pause_refund(task=refund("$150"))
        c = await h.approval(off.approval_ids[0])
        card = await h.card(c.id)
        assert cards.STANDING not in buttons_of(card["blocks"])
        assert cards.APPROVE in buttons_of(card["blocks"])
        forged = await h.slack.submit_view(
            cards.STANDING_MODAL, h.slack.filled(view["blocks"], {}), user_id="U_ALICE",
            private_metadata=views.modal_metadata(c.id, h.token(c), CHANNEL, c.message_ts))
        answer = forged.json()
        assert "turned off" in answer["errors"][cards.WINDOW_BLOCK]
        assert (await h.approval(c.id)).status == "pending" and len(await standing(h)) == 1


async def test_the_app_home_is_drawn_from_its_view_in_one_read(sqlite_url: str, tmp_path: Path,
                                                               monkeypatch: Any) -> None:
    """The App Home (requests to decide, decided ones, standing approvals with their
    masked scopes) comes from the engine's Home view: one read, whatever it holds."""
    from approvald.runtime.policies.scope import scope_for

    clock = ManualClock(datetime.now(UTC) + timedelta(days=1))
    async with harness(sqlite_url, tmp_path, clock=clock, background=False) as h:
        first = await h.pause_refund()
        a = await h.approval(first.approval_ids[0])
        s, _ = await h.engine.grant_standing(a.id, actor=Actor("U_ALICE", "slack"),
                                             window=timedelta(minutes=30),
                                             scope=scope_for(a, "exact"))
        await h.pause_refund(task="Refund order A-2002, customer was double charged")
        opened = opened_by_faces(monkeypatch, parts(h.engine).db)
        await h.service.slack.handlers.publish_home(h.service.slack.client, "U_ALICE")
        assert opened == ["read:runtime/views"]
        home = dump(h.emulator.home_view("U_ALICE"))
        assert s.id in home and "A-2002" in home
