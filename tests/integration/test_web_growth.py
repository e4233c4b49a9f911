"""What anyone on the network can make the web review queue store is bounded: a refusal
of someone unknown is counted (one audit entry per source and minute, small), not chained
entry by entry; a refusal of someone known stays an entry of its own; beginning a sign-in
with Slack writes nothing; and every web table's expired rows are pruned by the retention
job serve runs. Real HTTP against serve's listener, real databases, the injected clock."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from approvald.runtime.kernel.clock import ManualClock

from tests.helpers import Rows
from tests.integration.slack_harness import Harness
from tests.integration.test_web_slack_sign_in import SLACK, begin, sign_in_with_slack
from tests.integration.web_helpers import Browser, form_fields, smtp_server, web_harness


async def rows(h: Harness, table: str) -> int:
    return await Rows.of(h.engine).count(table)


async def refused_entries(h: Harness) -> list[Any]:
    return [e for e in await Rows.of(h.engine).audit() if e.action == "web_refused"]


def at_minute_start() -> ManualClock:
    now = datetime.now(UTC).replace(second=5, microsecond=0)
    return ManualClock(now)


async def test_anonymous_refusals_are_counted_not_chained(db_url: str, tmp_path: Path) -> None:
    clock = at_minute_start()
    async with smtp_server() as (inbox, smtp_port), \
            web_harness(db_url, tmp_path, clock=clock, smtp_port=smtp_port) as (h, url):
        paused = await h.pause_refund()
        [aid] = paused.approval_ids
        anyone = Browser(url)
        try:
            entries = await rows(h, "audit_log")
            # sixty decision POSTs with no session, each with a 7 KB path, and a few from
            # another origin: nobody is known, so each is counted and nothing is chained
            for _ in range(60):
                status, _ = await anyone.post("/review/requests/" + "x" * 7000,
                                              {"verdict": "approve", "digest": "d"})
                assert status == 401
            for _ in range(5):
                status, _ = await anyone.post(f"/review/requests/{aid}", {},
                                              origin="https://evil.example")
                assert status == 403
            assert await rows(h, "audit_log") == entries
            assert await rows(h, "web_refusal_counts") == 2
            # the minute closes; the fold (serve's, every minute) chains one entry for it
            assert h.service.scheduler.scheduler.get_job("web-refusals") is not None
            assert await h.service.web.auth.refusals.fold() == 0  # not closed long enough
            clock.advance(timedelta(minutes=2))
            assert await h.service.web.auth.refusals.fold() == 1
            assert await rows(h, "audit_log") == entries + 1
            [entry] = await refused_entries(h)
            details = json.loads(entry.details)
            assert entry.actor == "anonymous" and entry.via == "web"
            assert details == {"source": "127.0.0.1", "count": 65,
                               "minute": details["minute"],
                               "reasons": {"no_session": 60, "cross_origin": 5}}
            assert datetime.fromisoformat(details["minute"]).second == 0
            assert len(entry.details) < 200  # no request echo
            assert await rows(h, "web_refusal_counts") == 0
            assert await h.service.web.auth.refusals.fold() == 0  # each count once

            # a refusal of someone known stays an entry of its own, at once, and small
            alice = Browser(url)
            try:
                await alice.sign_in(inbox, "alice@example.com")
                _, page = await alice.get("/review")
                approve = form_fields(page, action=f"/review/requests/{aid}",
                                      verdict="approve")
                before = await rows(h, "audit_log")
                status, _ = await alice.post(f"/review/requests/{aid}",
                                             {k: v for k, v in approve.items() if k != "csrf"})
                assert status == 403
                status, _ = await alice.post(f"/review/requests/{aid}", approve,
                                             origin="https://evil.example")
                assert status == 403
            finally:
                await alice.close()
            assert await rows(h, "audit_log") == before + 2
            *_, csrf, cross = await refused_entries(h)
            assert (csrf.actor, csrf.approval_id) == ("U_ALICE", aid)
            assert json.loads(csrf.details) == {"reason": "csrf",
                                                "path": "/review/requests/{id}"}
            assert cross.actor == "U_ALICE" and json.loads(cross.details) == {
                "reason": "cross_origin", "path": "/review/requests/{id}",
                "origin": "https://evil.example"}
            assert (await h.approval(aid)).status == "pending"
        finally:
            await anyone.close()


async def test_beginning_sign_ins_with_slack_writes_nothing(db_url: str,
                                                            tmp_path: Path) -> None:
    """Anyone may press "Sign in with Slack" as often as they like: nothing is stored
    until Slack has signed a browser in, and then one row, pruned once expired."""
    async with web_harness(db_url, tmp_path, **SLACK) as (h, url):
        entries = await rows(h, "audit_log")
        for _ in range(5):
            b = Browser(url)  # a new browser (a new cookie) each time, and the same one
            try:
                for _ in range(6):
                    await begin(b)
            finally:
                await b.close()
        assert await rows(h, "web_slack_states") == 0
        assert await rows(h, "audit_log") == entries
        h.emulator.openid.sign_in_as("U_ALICE")
        alice = Browser(url)
        try:
            status, _ = await sign_in_with_slack(alice)
            assert status == 200
        finally:
            await alice.close()
        assert await rows(h, "web_slack_states") == 1


async def test_every_web_table_is_pruned_once_expired(db_url: str, tmp_path: Path) -> None:
    clock = at_minute_start()
    async with smtp_server() as (inbox, smtp_port), \
            web_harness(db_url, tmp_path, clock=clock, smtp_port=smtp_port,
                        **SLACK) as (h, url):
        assert h.service.scheduler.scheduler.get_job("web-expired") is not None
        alice, bob, dana = Browser(url), Browser(url), Browser(url)
        try:
            await alice.sign_in(inbox, "alice@example.com")  # a used link, a session
            assert await bob.ask_link("bob@example.com") == 200  # a link never used
            bob_link = await inbox.link_for("bob@example.com")
            h.emulator.openid.sign_in_as("U_DANA")
            status, _ = await sign_in_with_slack(dana)  # a used state, a session
            assert status == 200
            tables = ("web_links", "web_sessions", "web_slack_states")
            first = {t: await rows(h, t) for t in tables}
            assert first == {"web_links": 2, "web_sessions": 2, "web_slack_states": 1}
            # expired, but not for a day yet: kept (a late link is told it expired)
            clock.advance(timedelta(hours=1))
            await h.service.prune_expired()
            assert {t: await rows(h, t) for t in tables} == first
            status, body = await bob.get(bob_link)
            assert status == 410 and "expired" in body
            # a day later they go; what is live now stays
            clock.advance(timedelta(days=1))
            await alice.sign_in(inbox, "alice@example.com", nth=1)
            await h.service.prune_expired()
            assert {t: await rows(h, t) for t in tables} == {
                "web_links": 1, "web_sessions": 1, "web_slack_states": 0}
            status, page = await alice.get("/review")
            assert status == 200 and "Sign out" in page  # the live session still works
        finally:
            for b in (alice, bob, dana):
                await b.close()
