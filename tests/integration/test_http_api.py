"""The HTTP API end to end: real HTTP on serve's listener, a real database, the Slack
emulator for decisions, an agent that is a stdlib-only subprocess, a webhook receiver that
fails before it succeeds, and time moved by the injected clock."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from approvald.bot.api import schemas
from approvald.bot.slack import cards
from approvald.runtime.kernel import binding
from approvald.runtime.kernel.canonical import call_digest
from approvald.runtime.kernel.clock import ManualClock
from approvald.runtime.record.outbox_kinds import WEBHOOK
from approvald.runtime.requests import api_tokens
from approvald.runtime.runs import external
from approvald.store.records import OutboxRecord

from tests.helpers import InProcessCli, Rows, create_token, parts, revoke_token
from tests.integration.slack_harness import CHANNEL, Harness, harness, wait_for
from tests.integration.test_slack import assert_valid_blocks

AGENT = Path(__file__).resolve().parent.parent / "fixtures" / "http_agent.py"
SECRET = "approvald-test-secret-0123456789"  # the harness's APPROVALD_SECRET
POLICY = """
[tools."api:*/deploy"]
approvers = ["U_ALICE"]
ttl = "30m"

[tools."api:*/refund_card"]
approvers = ["U_ALICE"]

[[tools."api:*/refund_card".rules]]
when = "args.cents <= 2000"
policy = "auto"

[[tools."api:*/refund_card".rules]]
when = "args.cents > 1000000"
policy = "forbidden"
reason = "Refunds over $10,000 go through the finance system."
"""


def policy_file(tmp_path: Path) -> str:
    path = tmp_path / "policy.toml"
    path.write_text(POLICY)
    return str(path)


@dataclass
class Receiver:
    """A webhook endpoint that answers 500 to its first ``failures`` calls."""

    failures: int = 2
    calls: list[dict[str, Any]] = field(default_factory=list)
    url: str = ""
    allow: str = ""

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        ok = len(self.calls) >= self.failures
        self.calls.append({"body": body, "headers": dict(request.headers), "ok": ok})
        return web.json_response({"ok": ok}, status=200 if ok else 500)

    def succeeded(self) -> list[dict[str, Any]]:
        return [c for c in self.calls if c["ok"]]


@asynccontextmanager
async def receiver(failures: int = 2) -> AsyncIterator[Receiver]:
    r = Receiver(failures)
    app = web.Application()
    app.router.add_post("/hook", r.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    r.url = f"http://127.0.0.1:{port}/hook"
    r.allow = f"127.0.0.1:{port}"  # its APPROVALD_WEBHOOK_HOSTS entry
    try:
        yield r
    finally:
        await runner.cleanup()


def verify(secret: str, call: dict[str, Any]) -> dict[str, Any]:
    """Check a webhook's signature as a receiver would; the document it carries."""
    header = call["headers"]["X-Approvald-Signature"]
    parts = dict(p.split("=", 1) for p in header.split(","))
    expected = hmac.new(secret.encode(), parts["t"].encode() + b"." + call["body"],
                        hashlib.sha256).hexdigest()
    assert hmac.compare_digest(expected, parts["v1"]), "bad webhook signature"
    doc: dict[str, Any] = json.loads(call["body"])
    return doc


def base(h: Harness) -> str:
    assert h.service.slack is not None
    return f"http://127.0.0.1:{h.service.slack.port}"


async def make_token(h: Harness, name: str, *, webhook_url: str | None = None) -> Any:
    from approvald.bot.api.service import webhook_keys

    keys = webhook_keys(h.service.settings)
    assert keys is not None
    return await create_token(h.engine, keys, name,
                              created_by="test", via="test", tools="*",
                              webhook_url=webhook_url,
                              webhook_hosts=h.service.api.webhook_hosts)


async def api(session: aiohttp.ClientSession, method: str, url: str, token: str | None,
              body: Any = None, **kw: Any) -> tuple[int, Any]:
    """One call; its answer is checked against the OpenAPI document's schemas."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with session.request(method, url, json=body, headers=headers, **kw) as resp:
        status, doc = resp.status, await resp.json()
    if "/v1/" not in url or url.endswith("/openapi.json"):
        return status, doc
    shape = schemas.ForbiddenDocument if status == 403 and "id" in doc else \
        schemas.RequestDocument if status < 300 else schemas.ErrorBody
    shape.model_validate(doc)
    return status, doc


async def approval_of(h: Harness, request_id: str) -> Any:
    found = await Rows.of(h.engine).approvals(request_id)
    return found[-1] if found else None


async def webhook_rows(h: Harness) -> list[OutboxRecord]:
    return await Rows.of(h.engine).outbox(kind=WEBHOOK)


async def deliver_webhooks(h: Harness, clock: ManualClock, until: int) -> None:
    """Drain the outbox, moving the clock to each retry, until ``until`` rows delivered."""
    for _ in range(20):
        await h.service.drain.drain_once()
        rows = await webhook_rows(h)
        assert all(r.status != "dead" for r in rows), [r.last_error for r in rows]
        if sum(r.status == "delivered" for r in rows) >= until:
            return
        waiting = [r.not_before for r in rows if r.status == "pending"]
        if waiting:
            clock.set(max(clock.now(), min(waiting)))
    raise AssertionError("webhooks were not delivered")


@pytest.mark.slow  # starts a process
async def test_a_stdlib_agent_asks_waits_runs_and_reports(db_url: str, tmp_path: Path) -> None:
    clock = ManualClock()
    async with receiver(failures=2) as hook, \
            harness(db_url, tmp_path, clock=clock, background=False,
                    APPROVALD_POLICY_FILE=policy_file(tmp_path),
                    APPROVALD_WEBHOOK_HOSTS=hook.allow) as h:
        # the token through the command, as an operator makes it
        cli = InProcessCli(db_url, tmp_path, {"APPROVALD_SECRET": SECRET,
                                              "APPROVALD_CLOCK_FILE": "",
                                              "APPROVALD_WEBHOOK_HOSTS": hook.allow})
        made = await asyncio.to_thread(cli.json, "tokens", "create", "deploy-bot",
                                       "--tools", "deploy",
                                       "--webhook-url", hook.url, "--json")
        assert made["token"].startswith("apd_") and made["webhook_secret"].startswith("whsec_")
        listed = await asyncio.to_thread(cli.json, "tokens", "list", "--json")
        assert [t["name"] for t in listed] == ["deploy-bot"] and "token" not in listed[0]

        ran = tmp_path / "ran.jsonl"
        agent = await asyncio.create_subprocess_exec(
            sys.executable, str(AGENT), base(h), made["token"], str(ran),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)

        async def opened() -> Any:
            runs = [r for r in await Rows.of(h.engine).runs() if r.agent == "external:deploy-bot"]
            return runs[0] if runs else None

        run = await wait_for(opened, what="the agent's request")
        assert run.status == "external" and run.id.startswith("x")
        a = await approval_of(h, run.id)
        await h.service.drain.drain_once()  # the card goes out through the outbox
        card = await h.card(a.id)
        assert_valid_blocks(card["blocks"])
        assert "billing" in json.dumps(card) and "build 812 green" in json.dumps(card)
        # a signed Approve click from Slack decides it
        await h.slack.click(cards.APPROVE, h.value(a), user_id="U_ALICE", channel_id=CHANNEL,
                            message_ts=a.message_ts)
        out, err = await asyncio.wait_for(agent.communicate(), 60)
        assert agent.returncode == 0, err.decode()
        seen = json.loads(out)

        args = {"service": "billing", "version": "2.4.1"}
        assert (seen["create"], seen["retry"], seen["same_id"]) == (201, 200, True)
        assert (seen["bad_token"], seen["no_token"]) == (401, 401)
        decision = seen["decision"]
        assert decision["status"] == "approved" and decision["decision"]["decided_by"] == "U_ALICE"
        assert decision["effective_args"] == args
        assert decision["effective_digest"] == binding.shown(call_digest("deploy", args))
        assert seen["report"] == 201 and seen["reported"]["result"]["status"] == "succeeded"
        assert [json.loads(x) for x in ran.read_text().splitlines()] == [
            {"tool": "deploy", "args": args}]  # it ran once, exactly the approved call
        ended = await h.run(run.id)
        assert ended.status == "completed"

        # the audit export: requested -> approved -> executed, each with the exact arguments
        exported = await asyncio.to_thread(cli.ok, "audit", "export", "--run", run.id)
        entries = [json.loads(x) for x in exported.splitlines()]
        assert [e["action"] for e in entries] == ["requested", "approved", "executed"]
        assert all(e["details"]["args"] == args for e in entries)
        assert entries[1]["actor"] == "U_ALICE"
        assert entries[2]["details"]["result"] == {"deployed": "2.4.1"}
        assert entries[2]["details"]["idempotency_key"] == f"{run.id}:call"

        # the webhook: refused twice, then delivered once, signed with the token's secret
        await deliver_webhooks(h, clock, until=1)
        assert [c["ok"] for c in hook.calls] == [False, False, True]
        assert len({c["headers"]["X-Approvald-Delivery"] for c in hook.calls}) == 1
        [ok] = hook.succeeded()
        told = verify(made["webhook_secret"], ok)
        assert told["id"] == run.id and told["status"] == "approved"
        assert told["effective_digest"] == binding.shown(call_digest("deploy", args))
        for _ in range(3):  # nothing more is sent for this decision
            clock.advance(3600)
            await h.service.drain.drain_once()
        assert len(hook.calls) == 3


async def test_deny_and_edit_in_slack_reach_the_caller(db_url: str, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(external, "POLL", 60.0)  # long polls end on a wake-up, not a poll
    clock = ManualClock()
    async with receiver(failures=0) as hook, \
            harness(db_url, tmp_path, clock=clock, background=False,
                    APPROVALD_POLICY_FILE=policy_file(tmp_path),
                    APPROVALD_WEBHOOK_HOSTS=hook.allow) as h, \
            aiohttp.ClientSession() as http:
        token = await make_token(h, "ops-bot", webhook_url=hook.url)
        url = f"{base(h)}/v1/requests"

        async def ask(version: str) -> tuple[dict[str, Any], Any]:
            status, doc = await api(http, "POST", url, token.token, {
                "tool": "deploy", "args": {"service": "billing", "version": version}})
            assert status == 201 and doc["status"] == "pending", doc
            await h.service.drain.drain_once()
            a = await approval_of(h, doc["id"])
            await h.card(a.id)
            return doc, await h.approval(a.id)

        # deny, with a reason, in the modal
        denied, a = await ask("2.5.0")
        waiting = asyncio.ensure_future(api(http, "GET", f"{url}/{denied['id']}/decision?wait=30",
                                            token.token))
        await h.slack.click(cards.DENY, h.value(a), user_id="U_ALICE", channel_id=CHANNEL,
                            message_ts=a.message_ts)
        await wait_for(lambda: h.emulator.views(callback_id=cards.DENY_MODAL),
                       what="the deny modal")
        await h.slack.submit_view(cards.DENY_MODAL,
                                  {"reason": {"reason_input": "Freeze until Monday"}},
                                  user_id="U_ALICE")
        status, doc = await asyncio.wait_for(waiting, 10)  # the long poll wakes on it
        assert status == 200 and doc["status"] == "denied"
        assert doc["decision"]["reason"] == "Freeze until Monday"
        assert doc["decision"]["decided_by"] == "U_ALICE"
        refused = await api(http, "POST", f"{url}/{denied['id']}/result", token.token,
                            {"status": "succeeded", "args_digest": doc["effective_digest"]})
        assert refused[0] == 409 and refused[1]["error"]["code"] == "not_approved"
        await h.service.drain.drain_once()  # the decision's follow-up ends its run
        assert (await h.run(denied["id"])).status == "completed"

        # edit in the modal: the caller gets the edited arguments and their digest
        asked, a = await ask("2.6.0")
        await h.slack.click(cards.EDIT, h.value(a), user_id="U_ALICE", channel_id=CHANNEL,
                            message_ts=a.message_ts)
        await wait_for(lambda: h.emulator.views(callback_id=cards.EDIT_MODAL),
                       what="the edit modal")
        edited = {"service": "billing", "version": "2.6.1"}
        resp = await h.slack.submit_view(cards.EDIT_MODAL,
                                         {"args": {"args_input": json.dumps(edited)}},
                                         user_id="U_ALICE")
        assert resp.status == 200
        status, doc = await api(http, "GET", f"{url}/{asked['id']}/decision?wait=10",
                                token.token)
        assert doc["status"] == "approved" and doc["edited"] and doc["edited_by"] == "U_ALICE"
        assert doc["args"]["version"] == "2.6.0" and doc["effective_args"] == edited
        assert doc["effective_digest"] == binding.shown(call_digest("deploy", edited)) \
            != doc["args_digest"]
        # only the approved (edited) arguments may be reported as run
        stale = await api(http, "POST", f"{url}/{asked['id']}/result", token.token,
                          {"status": "succeeded", "args_digest": doc["args_digest"]})
        assert stale[0] == 409 and stale[1]["error"]["code"] == "digest_mismatch"
        report = {"status": "failed", "args_digest": doc["effective_digest"],
                  "error": "the canary failed"}
        first = await api(http, "POST", f"{url}/{asked['id']}/result", token.token, report)
        again = await api(http, "POST", f"{url}/{asked['id']}/result", token.token, report)
        other = await api(http, "POST", f"{url}/{asked['id']}/result", token.token,
                          {**report, "error": "something else"})
        assert (first[0], again[0], other[0]) == (201, 200, 409)
        assert first[1]["result"]["status"] == "failed" and first[1] == again[1]
        assert other[1]["error"]["code"] == "already_reported"
        assert (await h.run(asked["id"])).status == "failed"

        # one signed webhook per decision, each with its own outcome
        await deliver_webhooks(h, clock, until=2)
        told = [verify(token.webhook_secret, c) for c in hook.calls]
        assert [(d["id"], d["status"]) for d in told] == [(denied["id"], "denied"),
                                                          (asked["id"], "approved")]
        assert told[1]["effective_args"] == edited


async def test_an_expired_request_is_never_approved(db_url: str, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(external, "POLL", 60.0)  # long polls end on a wake-up, not a poll
    clock = ManualClock()
    async with harness(db_url, tmp_path, clock=clock, background=False,
                       APPROVALD_POLICY_FILE=policy_file(tmp_path)) as h, \
            aiohttp.ClientSession() as http:
        token = await make_token(h, "night-bot")
        url = f"{base(h)}/v1/requests"
        status, doc = await api(http, "POST", url, token.token, {
            "tool": "deploy", "args": {"service": "search", "version": "9"}})
        assert status == 201
        waiting = asyncio.ensure_future(api(http, "GET", f"{url}/{doc['id']}/decision?wait=30",
                                            token.token))
        await asyncio.sleep(0.2)
        assert not waiting.done()
        clock.advance(31 * 60)  # silence past the 30 minutes
        await h.engine.sweep()
        status, doc = await asyncio.wait_for(waiting, 10)
        assert status == 200 and doc["status"] == "expired"
        assert doc["decision"]["verdict"] == "expired"
        refused = await api(http, "POST", f"{url}/{doc['id']}/result", token.token,
                            {"status": "succeeded", "args_digest": doc["effective_digest"]})
        assert refused[0] == 409 and refused[1]["error"]["code"] == "not_approved"
        a = await approval_of(h, doc["id"])
        # a late click cannot approve it either
        await h.slack.click(cards.APPROVE, h.value(a), user_id="U_ALICE", channel_id=CHANNEL)
        status, doc = await api(http, "GET", f"{url}/{doc['id']}", token.token)
        assert doc["status"] == "expired"


async def test_policy_answers_and_refusals(db_url: str, tmp_path: Path) -> None:
    async with harness(db_url, tmp_path, background=False,
                       APPROVALD_POLICY_FILE=policy_file(tmp_path)) as h, \
            aiohttp.ClientSession() as http:
        token = await make_token(h, "pay-bot")
        other = await make_token(h, "other-bot")
        url = f"{base(h)}/v1/requests"

        async def count_runs() -> int:
            return len(await Rows.of(h.engine).runs(limit=1000))

        # the rules on arguments answer at once: auto, forbidden; else a person decides
        small = await api(http, "POST", url, token.token,
                          {"tool": "refund_card", "args": {"cents": 1500}})
        assert small[0] == 201 and small[1]["status"] == "approved"
        assert small[1]["decision"]["verdict"] == "auto"
        huge = await api(http, "POST", url, token.token,
                         {"tool": "refund_card", "args": {"cents": 2_000_000}})
        assert huge[0] == 403 and huge[1]["status"] == "forbidden"
        assert huge[1]["error"]["message"] == huge[1]["decision"]["reason"] == \
            "Refunds over $10,000 go through the finance system."
        mid = await api(http, "POST", url, token.token,
                        {"tool": "refund_card", "args": {"cents": 50_000}})
        assert mid[0] == 201 and mid[1]["status"] == "pending"
        # an auto answer is reported like any approval
        report = await api(http, "POST", f"{url}/{small[1]['id']}/result", token.token,
                           {"status": "succeeded", "args_digest": small[1]["effective_digest"],
                            "result": {"refund": "r-1"}})
        assert report[0] == 201
        # a tool the policy file does not name: the operator's default, which asks; a
        # caller may make a request stricter (a shorter wait, a higher risk), never looser
        inline = await api(http, "POST", url, token.token, {
            "tool": "rotate_key", "args": {"key": "k1"},
            "tighten": {"ttl": "5m", "risk": "high"}})
        assert inline[0] == 201 and inline[1]["status"] == "pending"
        assert inline[1]["policy"] == "api:pay-bot/rotate_key"
        stricter = await approval_of(h, inline[1]["id"])
        assert (stricter.expires_at - stricter.requested_at).total_seconds() == 300
        looser = await api(http, "POST", url, token.token, {
            "tool": "deploy", "args": {}, "tighten": {"approvers": ["U_BOB"]}})
        assert looser[0] == 403 and looser[1]["error"]["code"] == "looser_than_policy"
        longer = await api(http, "POST", url, token.token, {
            "tool": "deploy", "args": {}, "tighten": {"ttl": "2h"}})
        assert longer[0] == 403 and longer[1]["error"]["code"] == "looser_than_policy"
        for loosen in ({"policy": "deploy"}, {"approval": {"approvers": ["U_BOB"]}}):
            refused = await api(http, "POST", url, token.token,
                                {"tool": "nope", "args": {}, **loosen})
            assert refused[0] == 422 and refused[1]["error"]["code"] == "invalid_request"
        # the same idempotency key with other contents is a conflict
        key = {"tool": "deploy", "args": {"v": 1}, "idempotency_key": "k"}
        assert (await api(http, "POST", url, token.token, key))[0] == 201
        clash = await api(http, "POST", url, token.token, {**key, "args": {"v": 2}})
        assert clash[0] == 409 and clash[1]["error"]["code"] == "idempotency_conflict"
        # another token's key space is its own, and its requests are not this one's to read
        theirs = await api(http, "POST", url, other.token, key)
        assert theirs[0] == 201 and theirs[1]["id"] != small[1]["id"]
        hidden = await api(http, "GET", f"{url}/{small[1]['id']}", other.token)
        assert hidden[0] == 404 and hidden[1]["error"]["code"] == "not_found"

        before = await count_runs()
        # no token, a wrong one, a revoked one: 401, and nothing changes
        await revoke_token(h.engine, "other-bot",
                           by="test", via="test")
        for bearer in (None, "apd_" + "x" * 43, other.token):
            refused = await api(http, "POST", url, bearer, {"tool": "deploy", "args": {}})
            assert refused[0] == 401 and refused[1]["error"]["code"] == "unauthorized"
        async with http.post(url, data=b"{not json", headers={
                "Authorization": f"Bearer {token.token}"}) as resp:
            assert resp.status == 400 and (await resp.json())["error"]["code"] == "malformed_json"
        async with http.post(url, data=b"[1, 2]", headers={
                "Authorization": f"Bearer {token.token}"}) as resp:
            assert resp.status == 400
        for size in (300_000, 700_000):  # arguments over the payload cap; a body over its own
            big = {"tool": "deploy", "args": {"blob": "x" * size}}
            async with http.post(url, json=big, headers={
                    "Authorization": f"Bearer {token.token}"}) as resp:
                assert resp.status == 413
                assert (await resp.json())["error"]["code"] == "payload_too_large"
        bad = await api(http, "POST", url, token.token, {"tool": "deploy"})
        assert bad[0] == 422 and bad[1]["error"]["message"].startswith("args:")
        wrong_wait = await api(http, "GET", f"{url}/{small[1]['id']}/decision?wait=soon",
                               token.token)
        assert wrong_wait[0] == 400
        assert await count_runs() == before
        assert (await api(http, "GET", f"{base(h)}/v1/nothing", token.token))[0] == 404
        assert (await api(http, "GET", url, token.token))[0] == 405
        assert (await api(http, "GET", f"{url}/xmissing", token.token))[0] == 404
        status, spec = await api(http, "GET", f"{base(h)}/v1/openapi.json", None)
        assert status == 200 and spec["openapi"].startswith("3.1")


async def test_arguments_nested_too_deep_are_refused_naming_the_limit(
        db_url: str, tmp_path: Path) -> None:
    """Issue 45: 2 KB of brackets is 1,000 levels; what JSON reads (900) or not (1,000),
    approvald takes up to its depth limit and refuses past it with a 4xx saying so, never
    a 500, and nothing is asked."""
    async with harness(db_url, tmp_path, background=False,
                       APPROVALD_POLICY_FILE=policy_file(tmp_path)) as h, \
            aiohttp.ClientSession() as http:
        token = await make_token(h, "pay-bot")
        url = f"{base(h)}/v1/requests"
        for depth in (1000, 900, 65):
            body = '{"tool": "deploy", "args": ' + '{"a":' * depth + "1" + "}" * depth + "}"
            async with http.post(url, data=body.encode(), headers={
                    "Authorization": f"Bearer {token.token}"}) as resp:
                doc = await resp.json()
                assert resp.status in (400, 422), (depth, resp.status, doc)
                assert "deeper than" in doc["error"]["message"], doc
        # half a surrogate pair is JSON but not text: its digest was a 500
        async with http.post(url, data=b'{"tool": "deploy", "args": {"a": "\\ud800"}}',
                             headers={"Authorization": f"Bearer {token.token}"}) as resp:
            assert resp.status == 400, await resp.text()
            assert "surrogate" in (await resp.json())["error"]["message"]
        ok = '{"tool": "deploy", "args": ' + '{"a":' * 63 + "1" + "}" * 63 + "}"
        async with http.post(url, data=ok.encode(), headers={
                "Authorization": f"Bearer {token.token}"}) as resp:
            assert resp.status == 201, await resp.text()
        assert len(await Rows.of(h.engine).requests()) == 1


async def test_concurrent_creates_with_one_key_make_one_request(db_url: str,
                                                                tmp_path: Path) -> None:
    async with harness(db_url, tmp_path, background=False,
                       APPROVALD_POLICY_FILE=policy_file(tmp_path)) as h, \
            aiohttp.ClientSession() as http:
        token = await make_token(h, "racer")
        body = {"tool": "deploy", "args": {"v": 3}, "idempotency_key": "once"}
        answers = await asyncio.gather(*(api(http, "POST", f"{base(h)}/v1/requests",
                                             token.token, body) for _ in range(8)))
        assert sorted(s for s, _ in answers) == [200] * 7 + [201]
        assert len({d["id"] for _, d in answers}) == 1
        assert len(await Rows.of(h.engine).requests()) == 1


async def test_without_slack_the_api_is_on_the_health_listener(sqlite_url: str,
                                                               tmp_path: Path) -> None:
    from approvald.bot.config import Settings
    from approvald.bot.serve import Service
    from approvald.bot.wiring import open_database

    settings = Settings(APPROVALD_DATABASE_URL=sqlite_url, APPROVALD_PORT=0,
                        APPROVALD_HOST="127.0.0.1", APPROVALD_SECRET=SECRET,
                        APPROVALD_POLICY_FILE=policy_file(tmp_path))
    db = await open_database(settings, quiet=True)
    service = Service(settings, db)
    try:
        await service.start(background=False)
        from approvald.bot.api.service import webhook_keys

        keys = webhook_keys(settings)
        assert keys is not None
        made = await create_token(service.engine, keys, "socket-bot", created_by="test",
                                  via="test", tools="*")
        root = f"http://127.0.0.1:{service.ops_port}"
        async with aiohttp.ClientSession() as http:
            assert (await api(http, "GET", f"{root}/healthz", None))[0] == 200
            status, doc = await api(http, "POST", f"{root}/v1/requests", made.token,
                                    {"tool": "deploy", "args": {"service": "api"}})
            assert status == 201 and doc["status"] == "pending"
    finally:
        await service.stop()
        await db.close()


async def test_the_ops_thread_follows_an_external_request(sqlite_url: str,
                                                          tmp_path: Path) -> None:
    async with harness(sqlite_url, tmp_path, APPROVALD_CALLER_THREADS="asked",
                       APPROVALD_POLICY_FILE=policy_file(tmp_path)) as h, \
            aiohttp.ClientSession() as http:
        token = await make_token(h, "thread-bot")
        status, doc = await api(http, "POST", f"{base(h)}/v1/requests", token.token, {
            "tool": "deploy", "args": {"service": "api"},
            "packet": {"task": "Ship the api <!channel>"}})
        assert status == 201

        async def parent() -> Any:
            t = await Rows.of(h.engine).thread(doc["id"])
            return t and t.ts and h.emulator.message(t.channel, t.ts)

        msg = await wait_for(parent, what="the request's ops thread")
        text = json.dumps(msg)
        assert "thread-bot (HTTP API)" in text and "its caller runs the call" in text
        assert "<!channel>" not in text  # the caller's text is data
        await h.card(doc["approval_id"])
        a = await h.approval(doc["approval_id"])
        await h.slack.click(cards.APPROVE, h.value(a), user_id="U_ALICE", channel_id=CHANNEL,
                            message_ts=a.message_ts)
        status, done = await api(http, "GET", f"{base(h)}/v1/requests/{doc['id']}/decision"
                                 "?wait=10", token.token)
        assert done["status"] == "approved"


async def test_a_decision_on_one_replica_ends_a_long_poll_on_another(
        pg_url: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if pg_url is None:
        pytest.skip("PostgreSQL is not available")
    import uuid

    from approvald.bot.config import Settings
    from approvald.bot.serve import Service
    from approvald.runtime.approvals.decide import Actor
    from approvald.store.db import Database

    monkeypatch.setattr(external, "POLL", 60.0)  # only PostgreSQL's NOTIFY can end it soon
    settings = Settings(APPROVALD_DATABASE_URL=pg_url, APPROVALD_SECRET=SECRET,
                        APPROVALD_POLICY_FILE=policy_file(tmp_path),
                        APPROVALD_POLL_INTERVAL="600", APPROVALD_SWEEP_INTERVAL="600")
    db_a, db_b = Database(pg_url), Database(pg_url)
    a, b = Service(settings, db_a), Service(settings, db_b)
    try:
        assert await a.wakeups.start() and await b.wakeups.start()
        async with asyncio.timeout(10):
            await a.wakeups.listening()
            await b.wakeups.listening()
        made = await api_tokens.create(db_b, parts(b.engine).clock, api_tokens.WebhookKeys(SECRET),
                                       parts(b.engine).audit, f"replica-{uuid.uuid4().hex[:8]}",
                                       created_by="test", via="test", tools="*")
        doc, _ = await b.engine.open_request(made.record, external.NewRequest(
            tool="deploy", args={"service": "api"}, requested_by="U_DANA"))
        waiting = asyncio.ensure_future(b.engine.wait_request(made.record, doc["id"],
                                                               seconds=30))
        await asyncio.sleep(0.2)
        assert not waiting.done()
        await a.engine.decide(doc["approval_id"], actor=Actor("U_ALICE", "cli:test"),
                              verdict="approve")
        told = await asyncio.wait_for(waiting, 10)
        assert told["status"] == "approved"
    finally:
        await a.wakeups.close()
        await b.wakeups.close()
        await db_a.close()
        await db_b.close()


# -- every route of the OpenAPI document, without a token and with another token's request --

SPEC = schemas.openapi()
METHODS = ("get", "put", "post", "delete", "patch", "head", "options")
ROUTES = [(path, method) for path, ops in SPEC["paths"].items() for method in ops
          if method in METHODS]
# a body each operation taking one accepts, so that the token is all that is wrong
BODIES: dict[str, Any] = {
    "createRequest": {"tool": "deploy", "args": {"v": 2}},
    "reportResult": {"status": "succeeded", "args_digest": "0" * 64, "result": {"ok": True}},
    "claudeCodeHook": {"hook_event_name": "PreToolUse", "session_id": "s-1", "cwd": "/",
                       "tool_name": "Bash", "tool_input": {"command": "ls"},
                       "tool_use_id": "toolu_01"},
}


@pytest.mark.parametrize(("path", "method"), ROUTES,
                         ids=[f"{m.upper()} {p}" for p, m in ROUTES])
async def test_every_route_refuses_a_missing_token_and_another_tokens_request(
        sqlite_url: str, tmp_path: Path, path: str, method: str) -> None:
    op = SPEC["paths"][path][method]
    body = None
    if "requestBody" in op:
        assert op["operationId"] in BODIES, f"no body here for {op['operationId']}"
        body = BODIES[op["operationId"]]
    async with harness(sqlite_url, tmp_path, background=False,
                       APPROVALD_POLICY_FILE=policy_file(tmp_path)) as h, \
            aiohttp.ClientSession() as http:
        mine = await make_token(h, "pay-bot")
        theirs = await make_token(h, "other-bot")
        status, made = await api(http, "POST", f"{base(h)}/v1/requests", mine.token,
                                 {"tool": "deploy", "args": {"v": 1}, "idempotency_key": "k"})
        assert status == 201 and made["status"] == "pending"
        url = base(h) + path.replace("{id}", made["id"])
        if op.get("security", SPEC["security"]) == []:  # public: this document
            assert (await api(http, method.upper(), url, None, body))[0] == 200
            return

        async def state() -> tuple[int, Any]:
            runs = len(await Rows.of(h.engine).runs(limit=1000))
            return runs, (await api(http, "GET", f"{base(h)}/v1/requests/{made['id']}",
                                    mine.token))[1]

        before = await state()
        for bearer in (None, "apd_" + "x" * 43):  # no token, an unknown one
            status, doc = await api(http, method.upper(), url, bearer, body)
            assert (status, doc["error"]["code"]) == (401, "unauthorized"), (bearer, doc)
        assert await state() == before  # nothing read, nothing changed

        status, doc = await api(http, method.upper(), url, theirs.token,
                                body if "{id}" in path else {**body, "idempotency_key": "k"})
        if op["operationId"] == "claudeCodeHook":  # an API token calls no hook
            assert (status, doc["error"]["code"]) == (403, "wrong_face"), doc
            assert await state() == before
        elif "{id}" in path:  # another token's request is not this one's to read or report
            assert (status, doc["error"]["code"]) == (404, "not_found"), doc
            assert await state() == before
        else:  # creating: another token's idempotency keys are its own
            assert status == 201 and doc["id"] != made["id"]
