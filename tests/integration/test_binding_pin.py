"""The PIN-recovery attack (issue 46 item 1): nothing shown outside the database binds a
decision to arguments with a plain hash.

A tool takes a declared sensitive 4-digit PIN; an agent's call of it is asked about in
Slack and by mail, edited, and approved on the web review queue; an HTTP API caller asks
about a call with a PIN the policy declares sensitive, and reports it ran. Then whatever
a reader of the channel, of the mail, of the web pages, of ``audit export`` (without
``--reveal``), of ``approvald trace`` and of every ``--json`` document and API document
holds is gathered, and each of the 10,000 PINs is hashed with the shown fields, by every
unkeyed construction approvald ever used (the call's digest, the arguments', the value's):
none of them is found. Before bindings were keyed, the card's button value alone gave
the PIN back.
"""

from __future__ import annotations

import email
import functools
import hashlib
import json
import re
from pathlib import Path
from typing import Any

import aiohttp
from approvald.bot.slack import cards
from approvald.runtime.approvals.decide import Actor
from approvald.runtime.kernel import binding
from approvald.runtime.kernel.canonical import call_digest, canonical_json, value_digest
from approvald.runtime.models.base import ModelReply, Transcript
from approvald.runtime.models.scripted import ScriptedModel, assistant_turns, reply
from approvald.runtime.policies.tools import tool
from approvald.runtime.requests.packet import shown_args
from approvald.runtime.runs.agent import Agent

from tests.helpers import make_cli
from tests.integration.slack_harness import Harness, wait_for
from tests.integration.test_http_api import api, approval_of, base, make_token
from tests.integration.test_sensitive_args import ended, slack_saw
from tests.integration.web_helpers import Browser, form_fields, smtp_server, web_harness

PIN, API_PIN = "4821", "0937"

POLICY = """
[tools.withdraw]                     # the tool declares pin sensitive
approvers = ["U_ALICE", "U_BOB"]
channels = ["slack", "email"]
edits = "propose"

[tools."api:*/unlock"]
approvers = ["U_ALICE"]
channels = ["slack", "email"]
sensitive = ["args.pin"]
"""


def pin_agent() -> Agent:
    @tool(permission="execute", sensitive=["pin"])
    async def withdraw(account: str, amount_cents: int, pin: str) -> dict[str, Any]:
        """Withdraw cash from an account (the PIN authorises it)."""
        return {"withdrawn": amount_cents}

    def script(messages: Transcript) -> ModelReply:
        if assistant_turns(messages) == 0:
            return reply("Withdrawing.", ("withdraw", {"account": "AC-77", "amount_cents": 5000,
                                                        "pin": PIN}))
        return reply("done", turn=1)

    return Agent(name="pin-agent", instructions="", model=ScriptedModel(script),
                 tools=[withdraw])


AGENTS = [pin_agent()]  # serve loads them from this module (APPROVALD_AGENTS)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False,
                                                           default=str)


def mail_texts(inbox: Any) -> list[str]:
    """Each mail as sent, and each of its parts decoded (as a mail reader shows it)."""
    out = []
    for m in inbox.messages:
        raw = m.as_string()
        out.append(raw)
        for part in email.message_from_string(raw).walk():
            payload = part.get_payload(decode=True)
            if isinstance(payload, bytes):
                out.append(payload.decode("utf-8", "replace"))
    return out


def windows(seen: list[Any]) -> set[str]:
    """Every 12 hex characters in a row anywhere in what was seen (any case)."""
    found: set[str] = set()
    for run in re.findall(r"[0-9a-fA-F]{12,}", "\n".join(_text(s) for s in seen)):
        run = run.lower()
        found.update(run[i:i + 12] for i in range(len(run) - 11))
    return found


def unkeyed(tool_name: str, args: dict[str, Any], key: str, pin: str) -> list[str]:
    """Every unkeyed digest of the call with ``args[key] = pin``: the call's (what a
    request binds), its arguments' and its PIN's (what the audit log records of a masked
    value), as canonical JSON and as bare text."""
    real = {**args, key: pin}
    return [call_digest(tool_name, real), value_digest(real), value_digest(pin),
            hashlib.sha256(pin.encode()).hexdigest(),
            hashlib.sha256(canonical_json(real).encode()).hexdigest()]


def recovered(seen: list[Any], versions: list[tuple[str, dict[str, Any], str]]) -> list[str]:
    """The PINs whose unkeyed digests (of any version of the arguments) show up in
    ``seen``: what someone holding it finds by trying the 10,000."""
    shown = windows(seen)
    return sorted({pin for start, pins in _tried(canonical_json(versions)).items()
                   if start in shown for pin in pins})


@functools.cache
def _tried(versions: str) -> dict[str, frozenset[str]]:
    """The first 12 characters of every unkeyed digest of each of the 10,000 PINs in each
    version (``versions`` as canonical JSON), and the PINs whose digests start so: 150,000
    digests, worked out once for the test's two look-ups (and its other dialect's)."""
    tried: dict[str, set[str]] = {}
    for tool_name, args, key in json.loads(versions):
        for pin in (f"{n:04d}" for n in range(10_000)):
            for d in unkeyed(tool_name, args, key, pin):
                tried.setdefault(d[:12], set()).add(pin)
    return {start: frozenset(pins) for start, pins in tried.items()}


async def through_the_agent(h: Harness, browser: Browser, inbox: Any) -> tuple[str, str]:
    """The agent's withdrawal: a card, a mail, an edit of the amount (proposed by Bob),
    approved by Alice on the web."""
    paused = await h.engine.run("pin-agent", "Withdraw 50 from AC-77", requested_by="U_DANA")
    [aid] = paused.approval_ids
    await h.card(aid)
    await wait_for(lambda: inbox.to("approvals@example.com"), what="the request's mail")
    shown = dict(shown_args(await h.approval(aid)))  # the PIN masked, as on the card
    assert shown["pin"] != PIN
    await h.engine.decide(aid, actor=Actor("U_BOB", "slack"), verdict="edit",
                          args={**shown, "amount_cents": 4000})
    await browser.sign_in(inbox, "alice@example.com")
    status, page = await browser.get(f"/review/requests/{aid}")
    assert status == 200 and "withdraw" in page, page
    status, _ = await browser.post(f"/review/requests/{aid}", form_fields(
        page, action=f"/review/requests/{aid}", verdict="approve"))
    assert status == 303
    await wait_for(lambda: ended(h, paused.run_id), what="the withdrawal to end")
    assert (await h.run(paused.run_id)).status == "completed", await h.run(paused.run_id)
    return paused.run_id, aid


async def through_the_api(h: Harness, http: aiohttp.ClientSession) -> tuple[list[Any], str]:
    """A caller's unlock: asked, approved on its card, run and reported; its documents."""
    token = await make_token(h, "door-bot")
    url = f"{base(h)}/v1/requests"
    status, doc = await api(http, "POST", url, token.token, {
        "tool": "unlock", "args": {"door": "D-3", "pin": API_PIN}})
    assert status == 201 and doc["status"] == "pending", doc
    a = await wait_for(lambda: approval_of(h, doc["id"]), what="the API request")
    card = await h.card(a.id)
    value = next(e["value"] for b in card["blocks"] if b["type"] == "actions"
                 for e in b["elements"] if e.get("action_id") == "approvald.approve")
    await h.slack.click("approvald.approve", value, user_id="U_ALICE",
                        channel_id=a.channel, message_ts=a.message_ts)
    status, decided = await api(http, "GET", f"{url}/{doc['id']}/decision?wait=10",
                                token.token)
    assert status == 200 and decided["status"] == "approved", decided
    status, reported = await api(http, "POST", f"{url}/{doc['id']}/result", token.token, {
        "status": "succeeded", "args_digest": decided["effective_digest"],
        "result": {"unlocked": True}})
    assert status in (200, 201), reported
    status, after = await api(http, "GET", f"{url}/{doc['id']}", token.token)
    assert status == 200 and after["result"]["status"] == "succeeded", after
    return [doc, decided, reported, after], doc["id"]


async def test_no_pin_is_found_by_hashing_candidates_with_anything_shown(
        db_url: str, tmp_path: Path) -> None:
    (tmp_path / "policy.toml").write_text(POLICY)
    env = {"APPROVALD_POLICY_FILE": str(tmp_path / "policy.toml"),
           "APPROVALD_AGENTS": "tests.integration.test_binding_pin"}
    seen: list[Any] = []
    async with smtp_server() as (inbox, smtp_port), \
            web_harness(db_url, tmp_path, smtp_port=smtp_port, **env) as (h, base_url), \
            aiohttp.ClientSession() as http:
        browser = Browser(base_url)
        try:
            run_id, aid = await through_the_agent(h, browser, inbox)
            # (the caller's own documents hold its arguments in clear: it sent them)
            documents, request_id = await through_the_api(h, http)
            for path in ("/review", f"/review/requests/{aid}"):
                status, page = await browser.get(path)
                assert status == 200, page
                seen.append(page)
        finally:
            await browser.close()
        seen += slack_saw(h)
        seen += mail_texts(inbox)
        a = await h.approval(aid)
        api_request = await approval_of(h, request_id)
    assert inbox.messages and any("withdraw" in m for m in mail_texts(inbox))
    cli = make_cli(db_url, tmp_path, in_process=True)
    for run in (run_id, request_id):
        seen += [await cli.aok("trace", run), await cli.aok("trace", run, "--json"),
                 await cli.aok("runs", "show", run), await cli.aok("runs", "show", run, "--json")]
    for approval in (aid, api_request.id):
        seen += [await cli.aok("approvals", "show", approval),
                 await cli.aok("approvals", "show", approval, "--json")]
    seen += [await cli.aok("approvals", "list", "--json"), await cli.aok("audit", "export"),
             await cli.aok("audit", "export", "--format", "csv")]
    everything = "".join(_text(s) for s in seen)
    assert f'"{PIN}"' not in everything and f'"{API_PIN}"' not in everything  # masked
    seen += documents

    versions = [(a.tool, a.args_value(), "pin"), (a.tool, a.effective_args(), "pin"),
                (api_request.tool, api_request.args_value(), "pin")]
    # the attack works (the constructions are the ones approvald binds with) ...
    assert a.digest in unkeyed(a.tool, a.args_value(), "pin", PIN)
    assert a.effective_digest in unkeyed(a.tool, a.effective_args(), "pin", PIN)
    assert api_request.digest in unkeyed(api_request.tool, api_request.args_value(), "pin",
                                         API_PIN)
    assert recovered([f"{aid}:{a.digest[:12]}.x", api_request.digest], versions) == sorted(
        [PIN, API_PIN])
    # ... and finds nothing in what people, channels and exports were shown, which name
    # the arguments by their binding instead
    assert recovered(seen, versions) == []
    assert binding.short(a.effective_digest) in everything
    assert binding.shown(a.effective_digest) in everything
    assert all(d not in everything for d in (a.digest, a.effective_digest))
    assert f"{cards.VALUE_VERSION}{api_request.id}:" in everything  # the button values
