"""One way in (issue 36): the operator's policy decides every request, whichever face it
comes through. Each test is an attack through the face where it was found: real HTTP to a
real serve, the adapters' gate in-process, a tampered database row."""

from __future__ import annotations

import json
import secrets
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from approvald.runtime.adapters.gate import Call
from approvald.runtime.approvals.decide import Actor
from approvald.runtime.kernel.errors import ApprovaldError, DecisionRefused
from approvald.runtime.kernel.ids import new_id
from approvald.runtime.policies.scope import Scope
from approvald.runtime.requests import api_tokens

from tests.helpers import Rows, create_token, parts, revoke_token
from tests.integration.slack_harness import Harness, harness
from tests.integration.test_http_api import api, approval_of, base

ARGS = {"order_id": "A-1001", "amount_cents": 4200, "reason": "duplicate charge"}
ALICE = Actor("U_ALICE", "slack")
DANA = Actor("U_DANA", "slack")


class Token:
    def __init__(self, name: str, token: str) -> None:
        self.name, self.token = name, token


async def bearer(h: Harness, name: str) -> Token:
    """A token as an operator made it before token scopes (any tool): its row, by hand."""
    token = api_tokens.TOKEN_PREFIX + secrets.token_urlsafe(32)
    assert await Rows.of(h.engine).add_token(
        id=new_id(), name=name, token_hash=api_tokens.token_hash(token), webhook_url=None,
        created_at=h.engine.now(), created_by="cli:ops")
    return Token(name, token)


async def requests_made(h: Harness) -> int:
    return len([r for r in await Rows.of(h.engine).runs() if r.agent.startswith("external:")])


async def actions(h: Harness, run_id: str | None = None) -> list[str]:
    return [e.action for e in await Rows.of(h.engine).audit(run_id=run_id)]


async def test_a_caller_never_sets_policy_and_a_standing_approval_stays_with_its_source(
        db_url: str, tmp_path: Path) -> None:
    async with harness(db_url, tmp_path, background=False) as h, \
            aiohttp.ClientSession() as http:
        t = await bearer(h, "dana-bot")
        url = f"{base(h)}/v1/requests"
        # the request brings its own approval fields: refused, nothing is made
        status, doc = await api(http, "POST", url, t.token, {
            "tool": "issue_refund", "args": ARGS, "requested_by": "U_DANA",
            "approval": {"allow_self_approval": True}})
        assert status == 422, doc
        assert await requests_made(h) == 0
        # the operator's policy for api:dana-bot/issue_refund: the default, which asks
        status, doc = await api(http, "POST", url, t.token, {
            "tool": "issue_refund", "args": ARGS, "requested_by": "U_DANA"})
        assert status == 201 and doc["status"] == "pending", doc
        assert doc["policy"] == "api:dana-bot/issue_refund"
        a = await approval_of(h, doc["id"])
        # the requester may not grant herself a standing approval on it
        with pytest.raises(DecisionRefused):
            await h.engine.grant_standing(a.id, actor=DANA, window=timedelta(hours=1),
                                          scope=Scope(kind="condition", when="true"),
                                          token=h.token(a))
        # an approver's standing approval on the API request covers the API's calls only:
        # Dana's own agent's issue_refund still asks
        await h.engine.grant_standing(a.id, actor=ALICE, window=timedelta(hours=1),
                                      scope=Scope(kind="condition", when="true"),
                                      token=h.token(a))
        await h.pause_refund(requested_by="U_DANA")
        assert h.refunds() == []


async def test_requested_by_is_one_user_however_it_is_written(db_url: str,
                                                              tmp_path: Path) -> None:
    async with harness(db_url, tmp_path, background=False) as h, \
            aiohttp.ClientSession() as http:
        t = await bearer(h, "dana-bot")
        url = f"{base(h)}/v1/requests"
        for written in ("u_dana", "<@U_DANA>", " U_DANA ", "<@u_dana|dana>"):
            status, doc = await api(http, "POST", url, t.token, {
                "tool": "issue_refund", "args": ARGS, "requested_by": written})
            assert status == 201 and doc["requested_by"] == "U_DANA", (written, doc)
            a = await approval_of(h, doc["id"])
            with pytest.raises(DecisionRefused) as refused:
                await h.engine.decide(a.id, actor=DANA, verdict="approve", token=h.token(a))
            assert refused.value.reason == "self_approval", written
        made = await requests_made(h)
        # a claim that is not a Slack user could never be compared with who approves
        status, doc = await api(http, "POST", url, t.token, {
            "tool": "issue_refund", "args": ARGS, "requested_by": "dana"})
        assert status == 422, doc
        assert await requests_made(h) == made


@pytest.mark.parametrize("body", [
    '{"tool": "issue_refund", "args": {"amount_cents": NaN}}',
    '{"tool": "issue_refund", "args": {"amount_cents": Infinity}}',
    '{"tool": "issue_refund", "args": {"amount_cents": -Infinity}}',
    '{"tool": "issue_refund", "args": {"amount_cents": 1e400}}',
    '{"tool": "issue_refund", "args": {}, "packet": {"evidence": [{"detail": 1e400}]}}',
    '{"tool": "issue_refund", "args": {}, "approval": {"ttl": "9999999d"}}',
    '{"tool": "issue_refund", "args": {}, "approval": {"ttl": 1000000000000}}',
    '{"tool": "issue_refund", "args": {}, "approval": {"on_expire": "escalate", "escalate": '
    '[{"approvers": ["U_CFO"], "ttl": "99999999d"}]}}',
    '{"tool": "issue_refund", "args": {}, "tighten": {"ttl": "9999999d"}}',
    '{"tool": "issue_refund", "args": {}, "tighten": {"ttl": 1000000000000}}',
    '{"tool": "issue_refund", "args": {}, "tighten": {"quorum": 291076139102531648}}',
])
async def test_numbers_and_durations_json_cannot_hold_are_refused_and_change_nothing(
        sqlite_url: str, tmp_path: Path, body: str) -> None:
    async with harness(sqlite_url, tmp_path, background=False) as h, \
            aiohttp.ClientSession() as http:
        t = await bearer(h, "bot")
        async with http.post(f"{base(h)}/v1/requests", data=body, headers={
                "Authorization": f"Bearer {t.token}",
                "Content-Type": "application/json"}) as resp:
            status, doc = resp.status, await resp.json()
        assert status in (400, 422), (status, doc)
        assert doc["error"]["code"] in ("malformed_json", "invalid_request"), doc
        assert await requests_made(h) == 0


async def test_a_report_on_an_approved_then_cancelled_request_is_refused(
        db_url: str, tmp_path: Path) -> None:
    async with harness(db_url, tmp_path, background=False) as h, \
            aiohttp.ClientSession() as http:
        t = await bearer(h, "ops-bot")
        url = f"{base(h)}/v1/requests"
        status, doc = await api(http, "POST", url, t.token, {"tool": "issue_refund",
                                                             "args": ARGS})
        assert status == 201
        a = await approval_of(h, doc["id"])
        await h.engine.decide(a.id, actor=ALICE, verdict="approve", token=h.token(a))
        await h.engine.cancel(doc["id"], actor=Actor("U_OPS", "cli:ops"), reason="wrong order")
        status, now = await api(http, "GET", f"{url}/{doc['id']}", t.token)
        assert status == 200 and now["status"] == "cancelled", now
        assert now["decision"]["reason"] == "wrong order"
        status, refused = await api(http, "POST", f"{url}/{doc['id']}/result", t.token,
                                    {"status": "succeeded",
                                     "args_digest": now["effective_digest"]})
        assert status == 409 and refused["error"]["code"] == "cancelled", refused
        assert "executed" not in await actions(h, doc["id"])


async def test_a_call_started_before_a_cancel_is_still_reported(db_url: str,
                                                                tmp_path: Path) -> None:
    async with harness(db_url, tmp_path, background=False) as h:
        gate = h.engine.approval_gate(name="worker")
        call = Call("c1", "issue_refund", ARGS)
        doc = await gate.ask(call, key="k1", requested_by="U_DANA", framework="test")
        a = await approval_of(h, doc["id"])
        await h.engine.decide(a.id, actor=ALICE, verdict="approve", token=h.token(a))

        async def refund(args: dict[str, Any]) -> str:
            # the operator cancels while the call runs: it ran, and the record says so
            await h.engine.cancel(doc["id"], actor=Actor("U_OPS", "cli:ops"))
            return "refunded"

        ran = await gate.execute(call, doc["id"], refund)
        assert ran.result == "refunded" and not ran.reused
        assert (await actions(h, doc["id"]))[-1] == "executed"
        assert (await gate.document(doc["id"]))["status"] == "cancelled"


async def test_an_adapter_or_gateway_never_shares_an_operators_token(
        db_url: str, tmp_path: Path) -> None:
    async with harness(db_url, tmp_path, background=False) as h, \
            aiohttp.ClientSession() as http:
        held = await bearer(h, "support-agent")  # an operator's token, its bearer in hand
        gate = h.engine.approval_gate(name="support-agent")
        call = Call("c1", "issue_refund", ARGS)
        doc = await gate.ask(call, key="k1", requested_by="U_DANA", framework="test")
        a = await approval_of(h, doc["id"])
        await h.engine.decide(a.id, actor=ALICE, verdict="approve", token=h.token(a))
        # the bearer cannot see the adapter's request, nor post a result it never had
        url = f"{base(h)}/v1/requests/{doc['id']}"
        assert (await api(http, "GET", url, held.token))[0] == 404
        forged = await api(http, "POST", f"{url}/result", held.token, {
            "status": "succeeded", "args_digest": doc["effective_digest"],
            "result": "forged: nothing was refunded"})
        assert forged[0] == 404, forged
        ran: list[dict[str, Any]] = []

        async def refund(args: dict[str, Any]) -> str:
            ran.append(args)
            return "refunded"

        done = await gate.execute(call, doc["id"], refund)
        assert done.result == "refunded" and ran == [ARGS]

        # no operator token takes a name of approvald's own credentials...
        from approvald.bot.api.service import webhook_keys
        from approvald.runtime.record.audit import AuditTrail

        keys = webhook_keys(h.service.settings)
        assert keys is not None
        for name in ("mcp.files", "adapter.support-agent"):
            with pytest.raises(ApprovaldError):
                await api_tokens.create(parts(h.engine).db, parts(h.engine).clock, keys,
                                        AuditTrail(), name, created_by="cli:ops", via="cli",
                                        tools="*")
        # ...and a gateway never adopts one made before that rule
        legacy = await bearer(h, "mcp.files")
        from approvald.bot.mcp.gateway import Gateway

        gw = Gateway(h.engine, name="files", requested_by="U_DANA", server="files-server")
        with pytest.raises(ApprovaldError, match="never shares"):
            await gw.token()
        assert await Rows.of(h.engine).token(legacy.token) is None


async def test_an_unknown_tools_token_scope_is_a_403(db_url: str, tmp_path: Path) -> None:
    async with harness(db_url, tmp_path, background=False) as h, \
            aiohttp.ClientSession() as http:
        from approvald.bot.api.service import webhook_keys

        keys = webhook_keys(h.service.settings)
        assert keys is not None
        made = await create_token(h.engine, keys, "deploy-bot", created_by="cli:ops", via="cli",
                                  tools="deploy, db_*")
        url = f"{base(h)}/v1/requests"
        for tool, want in (("deploy", 201), ("db_migrate", 201), ("issue_refund", 403)):
            status, doc = await api(http, "POST", url, made.token, {"tool": tool, "args": {}})
            assert status == want, (tool, doc)
        assert doc["error"]["code"] == "tool_not_allowed"


async def test_tokens_made_and_revoked_and_the_policy_loaded_are_audited(
        db_url: str, tmp_path: Path) -> None:
    async with harness(db_url, tmp_path, background=False) as h:
        from approvald.bot.api.service import webhook_keys

        keys = webhook_keys(h.service.settings)
        assert keys is not None
        await create_token(h.engine, keys, "ci",
                           created_by="cli:ops", via="cli", tools="deploy")
        await revoke_token(h.engine, "ci",
                           by="cli:ops", via="cli")
        entries = await Rows.of(h.engine).audit()
        made = [json.loads(e.details) for e in entries if e.action == "token_created"]
        gone = [json.loads(e.details) for e in entries if e.action == "token_revoked"]
        assert [(d["token"], d["tools"]) for d in made] == [("ci", ["deploy"])]
        assert [d["token"] for d in gone] == ["ci"]
        assert all("hash" not in json.dumps(d) for d in made + gone)
        # serve recorded the policy in force when it started, once
        loaded = [json.loads(e.details) for e in entries if e.action == "policy_loaded"]
        assert [d["digest"] for d in loaded] == [h.engine.policy_file().digest]
        assert not await h.engine.note_policy()  # the same policy again: nothing new


async def test_a_tampered_standing_approval_covers_nothing(db_url: str,
                                                           tmp_path: Path) -> None:
    async with harness(db_url, tmp_path, background=False) as h:
        paused = await h.pause_refund(requested_by="U_DANA")
        [approval_id] = paused.approval_ids
        a = await h.approval(approval_id)
        standing, _ = await h.engine.grant_standing(
            a.id, actor=ALICE, window=timedelta(hours=1),
            scope=Scope(kind="fields", values={"order_id": "A-1001"}), token=h.token(a))
        await h.engine.revoke_standing(standing.id, actor=ALICE)
        # someone with write access to the database brings it back, and widens it
        await Rows.of(h.engine).execute(
            "UPDATE standing_approvals SET status = 'active', revoked_at = NULL, "
            "revoked_by = NULL, scope = :scope WHERE id = :id",
            id=standing.id, scope=json.dumps({"kind": "condition", "when": "true"}))
        before = len(h.refunds())
        await h.pause_refund(requested_by="U_DANA", task="Refund order A-2002, customer was "
                                                        "double charged")
        assert len(h.refunds()) == before  # it asked instead
        refused = [json.loads(e.details) for e in await Rows.of(h.engine).audit()
                   if e.action == "refused"]
        assert any(d.get("reason") == "standing_tampered" for d in refused), refused


async def test_a_standing_approval_answers_its_own_sources_later_requests_only(
        db_url: str, tmp_path: Path) -> None:
    async with harness(db_url, tmp_path, background=False) as h, \
            aiohttp.ClientSession() as http:
        mine, other = await bearer(h, "billing-bot"), await bearer(h, "other-bot")
        url = f"{base(h)}/v1/requests"
        status, doc = await api(http, "POST", url, mine.token, {
            "tool": "issue_refund", "args": ARGS, "requested_by": "U_DANA"})
        a = await approval_of(h, doc["id"])
        await h.engine.grant_standing(a.id, actor=ALICE, window=timedelta(hours=1),
                                      scope=Scope(kind="condition",
                                                  when="args.amount_cents <= 5000"),
                                      token=h.token(a))
        small = {**ARGS, "amount_cents": 1500}
        status, again = await api(http, "POST", url, mine.token, {
            "tool": "issue_refund", "args": small, "requested_by": "U_DANA"})
        assert status == 201 and again["status"] == "approved", again
        assert again["decision"]["decided_via"] == "standing"
        # another token's tool of the same name is another subject: it asks
        status, theirs = await api(http, "POST", url, other.token, {
            "tool": "issue_refund", "args": small, "requested_by": "U_DANA"})
        assert status == 201 and theirs["status"] == "pending", theirs
        # and a call outside the scope asks too
        status, big = await api(http, "POST", url, mine.token, {
            "tool": "issue_refund", "args": {**ARGS, "amount_cents": 9000},
            "requested_by": "U_DANA"})
        assert big["status"] == "pending"
