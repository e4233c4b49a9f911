"""Secrets never reach Slack (issue 34): a refund agent whose tool takes a card number.

Three runs of it, decided in Slack over real HTTP (approved, edited, denied): nothing
Slack received (cards, their updates, the run's thread, the App Home, the modals, the
ephemeral replies), nothing logged at any level, neither the run's trace (text, HTML,
JSON) nor the audit export holds eight digits of the card in a row; the tool receives
the real number, once per approved call; an edit that leaves the masked card as shown
refunds the original card. Undeclared secrets are masked by detection, and a detector the
operator turns off stops masking its kind.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import pytest
from approvald.bot import trace_view
from approvald.bot.slack import cards
from approvald.runtime.models.base import ModelReply, Transcript
from approvald.runtime.models.scripted import ScriptedModel, assistant_turns, reply
from approvald.runtime.policies import sensitive
from approvald.runtime.policies.tools import tool
from approvald.runtime.record.state import ToolMessage
from approvald.runtime.record.tracing import OtelTracer
from approvald.runtime.runs.agent import Agent
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.helpers import Rows, make_cli, parts
from tests.integration.slack_harness import CHANNEL, OPS, Harness, harness, wait_for

CARD = "4242 4242 4242 4242"
# eight digits of the card in a row, however they are spelt (spaces, dashes, none), and the
# authorisation code the tool declares sensitive, which no detector would recognise
DIGITS = re.compile(r"4242[ -]?4242|ZQX-7731")
AUTH = "AUTH-ZQX-7731"
KEY = "sk_live_51HqLyjWDarjtT1zdp7dc9f2a"


def card_agent(received: list[dict[str, Any]]) -> Agent:
    """Refunds the order its task names to the card on file, which it is handed in the
    call's arguments (the card number is declared sensitive by the tool)."""

    @tool(permission="execute", sensitive=["card_number", "auth.*"],
          impact=lambda a: f"${a['amount_cents'] / 100:.2f} back to card {a['card_number']}")
    async def refund_card(order_id: str, amount_cents: int, card_number: str,
                          auth: dict[str, str]) -> dict[str, Any]:
        """Refund an order to a card."""
        received.append({"order_id": order_id, "amount_cents": amount_cents,
                         "card_number": card_number, "auth": auth})
        if order_id == "A-4":  # a failure whose message quotes the card
            raise ValueError(f"card {card_number} declined")
        return {"refunded": amount_cents, "card": card_number}  # echoes it: results too

    def script(messages: Transcript) -> ModelReply:
        turn = assistant_turns(messages)
        task = next(m.content for m in messages if getattr(m, "role", "") == "user")
        order = str(task).split()[1]
        if turn == 0:
            return reply(f"Refunding {order} to card {CARD}.",
                         ("refund_card", {"order_id": order, "amount_cents": 4200,
                                          "card_number": CARD, "auth": {"code": AUTH}}))
        last = messages[-1]
        said = last.content if isinstance(last, ToolMessage) else None
        return reply(f"Finished: {json.dumps(said)}", turn=turn)

    return Agent(name="card-refund", instructions="", model=ScriptedModel(script),
                 tools=[refund_card])


def leaks(value: Any) -> list[str]:
    """The places in ``value`` (any JSON-like data, or text) that hold card digits."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False,
                                                            default=str)
    return [text[max(0, m.start() - 60):m.end() + 60] for m in DIGITS.finditer(text)]


def slack_saw(h: Harness) -> list[Any]:
    """Everything approvald sent Slack, and what Slack holds now."""
    seen: list[Any] = [c.params for c in h.emulator.calls()]
    seen += [h.emulator.messages(c) for c in (CHANNEL, OPS)]
    seen += h.emulator.views()
    seen += [r.body for r in h.emulator.responses()]
    seen += [h.emulator.ephemeral(CHANNEL, u) for u in ("U_ALICE", "U_BOB")]
    return seen


async def ended(h: Harness, run_id: str) -> bool:
    """Whether the run ended (completed, failed or cancelled)."""
    run = await h.run(run_id)
    return run.status in ("completed", "failed", "cancelled")


async def _thread_ended(h: Harness, run_id: str) -> bool:
    t, run = await Rows.of(h.engine).thread_and_run(run_id)
    return bool(t and t.ts and t.posted_status == run.status)


async def walk(h: Harness, plan: tuple[tuple[str, str], ...]) -> dict[str, str]:
    """For each (order, how) of ``plan``: a run of the card agent refunding ``order``,
    decided in Slack as ``how`` (see :func:`decide_in_slack`) and waited to its end; the
    run ids by ``how``."""
    runs = {}
    for order, how in plan:
        paused = await h.pause_refund(agent="card-refund", task=f"Refund {order} please")
        await h.card(paused.approval_ids[0])
        await decide_in_slack(h, paused.approval_ids[0], how)
        await wait_for(lambda r=paused.run_id: ended(h, r), what=f"run {order} to end")
        runs[how] = paused.run_id
    return runs


async def decide_in_slack(h: Harness, aid: str, how: str) -> dict[str, Any] | None:
    """Alice decides ``aid`` in Slack over signed HTTP: ``approve``; ``standing`` (approve,
    and calls with the same order, card and code for 15 minutes; returns the modal);
    ``edit`` (the amount changed to 2000, every other value, the masked card too, left as
    the modal showed it; returns the modal); ``deny`` (with a reason)."""
    a = await h.approval(aid)
    if how == "standing":
        await h.slack.click(cards.STANDING, h.value(a), user_id="U_ALICE",
                            channel_id=CHANNEL, message_ts=a.message_ts)
        [view] = await wait_for(lambda: h.emulator.views(callback_id=cards.STANDING_MODAL),
                                what="the standing approval modal")
        state = h.slack.filled(view["blocks"], {
            cards.WINDOW_BLOCK: "15m", cards.SCOPE_BLOCK: "fields",
            cards.FIELDS_BLOCK: ["order_id", "card_number", "auth"]})
        resp = await h.slack.submit_view(cards.STANDING_MODAL, state, user_id="U_ALICE",
                                         view_id=view["id"])
        assert resp.status == 200 and not resp.body.strip(), resp.body
        return dict(view)
    if how == "approve":
        await h.slack.click(cards.APPROVE, h.value(a), user_id="U_ALICE",
                            channel_id=CHANNEL, message_ts=a.message_ts)
        return None
    if how == "edit":
        await h.slack.click(cards.EDIT, h.value(a), user_id="U_ALICE",
                            channel_id=CHANNEL, message_ts=a.message_ts)
        [modal] = await wait_for(
            lambda: h.emulator.views(callback_id=cards.EDIT_MODAL), what="the modal")
        box = next(b for b in modal["blocks"] if b.get("block_id") == cards.ARGS_BLOCK)
        edited = {**json.loads(box["element"]["initial_value"]), "amount_cents": 2000}
        resp = await h.slack.submit_view(
            cards.EDIT_MODAL, {"args": {"args_input": json.dumps(edited)}},
            user_id="U_ALICE")
        assert resp.status == 200 and resp.body in ("", "{}"), resp.body
        return dict(modal)
    await h.slack.click(cards.DENY, h.value(a), user_id="U_ALICE",
                        channel_id=CHANNEL, message_ts=a.message_ts)
    await wait_for(lambda: h.emulator.views(callback_id=cards.DENY_MODAL),
                   what="the deny modal")
    await h.slack.submit_view(cards.DENY_MODAL, {"reason": {"reason_input": "not this card"}},
                              user_id="U_ALICE")
    return None


async def test_a_card_number_never_reaches_slack_logs_traces_or_the_audit_export(
        sqlite_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    received: list[dict[str, Any]] = []
    exporter = InMemorySpanExporter()
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    async with harness(sqlite_url, tmp_path, tracer=OtelTracer(provider)) as h:
        parts(h.engine).registry.add(card_agent(received))
        runs = {}
        for order, how in (("A-1", "approve"), ("A-2", "edit"), ("A-3", "deny"),
                           ("A-4", "fail")):
            paused = await h.pause_refund(agent="card-refund", task=f"Refund {order} please")
            [aid] = paused.approval_ids
            card = await h.card(aid)
            assert not leaks(card), leaks(card)
            assert "•••• 4242" in json.dumps(card, ensure_ascii=False)
            assert cards.masked(await h.approval(aid))
            a = await h.approval(aid)
            if how == "approve":  # and calls with the same order, card and code, for 15m
                view = await decide_in_slack(h, aid, "standing")
                assert "•••• 4242" in json.dumps(view, ensure_ascii=False)
            elif how == "fail":
                await h.slack.click(cards.APPROVE, h.value(a), user_id="U_ALICE",
                                    channel_id=CHANNEL, message_ts=a.message_ts)
            else:  # the edit leaves the masked card as shown
                modal = await decide_in_slack(h, aid, how)
                if how == "edit":
                    assert modal is not None
                    box = next(b for b in modal["blocks"]
                               if b.get("block_id") == cards.ARGS_BLOCK)
                    shown = json.loads(box["element"]["initial_value"])
                    assert shown["card_number"] == "•••• 4242"
                    assert shown["auth"] == {"code": "[masked]"}
                    assert "Sensitive values are shown masked" in json.dumps(modal)
            await wait_for(lambda r=paused.run_id: ended(h, r), what=f"run {order} to end")
            await wait_for(lambda r=paused.run_id: _thread_ended(h, r),
                           what=f"the thread of {order} to end")
            runs[how] = (paused.run_id, aid)

        # the tool received the real card, once per approved call; the edit kept it
        real = {"card_number": CARD, "auth": {"code": AUTH}}
        assert received == [
            {"order_id": "A-1", "amount_cents": 4200, **real},
            {"order_id": "A-2", "amount_cents": 2000, **real},
            {"order_id": "A-4", "amount_cents": 4200, **real}]
        failed = await h.run(runs["fail"][0])
        assert "declined" in (failed.result or "") and CARD in failed.result  # as stored
        edited = await h.approval(runs["edit"][1])
        assert edited.status == "approved" and edited.effective_args()["card_number"] == CARD

        await h.slack.event({"type": "app_home_opened", "user": "U_ALICE",
                             "channel": "D_ALICE", "tab": "home"})
        home = await wait_for(lambda: h.emulator.home_view("U_ALICE"), what="Alice's App Home")
        assert "A-1" in json.dumps(home)  # the standing approval, its scope masked
        await h.slack.slash("/approvals", "", user_id="U_ALICE", channel_id=CHANNEL)
        await wait_for(lambda: h.emulator.responses(), what="the /approvals answer")

        assert not leaks(slack_saw(h)), leaks(slack_saw(h))
        for run_id, _ in runs.values():
            trace = await h.engine.trace(run_id)
            for shown in (trace_view.text(trace), trace_view.html(trace),
                          trace.to_document()):
                assert not leaks(shown), leaks(shown)
        spans = [{"name": x.name, "attributes": dict(x.attributes or {}),
                  "events": [dict(e.attributes or {}) for e in x.events]}
                 for x in exporter.get_finished_spans()]
        assert any(x["name"] == "tool.call" for x in spans)
        assert not leaks(spans), leaks(spans)

        # what the command line shows of requests and runs: masked as on the cards
        cli = make_cli(sqlite_url, tmp_path, in_process=True)
        for run_id, aid in runs.values():
            for shown in (await cli.aok("approvals", "show", aid),
                          await cli.aok("runs", "show", run_id),
                          await cli.ajson("approvals", "show", aid, "--json"),
                          await cli.ajson("runs", "show", run_id, "--json")):
                assert not leaks(shown), leaks(shown)
        listed = await cli.aok("approvals", "list", "--status", "approved")
        assert "•••• 4242" in listed and not leaks(listed)

        # `approvald audit export`: masked, as the log records it (with no data key, the
        # real values are in the database only in the requests: --reveal is refused; it is
        # shown under a key in test_audit_masked)
        recorded = [r[0] for r in await Rows.of(h.engine).select("SELECT details FROM audit_log")]
        assert "refund_card" in "".join(recorded) and not leaks(recorded), leaks(recorded)
        exported = await cli.aok("audit", "export")
        assert "requested" in exported and not leaks(exported), leaks(exported)
        assert "•••• 4242" in exported
        assert not leaks(await cli.aok("audit", "export", "--format", "csv"))
        refused = await cli.acall("audit", "export", "--reveal")
        assert refused.returncode != 0 and "APPROVALD_DATA_KEY" in refused.stderr
        assert "revealed" not in await cli.aok("audit", "export")
    provider.shutdown()
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert len(caplog.records) > 10  # slack_sdk, aiohttp, approvald: logs were taken
    assert not leaks(logged), leaks(logged)


def key_agent() -> Agent:
    @tool(permission="execute")
    async def set_webhook(url: str, signing_key: str) -> str:
        """Point a payment provider's webhook at ``url``."""
        return "ok"

    return Agent(name="key-agent", instructions="", tools=[set_webhook],
                 model=ScriptedModel.sequence([
                     reply("Setting the webhook.", ("set_webhook", {
                         "url": "https://example.com/hook", "signing_key": KEY})),
                     reply("done", turn=1)]))


@pytest.mark.parametrize("off", [None, "api_key"])
async def test_an_undeclared_api_key_is_masked_unless_its_detector_is_off(
        sqlite_url: str, tmp_path: Path, off: str | None) -> None:
    extra = {"APPROVALD_SECRET_DETECTORS_OFF": off} if off else {}
    try:
        async with harness(sqlite_url, tmp_path, **extra) as h:
            parts(h.engine).registry.add(key_agent())
            paused = await h.pause_refund(agent="key-agent", task="Set the webhook")
            card = json.dumps(await h.card(paused.approval_ids[0]), ensure_ascii=False)
            if off:
                assert KEY in card
            else:
                assert KEY not in card and "sk_live_…9f2a" in card
                assert "Sensitive values are masked" in card
    finally:
        sensitive.configure(sensitive.Detectors())


async def test_an_edit_given_back_masked_keeps_the_real_value_on_every_face(
        sqlite_url: str, tmp_path: Path) -> None:
    """The engine's one ``decide`` reads an edit of the masked view, whichever face it came
    through (the HTTP API hands its callers the masked arguments, as the card does): a
    value given back as shown keeps the real one, a value typed over is the new one."""
    received: list[dict[str, Any]] = []
    async with harness(sqlite_url, tmp_path) as h:
        parts(h.engine).registry.add(card_agent(received))
        paused = await h.pause_refund(agent="card-refund", task="Refund A-7")
        a = await h.engine.approval(paused.approval_ids[0])
        shown = sensitive.mask_args(a.effective_args(), ["card_number", "auth.*"])
        assert shown["card_number"] != CARD
        from approvald.runtime.approvals.decide import Actor
        decision = await h.engine.decide(
            a.id, actor=Actor("U_ALICE", "api"), verdict="edit",
            args={**shown, "amount_cents": 1000}, token=h.engine.button_token(a))
        assert decision.outcome == "approved"
        await wait_for(lambda: ended(h, paused.run_id))
    assert received == [{"order_id": "A-7", "amount_cents": 1000, "card_number": CARD,
                         "auth": {"code": AUTH}}]
