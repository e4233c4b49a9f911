"""Where decision webhooks may go (issue 36, defect 10), through the faces: ``approvald
tokens create`` refuses a webhook the operator did not allow, and serve's outbox checks
every webhook again when it delivers it, after DNS: it connects only to the addresses the
name resolved to that pass, and a refused one is a dead delivery reported to ops, with
the reason, not a retry forever. Name resolution is a resolver the test controls, as
the DNS an attacker controls would be."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from approvald.runtime.approvals.decide import Actor
from approvald.runtime.kernel.clock import ManualClock
from approvald.runtime.kernel.webhook_hosts import WebhookHosts
from approvald.runtime.record.outbox_kinds import DEAD_REPORT, WEBHOOK
from approvald.runtime.requests import api_tokens
from approvald.store.records import OutboxRecord

from tests.helpers import InProcessCli, Rows, create_token
from tests.integration.slack_harness import Harness, harness
from tests.integration.test_http_api import SECRET, api, base, policy_file, receiver, verify


class StaticResolver(AbstractResolver):
    """Names resolve to what the test says (an attacker's DNS), and to nothing else."""

    def __init__(self, names: dict[str, list[str]]) -> None:
        self.names = names
        self.asked: list[str] = []

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        self.asked.append(host)
        if host not in self.names:
            raise OSError(f"{host}: no such name")
        return [ResolveResult(hostname=host, host=ip, port=port,
                              family=socket.AF_INET6 if ":" in ip else socket.AF_INET,
                              proto=0, flags=socket.AI_NUMERICHOST)
                for ip in self.names[host]]

    async def close(self) -> None:
        pass


async def rows(h: Harness, kind: str) -> list[OutboxRecord]:
    found: list[OutboxRecord] = await Rows.of(h.engine).outbox(kind)
    return found


async def decided_webhook(h: Harness, http: aiohttp.ClientSession, token: str,
                          webhook_url: str | None = None) -> OutboxRecord:
    """Ask over the HTTP API, approve from the CLI's path, drain: the webhook row."""
    body: dict[str, Any] = {"tool": "deploy", "args": {"service": "api"}}
    if webhook_url is not None:
        body["webhook_url"] = webhook_url
    status, doc = await api(http, "POST", f"{base(h)}/v1/requests", token, body)
    assert status == 201, doc
    await h.engine.decide(doc["approval_id"], actor=Actor("U_ALICE", "cli:test"),
                          verdict="approve")
    await h.service.drain.drain_once()
    [row] = [r for r in await rows(h, WEBHOOK) if r.payload_value()["run_id"] == doc["id"]]
    return row


def reported(h: Harness, words: str) -> list[str]:
    """What the dead-delivery reports told ops (the ops channel or a run's thread)."""
    said = [str(c.params.get("text")) for c in h.emulator.calls("chat.postMessage")
            if c.ok and "outbox retry" in str(c.params.get("text"))]
    return [t for t in said if words in t]


async def test_serve_refuses_at_delivery_what_a_name_resolves_to(db_url: str,
                                                                 tmp_path: Path) -> None:
    clock = ManualClock()
    dns = StaticResolver({})
    async with receiver(failures=0) as hook, \
            harness(db_url, tmp_path, clock=clock, background=False,
                    APPROVALD_POLICY_FILE=policy_file(tmp_path),
                    APPROVALD_WEBHOOK_HOSTS="hooks.test, *.corp.test, localhost") as h, \
            aiohttp.ClientSession() as http:
        hook_port = int(hook.url.split(":")[2].split("/")[0])
        assert h.service.slack is not None and h.service.slack.port
        own = h.service.slack.port
        dns.names.update({
            # allowed by name, pointed at the cloud metadata service when delivered
            "hooks.test": ["169.254.169.254"],
            # a wildcard's name pointed at this host's loopback (a receiver listens there)
            "build.corp.test": ["127.0.0.1"],
            # named exactly, but at approvald's own listener
            "localhost": ["127.0.0.1"],
            # one good and one link-local answer: only the good one is used
            "mixed.corp.test": ["169.254.169.254", "127.0.0.1"]})
        h.service.api.webhooks.resolver = lambda: dns
        token = await create_token(
            h.engine, api_tokens.WebhookKeys(SECRET), "resolver-bot", created_by="test",
            via="test", tools="*", webhook_hosts=h.service.api.webhook_hosts)

        cases = [(f"http://hooks.test:{hook_port}/hook", "169.254.169.254 is a link-local "
                  "address (cloud metadata lives there): webhooks never go there"),
                 (f"http://build.corp.test:{hook_port}/hook", "127.0.0.1 is a loopback "
                  "address, allowed only for a host named exactly in APPROVALD_WEBHOOK_HOSTS"),
                 (f"http://localhost:{own}/slack/events",
                  f"127.0.0.1 is approvald's own listener (port {own})"),
                 (f"http://mixed.corp.test:{hook_port}/hook", "127.0.0.1 is a loopback")]
        for url, why in cases:
            row = await decided_webhook(h, http, token.token, url)
            assert row.status == "dead", (url, row.status, row.last_error)
            assert row.attempts == 1 and why in (row.last_error or ""), row.last_error
        assert hook.calls == []  # no connection reached the receiver on 127.0.0.1
        assert {"hooks.test", "build.corp.test", "localhost",
                "mixed.corp.test"} <= set(dns.asked)
        # each is reported to ops like a dead card, with the reason
        await h.service.drain.drain_once()
        reports = await rows(h, DEAD_REPORT)
        assert len(reports) == 4 and all(r.status == "delivered" for r in reports)
        assert reported(h, "link-local") and reported(h, "own listener")

        # an exact name still reaches an allowed loopback receiver, signed: of what it
        # resolves to, only the address that passes is connected to
        dns.names["localhost"] = ["169.254.169.254", "127.0.0.1"]
        row = await decided_webhook(h, http, token.token, hook.url.replace("127.0.0.1",
                                                                           "localhost"))
        assert row.status == "delivered", row.last_error
        [call] = hook.calls
        assert verify(token.webhook_secret, call)["status"] == "approved"


async def test_a_webhook_allowed_when_made_is_checked_again_when_delivered(
        db_url: str, tmp_path: Path) -> None:
    """The operator narrowed APPROVALD_WEBHOOK_HOSTS after a token was made, or the
    token's maker (a CLI with APPROVALD_PORT unset) did not know the port serve bound."""
    clock = ManualClock()
    async with receiver(failures=0) as hook, \
            harness(db_url, tmp_path, clock=clock, background=False,
                    APPROVALD_POLICY_FILE=policy_file(tmp_path),
                    APPROVALD_WEBHOOK_HOSTS="127.0.0.1") as h, \
            aiohttp.ClientSession() as http:
        assert h.service.slack is not None
        then = WebhookHosts.from_setting("127.0.0.1, hooks.example.com")
        keys = api_tokens.WebhookKeys(SECRET)
        gone = await create_token(h.engine, keys, "narrowed", created_by="test", via="test",
                                  tools="*", webhook_hosts=then,
                                  webhook_url="https://hooks.example.com/approvald")
        own = await create_token(h.engine, keys, "own-port", created_by="test", via="test",
                                 tools="*", webhook_hosts=then,
                                 webhook_url=f"http://127.0.0.1:{h.service.slack.port}"
                                           "/slack/events")
        row = await decided_webhook(h, http, gone.token)
        assert row.status == "dead" and "hooks.example.com is not in " \
            "APPROVALD_WEBHOOK_HOSTS" in (row.last_error or ""), row.last_error
        row = await decided_webhook(h, http, own.token)
        assert row.status == "dead" and "approvald's own listener" in (row.last_error or "")
        # the allowlisted loopback receiver, named exactly, gets its webhook
        ok = await create_token(h.engine, keys, "receiver", created_by="test", via="test",
                                tools="*", webhook_url=hook.url,
                                webhook_hosts=h.service.api.webhook_hosts)
        row = await decided_webhook(h, http, ok.token)
        assert row.status == "delivered", row.last_error
        assert verify(ok.webhook_secret, hook.calls[0])["status"] == "approved"


async def test_tokens_create_refuses_webhooks_the_operator_did_not_allow(
        sqlite_url: str, tmp_path: Path) -> None:
    cli = InProcessCli(sqlite_url, tmp_path, {"APPROVALD_SECRET": SECRET,
                                              "APPROVALD_CLOCK_FILE": "",
                                              "APPROVALD_PORT": "3999"})

    def refused(url: str, hosts: str | None) -> str:
        done = cli("tokens", "create", f"t{abs(hash((url, hosts))) % 10**8}", "--tools", "*",
                   "--webhook-url", url, APPROVALD_WEBHOOK_HOSTS=hosts or "")
        assert done.returncode != 0, done.stdout
        return done.stderr

    said = await asyncio.to_thread(refused, "https://hooks.example.com/approvald", None)
    assert "APPROVALD_WEBHOOK_HOSTS" in said and "no webhook host" in said
    allowed = "hooks.example.com, 127.0.0.1"
    said = await asyncio.to_thread(refused, "http://169.254.169.254/latest/meta-data/",
                                   allowed)
    assert "169.254.169.254" in said and "link-local" in said
    said = await asyncio.to_thread(refused, "https://evil.example.net/x", allowed)
    assert "evil.example.net is not in APPROVALD_WEBHOOK_HOSTS" in said
    said = await asyncio.to_thread(refused, "http://127.0.0.1:3999/slack/events", allowed)
    assert "approvald's own listener" in said
    listed = await asyncio.to_thread(cli.json, "tokens", "list", "--json")
    assert listed == []  # nothing was made
    made = await asyncio.to_thread(
        lambda: cli("tokens", "create", "allowed", "--tools", "*", "--webhook-url",
                    "https://hooks.example.com/approvald", "--json",
                    APPROVALD_WEBHOOK_HOSTS=allowed))
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["webhook_url"] == "https://hooks.example.com/approvald"
    # a malformed setting stops the command with one line naming it
    bad = await asyncio.to_thread(lambda: cli("tokens", "list",
                                              APPROVALD_WEBHOOK_HOSTS="*"))
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0
    assert "APPROVALD_WEBHOOK_HOSTS" in bad.stderr


async def test_the_http_api_refuses_a_request_naming_a_webhook_not_allowed(
        sqlite_url: str, tmp_path: Path) -> None:
    async with harness(sqlite_url, tmp_path, background=False,
                       APPROVALD_POLICY_FILE=policy_file(tmp_path),
                       APPROVALD_WEBHOOK_HOSTS="hooks.example.com, 127.0.0.1") as h, \
            aiohttp.ClientSession() as http:
        assert h.service.slack is not None
        token = await create_token(h.engine, api_tokens.WebhookKeys(SECRET), "asker",
                                   created_by="test", via="test", tools="*")
        for url, words in [("http://169.254.169.254/latest/meta-data/", "link-local"),
                           ("https://evil.example.net/x", "not in APPROVALD_WEBHOOK_HOSTS"),
                           (f"http://127.0.0.1:{h.service.slack.port}/slack/events",
                            "approvald's own listener")]:
            status, doc = await api(http, "POST", f"{base(h)}/v1/requests", token.token,
                                    {"tool": "deploy", "args": {"service": "api"},
                                     "webhook_url": url})
            assert status == 403 and words in doc["error"]["message"], doc
            assert doc["error"]["code"] == "webhook_not_allowed"
        assert await Rows.of(h.engine).requests() == []  # nothing was asked
