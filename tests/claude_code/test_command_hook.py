"""The real Claude Code CLI gated by ``approvald hook claude-code`` (the command hook,
installed in the project's ``.claude/settings.json``), its model played by the fake
Messages API, its cards decided by signed clicks and modal submissions through the Slack
emulator (issue 45). Claude Code is started with ``--allowedTools Bash,Write,Edit``: its own
permission rules would let every call run, so only the hook stops one, and whether a call
ran is read from the file its command creates."""

from __future__ import annotations

import asyncio
import json

import pytest
from approvald.bot.slack import cards

from tests.claude_code.claude import ClaudeCode
from tests.claude_code.conftest import request_for
from tests.claude_code.fake_anthropic import Turn, say, tool_use
from tests.helpers import Rows
from tests.integration.adapter_helpers import (
    approve_in_slack,
    audit_actions,
    card_of,
    deny_in_slack,
    edit_in_slack,
)
from tests.integration.slack_harness import CHANNEL, OPS, Harness, wait_for

# each test starts Claude Code, and it starts the hook for each of its calls
pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]


def bash(command: str) -> dict[str, str]:
    return {"command": command, "description": "the test's command"}


async def test_approved_in_slack_the_call_runs(claude: ClaudeCode, serve: Harness) -> None:
    marker = claude.marker("approved")
    claude.install()
    claude.fake.script(tool_use("Bash", bash(f"touch {marker}")), say("done"))
    run = asyncio.create_task(claude.run())
    rid = await request_for(serve, str(marker))
    # the call waits for its decision: it has not run
    assert not marker.exists()
    card = json.dumps(await serve.card((await card_of(serve, rid)).id))
    assert f"touch {marker}" in card and str(claude.project) in card
    await approve_in_slack(serve, rid)
    done = (await run).check()
    assert marker.exists()
    assert done.result["result"] == "done"
    [result] = claude.fake.tool_results()
    assert not result.get("is_error"), result
    # what Claude Code ran, reported by its PostToolUse, is the call's execution
    trail = await audit_actions(serve, rid)
    [executed] = [e for e in trail if e["action"] == "executed"]
    assert executed["details"]["args"]["command"] == f"touch {marker}"


async def test_denied_the_reason_reaches_the_model(claude: ClaudeCode, serve: Harness) -> None:
    marker = claude.marker("denied")
    claude.install()
    claude.fake.script(tool_use("Bash", bash(f"touch {marker}")), say("understood"))
    run = asyncio.create_task(claude.run())
    rid = await request_for(serve, str(marker))
    await deny_in_slack(serve, rid, "use the staging database instead")
    (await run).check()
    assert not marker.exists()
    # the next request the model receives carries the denial, with the approver's reason
    [result] = claude.fake.tool_results()
    assert result.get("is_error") is True
    said = claude.fake.tool_result_text()
    assert "use the staging database instead" in said and "U_ALICE" in said


async def test_auto_calls_run_at_once_each_time_they_are_made(
        claude: ClaudeCode, serve: Harness) -> None:
    log = claude.marker("auto.log")
    claude.install()
    same = bash(f"echo auto >> {log}")
    claude.fake.script(tool_use("Bash", same), tool_use("Bash", same), say("done"))
    (await claude.run()).check()
    # the policy trusts it: both calls ran, neither asked anyone
    assert log.read_text().splitlines() == ["auto", "auto"]
    results = claude.fake.tool_results()
    assert len(results) == 2 and not any(r.get("is_error") for r in results), results
    assert not [a for a in await Rows.of(serve.engine).requests()
                if str(log) in json.dumps(a.effective_args())]


async def test_forbidden_calls_are_denied_with_the_operators_reason(
        claude: ClaudeCode) -> None:
    marker = claude.marker("forbidden")
    claude.install()
    claude.fake.script(tool_use("Bash", bash(f"git push origin main || touch {marker}")),
                       say("ok"))
    (await claude.run()).check()
    assert not marker.exists()
    assert "pushes go through CI" in claude.fake.tool_result_text()


async def test_the_wait_runs_out_the_same_call_joins_its_request_and_is_approved(
        claude: ClaudeCode, serve: Harness) -> None:
    marker = claude.marker("joined")
    claude.install(wait=4)
    call = bash(f"touch {marker}")
    # the model makes the call; told it is waiting, makes it again
    claude.fake.script(tool_use("Bash", call), tool_use("Bash", call), say("done"))
    run = asyncio.create_task(claude.run())
    rid = await request_for(serve, str(marker))
    # nobody decides within the hook's wait: the first call is denied, naming the request
    await wait_for(lambda: len(claude.fake.conversation()) >= 2,
                   within=60, what="the first call's result to reach the model")
    first = claude.fake.tool_result_text()
    assert not marker.exists()
    assert "waiting for approval" in first and rid in first and "same call again" in first
    # the model has been told, and makes the call again: its hook joins that request (no
    # second card), and learns its decision when it comes (approved while it waits, or
    # just before it looks: the hook is a process starting now; either way, one request)
    await approve_in_slack(serve, rid)
    (await run).check()
    assert marker.exists()
    assert len([a for a in await Rows.of(serve.engine).requests()
                if str(marker) in json.dumps(a.effective_args())]) == 1


async def test_an_edit_in_the_modal_runs_the_edited_input(
        claude: ClaudeCode, serve: Harness) -> None:
    asked, edited = claude.marker("as-asked"), claude.marker("as-edited")
    claude.install()
    claude.fake.script(tool_use("Bash", bash(f"touch {asked}")), say("done"))
    run = asyncio.create_task(claude.run())
    rid = await request_for(serve, str(asked))
    await edit_in_slack(serve, rid, bash(f"touch {edited}"))
    (await run).check()
    # Claude Code ran what the approver wrote (updatedInput), not what the model asked
    assert edited.exists() and not asked.exists()
    trail = await audit_actions(serve, rid)
    [executed] = [e for e in trail if e["action"] == "executed"]
    assert executed["details"]["args"]["command"] == f"touch {edited}"


async def test_the_requester_may_not_approve_her_own_call(
        claude: ClaudeCode, serve: Harness) -> None:
    marker = claude.marker("self-approved")
    claude.install()  # the calls are Dana's (--requested-by U_DANA), and she is an approver
    claude.fake.script(tool_use("Bash", bash(f"touch {marker}")), say("ok"))
    run = asyncio.create_task(claude.run())
    rid = await request_for(serve, str(marker))
    a = await card_of(serve, rid)
    await serve.slack.click(cards.APPROVE, serve.value(a), user_id="U_DANA",
                            channel_id=CHANNEL, message_ts=a.message_ts)
    said = await wait_for(lambda: serve.emulator.ephemeral(CHANNEL, "U_DANA"),
                          what="Dana's ephemeral reply")
    assert "can't approve" in json.dumps(said)
    assert (await serve.approval(a.id)).status == "pending" and not marker.exists()
    await deny_in_slack(serve, rid, "not without a second pair of eyes")
    (await run).check()
    assert not marker.exists()
    assert "not without a second pair of eyes" in claude.fake.tool_result_text()


# -- what issue 45's second half changed (items 7 to 10) -------------------------------------

async def test_a_denial_after_the_wait_reaches_the_call_made_again(
        claude: ClaudeCode, serve: Harness) -> None:
    marker = claude.marker("denied-late")
    claude.install(wait=3)
    call = bash(f"touch {marker}")
    decided = asyncio.Event()

    async def again(_: object) -> Turn:  # the model retries once the approver has decided
        await decided.wait()
        return tool_use("Bash", call)

    claude.fake.script(tool_use("Bash", call), again, say("understood"))
    run = asyncio.create_task(claude.run())
    rid = await request_for(serve, str(marker))
    await wait_for(lambda: len(claude.fake.conversation()) >= 2,
                   within=60, what="the first call's result to reach the model")
    assert "waiting for approval" in claude.fake.tool_result_text()
    await deny_in_slack(serve, rid, "we freeze deploys this week")
    decided.set()
    (await run).check()
    assert not marker.exists()
    # the call made again hears the denial and its reason, and nobody is asked again
    assert "we freeze deploys this week" in claude.fake.tool_result_text()
    assert len([a for a in await Rows.of(serve.engine).requests()
                if str(marker) in json.dumps(a.effective_args())]) == 1


async def post_everything(h: Harness) -> None:
    """What serve's loops would post by now, posted (the module's serve runs them on
    demand): until a round of the outbox and of the run threads posts nothing (run threads
    are paced per channel, so one round may leave some for the next)."""
    assert h.service.slack is not None
    quiet = 0
    while quiet < 3:
        posts = await h.service.drain.drain_once() + await h.service.slack.threads.sync_once()
        quiet = quiet + 1 if not posts else 0
        await asyncio.sleep(0.05)  # past the pacing (the harness's 0.02 s per channel)


async def test_auto_calls_post_nothing_in_the_approvals_channel(
        claude: ClaudeCode, serve: Harness) -> None:
    log = claude.marker("quiet.log")
    claude.install()
    claude.fake.script(tool_use("Bash", bash(f"echo auto >> {log}")), say("done"))
    session = (await claude.run()).check().result["session_id"]
    assert log.read_text() == "auto\n"
    await post_everything(serve)
    said = [m for channel in (CHANNEL, OPS) for m in serve.emulator.messages(channel)
            if session in json.dumps(m)]
    assert said == []


async def test_what_claude_and_the_approver_are_told_is_true(
        claude: ClaudeCode, serve: Harness) -> None:
    marker = claude.marker("told")
    claude.install(wait=4)
    claude.fake.script(tool_use("Bash", bash(f"touch {marker}")), say("ok"))
    run = asyncio.create_task(claude.run())
    rid = await request_for(serve, str(marker))
    card = json.dumps(await serve.card((await card_of(serve, rid)).id))
    (await run).check()
    said = claude.fake.tool_result_text()
    assert not marker.exists() and "waiting for approval" in said
    await deny_in_slack(serve, rid, "(the test is over)")
    # the card is in Slack: the hook says so, and names no HTTP API to decide in
    assert "Slack is not configured" not in said and "HTTP API" not in said, said
    # the card says who asked, through what: Claude Code, not the HTTP API
    assert "Claude Code" in card and "HTTP API" not in card, card
