"""``approvald hook claude-code`` (bot.claude_code): Claude Code's PreToolUse and
PostToolUse events, gated under the operator's policy for ``hook:claude-code/<tool>``.

In this process (the decisions made through the engine, as a Slack click's handler makes
them); the command itself, fed the event on stdin, in tests/acceptance/test_cli_hook.py."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from typing import Any

import pytest
from approvald.bot.claude_code import ClaudeCodeHook, HookEvent, HookEventError
from approvald.bot.slack import cards, messages
from approvald.runtime.approvals.decide import Actor
from approvald.runtime.engine import Engine
from approvald.runtime.kernel import binding
from approvald.runtime.kernel.canonical import call_digest
from approvald.runtime.kernel.errors import ApprovaldError
from approvald.runtime.policies.policy import PolicyFile
from approvald.runtime.record import switches

from tests.helpers import Rows, revoke_token
from tests.integration.slack_harness import wait_for
from tests.unit.test_cards import check_blocks

ALICE = Actor("U_ALICE", "slack")
POLICY = PolicyFile.model_validate({"tools": {
    "hook:claude-code/Read": {"policy": "auto"},
    "hook:claude-code/Bash": {"approvers": ["U_ALICE"], "ttl": "30m", "rules": [
        {"when": 'args.command.startsWith("git push")', "policy": "forbidden",
         "reason": "pushes go through CI"}]},
    "hook:claude-code/mcp__*": {"approvers": ["U_ALICE"], "ttl": "30m"},
}})
SESSION = "0b6c9a52-5c1e-4d3b-9d69-6f0c1f6a1e10"


def event(tool: str, tool_input: dict[str, Any], *, name: str = "PreToolUse",
          session: str = SESSION, use: str = "toolu_01", **extra: Any) -> HookEvent:
    return HookEvent.parse(json.dumps({
        "hook_event_name": name, "session_id": session, "cwd": "/home/dana/shop",
        "tool_name": tool, "tool_input": tool_input, "tool_use_id": use,
        "transcript_path": "/tmp/t.jsonl", **extra}))


def hook(engine: Engine, ev: HookEvent) -> ClaudeCodeHook:
    return ClaudeCodeHook(engine, ev, requested_by="U_DANA")


def answer(out: dict[str, Any]) -> tuple[str, str, dict[str, Any] | None]:
    h = out["hookSpecificOutput"]
    assert h["hookEventName"] == "PreToolUse"
    return h["permissionDecision"], h["permissionDecisionReason"], h.get("updatedInput")


async def pending(engine: Engine, n: int = 1) -> Any:
    async def found() -> Any:
        rows = await Rows.of(engine).requests(status="pending")
        return rows[0] if len(rows) >= n else None

    return await wait_for(found, what="a pending request")


async def actions(engine: Engine) -> list[tuple[str, dict[str, Any]]]:
    return [(e.action, json.loads(e.details) if isinstance(e.details, str) else e.details)
            for e in await Rows.of(engine).audit()]


@pytest.fixture
def engine(make_engine: Callable[..., Engine]) -> Engine:
    return make_engine(policy=POLICY)


async def test_auto_allows_at_once_and_the_result_is_the_calls_execution(
        engine: Engine) -> None:
    read = {"file_path": "/home/dana/shop/README.md"}
    verdict, why, updated = answer(await hook(engine, event("Read", read)).pre_tool_use(wait=5))
    assert (verdict, updated) == ("allow", None)
    assert "allowed by the operator's policy for hook:claude-code/Read" in why
    after = event("Read", read, name="PostToolUse", tool_response={"content": "# shop"})
    rid = await hook(engine, after).post_tool_use()
    assert rid is not None
    done = [d for a, d in await actions(engine) if a == "executed"]
    assert done == [done[0]] and done[0]["args"] == read and done[0]["status"] == "succeeded"
    assert done[0]["result"] == {"content": "# shop"}


async def test_an_allowed_call_binds_its_arguments_and_records_its_task(
        engine: Engine) -> None:
    """The digest the hook's join key is made of is the one its request binds (computed
    once), and a request the policy answers at once records the task a card would show."""
    read = {"file_path": "/home/dana/shop/README.md", "limit": 20}
    verdict, why, _ = answer(await hook(engine, event("Read", read)).pre_tool_use(wait=5))
    assert verdict == "allow"
    rid = re.search(r"request (x[0-9a-z]+)", why)
    assert rid is not None
    rows = Rows.of(engine)
    rec, run = await rows.external(rid[1]), await rows.run(rid[1])
    assert rec.digest == call_digest("Read", read)
    assert (await rows.execution(rid[1], "call")).args_digest == rec.digest
    assert {e.digest for e in await rows.audit() if e.run_id == rid[1]} == {rec.digest}
    assert run.task == f"working in `/home/dana/shop` (session `{SESSION}`)"
    assert run.agent == "external:hook.claude-code"


async def test_a_forbidden_rule_denies_at_once_with_its_reason(engine: Engine) -> None:
    push = {"command": "git push origin main"}
    verdict, why, _ = answer(await hook(engine, event("Bash", push)).pre_tool_use(wait=5))
    assert verdict == "deny" and "pushes go through CI" in why
    assert await Rows.of(engine).requests(status="pending") == []


async def test_an_approval_allows_the_call_once(engine: Engine) -> None:
    ls = {"command": "rm -rf build/"}
    asking = asyncio.ensure_future(hook(engine, event("Bash", ls)).pre_tool_use(wait=30))
    a = await pending(engine)
    await engine.decide(a.id, actor=ALICE, verdict="approve")
    verdict, why, updated = answer(await asking)
    assert (verdict, updated) == ("allow", None) and "approved by U_ALICE" in why
    # the same call later (another tool use) asks again: a new request, a new card
    again = asyncio.ensure_future(hook(engine, event("Bash", ls, use="toolu_02"))
                                  .pre_tool_use(wait=30))
    b = await pending(engine)
    assert b.id != a.id
    await engine.decide(b.id, actor=ALICE, verdict="deny", reason="once was enough")
    verdict, why, _ = answer(await again)
    assert verdict == "deny" and "once was enough" in why and "U_ALICE" in why


async def test_an_edit_allows_the_edited_input(engine: Engine) -> None:
    cmd = {"command": "rm -rf /", "description": "clean up"}
    asking = asyncio.ensure_future(hook(engine, event("Bash", cmd)).pre_tool_use(wait=30))
    a = await pending(engine)
    edited = {"command": "rm -rf ./build", "description": "clean up"}
    await engine.decide(a.id, actor=ALICE, verdict="edit", args=edited)
    verdict, why, updated = answer(await asking)
    assert verdict == "allow" and updated == edited and "with edits by U_ALICE" in why
    # PostToolUse carries the input that ran: recorded against the approved request
    ran = event("Bash", edited, name="PostToolUse", tool_response={"stdout": ""})
    assert await hook(engine, ran).post_tool_use() is not None
    [done] = [d for a, d in await actions(engine) if a == "executed"]
    assert done["args"] == edited


async def test_still_pending_at_the_budget_denies_and_the_retry_joins_the_request(
        engine: Engine) -> None:
    cmd = {"command": "npm publish"}
    verdict, why, _ = answer(await hook(engine, event("Bash", cmd)).pre_tool_use(wait=0))
    a = await pending(engine)
    assert verdict == "deny" and f"request {a.run_id}" in why
    assert f"`approvald approvals approve {a.id} --as U…`" in why
    assert "Make the same call again to join that request" in why
    # Claude retries the same call: the same request, one card
    verdict, _, _ = answer(await hook(engine, event("Bash", cmd, use="toolu_09"))
                           .pre_tool_use(wait=0))
    assert [p.id for p in await Rows.of(engine).requests(status="pending")] == [a.id]
    # another session's same call is its own request
    await hook(engine, event("Bash", cmd, session="another-session")).pre_tool_use(wait=0)
    assert len(await Rows.of(engine).requests(status="pending")) == 2
    # approved meanwhile: the next retry is allowed
    await engine.decide(a.id, actor=ALICE, verdict="approve")
    verdict, _, _ = answer(await hook(engine, event("Bash", cmd, use="toolu_10"))
                           .pre_tool_use(wait=0))
    assert verdict == "allow"


async def test_an_mcp_tool_and_a_failure_after_the_call(engine: Engine) -> None:
    tool, args = "mcp__github__create_issue", {"repo": "shop", "title": "flaky test"}
    asking = asyncio.ensure_future(hook(engine, event(tool, args)).pre_tool_use(wait=30))
    a = await pending(engine)
    assert a.tool == tool
    await engine.decide(a.id, actor=ALICE, verdict="approve")
    assert answer(await asking)[0] == "allow"
    failed = event(tool, args, name="PostToolUseFailure", error="rate limited")
    assert await hook(engine, failed).post_tool_use() is not None
    [done] = [d for a, d in await actions(engine) if a == "executed"]
    assert done["status"] == "failed" and done["error"] == "rate limited"


async def test_a_post_event_for_a_call_the_hook_never_allowed_records_nothing(
        engine: Engine) -> None:
    stray = event("Bash", {"command": "ls"}, name="PostToolUse", use="toolu_77")
    assert await hook(engine, stray).post_tool_use() is None
    assert [a for a, _ in await actions(engine) if a == "executed"] == []


@pytest.mark.parametrize("text,message", [
    ("not json", "not JSON"),
    ("[]", "not a JSON object"),
    ('{"hook_event_name": "Stop"}', "hook_event_name 'Stop' is not one of"),
    ('{"hook_event_name": "PreToolUse", "session_id": "s", "tool_name": "Bash", '
     '"tool_use_id": "t", "tool_input": "ls"}', "tool_input: expected a JSON object"),
    ('{"hook_event_name": "PreToolUse", "session_id": "", "tool_name": "Bash", '
     '"tool_use_id": "t", "tool_input": {}}', "session_id: expected a string"),
])
def test_an_event_the_hook_cannot_read_is_refused_saying_why(text: str, message: str) -> None:
    with pytest.raises(HookEventError, match=message):
        HookEvent.parse(text)


def request_of(why: str) -> str:
    """The request id an answer names."""
    found = re.search(r"request (x[0-9a-f]+)", why)
    assert found is not None, why
    return found[1]


async def test_an_auto_call_is_allowed_each_time_and_recorded_once_each(engine: Engine) -> None:
    """Issue 45 item 6: the same trusted call made again in the session was denied as
    "already started" until the first call's PostToolUse came (never, with only PreToolUse
    installed), and that denial was not in the audit log."""
    read = {"file_path": "/home/dana/shop/README.md"}
    said = [answer(await hook(engine, event("Read", read, use=f"toolu_{n}")).pre_tool_use(wait=5))
            for n in range(3)]
    assert [verdict for verdict, _, _ in said] == ["allow"] * 3, said
    ids = [request_of(why) for _, why, _ in said]
    assert len(set(ids)) == 3  # a request, and so an execution, for each call
    # two at once (Claude Code runs a message's tool calls in parallel): both allowed
    both = await asyncio.gather(*(hook(engine, event("Read", read, use=f"toolu_p{n}"))
                                  .pre_tool_use(wait=5) for n in range(2)))
    assert [answer(out)[0] for out in both] == ["allow", "allow"], both
    started = [await Rows.of(engine).execution(rid, "call") for rid in ids]
    assert all(e is not None for e in started)
    trail = await actions(engine)
    assert [a for a, _ in trail].count("requested") == 5
    assert [a for a, _ in trail].count("approved") == 5
    assert "refused" not in [a for a, _ in trail]
    # each PostToolUse reports its own call
    after = event("Read", read, name="PostToolUse", use="toolu_1", tool_response="# shop")
    assert await hook(engine, after).post_tool_use() == ids[1]


async def test_every_refusal_of_the_hook_is_audited(engine: Engine) -> None:
    """Invariant 24: a call the hook denies without a decision behind it (still waiting at
    the budget) has its audit entry, naming the session and the tool use."""
    cmd = {"command": "npm publish"}
    verdict, _why, _ = answer(await hook(engine, event("Bash", cmd, use="toolu_7"))
                             .pre_tool_use(wait=0))
    assert verdict == "deny"
    [refused] = [d for a, d in await actions(engine) if a == "refused"]
    assert refused["reason"] == "pending" and refused["tool"] == "Bash"
    assert refused["tool_use_id"] == "toolu_7" and refused["session"] == SESSION


async def test_a_decision_answers_the_call_that_waited_for_it_once(engine: Engine) -> None:
    """Issue 45 item 7: after an approver denied a waiting call, the same call made again
    opened a new request instead of telling Claude the denial and its reason."""
    cmd = {"command": "npm publish"}
    verdict, why, _ = answer(await hook(engine, event("Bash", cmd, use="toolu_1"))
                             .pre_tool_use(wait=0))
    a = await pending(engine)
    assert verdict == "deny" and "waiting for approval" in why
    await engine.decide(a.id, actor=ALICE, verdict="deny", reason="not from a laptop")
    # the same call again: the answer to the call that waited, with the approver's reason
    verdict, why, _ = answer(await hook(engine, event("Bash", cmd, use="toolu_2"))
                             .pre_tool_use(wait=0))
    assert verdict == "deny" and "denied by U_ALICE: not from a laptop" in why, why
    assert request_of(why) == a.run_id
    assert await Rows.of(engine).requests(status="pending") == []
    # told once: a later call asks again
    verdict, why, _ = answer(await hook(engine, event("Bash", cmd, use="toolu_3"))
                             .pre_tool_use(wait=0))
    b = await pending(engine)
    assert verdict == "deny" and "waiting for approval" in why and b.id != a.id
    # an approval too: it allows the call made next, once
    await engine.decide(b.id, actor=ALICE, verdict="approve")
    verdict, why, _ = answer(await hook(engine, event("Bash", cmd, use="toolu_4"))
                             .pre_tool_use(wait=0))
    assert verdict == "allow" and request_of(why) == b.run_id
    verdict, why, _ = answer(await hook(engine, event("Bash", cmd, use="toolu_5"))
                             .pre_tool_use(wait=0))
    assert verdict == "deny" and request_of(why) not in (a.run_id, b.run_id)


async def test_a_call_denied_while_it_waited_is_told_once(engine: Engine) -> None:
    """The call waiting when the denial came is the one it answers: the next asks again."""
    cmd = {"command": "npm publish"}
    asking = asyncio.ensure_future(hook(engine, event("Bash", cmd, use="toolu_1"))
                                   .pre_tool_use(wait=30))
    a = await pending(engine)
    await engine.decide(a.id, actor=ALICE, verdict="deny", reason="no")
    assert answer(await asking)[0] == "deny"
    _verdict, why, _ = answer(await hook(engine, event("Bash", cmd, use="toolu_2"))
                             .pre_tool_use(wait=0))
    assert "waiting for approval" in why and request_of(why) != a.run_id


async def test_what_ran_is_what_claude_code_reports_and_a_mismatch_is_flagged(
        engine: Engine) -> None:
    """Issue 45 item 11: after an edit, a PostToolUse saying the original input ran was
    recorded as the edited input having run."""
    cmd = {"command": "rm -rf /", "description": "clean up"}
    asking = asyncio.ensure_future(hook(engine, event("Bash", cmd)).pre_tool_use(wait=30))
    a = await pending(engine)
    edited = {"command": "rm -rf ./build", "description": "clean up"}
    await engine.decide(a.id, actor=ALICE, verdict="edit", args=edited)
    assert answer(await asking)[2] == edited
    ran = event("Bash", cmd, name="PostToolUse", tool_response={"stdout": ""})
    assert await hook(engine, ran).post_tool_use() == a.run_id
    [done] = [d for act, d in await actions(engine) if act == "executed"]
    assert done["args"] == cmd and done["effective_args"] == edited, done
    assert done["args_mismatch"] is True
    doc = await engine.request_document(await hook(engine, ran).token(), a.run_id)
    assert doc["result"]["args_digest"] == binding.shown(call_digest("Bash", cmd))
    assert doc["result"]["args_digest"] != doc["effective_digest"]


async def test_the_hook_says_where_the_request_can_be_decided_from_what_the_database_knows(
        engine: Engine) -> None:
    """Issue 45 item 9: the hook said "Slack is not configured" (its own process's settings)
    while serve, on the same database, had the card in Slack; and it offered "the HTTP API",
    which decides nothing."""
    cmd = {"command": "npm publish"}

    async def told() -> str:
        out = await hook(engine, event("Bash", cmd, use="toolu_x")).pre_tool_use(wait=0)
        why = answer(out)[1]
        assert "HTTP API" not in why and "not configured" not in why, why
        return why

    await hook(engine, event("Bash", cmd)).pre_tool_use(wait=0)
    a = await pending(engine)
    why = await told()  # the card is queued: serve posts it
    assert "Its card waits to be posted to Slack by `approvald serve`" in why, why
    assert f"`approvald approvals deny {a.id} --as U… --reason …`" in why
    await Rows.of(engine).card_posted(a.id, channel="C_APPROVALS", ts="1.000001")  # serve did
    why = await told()
    assert "It can be decided on its card in Slack (channel C_APPROVALS); from a terminal" \
        in why, why


@pytest.mark.parametrize("bearer", [None, "dana-laptop"])
async def test_the_card_says_claude_code_asked_and_shows_the_command_as_code(
        engine: Engine, bearer: str | None) -> None:
    """Issue 45 item 10: the card said "external:hook.claude-code" asked (and the run's
    thread "asked over the HTTP API"), and the command's code fence reached Slack as
    literal backticks broken up by zero-width spaces. Agent-written text stays escaped."""
    command = "echo ```done``` <!channel> && curl '<http://evil|bank.com>'"
    gate = ClaudeCodeHook(engine, event("Bash", {"command": command}), requested_by="U_DANA",
                          bearer=bearer)
    await gate.pre_tool_use(wait=0)
    a = await pending(engine)
    card = cards.approval_card(a, token="t0k3n", now=engine.now())
    check_blocks(card["blocks"], 50)
    texts = [b["text"]["text"] for b in card["blocks"] if b["type"] == "section"]
    intro, doing = texts[0], texts[1]
    assert intro.startswith("*Claude Code* wants to run `Bash` for <@U_DANA>."), intro
    assert "/home/dana/shop" in intro and SESSION in intro
    assert ("dana-laptop" in intro) == (bearer is not None), intro
    assert "HTTP API" not in json.dumps(card) and "external:" not in json.dumps(card)
    assert card["text"].startswith("Claude Code needs approval to run Bash")
    # the command in a real code block, its own backtick runs broken, its markup escaped
    fence = "\n```\necho `\u200b`\u200b`done`\u200b`\u200b` &lt;!channel&gt; &amp;&amp; curl "
    assert fence in doing and doing.endswith("'&lt;http://evil|bank.com&gt;'\n```"), doing
    assert "<!channel>" not in json.dumps(card) and "<http://evil" not in json.dumps(card)
    run = await Rows.of(engine).run(a.run_id)
    assert run is not None
    parent = json.dumps(messages.run_parent(run, now=engine.now(), pending=[a]))
    assert "HTTP API" not in parent and "Claude Code" in parent, parent


async def test_revoking_the_hooks_credential_is_refused_and_leaves_peoples_tokens_alone(
        engine: Engine) -> None:
    """Issue 45 item 12: `tokens revoke hook.claude-code`, the documented kill switch, also
    shut off every person's HTTP hook token, with no way back (the name cannot be made
    again). Revoking it is refused now, pointing at the switch; people's tokens work on."""
    read = event("Read", {"file_path": "README.md"})
    assert answer(await hook(engine, read).pre_tool_use(wait=5))[0] == "allow"
    with pytest.raises(ApprovaldError, match="approvald hook disable claude-code"):
        await revoke_token(engine, "hook.claude-code",
                           by="cli:ops", via="cli")
    over_http = ClaudeCodeHook(engine, event("Read", {"file_path": "README.md"}, use="t2"),
                               requested_by="U_DANA", bearer="dana-laptop")
    assert answer(await over_http.pre_tool_use(wait=5))[0] == "allow"
    assert answer(await hook(engine, event("Read", {"file_path": "x"}, use="t3"))
                  .pre_tool_use(wait=5))[0] == "allow"


@pytest.mark.parametrize("form", ["command", "http"])
async def test_the_kill_switch_turns_one_form_off_and_on_again(engine: Engine,
                                                               form: str) -> None:
    """A kill switch that can be turned off again and says what it covers: each form of
    the hook (the command, every person's HTTP hook) switched off and on, audited."""
    def gate(use: str, bearer: str | None) -> ClaudeCodeHook:
        return ClaudeCodeHook(engine, event("Read", {"file_path": "README.md"}, use=use),
                              requested_by="U_DANA", bearer=bearer)

    other = "dana-laptop" if form == "command" else None
    this = None if form == "command" else "dana-laptop"
    assert answer(await gate("t0", this).pre_tool_use(wait=5))[0] == "allow"
    off = await engine.switch_off("hook:claude-code", [form], by="cli:ops", via="cli",
                                  reason="incident 42")
    assert [s.form for s in off] == [form]
    # a call allowed before it was switched off ran all the same: what came of it counts
    after = ClaudeCodeHook(engine, event("Read", {"file_path": "README.md"}, use="t0",
                                         name="PostToolUse", tool_response="# shop"),
                           requested_by="U_DANA", bearer=this)
    assert await after.post_tool_use() is not None
    verdict, why, _ = answer(await gate("t1", this).pre_tool_use(wait=5))
    assert verdict == "deny" and "switched off by cli:ops" in why and "incident 42" in why
    assert "approvald hook enable claude-code" in why, why
    assert answer(await gate("t2", other).pre_tool_use(wait=5))[0] == "allow"
    on = await engine.switch_on("hook:claude-code", [form], by="cli:ops", via="cli")
    assert [s.form for s in on] == [form]
    assert answer(await gate("t3", this).pre_tool_use(wait=5))[0] == "allow"
    trail = await actions(engine)
    [disabled] = [d for a, d in trail if a == "face_disabled"]
    assert disabled == {"face": "hook:claude-code", "form": form, "reason": "incident 42",
                        "covers": switches.COVERS[form]}
    assert [d["form"] for a, d in trail if a == "face_enabled"] == [form]
    [refused] = [d for a, d in trail if a == "refused"]
    assert refused["reason"] == "off"


async def test_a_credential_revoked_before_the_switch_existed_is_switched_on_again(
        engine: Engine) -> None:
    read = event("Read", {"file_path": "README.md"})
    await hook(engine, read).pre_tool_use(wait=5)
    # as `tokens revoke hook.claude-code` left it
    await Rows.of(engine).revoke_token("hook.claude-code", by="cli:ops", now=engine.now())
    verdict, why, _ = answer(await hook(engine, event("Read", {}, use="t2"))
                             .pre_tool_use(wait=5))
    assert verdict == "deny" and "approvald hook enable claude-code" in why, why
    await engine.switch_on("hook:claude-code", list(switches.FORMS), by="cli:ops", via="cli")
    assert answer(await hook(engine, event("Read", {}, use="t3"))
                  .pre_tool_use(wait=5))[0] == "allow"
