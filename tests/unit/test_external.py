"""External requests (the HTTP API's runtime half) without HTTP: a request is a run no
worker advances; the decision path (the CLI's here) decides it unchanged; every way a
request ends is told once, by a webhook row written with the transition."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from approvald.runtime.approvals.decide import Actor
from approvald.runtime.engine import Engine
from approvald.runtime.kernel import binding
from approvald.runtime.kernel.clock import ManualClock
from approvald.runtime.kernel.errors import DecisionRefused
from approvald.runtime.kernel.webhook_hosts import WebhookHosts
from approvald.runtime.policies.intake import IntakeError, Tighten
from approvald.runtime.policies.policy import PolicyFile
from approvald.runtime.record.outbox_kinds import CARD_POST, WEBHOOK
from approvald.runtime.requests import api_tokens
from approvald.runtime.runs import external
from approvald.runtime.runs.external import ExternalError, NewRequest, Report

from tests.helpers import Rows, create_token, follow_up

KEYS = api_tokens.WebhookKeys("approvald-test-secret-0123456789")
ALICE = Actor("U_ALICE", "cli:test")
POLICY = PolicyFile.model_validate({"tools": {
    "api:bot/deploy": {"approvers": ["U_ALICE"], "ttl": "30m"},
    "api:bot/rotate_key": {"approvers": ["U_ALICE"], "ttl": "10m", "on_expire": "escalate",
                           "escalate": [{"approvers": ["U_CFO"], "ttl": "1h"}]},
    "api:*/refund_card": {"approvers": ["U_ALICE"], "rules": [
        {"when": "args.cents <= 2000", "policy": "auto"},
        {"when": "args.cents > 100000", "approvers": ["U_ALICE", "U_BOB"], "quorum": 2}]},
}})


async def setup(make_engine: Callable[..., Engine], *, webhook: bool = True
                ) -> tuple[Engine, Any]:
    engine = make_engine(policy=POLICY)
    made = await create_token(engine, KEYS, "bot",
                              created_by="test", via="test", tools="*",
                              webhook_url="https://hooks.example/approvald"
                              if webhook else None,
                              webhook_hosts=WebhookHosts.from_setting("hooks.example"))
    return engine, made.record


async def rows(engine: Engine, kind: str) -> list[Any]:
    return await Rows.of(engine).outbox(kind)


async def approval(engine: Engine, request_id: str) -> Any:
    return external.current(await Rows.of(engine).approvals(request_id))


async def test_a_request_is_a_run_no_worker_advances(make_engine, clock: ManualClock) -> None:
    engine, token = await setup(make_engine)
    doc, new = await engine.open_request(token, NewRequest(
        tool="deploy", args={"service": "api"}, requested_by="U_DANA"))
    assert new and doc["status"] == "pending" and doc["id"].startswith("x")
    run = await Rows.of(engine).run(doc["id"])
    claimed = await Rows.of(engine).claim_runnable(owner="w", now=clock.now(), limit=10,
                                                   until=clock.now() + timedelta(seconds=30))
    assert (run.agent, run.status, claimed) == ("external:bot", "external", [])
    assert len(await rows(engine, CARD_POST)) == 1
    a = await approval(engine, doc["id"])
    decision = await engine.decide(a.id, actor=ALICE, verdict="approve")
    assert decision.outcome == "approved" and not decision.run_ready  # nothing to resume
    assert (await engine.request_document(token, doc["id"]))["status"] == "approved"
    await follow_up(engine)  # the drain follows the decision up: its webhook
    [hook] = await rows(engine, WEBHOOK)
    assert hook.payload_value()["document"]["decision"]["decided_by"] == "U_ALICE"
    with pytest.raises(DecisionRefused):  # a late answer is refused, and told to nobody
        await engine.decide(a.id, actor=ALICE, verdict="deny", reason="too late")
    await follow_up(engine)
    assert len(await rows(engine, WEBHOOK)) == 1
    assert (await Rows.of(engine).run(doc["id"])).status == "external"  # until its report


async def test_a_report_is_for_the_approved_digest_once(make_engine) -> None:
    engine, token = await setup(make_engine)
    doc, _ = await engine.open_request(token, NewRequest(
        tool="deploy", args={"service": "api"}, requested_by="U_DANA"))
    with pytest.raises(ExternalError, match="pending"):
        await engine.report_request(token, doc["id"], Report("succeeded", doc["args_digest"]))
    a = await approval(engine, doc["id"])
    await engine.decide(a.id, actor=ALICE, verdict="edit", args={"service": "api", "n": 2})
    done = await engine.request_document(token, doc["id"])
    assert done["status"] == "approved" and done["effective_args"] == {"service": "api", "n": 2}
    with pytest.raises(ExternalError) as wrong:
        await engine.report_request(token, doc["id"], Report("succeeded", doc["args_digest"]))
    assert wrong.value.code == "digest_mismatch"
    rep = Report("succeeded", done["effective_digest"], result={"ok": True})
    first, new = await engine.report_request(token, doc["id"], rep)
    again, repeated = await engine.report_request(token, doc["id"], rep)
    assert (new, repeated) == (True, False) and first == again
    assert first["result"]["result"] == {"ok": True}
    ledger = await Rows.of(engine).execution(doc["id"], external.CALL_ID)
    run = await Rows.of(engine).run(doc["id"])
    assert ledger.status == "succeeded"
    assert binding.shown(ledger.args_digest) == done["effective_digest"]  # shown keyed
    assert run.status == "completed"


async def test_escalation_keeps_it_open_and_silence_ends_it(make_engine,
                                                          clock: ManualClock) -> None:
    engine, token = await setup(make_engine)
    doc, _ = await engine.open_request(token, NewRequest(
        tool="rotate_key", args={"key": "k1"}, requested_by="U_DANA"))
    first = doc["approval_id"]
    clock.advance(timedelta(minutes=11))
    await engine.sweep()
    now = await engine.request_document(token, doc["id"])
    assert now["status"] == "pending" and now["approval_id"] != first  # the next rung asks
    await follow_up(engine)
    assert await rows(engine, WEBHOOK) == []
    clock.advance(timedelta(hours=2))
    await engine.sweep()
    ended = await engine.request_document(token, doc["id"])
    assert ended["status"] == "expired" and ended["decision"]["verdict"] == "expired"
    await follow_up(engine)
    [hook] = await rows(engine, WEBHOOK)
    assert hook.payload_value()["document"]["status"] == "expired"
    assert (await Rows.of(engine).run(doc["id"])).status == "completed"


async def test_cancelling_its_run_cancels_it(make_engine) -> None:
    engine, token = await setup(make_engine)
    doc, _ = await engine.open_request(token, NewRequest(
        tool="deploy", args={"service": "api"}, requested_by="U_DANA"))
    assert await engine.cancel(doc["id"], actor=ALICE, reason="wrong window") == "cancelled"
    ended = await engine.request_document(token, doc["id"])
    assert ended["status"] == "cancelled" and ended["decision"]["reason"] == "wrong window"
    await follow_up(engine)
    assert len(await rows(engine, WEBHOOK)) == 1


async def test_the_rules_choose_and_an_edit_stays_in_its_band(make_engine) -> None:
    engine, token = await setup(make_engine, webhook=False)
    auto, _ = await engine.open_request(token, NewRequest(
        tool="refund_card", args={"cents": 1500}, requested_by="U_DANA"))
    assert auto["status"] == "approved" and auto["decision"]["verdict"] == "auto"
    mid, _ = await engine.open_request(token, NewRequest(
        tool="refund_card", args={"cents": 50_000}, requested_by="U_DANA"))
    a = await approval(engine, mid["id"])
    for cents in (1000, 500_000):  # into auto, into the two-person band: both refused
        with pytest.raises(DecisionRefused) as refused:
            await engine.decide(a.id, actor=ALICE, verdict="edit", args={"cents": cents})
        assert refused.value.reason == "rule_changed"
    await engine.decide(a.id, actor=ALICE, verdict="edit", args={"cents": 40_000})
    assert (await engine.request_document(token, mid["id"]))["effective_args"] == {"cents": 40_000}
    big, _ = await engine.open_request(token, NewRequest(
        tool="refund_card", args={"cents": 500_000}, requested_by="U_DANA"))
    assert (await approval(engine, big["id"])).quorum == 2
    assert await rows(engine, WEBHOOK) == []  # neither the token nor the requests name a URL


async def test_a_waiter_wakes_on_a_decision_in_this_process(make_engine, monkeypatch) -> None:
    monkeypatch.setattr(external, "POLL", 60.0)  # no polling: only the wake-up can end it
    engine, token = await setup(make_engine)
    doc, _ = await engine.open_request(token, NewRequest(
        tool="deploy", args={"service": "api"}, requested_by="U_DANA"))
    waiting = asyncio.ensure_future(engine.wait_request(token, doc["id"], seconds=30))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    await engine.decide(doc["approval_id"], actor=ALICE, verdict="deny", reason="no")
    told = await asyncio.wait_for(waiting, 5)
    assert told["status"] == "denied" and told["decision"]["reason"] == "no"
    stop = asyncio.Event()
    other, _ = await engine.open_request(token, NewRequest(
        tool="deploy", args={"service": "web"}, requested_by="U_DANA"))
    waiting = asyncio.ensure_future(engine.wait_request(token, other["id"], seconds=30,
                                                         stop=stop))
    await asyncio.sleep(0.05)
    stop.set()  # a stopping server answers its long polls at once
    assert (await asyncio.wait_for(waiting, 5))["status"] == "pending"


async def test_an_answer_of_the_policy_is_told_too(make_engine) -> None:
    engine, token = await setup(make_engine)
    auto, _ = await engine.open_request(token, NewRequest(
        tool="refund_card", args={"cents": 100}, requested_by="U_DANA"))
    [hook] = await rows(engine, WEBHOOK)
    told = hook.payload_value()["document"]
    assert (told["id"], told["status"], told["decision"]["decided_by"]) == (
        auto["id"], "approved", "policy")
    entries = [e.action for e in await Rows.of(engine).audit(run_id=auto["id"])]
    assert entries == ["requested", "approved"]


async def test_a_tightened_wait_never_hands_an_escalating_request_to_the_next_rung_early(
        make_engine, clock: ManualClock) -> None:
    """Issue 46 item 6: ``tighten.ttl = "1s"`` on a ladder of 10 minutes then the CFO handed
    the request to the CFO within 2 s: a "stricter" request chose its approver. A shorter
    wait on an escalating policy is refused (the ladder's timing is the operator's), and
    nothing is asked; the same wait on a policy that cancels is taken."""
    engine, token = await setup(make_engine)
    with pytest.raises(IntakeError) as refused:
        await engine.open_request(token, NewRequest(
            tool="rotate_key", args={"key": "k1"}, requested_by="U_DANA",
            tighten=Tighten(ttl=timedelta(seconds=1))))
    assert refused.value.code == "looser_than_policy"
    assert refused.value.field == "tighten.ttl" and "next rung" in str(refused.value)
    assert await Rows.of(engine).requests() == []
    # the operator's own wait, restated, changes nothing and is taken
    doc, _ = await engine.open_request(token, NewRequest(
        tool="rotate_key", args={"key": "k2"}, requested_by="U_DANA",
        tighten=Tighten(ttl=timedelta(minutes=10))))
    clock.advance(timedelta(minutes=9))
    await engine.sweep()
    a = await approval(engine, doc["id"])
    assert (a.status, a.rung, a.approvers_value()) == ("pending", 0, ["U_ALICE"])
    # on a policy that cancels, a shorter wait is stricter: taken
    short, _ = await engine.open_request(token, NewRequest(
        tool="deploy", args={"service": "api"}, requested_by="U_DANA",
        tighten=Tighten(ttl=timedelta(seconds=1))))
    assert short["status"] == "pending"
    clock.advance(timedelta(seconds=2))
    await engine.sweep()
    assert (await engine.request_document(token, short["id"]))["status"] == "expired"
