"""The Slack face over real HTTP: cards, clicks, modals, refusals, delivery, threads, home."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from approvald.bot.slack import cards
from approvald.runtime.kernel.clock import ManualClock
from approvald.runtime.record.state import ToolMessage
from slack_sdk.models.blocks import Block

from tests.helpers import Rows, parts
from tests.integration.slack_harness import CHANNEL, OPS, harness, wait_for


def text_of(msg: dict) -> str:
    return json.dumps(msg, ensure_ascii=False)


def assert_valid_blocks(blocks: list[dict]) -> None:
    for b in blocks:
        assert Block.parse(b).to_dict() == b


async def test_refund_through_slack_approve(sqlite_url: str, tmp_path: Path) -> None:
    async with harness(sqlite_url, tmp_path) as h:
        paused = await h.pause_refund()
        [aid] = paused.approval_ids
        a = await h.approval(aid)
        assert a.status == "pending"  # committed before any card exists
        card = await h.card(aid)
        assert_valid_blocks(card["blocks"])
        assert "issue_refund" in text_of(card) and "4200" in text_of(card)
        buttons = [e for b in card["blocks"] if b["type"] == "actions" for e in b["elements"]]
        assert {e["action_id"] for e in buttons} >= {cards.APPROVE, cards.DENY, cards.EDIT}
        approve = next(e for e in buttons if e["action_id"] == cards.APPROVE)
        assert approve["value"] == h.value(a) and "confirm" in approve  # high risk

        resp = await h.slack.click(cards.APPROVE, approve["value"], user_id="U_ALICE",
                                   channel_id=CHANNEL, message_ts=a.message_ts)
        assert resp.status == 200
        await wait_for(lambda: h.run(paused.run_id), what="run")
        run = await wait_for(lambda: _status(h, paused.run_id, "completed"),
                             what="the run to complete")
        assert "was issued" in run.result
        assert len(h.refunds()) == 1
        updated = await wait_for(lambda: _updated_card(h, aid, "Approved"),
                                 what="the card to show the approval")
        assert_valid_blocks(updated["blocks"])
        assert not [b for b in updated["blocks"] if b["type"] == "actions"]
        assert "U_ALICE" in text_of(updated)
        # the ops thread tells the story
        await wait_for(lambda: _thread_has(h, paused.run_id, "was issued"),
                       what="the final answer in the thread")


async def _status(h, run_id: str, status: str):
    run = await h.run(run_id)
    return run if run.status == status else None


async def _updated_card(h, approval_id: str, word: str):
    a = await h.approval(approval_id)
    msg = h.emulator.message(a.channel, a.message_ts)
    return msg if msg and word in text_of(msg) else None


async def _thread_has(h, run_id: str, text: str) -> bool:
    thread = await Rows.of(h.engine).thread(run_id)
    if thread is None:
        return False
    replies = h.emulator.thread(thread.channel, thread.ts)
    return any(text in text_of(m) for m in replies)


async def test_deny_opens_a_modal_and_the_model_gets_the_reason(sqlite_url, tmp_path):
    async with harness(sqlite_url, tmp_path) as h:
        paused = await h.pause_refund()
        [aid] = paused.approval_ids
        await h.card(aid)
        a = await h.approval(aid)
        resp = await h.slack.click(cards.DENY, h.value(a), user_id="U_ALICE",
                                   channel_id=CHANNEL, message_ts=a.message_ts)
        assert resp.status == 200
        view = await wait_for(lambda: h.emulator.views(callback_id=cards.DENY_MODAL),
                              what="the deny modal")
        empty = await h.slack.submit_view(cards.DENY_MODAL, {"reason": {"reason_input": " "}},
                                          user_id="U_ALICE")
        assert empty.status == 200 and empty.json()["response_action"] == "errors"
        assert (await h.approval(aid)).status == "pending"
        done = await h.slack.submit_view(cards.DENY_MODAL,
                                         {"reason": {"reason_input": "Already credited"}},
                                         user_id="U_ALICE")
        assert done.status == 200 and view
        await wait_for(lambda: _status(h, paused.run_id, "completed"), what="completion")
        state = await h.engine.state(paused.run_id)
        refusal = next(m for m in state.messages
                       if isinstance(m, ToolMessage) and m.name == "issue_refund")
        assert refusal.content == {"status": "denied", "reason": "Already credited",
                                   "by": "U_ALICE"}
        await wait_for(lambda: _updated_card(h, aid, "Already credited"),
                       what="the reason on the card")
        assert h.refunds() == []


async def test_edit_modal_shows_errors_inline_then_executes_the_edit(sqlite_url, tmp_path):
    async with harness(sqlite_url, tmp_path) as h:
        paused = await h.pause_refund()
        [aid] = paused.approval_ids
        await h.card(aid)
        a = await h.approval(aid)
        await h.slack.click(cards.EDIT, h.value(a), user_id="U_ALICE", channel_id=CHANNEL,
                            message_ts=a.message_ts)
        [view] = await wait_for(lambda: h.emulator.views(callback_id=cards.EDIT_MODAL),
                                what="the edit modal")
        initial = json.dumps(view, ensure_ascii=False)
        assert "A-1001" in initial and "4200" in initial

        def submit(text: str):
            return h.slack.submit_view(cards.EDIT_MODAL, {"args": {"args_input": text}},
                                       user_id="U_ALICE")

        bad_json = await submit("{not json")
        assert bad_json.json()["response_action"] == "errors"
        assert "args" in bad_json.json()["errors"]
        bad_schema = await submit(json.dumps({"order_id": "A-1001", "amount_cents": "many",
                                              "reason": "x"}))
        assert "amount_cents" in bad_schema.json()["errors"]["args"]
        assert (await h.approval(aid)).status == "pending"
        ok = await submit(json.dumps({"order_id": "A-1001", "amount_cents": 1500,
                                      "reason": "partial refund"}))
        assert ok.status == 200 and ok.body in ("", "{}")
        await wait_for(lambda: _status(h, paused.run_id, "completed"), what="completion")
        assert [r["args"]["amount_cents"] for r in h.refunds()] == [1500]


@pytest.mark.parametrize("case", ["forged", "stale", "unsigned"])
async def test_bad_signatures_get_401_and_change_nothing(sqlite_url, tmp_path, case):
    async with harness(sqlite_url, tmp_path) as h:
        paused = await h.pause_refund()
        [aid] = paused.approval_ids
        a = await h.approval(aid)
        kwargs = {"forged": {"forge": True}, "stale": {"timestamp_offset": -301},
                  "unsigned": {"signed": False}}[case]
        resp = await h.slack.click(cards.APPROVE, h.value(a), user_id="U_ALICE",
                                   channel_id=CHANNEL, **kwargs)
        assert resp.status == 401
        assert (await h.approval(aid)).status == "pending"
        assert await Rows.of(h.engine).votes(aid) == []


@pytest.mark.parametrize("case", ["unknown", "tampered", "stranger", "requester", "garbage"])
async def test_refused_clicks_get_an_ephemeral_reply_and_change_nothing(sqlite_url, tmp_path,
                                                                      case):
    async with harness(sqlite_url, tmp_path,
                       APPROVALD_POLICY_FILE=str(_policy(tmp_path))) as h:
        paused = await h.pause_refund()
        [aid] = paused.approval_ids
        a = await h.approval(aid)
        token = h.token(a)
        value, user = {
            "unknown": (f"{'f' * 32}:{token}", "U_ALICE"),
            "tampered": (f"{a.id}:{token[:-2]}xx", "U_ALICE"),
            "stranger": (h.value(a), "U_MALLORY"),
            "requester": (h.value(a), "U_DANA"),
            "garbage": ("not-a-value", "U_ALICE"),
        }[case]
        resp = await h.slack.click(cards.APPROVE, value, user_id=user, channel_id=CHANNEL)
        assert resp.status == 200
        said = await wait_for(lambda: h.emulator.ephemeral(CHANNEL, user),
                              what="an ephemeral reply")
        assert said[0]["text"]
        assert (await h.approval(aid)).status == "pending"
        assert await Rows.of(h.engine).votes(aid) == []


def _policy(tmp_path: Path) -> Path:
    path = tmp_path / "policy.toml"
    path.write_text('[tools.issue_refund]\napprovers = ["U_ALICE", "S_FINANCE"]\n')
    return path


async def test_double_click_and_late_click(sqlite_url, tmp_path):
    async with harness(sqlite_url, tmp_path) as h:
        paused = await h.pause_refund()
        [aid] = paused.approval_ids
        a = await h.approval(aid)
        first = await h.slack.click(cards.APPROVE, h.value(a), user_id="U_ALICE",
                                    channel_id=CHANNEL)
        second = await h.slack.click(cards.APPROVE, h.value(a), user_id="U_BOB",
                                     channel_id=CHANNEL)
        assert first.status == second.status == 200
        await wait_for(lambda: _status(h, paused.run_id, "completed"), what="completion")
        said = await wait_for(lambda: h.emulator.ephemeral(CHANNEL, "U_BOB"),
                              what="Bob's ephemeral")
        assert "already" in said[0]["text"].lower()
        assert len(h.refunds()) == 1
        votes = await Rows.of(h.engine).votes(aid)
        assert [v.actor for v in votes] == ["U_ALICE"]


async def test_a_click_after_expiry_is_refused_and_the_card_says_expired(sqlite_url, tmp_path):
    # engine time runs a day ahead of the wall clock, so no scheduler job fires by itself
    clock = ManualClock(datetime.now(UTC) + timedelta(days=1))
    policy = tmp_path / "policy.toml"
    policy.write_text('[tools.issue_refund]\nttl = "2s"\nreminders = []\n')
    async with harness(sqlite_url, tmp_path, clock=clock,
                       APPROVALD_POLICY_FILE=str(policy)) as h:
        paused = await h.pause_refund()
        [aid] = paused.approval_ids
        await h.card(aid)
        a = await h.approval(aid)
        clock.advance(4)  # 2 s past expiry, and no sweep has run
        resp = await h.slack.click(cards.APPROVE, h.value(a), user_id="U_ALICE",
                                   channel_id=CHANNEL, message_ts=a.message_ts)
        assert resp.status == 200
        said = await wait_for(lambda: h.emulator.ephemeral(CHANNEL, "U_ALICE"),
                              what="the refusal")
        assert "too late" in said[0]["text"].lower()
        assert (await h.approval(aid)).status == "expired"  # applied by the click itself
        run = await wait_for(lambda: _status(h, paused.run_id, "completed"),
                             what="the run to end")
        assert "expired" in run.result and h.refunds() == []
        await wait_for(lambda: _updated_card(h, aid, "Expired"), what="the expired card")


async def test_group_member_approves_via_slack_usergroups(sqlite_url, tmp_path):
    async with harness(sqlite_url, tmp_path,
                       APPROVALD_POLICY_FILE=str(_policy(tmp_path))) as h:
        paused = await h.pause_refund()
        a = await h.approval(paused.approval_ids[0])
        await h.slack.click(cards.APPROVE, h.value(a), user_id="U_CAROL", channel_id=CHANNEL)
        await wait_for(lambda: _status(h, paused.run_id, "completed"), what="completion")
        assert h.emulator.calls("usergroups.users.list")


async def test_home_tab_and_slash_command_list_the_viewers_requests(sqlite_url, tmp_path):
    async with harness(sqlite_url, tmp_path,
                       APPROVALD_POLICY_FILE=str(_policy(tmp_path))) as h:
        paused = await h.pause_refund()
        a = await h.approval(paused.approval_ids[0])
        resp = await h.slack.event({"type": "app_home_opened", "user": "U_ALICE",
                                    "channel": "D_ALICE", "tab": "home"})
        assert resp.status == 200
        home = await wait_for(lambda: h.emulator.home_view("U_ALICE"), what="App Home")
        assert_valid_blocks(home["blocks"])
        values = [e.get("value") for b in home["blocks"] if b["type"] == "actions"
                  for e in b["elements"]]
        assert h.value(a) in values
        await h.slack.event({"type": "app_home_opened", "user": "U_MALLORY", "tab": "home",
                             "channel": "D_M"})
        other = await wait_for(lambda: h.emulator.home_view("U_MALLORY"), what="Mallory's home")
        assert h.value(a) not in text_of(other)

        slash = await h.slack.slash("/approvals", "", user_id="U_BOB", channel_id=CHANNEL)
        assert slash.status == 200
        [answer] = await wait_for(lambda: h.emulator.responses(), what="the slash answer")
        body = answer.body if hasattr(answer, "body") else answer
        assert h.value(a) in text_of(body)


async def test_hostile_arguments_render_inert(sqlite_url, tmp_path):
    from approvald.runtime.models.scripted import ScriptedModel, reply
    from approvald.runtime.policies.tools import tool
    from approvald.runtime.runs.agent import Agent

    @tool(permission="execute")
    async def post_note(text: str, blob: dict) -> str:
        """Posts a note."""
        return "ok"

    hostile = ("<!channel> <!here> <@U123> <http://evil.example|bank.com> ``` `x` "
               "ünïcødé 日本語 🚀 &amp; ")
    blob = {f"k{i}": hostile * 3 for i in range(60)}  # ~20 KB of JSON
    agent = Agent(name="hostile", instructions="", tools=[post_note],
                  model=ScriptedModel.sequence([reply(hostile, ("post_note", {
                      "text": hostile, "blob": blob})), reply("done", turn=1)]))
    async with harness(sqlite_url, tmp_path) as h:
        parts(h.engine).registry.add(agent)
        paused = await h.pause_refund(agent="hostile", task=hostile)
        card = await h.card(paused.approval_ids[0])
        assert_valid_blocks(card["blocks"])
        raw = text_of(card)
        for needle in ("<!channel>", "<!here>", "<@U123>", "<http://evil"):
            assert needle not in raw
        assert len(card["blocks"]) <= 50
        buttons = [e["action_id"] for b in card["blocks"] if b["type"] == "actions"
                   for e in b["elements"]]
        assert cards.VIEW_ARGS in buttons


async def test_thread_is_created_and_kept_current(sqlite_url, tmp_path):
    async with harness(sqlite_url, tmp_path) as h:
        outcome = await h.engine.run("demo-steps", "12", requested_by="U_DANA")
        assert outcome.status == "completed"
        async def thread():
            t = await Rows.of(h.engine).thread(outcome.run_id)
            return t if t and t.posted_status == "completed" else None
        t = await wait_for(thread, what="the thread to catch up")
        parent = h.emulator.message(OPS, t.ts)
        assert "completed" in text_of(parent).lower() or "✅" in text_of(parent)
        replies = h.emulator.thread(OPS, t.ts)
        body = "\n".join(m["text"] for m in replies if m["ts"] != t.ts)
        assert body.count("tick") >= 12 and "Ticked 12 times." in body
        # coalesced: far fewer messages than steps
        assert len([m for m in replies if m["ts"] != t.ts]) < 6


async def test_too_large_or_malformed_requests_are_refused_and_change_nothing(sqlite_url,
                                                                             tmp_path):
    async with harness(sqlite_url, tmp_path) as h:
        paused = await h.pause_refund()
        [aid] = paused.approval_ids
        import io

        import aiohttp

        async with aiohttp.ClientSession() as http, http.post(
                h.slack.app_url, data=io.BytesIO(b"payload=" + b"x" * (2 * 1024 * 1024)),
                headers={"Content-Type": "application/x-www-form-urlencoded"}) as resp:
            assert resp.status == 413
        garbled = await h.slack.post("payload=%7Bnot-json", "application/x-www-form-urlencoded")
        assert garbled.status == 400 and "malformed" in garbled.body
        assert (await h.approval(aid)).status == "pending"
        assert await Rows.of(h.engine).votes(aid) == []


async def test_a_run_that_starts_waiting_says_why_and_until_when_in_ops(sqlite_url, tmp_path):
    from approvald.runtime.kernel.errors import ModelUnavailable
    from approvald.runtime.runs.agent import Agent

    class Down:
        async def complete(self, **kw):  # type: ignore[no-untyped-def]
            raise ModelUnavailable("provider answered HTTP 503", retry_after=600)

    async with harness(sqlite_url, tmp_path) as h:
        parts(h.engine).registry.add(Agent(name="flaky", instructions="", model=Down(), tools=[]))
        outcome = await h.engine.run("flaky", "hello", requested_by="U_DANA")
        assert outcome.status == "running" and "503" in outcome.reason

        def told() -> bool:
            return any("Waiting until" in m.get("text", "") and "503" in m.get("text", "")
                       for m in h.emulator.messages(OPS))
        await wait_for(told, what="the waiting line in ops")
        again = await h.engine.advance(outcome.run_id)  # still waiting: told once
        assert again.status == "running"
        assert sum("Waiting until" in m.get("text", "") for m in h.emulator.messages(OPS)) == 1


async def test_the_audit_head_is_posted_to_the_audit_channel_as_a_witness(sqlite_url, tmp_path):

    async with harness(sqlite_url, tmp_path, APPROVALD_AUDIT_CHANNEL="C_AUDIT") as h:

        def posted() -> list[dict]:
            return [m for m in h.emulator.messages("C_AUDIT") if "Audit log head" in
                    m.get("text", "")]
        # serve posts the head it started on (the policy it loaded is the first entry)
        [at_start] = await wait_for(posted, what="the head posted when serve started")
        assert "`1:" in at_start["text"]
        paused = await h.pause_refund()
        await h.service.post_audit_head()
        await h.service.post_audit_head()  # nothing new: not posted twice
        await wait_for(lambda: len(posted()) == 2, what="the head in the audit channel")
        message = posted()[-1]
        report = await Rows.of(h.engine).verify_audit()
        assert report.head_text in message["text"]
        assert f"approvald audit verify --expect {report.head_text}" in message["text"]
        from approvald.runtime.approvals.decide import Actor

        await h.engine.decide(paused.approval_ids[0], actor=Actor("U_ALICE", "slack"),
                              verdict="approve")
        await h.service.post_audit_head()  # the head moved: a new witness
        await wait_for(lambda: len(posted()) == 3, what="the second head")
