"""The outbox drain gives up by time, not by count: waits are not failures (both dialects).

Names added by this change (``delivery.dead``, ``give_up_time``) are spelled out or
imported inside the tests that need them, so on a tree without them these tests fail on
behaviour, not at collection.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from approvald.runtime.engine import Engine
from approvald.runtime.kernel.clock import ManualClock
from approvald.runtime.record.outbox import DrainConfig, OutboxDrain
from approvald.runtime.record.outbox_kinds import RetryLater, Undeliverable
from approvald.store.records import OutboxRecord
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_slack_response import AsyncSlackResponse

from tests.helpers import Rows

NOTICE = "tool.notice"
DEAD_REPORT = "delivery.dead"


class Scripted:
    """A deliverer whose every try raises what ``fail(row)`` returns (None: delivered)."""

    def __init__(self, fail: Callable[[OutboxRecord], Exception | None]) -> None:
        self.fail = fail
        self.tries: list[tuple[int, str]] = []
        self.delivered: list[int] = []

    async def deliver(self, row: OutboxRecord) -> dict[str, Any] | None:
        self.tries.append((row.id, row.kind))
        exc = self.fail(row)
        if exc is not None:
            raise exc
        self.delivered.append(row.id)
        return {"ok": True}


def drain_for(engine: Engine, deliverer: Scripted) -> OutboxDrain:
    return engine.drain(deliverer, DrainConfig(patience=0))


async def add_notice(engine: Engine, clock: ManualClock, group: str = "run-1") -> int:
    return await Rows.of(engine).add_outbox(
        kind=NOTICE, group_key=group, now=clock.now(),
        payload=json.dumps({"run_id": group, "call_id": "c1"}))


def errors(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [x for x in caplog.records
            if x.levelno == logging.ERROR and x.name == "approvald.outbox"]


async def rows(engine: Engine) -> list[OutboxRecord]:
    return await Rows.of(engine).outbox()


async def row(engine: Engine, outbox_id: int) -> OutboxRecord:
    found = await Rows.of(engine).outbox_row(outbox_id)
    assert found is not None
    return found


async def test_a_long_rate_limit_is_waited_out_never_fatal(make_engine, clock) -> None:
    """Five hours of 429s (Retry-After 60 s): 300 waits, the row stays pending, then lands."""
    engine = make_engine()
    oid = await add_notice(engine, clock)
    limited = True
    deliverer = Scripted(lambda r: RetryLater("Slack rate limit", after=60) if limited
                         else None)
    drain = drain_for(engine, deliverer)
    for _ in range(300):
        assert await drain.drain_once() == 0
        r = await row(engine, oid)
        assert r.status == "pending", r.last_error
        assert r.not_before - clock.now() == timedelta(seconds=60)  # exactly as asked
        clock.advance(timedelta(seconds=60))
    limited = False
    assert await drain.drain_once() == 1
    r = await row(engine, oid)
    assert (r.status, r.waits, deliverer.delivered) == ("delivered", 300, [oid])
    assert [x.kind for x in await rows(engine)] == [NOTICE]  # nothing was reported dead


async def test_failures_back_off_exponentially_with_jitter_under_a_cap(make_engine,
                                                                      clock) -> None:
    engine = make_engine()
    oid = await add_notice(engine, clock)
    drain = drain_for(engine, Scripted(lambda r: RetryLater("Slack answered HTTP 503")))
    delays = []
    for _ in range(40):  # far past the old 25-attempt limit
        await drain.drain_once()
        r = await row(engine, oid)
        assert r.status == "pending"
        delays.append((r.not_before - clock.now()).total_seconds())
        clock.set(r.not_before)
    for n, delay in enumerate(delays[:8]):
        assert 0.8 * 2 ** n <= delay <= 1.2 * 2 ** n
    assert max(delays) <= 300  # the cap holds, jitter included
    assert delays[-1] >= 240  # and it is reached
    assert (await row(engine, oid)).waits == 0


async def test_waits_do_not_grow_the_backoff(make_engine, clock) -> None:
    engine = make_engine()
    oid = await add_notice(engine, clock)
    tries = 0

    def fail(r: OutboxRecord) -> Exception:
        nonlocal tries
        tries += 1
        return RetryLater("rate", after=5) if tries <= 20 else RetryLater("HTTP 500")
    drain = drain_for(engine, Scripted(fail))
    for _ in range(21):
        await drain.drain_once()
        r = await row(engine, oid)
        delay = (r.not_before - clock.now()).total_seconds()
        clock.set(r.not_before)
    assert 0.8 <= delay <= 1.2  # the first failure backs off 1 s, not 2**20 s
    assert r.waits == 20 and r.attempts == 21


async def test_a_row_gives_up_at_its_deadline_and_reports_itself_once(make_engine, clock,
                                                                     caplog) -> None:
    engine = make_engine()
    created = clock.now()
    oid = await add_notice(engine, clock)
    drain = drain_for(engine, Scripted(lambda r: RetryLater("Slack answered HTTP 502")))
    await drain.drain_once()
    give_up = created + timedelta(hours=24)  # a notice's window: a day
    clock.set(give_up - timedelta(seconds=1))
    await drain.drain_once()
    r = await row(engine, oid)
    assert r.status == "pending"
    assert r.not_before == give_up  # the last try falls on the deadline, not after it
    clock.set(give_up)
    with caplog.at_level(logging.ERROR, logger="approvald.outbox"):
        await drain.drain_once()
    r = await row(engine, oid)
    assert r.status == "dead" and r.last_error == "Slack answered HTTP 502"
    assert r.give_up_at == give_up
    [line] = errors(caplog)
    msg = line.getMessage()
    assert f"outbox {oid} ({NOTICE}, run run-1) is dead" in msg
    assert "attempt" in msg and "wait" in msg and "HTTP 502" in msg
    assert f"approvald outbox retry {oid}" in msg
    [report] = [x for x in await rows(engine) if x.kind == DEAD_REPORT]
    body = report.payload_value()
    assert body["outbox_id"] == oid and body["kind"] == NOTICE and body["run_id"] == "run-1"
    assert body["attempts"] == r.attempts and body["waits"] == 0
    assert "HTTP 502" in body["error"]
    assert report.status == "pending" and report.give_up_at == clock.now() + timedelta(days=1)


async def test_a_dead_report_that_dies_does_not_cascade(make_engine, clock, caplog) -> None:
    engine = make_engine()
    oid = await add_notice(engine, clock)
    deliverer = Scripted(lambda r: Undeliverable("Slack said channel_not_found"))
    drain = drain_for(engine, deliverer)
    with caplog.at_level(logging.ERROR, logger="approvald.outbox"):
        await drain.drain_once()
        await drain.drain_once()
        await drain.drain_once()
    everything = await rows(engine)
    assert [(x.kind, x.status) for x in everything] == [(NOTICE, "dead"),
                                                      (DEAD_REPORT, "dead")]
    assert everything[1].payload_value()["outbox_id"] == oid
    assert len(errors(caplog)) == 2
    assert len(deliverer.tries) == 2


async def test_an_approval_card_gives_up_at_the_request_expiry(make_engine, clock) -> None:
    engine = make_engine()
    paused = await engine.run("demo-refund", "Refund order A-1001, double charged",
                              requested_by="U_DANA")
    [aid] = paused.approval_ids
    a = await Rows.of(engine).approval(aid)
    assert a is not None
    drain = drain_for(engine, Scripted(lambda r: RetryLater("Slack refused the token")))
    await drain.drain_once()
    [card] = await rows(engine)
    assert card.kind == "approval.requested"
    while clock.now() < a.expires_at:
        card = await row(engine, card.id)
        assert card.status == "pending"
        assert card.not_before <= a.expires_at
        clock.set(card.not_before)
        await drain.drain_once()
    card = await row(engine, card.id)
    assert card.status == "dead" and card.give_up_at == a.expires_at


async def test_the_update_of_a_decided_request_keeps_trying_for_a_day(make_engine,
                                                                      clock) -> None:
    from approvald.runtime.approvals.decide import Actor

    engine = make_engine()
    paused = await engine.run("demo-refund", "Refund order A-1001, double charged",
                              requested_by="U_DANA")
    [aid] = paused.approval_ids
    drain = drain_for(engine, Scripted(
        lambda r: RetryLater("HTTP 503") if r.kind == "approval.updated" else None))
    await drain.drain_once()  # the card is posted
    clock.advance(timedelta(minutes=20))
    await engine.decide(aid, actor=Actor("U_ALICE", "cli:ops"), verdict="deny",
                        reason="no")
    decided_at = clock.now()
    clock.advance(timedelta(hours=2))  # past the request's expiry: the update still tries
    await drain.drain_once()
    [update] = [r for r in await rows(engine) if r.kind == "approval.updated"]
    assert update.status == "pending"
    assert update.give_up_at == decided_at + timedelta(hours=24)



async def test_a_card_slack_does_not_take_mails_its_request_at_once(make_engine,
                                                                    clock) -> None:
    """Past ``mail_fallback_after`` the card's failed try queues its request's mail: it goes
    out at once, not at the drain's next poll (a second in serve, an hour here)."""
    engine = make_engine()
    await engine.run("demo-refund", "Refund order A-1001, double charged",
                     requested_by="U_DANA")
    deliverer = Scripted(lambda r: RetryLater("Slack unreachable")
                         if r.kind == "approval.requested" else None)
    drain = engine.drain(deliverer, DrainConfig(patience=0, mail_fallback=True,
                                                mail_fallback_after=timedelta(minutes=5)))
    stop = asyncio.Event()
    running = asyncio.create_task(drain.run(stop, interval=3600))
    try:
        await until(lambda: deliverer.tries)  # the card's first try, at start
        clock.advance(timedelta(minutes=5, seconds=1))
        drain.wake()  # its next try mails the request
        await until(lambda: [kind for _, kind in deliverer.tries if kind == "mail.request"])
        assert [kind for _, kind in deliverer.tries] == [
            "approval.requested", "approval.requested", "mail.request"]
    finally:
        stop.set()
        await running


async def until(predicate: Callable[[], object]) -> None:
    """Let the drain's task run until ``predicate`` holds: within 10 s, not a poll's hour."""
    for _ in range(2000):
        if predicate():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("the drain did not get there without its next poll")

def test_deadlines_by_kind() -> None:
    from approvald.runtime.record.outbox import give_up_time

    clock = ManualClock()
    t0 = clock.now()

    def rec(kind: str, give_up_at=None) -> OutboxRecord:  # type: ignore[no-untyped-def]
        return OutboxRecord(id=1, kind=kind, group_key="g", payload="{}", status="pending",
                            attempts=0, not_before=t0, claimed_by=None, claimed_until=None,
                            created_at=t0, delivered_at=None, last_error=None, result=None,
                            give_up_at=give_up_at, waits=0)
    soon, late = t0 + timedelta(minutes=30), t0 + timedelta(days=3)
    day = t0 + timedelta(hours=24)
    assert give_up_time(rec("approval.requested"), soon) == soon
    assert give_up_time(rec("approval.reminder"), soon) == soon
    # an update of an open request: while it lives, and at least a day
    assert give_up_time(rec("approval.updated"), soon) == day
    assert give_up_time(rec("approval.updated"), late) == late
    # of a closed one (the decision or the expiry should reach the card): a day
    assert give_up_time(rec("approval.updated"), late, decided=True) == day
    assert give_up_time(rec("approval.requested"), soon, decided=True) == soon
    for kind in ("tool.notice", "audit.head", DEAD_REPORT, "something.else"):
        assert give_up_time(rec(kind), None) == day  # written before deadlines: a day
    assert give_up_time(rec("approval.requested"), None) == day  # its approval is gone
    assert give_up_time(rec("approval.requested", give_up_at=late), soon) == late


async def test_redrive_revives_dead_rows_and_leaves_delivered_ones(make_engine,
                                                                   clock) -> None:
    engine = make_engine()
    dead_id = await add_notice(engine, clock, "run-1")
    done_id = await add_notice(engine, clock, "run-2")
    drain = drain_for(engine, Scripted(
        lambda r: None if r.id == done_id else Undeliverable("gone")))
    await drain.drain_once()
    clock.advance(timedelta(hours=30))
    revived = await Rows.of(engine).redrive([dead_id, done_id], now=clock.now(),
                                            give_up_at=clock.now() + timedelta(days=1))
    assert [r.id for r in revived] == [dead_id]
    r = revived[0]
    assert (r.status, r.not_before, r.give_up_at) == ("pending", clock.now(),
                                                      clock.now() + timedelta(days=1))
    assert r.last_error == "gone"  # why it died stays visible until it is delivered
    assert (await row(engine, done_id)).status == "delivered"
    # --all: only dead rows (the report)
    again = await Rows.of(engine).redrive(None, now=clock.now(), give_up_at=clock.now())
    assert [x.kind for x in again] == [DEAD_REPORT]
    clock.advance(timedelta(minutes=1))
    # a waiting row: only its next try moves
    [nudged] = await Rows.of(engine).redrive([dead_id], now=clock.now(),
                                             give_up_at=clock.now() + timedelta(days=9))
    assert (nudged.not_before, nudged.give_up_at) == (clock.now(),
                                                      r.give_up_at)


def _slack_error(status: int, body: dict[str, Any],
                 headers: dict[str, str] | None = None) -> SlackApiError:
    resp = AsyncSlackResponse(client=None, http_verb="POST", api_url="chat.postMessage",
                              req_args={}, data=body, headers=headers or {},
                              status_code=status)
    return SlackApiError("failed", resp)


@pytest.mark.parametrize("error", ["token_revoked", "invalid_auth", "account_inactive"])
def test_a_refused_token_is_a_failure_not_a_wait(error: str) -> None:
    from approvald.bot.slack.delivery import classify

    got = classify(_slack_error(200, {"ok": False, "error": error}))
    assert isinstance(got, RetryLater) and got.after is None
    assert error in str(got) and "SLACK_BOT_TOKEN" in str(got)


def test_a_rate_limit_is_a_wait_for_retry_after() -> None:
    from approvald.bot.slack.delivery import classify

    got = classify(_slack_error(429, {"ok": False, "error": "ratelimited"},
                                {"Retry-After": "42"}))
    assert isinstance(got, RetryLater) and got.after == 42.0
    got = classify(_slack_error(429, {"ok": False, "error": "ratelimited"},
                                {"Retry-After": "soon"}))
    assert isinstance(got, RetryLater) and got.after == 1.0
    got = classify(_slack_error(503, {"ok": False, "error": "service_unavailable"}))
    assert isinstance(got, RetryLater) and got.after is None


def test_a_plain_text_5xx_is_named_as_such() -> None:
    from approvald.bot.slack.delivery import classify

    resp = AsyncSlackResponse(client=None, http_verb="POST", api_url="chat.postMessage",
                              req_args={}, data="Service Unavailable",  # type: ignore[arg-type]
                              headers={}, status_code=503)
    got = classify(SlackApiError("failed", resp))
    assert isinstance(got, RetryLater) and got.after is None
    assert str(got) == "Slack answered HTTP 503"
    assert isinstance(classify(_slack_error(200, {"ok": False, "error": "channel_not_found"})),
                      Undeliverable)
