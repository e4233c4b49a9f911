"""Webhook observation is an outbox row, not a reaction inside the decision (issue 47).

The transaction that decides a caller's request (a click, the CLI, the sweep, a cancel)
queues one ``request.decided`` row, worked out from what it audited; the drain follows it
up in a transaction of its own: the decision webhook (the payload as before) is queued and
the run of a request that will not run is ended. So a webhook goes out once per decision,
a crash between the decision's commit and its follow-up loses nothing, and a follow-up
that fails can neither slow nor roll back the decision.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from approvald.runtime.approvals.decide import Actor
from approvald.runtime.engine import Engine
from approvald.runtime.kernel import failpoints
from approvald.runtime.kernel.webhook_hosts import WebhookHosts
from approvald.runtime.policies.policy import PolicyFile
from approvald.runtime.record.outbox import DrainConfig
from approvald.runtime.record.outbox_kinds import REQUEST_DECIDED, WEBHOOK
from approvald.runtime.requests import api_tokens
from approvald.runtime.runs.external import ExternalRequests, NewRequest
from approvald.store.db import Database

from tests.helpers import Crash, Rows, crash, create_token, follow_up, parts
from tests.unit.test_intake_statements import Statements, statements  # noqa: F401

ALICE = Actor("U_ALICE", "slack")
KEYS = api_tokens.WebhookKeys("approvald-test-secret-0123456789")
POLICY = PolicyFile.model_validate({"tools": {"api:*/deploy": {"approvers": ["U_ALICE"]}}})


async def asked(make_engine: Callable[..., Engine]) -> tuple[Engine, Any, dict[str, Any]]:
    engine = make_engine(policy=POLICY)
    made = await create_token(engine, KEYS, "bot",
                              created_by="test", via="test", tools="*",
                              webhook_url="https://hooks.example/approvald",
                              webhook_hosts=WebhookHosts.from_setting("hooks.example"))
    doc, _ = await engine.open_request(made.record, NewRequest(
        tool="deploy", args={"service": "api"}, requested_by="U_DANA"))
    return engine, made.record, doc


async def rows(engine: Engine, kind: str) -> list[Any]:
    return await Rows.of(engine).outbox(kind)


async def run_status(engine: Engine, run_id: str) -> str:
    return str((await Rows.of(engine).run(run_id)).status)


async def test_a_webhook_is_queued_once_per_decision_with_the_document_as_read(
        make_engine) -> None:
    engine, token, doc = await asked(make_engine)
    await engine.decide(doc["approval_id"], actor=ALICE, verdict="approve")
    assert await rows(engine, WEBHOOK) == []  # not in the deciding transaction
    [followed] = await rows(engine, REQUEST_DECIDED)
    assert followed.payload_value() == {"run_id": doc["id"], "approval_id": doc["approval_id"]}
    assert followed.group_key == f"{WEBHOOK}:{doc['id']}"  # its webhook follows it in order
    await follow_up(engine)
    [hook] = await rows(engine, WEBHOOK)
    assert hook.payload_value() == {
        "run_id": doc["id"], "token_id": token.id, "url": "https://hooks.example/approvald",
        "event": "decision", "document": await engine.request_document(token, doc["id"])}
    # the follow-up again (a drain that died before marking it delivered): nobody is told
    # twice, and more drains add nothing
    assert (await parts(engine).external.deliver(followed)) == {"told": False}
    await follow_up(engine)
    assert len(await rows(engine, WEBHOOK)) == 1
    # a later decision on the same request (its run cancelled after the approval): its own
    assert await engine.cancel(doc["id"], actor=ALICE, reason="wrong window") == "cancelled"
    await follow_up(engine)
    first, second = sorted(await rows(engine, WEBHOOK), key=lambda r: r.id)
    assert first.id == hook.id
    assert second.payload_value()["document"]["status"] == "cancelled"


async def test_a_denial_ends_its_run_in_the_follow_up(make_engine) -> None:
    engine, token, doc = await asked(make_engine)
    await engine.decide(doc["approval_id"], actor=ALICE, verdict="deny", reason="no")
    assert (await engine.request_document(token, doc["id"]))["status"] == "denied"  # at once
    await follow_up(engine)
    assert await run_status(engine, doc["id"]) == "completed"
    [hook] = await rows(engine, WEBHOOK)
    assert hook.payload_value()["document"]["decision"]["reason"] == "no"


@pytest.mark.parametrize("where", ["after_decision", "after_post_before_mark"])
async def test_a_crash_between_the_commit_and_the_webhook_loses_nothing(
        make_engine, where: str) -> None:
    """The process dies after the decision committed (before anything told anyone), or
    after the drain followed it up but before it marked the row delivered; a process
    started afterwards queues the webhook exactly once."""
    engine, _, doc = await asked(make_engine)
    failpoints.arm(where, crash)
    try:
        with pytest.raises(Crash):
            await engine.decide(doc["approval_id"], actor=ALICE, verdict="approve")
            await follow_up(engine)
    finally:
        failpoints.arm("")
    restarted = make_engine(policy=POLICY)
    parts(restarted).clock.advance(DrainConfig().claim_ttl * 2)  # (a dead drain's claim lapses)
    await follow_up(restarted)
    [hook] = await rows(restarted, WEBHOOK)
    assert hook.payload_value()["document"]["status"] == "approved"
    assert [r.status for r in await rows(restarted, REQUEST_DECIDED)] == ["delivered"]


async def test_a_failing_follow_up_neither_rolls_back_nor_loses_the_decision(
        make_engine, monkeypatch: pytest.MonkeyPatch) -> None:
    engine, token, doc = await asked(make_engine)
    real = ExternalRequests._decided_in

    async def broken(self: ExternalRequests, *args: Any) -> bool:
        raise RuntimeError("the follow-up broke")

    monkeypatch.setattr(ExternalRequests, "_decided_in", broken)
    decision = await engine.decide(doc["approval_id"], actor=ALICE, verdict="deny",
                                   reason="no")
    assert decision.outcome == "denied"  # committed, whatever the follow-up does
    await follow_up(engine)
    [row] = await rows(engine, REQUEST_DECIDED)
    assert row.status == "pending" and "the follow-up broke" in (row.last_error or "")
    assert await rows(engine, WEBHOOK) == []
    assert (await engine.request_document(token, doc["id"]))["status"] == "denied"
    monkeypatch.setattr(ExternalRequests, "_decided_in", real)
    parts(engine).clock.advance(timedelta(seconds=DrainConfig().max_backoff))  # its retry is due
    await follow_up(engine)
    assert len(await rows(engine, WEBHOOK)) == 1


async def test_the_deciding_transaction_runs_no_observer(
        make_engine, db: Database,
        statements: Statements) -> None:  # noqa: F811 (the counting fixture)
    """What the old observer sent in every decision of a caller's request (its request's
    row read and marked, its run read and ended, its webhook built) is gone from the
    decision: one outbox row more than a decision on an agent's call, no statement about
    the request."""
    engine, token, doc = await asked(make_engine)
    second, _ = await engine.open_request(token, NewRequest(
        tool="deploy", args={"service": "web"}, requested_by="U_DANA"))
    await engine.decide(doc["approval_id"], actor=ALICE, verdict="deny", reason="warm-up")
    window = statements.during()
    await engine.decide(second["approval_id"], actor=ALICE, verdict="deny", reason="no")
    sent = window.sent
    assert not [s for s in sent if "external_requests" in s], sent
    kinds = window.kinds()
    # the decision's own look at waking its run (not one to wake); the card's redraw and
    # the follow-up row (on PostgreSQL the first two ride in the decision's statement,
    # ``WITH vote ..., card AS (INSERT INTO outbox ...), woke AS (UPDATE runs ...)``)
    if db.dialect == "postgresql":
        assert kinds["UPDATE runs"] == 0 and kinds["INSERT outbox"] == 1, kinds
        assert sum(s.startswith("WITH vote AS") and "card AS (INSERT INTO outbox" in s
                   and "woke AS (UPDATE runs" in s for s in sent) == 1, sent
    else:
        assert kinds["UPDATE runs"] == 1 and kinds["INSERT outbox"] == 2, kinds
