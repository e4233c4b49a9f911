"""An approved call the deployed release cannot run, in Slack (issue 38): the approved card
says it was not executed, a question card asks to re-plan or abort, the ops thread says so,
and the Re-plan button hands the model the error."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from approvald.bot.slack import cards
from approvald.runtime.runs.agent import Registry

from tests.helpers import Rows, parts
from tests.integration.slack_harness import CHANNEL, harness, wait_for


def redeploy_without(registry: Registry, agent: str, tool: str) -> None:
    """What a deploy does to this process's agents: the next release of ``agent`` has no
    ``tool`` (the previous one is not registered beside it)."""
    old = registry.get(agent)
    new = replace(old, version="2", tools=[t for t in old.tools if t.name != tool])
    registry._agents[agent] = new  # a deploy, simulated in-process
    registry._versions = {k: v for k, v in registry._versions.items() if k[0] != agent}
    registry._versions[(agent, "2")] = new


def buttons(msg: dict) -> dict[str, dict]:
    return {e["action_id"]: e for b in msg["blocks"] if b["type"] == "actions"
            for e in b["elements"]}


async def test_replan_from_the_cannot_run_card(sqlite_url: str, tmp_path: Path) -> None:
    async with harness(sqlite_url, tmp_path) as h:
        paused = await h.pause_refund()
        [aid] = paused.approval_ids
        await h.card(aid)
        a = await h.approval(aid)
        redeploy_without(parts(h.engine).registry, "demo-refund", "issue_refund")
        resp = await h.slack.click(cards.APPROVE, h.value(a), user_id="U_ALICE",
                                   channel_id=CHANNEL, message_ts=a.message_ts)
        assert resp.status == 200

        async def question():
            found = [x for x in await Rows.of(h.engine).approvals(paused.run_id)
                     if x.kind == "cannot_run" and x.message_ts]
            return found[0] if found else None
        q = await wait_for(question, what="the cannot_run card")
        run = await h.run(paused.run_id)
        assert run.status == "needs_attention"
        assert h.refunds() == []
        card = await h.card(q.id)
        assert set(buttons(card)) == {cards.REPLAN, cards.ABORT}
        assert "no such tool" in json.dumps(card)

        async def approved_card_says_so():
            msg = h.emulator.message(a.channel, a.message_ts)
            return msg if msg and "Not executed" in json.dumps(msg) else None
        await wait_for(approved_card_says_so, what="the approved card to say not executed")

        async def thread_says_so():
            t = await Rows.of(h.engine).thread(paused.run_id)
            if t is None:
                return None
            return any("not executed" in json.dumps(m) for m in h.emulator.thread(t.channel, t.ts))
        await wait_for(thread_says_so, what="the ops thread to say so")

        resp = await h.slack.click(cards.REPLAN, buttons(card)[cards.REPLAN]["value"],
                                   user_id="U_ALICE", channel_id=CHANNEL,
                                   message_ts=q.message_ts)
        assert resp.status == 200

        async def done():
            r = await h.run(paused.run_id)
            return r if r.status == "completed" else None
        run = await wait_for(done, what="the run to re-plan and finish")
        assert "not_executed" in (run.result or "")
        state = await h.engine.state(paused.run_id)
        seen = [m.content for m in state.messages
                if getattr(m, "role", "") == "tool" and m.name == "issue_refund"]
        assert seen and seen[0]["status"] == "not_executed"
        assert "no such tool" in seen[0]["reason"]
        assert h.refunds() == []
