"""The web review queue end to end: real HTTP against serve's listener, a real SMTP server
on loopback (aiosmtpd), real databases, the Slack emulator for the card, time moved by the
injected clock. Sign-in by a single-use mailed link; a decision on the queue page resumes
the run, updates the Slack card, runs the call once and is audited ``via: web``; every
refusal is a status, an audit entry and nothing else."""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from approvald.bot.web.routes import SESSION_COOKIE
from approvald.runtime.approvals.decide import Actor
from approvald.runtime.kernel import binding
from approvald.runtime.kernel.clock import ManualClock
from approvald.runtime.kernel.vocabulary import WORDS, OutcomeName

from tests.helpers import Rows
from tests.integration.slack_harness import Harness, wait_for
from tests.integration.web_helpers import (
    Browser,
    Tally,
    form_fields,
    refusal_tally,
    smtp_server,
    web_harness,
)


async def audit(h: Harness, action: str) -> list[Any]:
    return [e for e in await Rows.of(h.engine).audit() if e.action == action]


async def refusals(h: Harness) -> list[dict[str, Any]]:
    return [json.loads(e.details) for e in await audit(h, "web_refused")]


async def sql(h: Harness, query: str) -> list[tuple[Any, ...]]:
    return await Rows.of(h.engine).select(query)


async def one_session(h: Harness, b: Browser, user: str) -> Any:
    """``b`` holds the one session, ``user``'s; only its id's hash is stored; its sign-in
    audited (the entry is returned)."""
    sid = b.cookie(SESSION_COOKIE)
    assert sid
    stored = await sql(h, "SELECT id_hash, user_id FROM web_sessions")
    assert len(stored) == 1 and stored[0][1] == user and sid not in str(stored)
    [signed_in] = await audit(h, "web_signed_in")
    assert signed_in.actor == user and signed_in.via == "web"
    return signed_in


async def counts(h: Harness) -> dict[str, int]:
    """What a refusal must not change: sessions, used links, decisions."""
    [(sessions, used, decided, votes)] = await sql(
        h, "SELECT (SELECT count(*) FROM web_sessions), "
           "(SELECT count(*) FROM web_links WHERE used_at IS NOT NULL), "
           "(SELECT count(*) FROM approvals WHERE status <> 'pending'), "
           "(SELECT count(*) FROM approval_votes)")
    return {"sessions": sessions, "used": used, "decided": decided, "votes": votes}


async def _status(h: Harness, run_id: str, status: str) -> Any:
    run = await h.run(run_id)
    return run if run.status == status else None


async def test_sign_in_by_mail_and_approve_on_the_queue_page(db_url: str,
                                                             tmp_path: Path) -> None:
    async with smtp_server() as (inbox, smtp_port), \
            web_harness(db_url, tmp_path, smtp_port=smtp_port) as (h, url):
        paused = await h.pause_refund()  # requested by U_DANA
        [aid] = paused.approval_ids
        await h.card(aid)
        alice = Browser(url)
        dana = Browser(url)
        try:
            assert await alice.ask_link("Alice@Example.com") == 200
            link = await inbox.link_for("alice@example.com")
            [mail] = inbox.to("alice@example.com")
            assert mail["From"].addresses[0].addr_spec == "approvals@example.com"
            # the link's token is nowhere in the database: only its hash, and no outbox row
            # holds it either
            token = link.rsplit("/", 1)[1]
            dump = str(await sql(h, "SELECT * FROM web_links")) \
                + str(await sql(h, "SELECT payload, result FROM outbox"))
            assert token not in dump
            # opening the link (a mail scanner's prefetch) signs nobody in, uses nothing
            before = await counts(h)
            for _ in range(2):
                status, page = await alice.get(link)
                assert status == 200 and "Sign in" in page and "U_ALICE" in page
            assert await counts(h) == before
            status, _ = await alice.post("/review/sign-in",
                                         form_fields(page, action="/review/sign-in"))
            assert status == 303
            cookie = alice.last.headers.getall("Set-Cookie")  # type: ignore[union-attr]
            session_cookie = next(c for c in cookie if c.startswith(SESSION_COOKIE + "="))
            assert "HttpOnly" in session_cookie and "SameSite=Strict" in session_cookie
            assert "Secure" not in session_cookie  # the public URL is http here
            # only the session id's hash is stored
            await one_session(h, alice, "U_ALICE")

            status, page = await alice.get("/review")
            assert status == 200
            # the card's packet and exact arguments
            a = await h.approval(aid)
            assert "issue_refund" in page and "A-1001" in page and "4200" in page
            assert "duplicate charge" in page and binding.short(a.effective_digest) in page
            assert a.effective_digest[:12] not in page  # (never the plain digest)
            assert "goes back to the customer" in page  # the impact
            assert alice.last is not None
            csp = alice.last.headers["Content-Security-Policy"]
            assert "default-src 'none'" in csp and "<script" not in page
            # the requester cannot approve her own: her queue is empty
            await dana.sign_in(inbox, "dana@example.com")
            status, dpage = await dana.get("/review")
            assert status == 200 and aid not in dpage and "Nothing waits for you" in dpage

            fields = form_fields(page, action=f"/review/requests/{aid}", verdict="approve")
            status, _ = await alice.post(f"/review/requests/{aid}", fields)
            assert status == 303
            run = await wait_for(lambda: _status(h, paused.run_id, "completed"),
                                 what="the run to complete")
            assert "was issued" in run.result
            assert len(h.refunds()) == 1
            updated = await wait_for(lambda: _card_says(h, aid, "Approved"),
                                     what="the card to show the approval")
            assert "U_ALICE" in json.dumps(updated)
            assert "on the web review queue" in json.dumps(updated)
            assert not [b for b in updated["blocks"] if b["type"] == "actions"]
            [approved] = await audit(h, "approved")
            assert approved.actor == "U_ALICE" and approved.via == "web"
            assert approved.digest == a.effective_digest
            # the same form again is a repeat, not a second execution
            status, _ = await alice.post(f"/review/requests/{aid}", fields)
            assert status == 303 and alice.last is not None
            assert alice.last.headers["Location"] == "/review?done=repeated"
            assert len(h.refunds()) == 1
        finally:
            await alice.close()
            await dana.close()


async def _card_says(h: Harness, approval_id: str, word: str) -> Any:
    a = await h.approval(approval_id)
    if not a.message_ts:  # not posted (yet)
        return None
    msg = h.emulator.message(a.channel, a.message_ts)
    return msg if msg and word in json.dumps(msg) else None


async def test_refusals_are_audited_and_change_nothing(db_url: str, tmp_path: Path) -> None:
    clock = ManualClock(datetime.now(UTC))
    async with smtp_server() as (inbox, smtp_port), \
            web_harness(db_url, tmp_path, clock=clock, smtp_port=smtp_port) as (h, url):
        paused = await h.pause_refund()
        [aid] = paused.approval_ids
        alice, mallory, dana = Browser(url), Browser(url), Browser(url)
        tally = Tally(h)  # (someone unknown is counted; someone known, an entry each)
        try:
            await alice.sign_in(inbox, "alice@example.com")
            status, page = await alice.get("/review")
            approve = form_fields(page, action=f"/review/requests/{aid}", verdict="approve")
            assert await tally.new() == {}

            # a link used twice (from another browser: the one that got the mail forwarded)
            first = await inbox.link_for("alice@example.com")
            before = await counts(h)
            status, body = await mallory.get(first)
            assert status == 410 and "used already" in body  # said, and nothing audited
            status, body = await mallory.post_token(first)
            assert status == 403 and "used already" in body
            assert mallory.cookie(SESSION_COOKIE) is None
            assert await tally.new() == {"link_used": 1}
            assert await counts(h) == before

            # a link for another approver than the one signed in here
            assert await dana.ask_link("dana@example.com") == 200
            dana_link = await inbox.link_for("dana@example.com")
            status, body = await alice.open_and_sign_in(dana_link)
            assert status == 403 and "another approver" in body
            [*_, refused] = await audit(h, "web_refused")
            assert refused.actor == "U_ALICE"
            assert json.loads(refused.details)["reason"] == "other_approver"
            assert json.loads(refused.details)["link_user"] == "U_DANA"
            assert await tally.new() == {"other_approver": 1}
            assert await counts(h) == before  # Dana's link is still unused
            status, _ = await dana.open_and_sign_in(dana_link)
            assert status == 303
            before = await counts(h)

            # an expired link: asked for, then opened after 15 minutes
            assert await mallory.ask_link("bob@example.com") == 200
            bob_link = await inbox.link_for("bob@example.com")
            status, page_b = await mallory.get(bob_link)
            assert status == 200
            clock.advance(timedelta(minutes=15, seconds=1))
            status, body = await mallory.post("/review/sign-in",
                                              form_fields(page_b, action="/review/sign-in"))
            assert status == 403 and "expired" in body
            assert await tally.new() == {"link_expired": 1}
            assert await counts(h) == before
            status, _ = await mallory.get(bob_link)
            assert status == 410

            # a forged session
            forged = Browser(url)
            forged.http.cookie_jar.update_cookies({SESSION_COOKIE: "A" * 43})
            status, body = await forged.post(f"/review/requests/{aid}", approve)
            await forged.close()
            assert status == 401
            assert await tally.new() == {"bad_session": 1}
            assert await counts(h) == before

            # a POST without the CSRF token, and with another session's
            status, body = await alice.post(f"/review/requests/{aid}",
                                            {k: v for k, v in approve.items() if k != "csrf"})
            assert status == 403
            assert await tally.new() == {"csrf": 1}
            _, dpage = await dana.get("/review")
            dana_csrf = form_fields(dpage, action="/review/sign-out")["csrf"]
            status, _ = await alice.post(f"/review/requests/{aid}",
                                         {**approve, "csrf": dana_csrf})
            assert status == 403
            assert await tally.new() == {"csrf": 1}
            [*_, last] = await audit(h, "web_refused")
            assert (last.actor, last.approval_id) == ("U_ALICE", aid)
            assert await counts(h) == before

            # a cross-origin POST (and one with no Origin at all)
            status, _ = await alice.post(f"/review/requests/{aid}", approve,
                                         origin="https://evil.example")
            assert status == 403
            assert await tally.new() == {"cross_origin": 1}
            assert (await refusals(h))[-1]["origin"] == "https://evil.example"
            status, _ = await alice.post(f"/review/requests/{aid}", approve, origin=False)
            assert status == 403
            assert (await refusals(h))[-1]["origin"] == "(none)"
            # ... and from nobody known: counted
            status, _ = await mallory.post(f"/review/requests/{aid}", approve,
                                           origin="https://evil.example")
            assert status == 403
            assert await tally.new() == {"cross_origin": 2}
            assert await counts(h) == before

            # nothing was decided, nothing ran; the form, untouched, still works
            assert (await h.approval(aid)).status == "pending" and h.refunds() == []
            status, _ = await alice.post(f"/review/requests/{aid}", approve)
            assert status == 303
            await wait_for(lambda: _status(h, paused.run_id, "completed"), what="completion")
            assert len(h.refunds()) == 1
        finally:
            for b in (alice, mallory, dana):
                await b.close()


async def test_a_page_drawn_before_an_edit_cannot_decide(sqlite_url: str,
                                                         tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text('[tools.issue_refund]\nedits = "propose"\n')
    async with smtp_server() as (inbox, smtp_port), \
            web_harness(sqlite_url, tmp_path, smtp_port=smtp_port,
                        APPROVALD_POLICY_FILE=str(policy)) as (h, url):
        paused = await h.pause_refund()
        [aid] = paused.approval_ids
        alice = Browser(url)
        try:
            await alice.sign_in(inbox, "alice@example.com")
            _, page = await alice.get("/review")
            approve = form_fields(page, action=f"/review/requests/{aid}", verdict="approve")
            # Bob proposes other arguments in Slack while Alice's page is open
            edited = {"order_id": "A-1001", "amount_cents": 100, "reason": "duplicate charge"}
            await h.engine.decide(aid, actor=Actor("U_BOB", "slack"), verdict="edit",
                                  args=edited)
            status, body = await alice.post(f"/review/requests/{aid}", approve)
            assert status == 409 and "edited" in body
            a = await h.approval(aid)
            assert a.status == "pending" and h.refunds() == []
            [*_, refused] = await audit(h, "refused")
            assert refused.via == "web" and json.loads(refused.details)["reason"] == "stale_card"
            # the page drawn now shows the proposal, and approving it runs exactly it
            _, page = await alice.get("/review")
            assert "Arguments that will run (edited by U_BOB)" in page
            approve = form_fields(page, action=f"/review/requests/{aid}", verdict="approve")
            assert approve["digest"] == binding.shown(a.effective_digest)
            status, _ = await alice.post(f"/review/requests/{aid}", approve)
            assert status == 303
            await wait_for(lambda: _status(h, paused.run_id, "completed"), what="completion")
            assert [r["args"]["amount_cents"] for r in h.refunds()] == [100]
        finally:
            await alice.close()


async def test_deny_with_a_reason_reaches_the_model(sqlite_url: str, tmp_path: Path) -> None:
    async with smtp_server() as (inbox, smtp_port), \
            web_harness(sqlite_url, tmp_path, smtp_port=smtp_port) as (h, url):
        paused = await h.pause_refund()
        [aid] = paused.approval_ids
        alice = Browser(url)
        try:
            await alice.sign_in(inbox, "alice@example.com")
            _, page = await alice.get("/review")
            deny = form_fields(page, action=f"/review/requests/{aid}", verdict="deny")
            status, _ = await alice.post(f"/review/requests/{aid}", deny)
            assert status == 409  # a denial needs a reason; decide refused it
            status, _ = await alice.post(f"/review/requests/{aid}",
                                         {**deny, "reason": "<b>not</b> this order"})
            assert status == 303
            a = await h.approval(aid)
            assert a.status == "denied" and a.decided_via == "web"
            assert a.reason == "<b>not</b> this order"
            await wait_for(lambda: _card_says(h, aid, "Denied"), what="the denied card")
            assert h.refunds() == []
        finally:
            await alice.close()


async def test_unknown_addresses_get_the_same_answer_and_no_mail(sqlite_url: str,
                                                                 tmp_path: Path) -> None:
    async with smtp_server() as (inbox, smtp_port), \
            web_harness(sqlite_url, tmp_path, smtp_port=smtp_port) as (h, url):
        b = Browser(url)
        try:
            _, page = await b.get("/review")
            fields = form_fields(page, action="/review/sign-in/mail")
            status, known = await b.post("/review/sign-in/mail",
                                         {**fields, "email": "alice@example.com"})
            status2, unknown = await b.post("/review/sign-in/mail",
                                            {**fields, "email": "eve@example.com"})
            assert status == status2 == 200 and known == unknown
            await inbox.link_for("alice@example.com")
            await h.service.drain.drain_once()
            assert [m["To"] for m in inbox.messages] == ["alice@example.com"]
            # at most five live links per approver, however often anyone asks
            for _ in range(7):
                await b.post("/review/sign-in/mail", {**fields, "email": "alice@example.com"})
            await wait_for(lambda: len(inbox.to("alice@example.com")) == 5, what="5 mails")
            [(n,)] = await sql(h, "SELECT count(*) FROM web_links")
            assert n == 5
        finally:
            await b.close()


async def test_a_sign_in_mail_is_retried_then_reported_dead(sqlite_url: str,
                                                            tmp_path: Path) -> None:
    """The SMTP server is down: the mail waits in the outbox and is retried; once the
    server answers it is delivered. A mail that cannot go out before its link expires is
    given up and reported to ops in Slack, like a dead card."""
    from aiosmtpd.controller import Controller
    from approvald.runtime.record.outbox_kinds import DEAD_REPORT

    from tests.helpers import free_port
    from tests.integration.slack_harness import OPS
    from tests.integration.web_helpers import Inbox

    clock = ManualClock(datetime.now(UTC))
    smtp_port = free_port()  # nothing listens there yet
    async with web_harness(sqlite_url, tmp_path, clock=clock, smtp_port=smtp_port) as (h, url):
        b = Browser(url)
        try:
            assert await b.ask_link("alice@example.com") == 200

            async def tried() -> Any:
                rows = await sql(h, "SELECT attempts, last_error, status FROM outbox "
                                    "WHERE kind = 'mail.signin'")
                # (attempts counts a try from its claim: its error is recorded after it)
                return rows if rows and rows[0][0] >= 1 and rows[0][1] else None

            [(_attempts, error, status)] = await wait_for(tried, what="a first try")
            assert status == "pending" and "unreachable" in error
            inbox = Inbox()
            controller = Controller(inbox, hostname="127.0.0.1", port=smtp_port)
            controller.start()
            try:
                clock.advance(timedelta(seconds=10))  # past the backoff
                h.engine.notify_outbox()
                link = await inbox.link_for("alice@example.com")
                assert link.startswith(f"{url}/review/sign-in/")
            finally:
                controller.stop()
            # the server is gone again: Bob's mail never goes out and is given up when its
            # link expires, and ops is told in Slack
            assert await b.ask_link("bob@example.com") == 200
            await wait_for(lambda: _tries(h, "bob"), what="a try of Bob's mail")
            clock.advance(timedelta(minutes=15, seconds=1))
            h.engine.notify_outbox()

            async def dead() -> Any:
                rows = await sql(h, "SELECT status FROM outbox WHERE kind = 'mail.signin' "
                                    "AND payload LIKE '%U_BOB%'")
                return rows == [("dead",)]

            await wait_for(dead, what="Bob's mail to be given up")
            [(report,)] = await sql(h, f"SELECT payload FROM outbox WHERE kind = "
                                       f"'{DEAD_REPORT}'")
            assert json.loads(report)["kind"] == "mail.signin"
            posted = await wait_for(
                lambda: [m for m in h.emulator.messages(OPS)
                         if "mail.signin" in json.dumps(m)], what="the report in Slack")
            assert "Delivery given up" in json.dumps(posted)
        finally:
            await b.close()


async def _tries(h: Harness, who: str) -> bool:
    rows = await sql(h, "SELECT attempts FROM outbox WHERE kind = 'mail.signin' "
                        f"AND payload LIKE '%U_{who.upper()}%'")
    return bool(rows and rows[0][0] >= 1)


async def test_https_cookies_are_secure(sqlite_url: str, tmp_path: Path) -> None:
    """Behind TLS (an https public URL, a proxy in front) the session cookie is Secure, and
    the Origin checked is the https one."""
    async with smtp_server() as (inbox, smtp_port), \
            web_harness(sqlite_url, tmp_path, smtp_port=smtp_port,
                        APPROVALD_PUBLIC_URL="https://approvals.example.com") as (_h, url):
        b = Browser(url, origin="https://approvals.example.com")
        try:
            assert await b.ask_link("alice@example.com") == 200
            link = await inbox.link_for("alice@example.com")
            assert link.startswith("https://approvals.example.com/review/sign-in/")
            status, page = await b.get(url + link.removeprefix("https://approvals.example.com"))
            assert status == 200
            status, _ = await b.post("/review/sign-in", form_fields(page,
                                                                    action="/review/sign-in"))
            assert status == 303 and b.last is not None
            cookie = next(c for c in b.last.headers.getall("Set-Cookie")
                          if c.startswith(SESSION_COOKIE + "="))
            assert "Secure" in cookie and "HttpOnly" in cookie and "SameSite=Strict" in cookie
            # the listener's own http origin is not the public one
            status, _ = await b.post("/review/sign-in/mail", {}, origin=url)
            assert status == 403
        finally:
            await b.close()


async def test_a_request_is_mailed_to_its_approvers_when_its_policy_says_email(
        db_url: str, tmp_path: Path) -> None:
    """channels = ["slack", "email"]: besides the card, one mail to the approvers who have
    an address (Bob through the S_FINANCE group; never Dana, who asked), with the packet,
    the exact arguments and a link to the request in the queue, which decides nothing."""
    policy = tmp_path / "policy.toml"
    policy.write_text('[tools.issue_refund]\napprovers = ["U_ALICE", "S_FINANCE"]\n'
                      'channels = ["slack", "email"]\n')
    async with smtp_server() as (inbox, smtp_port), \
            web_harness(db_url, tmp_path, smtp_port=smtp_port,
                        APPROVALD_POLICY_FILE=str(policy)) as (h, url):
        paused = await h.pause_refund()
        [aid] = paused.approval_ids
        await h.card(aid)
        await wait_for(lambda: inbox.messages, what="the request's mail")
        [mail] = inbox.messages
        assert mail["X-Envelope-To"] == "alice@example.com,bob@example.com"
        assert mail["To"] == "approvals@example.com"  # approvers do not see each other
        assert "issue_refund" in mail["Subject"] and "high risk" in mail["Subject"]
        body = mail.get_body(("plain",))
        assert body is not None
        text_ = body.get_content()
        assert '"amount_cents": 4200' in text_ and "A-1001" in text_
        assert "goes back to the customer" in text_
        link = f"{url}/review/requests/{aid}"
        assert link in text_
        # following it (a scanner, say) decides nothing: it is the queue's sign-in page
        b, mallory = Browser(url), Browser(url)
        try:
            status, page = await b.get(link)
            assert status == 200 and "Mail me a sign-in link" in page
            assert (await h.approval(aid)).status == "pending"
            # signed in, it is the request to decide; once decided, who decided it
            await b.sign_in(inbox, "bob@example.com")
            status, page = await b.get(link)
            assert status == 200 and f'id="r-{aid}"' in page and "4200" in page
            status, _ = await b.post(f"/review/requests/{aid}", form_fields(
                page, action=f"/review/requests/{aid}", verdict="approve"))
            assert status == 303
            status, page = await b.get(link)
            assert status == 200 and "was approved by U_BOB on the web review queue" in page
            # someone who may not decide it sees nothing of it
            await mallory.sign_in(inbox, "dana@example.com")  # its requester
            status, page = await mallory.get(link)
            assert status == 403 and "4200" not in page and "U_BOB" not in page
        finally:
            await b.close()
            await mallory.close()
        await wait_for(lambda: _status(h, paused.run_id, "completed"), what="completion")
        assert len(h.refunds()) == 1


async def test_a_request_mail_for_a_decided_request_is_not_sent(sqlite_url: str,
                                                                tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text('[tools.issue_refund]\nchannels = ["slack", "email"]\n')
    async with smtp_server() as (inbox, smtp_port), \
            web_harness(sqlite_url, tmp_path, smtp_port=smtp_port, background=False,
                        APPROVALD_POLICY_FILE=str(policy)) as (h, _url):
        paused = await h.pause_refund()
        [aid] = paused.approval_ids
        await h.engine.decide(aid, actor=Actor("U_ALICE", "slack"), verdict="approve")
        await h.service.drain.drain_once()
        assert inbox.messages == []
        [(result,)] = await sql(h, "SELECT result FROM outbox WHERE kind = 'mail.request'")
        assert json.loads(result) == {"skipped": True}
        # nor is its outcome: there is no thread to follow
        [(status, result)] = await sql(h, "SELECT status, result FROM outbox "
                                          "WHERE kind = 'mail.outcome'")
        assert status == "delivered" and json.loads(result) == {"skipped": True}


async def test_a_cancelled_run_tells_its_mailed_requests(sqlite_url: str,
                                                         tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text('[tools.issue_refund]\napprovers = ["U_ALICE"]\n'
                      'channels = ["slack", "email"]\n')
    async with smtp_server() as (inbox, smtp_port), \
            web_harness(sqlite_url, tmp_path, smtp_port=smtp_port, background=False,
                        APPROVALD_POLICY_FILE=str(policy)) as (h, _url):
        paused = await h.pause_refund()
        await h.service.drain.drain_once()
        [first] = inbox.messages
        await h.engine.cancel(paused.run_id, actor=Actor("U_DANA", "cli"),
                              reason="customer withdrew")
        await h.service.drain.drain_once()
        [_, told] = inbox.messages
        assert told["In-Reply-To"] == first["Message-ID"]
        assert told["X-Envelope-To"] == "alice@example.com"
        assert "was cancelled by U_DANA at " in _text(told)
        assert "customer withdrew" in _text(told)


async def test_edit_on_the_page_runs_the_edited_call_and_sign_out_ends_the_session(
        sqlite_url: str, tmp_path: Path) -> None:
    async with smtp_server() as (inbox, smtp_port), \
            web_harness(sqlite_url, tmp_path, smtp_port=smtp_port) as (h, url):
        paused = await h.pause_refund()
        [aid] = paused.approval_ids
        alice = Browser(url)
        try:
            await alice.sign_in(inbox, "alice@example.com")
            _, page = await alice.get("/review")
            edit = form_fields(page, action=f"/review/requests/{aid}", verdict="edit")
            status, _ = await alice.post(f"/review/requests/{aid}",
                                         {**edit, "args": "{not json"})
            assert status == 400 and (await h.approval(aid)).status == "pending"
            deep = '{"a":' * 1000 + "1" + "}" * 1000  # issue 45: a RecursionError (500)
            status, body = await alice.post(f"/review/requests/{aid}", {**edit, "args": deep})
            assert status == 400 and "nested deeper than 64 levels" in body
            assert (await h.approval(aid)).status == "pending"
            bad = {"order_id": "A-1001", "amount_cents": "lots", "reason": "duplicate charge"}
            status, body = await alice.post(f"/review/requests/{aid}",
                                            {**edit, "args": json.dumps(bad)})
            assert status == 409 and "amount_cents" in body  # the tool's own validation
            assert (await h.approval(aid)).status == "pending"
            args = {"order_id": "A-1001", "amount_cents": 2100, "reason": "half of it"}
            status, _ = await alice.post(f"/review/requests/{aid}",
                                         {**edit, "args": json.dumps(args)})
            assert status == 303
            await wait_for(lambda: _status(h, paused.run_id, "completed"), what="completion")
            assert [r["args"] for r in h.refunds()] == [args]
            [edited] = await audit(h, "edited")
            assert edited.actor == "U_ALICE" and edited.via == "web"
            # signing out ends the session in the database: its cookie no longer works
            _, page = await alice.get("/review")
            old = alice.cookie(SESSION_COOKIE)
            assert old
            status, _ = await alice.post("/review/sign-out",
                                         form_fields(page, action="/review/sign-out"))
            assert status == 303 and alice.cookie(SESSION_COOKIE) in (None, "")
            [out] = await audit(h, "web_signed_out")
            assert out.actor == "U_ALICE"
            replay = Browser(url)
            before_replay = await refusal_tally(h)
            try:
                replay.http.cookie_jar.update_cookies({SESSION_COOKIE: old})
                status, page = await replay.get("/review")
                assert status == 200 and "Mail me a sign-in link" in page
                status, _ = await replay.post("/review/sign-out", {"csrf": "x"})
                assert status == 401
                assert await Tally(h, before_replay).new() == {"bad_session": 1}
            finally:
                await replay.close()
        finally:
            await alice.close()


async def test_a_dead_card_is_mailed_to_the_approvers_instead(sqlite_url: str,
                                                              tmp_path: Path) -> None:
    """Slack will never take the card (its channel does not exist): the card is given up
    and, in the same transaction, the request is queued as a mail to its approvers, who
    sign in and approve it on the queue page. The run resumes; the call runs once."""
    policy = tmp_path / "policy.toml"
    policy.write_text('[tools.issue_refund]\napprovers = ["U_ALICE"]\n')
    async with smtp_server() as (inbox, smtp_port), \
            web_harness(sqlite_url, tmp_path, smtp_port=smtp_port,
                        APPROVALD_CHANNEL="C_NOWHERE",
                        APPROVALD_POLICY_FILE=str(policy)) as (h, url):
        paused = await h.pause_refund()
        [aid] = paused.approval_ids
        await wait_for(lambda: inbox.to("approvals@example.com"), what="the fallback mail")
        [mail] = inbox.messages
        assert mail["X-Envelope-To"] == "alice@example.com"
        [(status,)] = await sql(h, "SELECT status FROM outbox WHERE kind = "
                                   "'approval.requested'")
        assert status == "dead"
        [mailed] = await audit(h, "mailed_instead")
        assert mailed.approval_id == aid and json.loads(mailed.details)["because"] == "card_dead"
        alice = Browser(url)
        try:
            await alice.sign_in(inbox, "alice@example.com")
            _, page = await alice.get("/review")
            status, _ = await alice.post(f"/review/requests/{aid}", form_fields(
                page, action=f"/review/requests/{aid}", verdict="approve"))
            assert status == 303
            await wait_for(lambda: _status(h, paused.run_id, "completed"), what="completion")
            assert len(h.refunds()) == 1
            [approved] = await audit(h, "approved")
            assert approved.via == "web"
        finally:
            await alice.close()


async def test_without_mail_a_dead_card_mails_nothing(sqlite_url: str, tmp_path: Path) -> None:
    async with web_harness(sqlite_url, tmp_path, APPROVALD_CHANNEL="C_NOWHERE",
                           APPROVALD_MAIL_FALLBACK_AFTER="1m") as (h, _url):
        assert h.service.drain.config.mail_fallback_after is None  # no mail: off
        assert "is mailed" not in h.service.describe()
        await h.pause_refund()

        async def dead() -> bool:
            return await sql(h, "SELECT status FROM outbox WHERE kind = "
                                "'approval.requested'") == [("dead",)]

        await wait_for(dead, what="the card to be given up")
        assert await sql(h, "SELECT kind FROM outbox WHERE kind LIKE 'mail.%'") == []


async def test_two_uses_of_one_link_at_once_sign_in_one_browser(db_url: str,
                                                                tmp_path: Path) -> None:
    """The link's use is a compare-and-set: of two browsers pressing Sign in with one link
    at the same moment, one is signed in and the other refused (and audited)."""
    import asyncio

    async with smtp_server() as (inbox, smtp_port), \
            web_harness(db_url, tmp_path, smtp_port=smtp_port) as (h, url):
        first, second = Browser(url), Browser(url)
        try:
            assert await first.ask_link("alice@example.com") == 200
            link = await inbox.link_for("alice@example.com")
            _, page = await first.get(link)
            form = form_fields(page, action="/review/sign-in")
            _, page2 = await second.get("/review")
            form2 = {"csrf": form_fields(page2, action="/review/sign-in/mail")["csrf"],
                     "token": form["token"]}
            results = await asyncio.gather(first.post("/review/sign-in", form),
                                           second.post("/review/sign-in", form2))
            assert sorted(status for status, _ in results) == [303, 403]
            assert await sql(h, "SELECT count(*) FROM web_sessions") == [(1,)]
            assert await refusal_tally(h) == {"link_used": 1}
        finally:
            await first.close()
            await second.close()


async def test_a_public_url_without_a_listener_stops_serve(sqlite_url: str,
                                                           tmp_path: Path) -> None:
    """Without Slack and without APPROVALD_PORT there is no listener to serve /review on:
    one line saying so, rather than a queue nobody can reach."""
    import pytest
    from approvald.bot.config import Settings
    from approvald.bot.serve import Service
    from approvald.bot.wiring import open_database
    from approvald.runtime.kernel.errors import ConfigError

    settings = Settings(APPROVALD_DATABASE_URL=sqlite_url,  # type: ignore[call-arg]
                        APPROVALD_PUBLIC_URL="https://approvals.example.com",
                        APPROVALD_SECRET="approvald-test-secret-0123456789",
                        APPROVALD_METRICS_ADDR="off")
    db = await open_database(settings, quiet=True)
    try:
        service = Service(settings, db)
        try:
            with pytest.raises(ConfigError, match=r"APPROVALD_PUBLIC_URL: .* set APPROVALD_PORT"):
                await service.start(background=False)
        finally:
            await service.stop()
    finally:
        await db.close()


async def test_slack_unreachable_past_the_fallback_delay_mails_the_request(
        db_url: str, tmp_path: Path) -> None:
    """Slack is unreachable: the card waits in the outbox. Once it is still not posted
    APPROVALD_MAIL_FALLBACK_AFTER after the request was made, the request is mailed to its
    approver (once, audited); she signs in through the emailed link and approves on the
    queue page; the run resumes and the call runs once; when Slack is back the card is
    posted showing the decision, made on the web review queue."""
    policy = tmp_path / "policy.toml"
    policy.write_text('[tools.issue_refund]\napprovers = ["U_ALICE"]\n')
    clock = ManualClock(datetime.now(UTC))
    async with smtp_server() as (inbox, smtp_port), \
            web_harness(db_url, tmp_path, clock=clock, smtp_port=smtp_port,
                        APPROVALD_MAIL_FALLBACK_AFTER="5m",
                        APPROVALD_POLICY_FILE=str(policy)) as (h, url):
        assert "a card Slack has not taken in 5m is mailed" in h.service.describe()
        await h.emulator.down()
        paused = await h.pause_refund()
        [aid] = paused.approval_ids
        await wait_for(lambda: _card_tries(h), what="a first try of the card")
        # before the delay: tries fail, nothing is mailed
        clock.advance(timedelta(minutes=4))
        h.engine.notify_outbox()
        await wait_for(lambda: _card_tries(h, 2), what="a second try of the card")
        assert await mail_rows(h) == [] and inbox.messages == []
        # past it: the next try (due by then at the latest) mails the request
        clock.advance(timedelta(minutes=1, seconds=1))
        h.engine.notify_outbox()
        await wait_for(lambda: inbox.to("approvals@example.com"), what="the fallback mail")
        [mail] = inbox.messages
        assert mail["X-Envelope-To"] == "alice@example.com"
        body = mail.get_body(("plain",))
        assert body is not None and f"{url}/review/requests/{aid}" in body.get_content()
        [mailed] = await audit(h, "mailed_instead")
        assert mailed.approval_id == aid and mailed.via == "email"
        assert json.loads(mailed.details)["because"] == "slack_unreachable"
        await wait_for(lambda: _no_mail_in_flight(h), what="the drain to mark its mail")
        # more failed tries of the card mail nothing more
        for _ in range(2):
            tries = await _card_tries(h)
            clock.advance(timedelta(minutes=6))
            h.engine.notify_outbox()
            await wait_for(lambda t=tries: _card_tries(h, t + 1), what="another try")
        assert len(await mail_rows(h)) == 1 and len(await audit(h, "mailed_instead")) == 1
        [(card_status,)] = await sql(h, "SELECT status FROM outbox WHERE kind = "
                                        "'approval.requested'")
        assert card_status == "pending"

        alice = Browser(url)
        try:
            await alice.sign_in(inbox, "alice@example.com")
            status, page = await alice.get(f"/review/requests/{aid}")
            assert status == 200
            status, _ = await alice.post(f"/review/requests/{aid}", form_fields(
                page, action=f"/review/requests/{aid}", verdict="approve"))
            assert status == 303
        finally:
            await alice.close()
        await wait_for(lambda: _status(h, paused.run_id, "completed"), what="completion")
        assert len(h.refunds()) == 1
        a = await h.approval(aid)
        assert a.status == "approved" and a.decided_via == "web"
        [approved] = await audit(h, "approved")
        assert approved.actor == "U_ALICE" and approved.via == "web"

        # the mail's thread is told who decided, where
        [_, told] = await wait_for(lambda: len(inbox.to("approvals@example.com")) == 2
                                   and inbox.to("approvals@example.com"), what="the outcome")
        assert told["In-Reply-To"] == mail["Message-ID"]
        assert "was approved by U_ALICE on the web review queue" in _text(told)
        await wait_for(lambda: _no_mail_in_flight(h), what="the drain to mark its mail")

        # Slack is back: the card is posted as the request stands, decided on the web
        await h.emulator.up()
        clock.advance(timedelta(minutes=10))
        h.engine.notify_outbox()
        card = await wait_for(lambda: _card_says(h, aid, "Approved"), what="the card")
        assert "U_ALICE" in json.dumps(card) and "on the web review queue" in json.dumps(card)
        assert not [b for b in card["blocks"] if b["type"] == "actions"]
        assert len(h.refunds()) == 1 and len(inbox.to("approvals@example.com")) == 2


async def _card_tries(h: Harness, at_least: int = 1) -> int:
    """How often the card post was tried and failed, once that is ``at_least`` (a try is
    counted at its claim; its failure is recorded when the claim is let go)."""
    rows = await sql(h, "SELECT attempts, last_error FROM outbox WHERE kind = "
                        "'approval.requested' AND claimed_until IS NULL")
    tries = rows[0][0] if rows and rows[0][1] else 0
    return tries if tries >= at_least else 0


async def mail_rows(h: Harness) -> list[tuple[Any, ...]]:
    return await sql(h, "SELECT id, payload FROM outbox WHERE kind = 'mail.request'")


def _text(mail: Any) -> str:
    body = mail.get_body(("plain",))
    assert body is not None
    return str(body.get_content()).replace("\r\n", "\n")


async def test_a_mailed_request_is_followed_in_its_thread(db_url: str,
                                                          tmp_path: Path) -> None:
    """One request, many channels: a mailed request's reminders go by mail too, in its
    mail's thread (In-Reply-To and References its Message-ID, to the same approvers); its
    escalation tells the first rung's approvers in their thread and mails the next rung's;
    the decision (in Slack here) is told in the next rung's thread: who, how, when. The
    arguments stay masked where sensitive in every mail."""
    policy = tmp_path / "policy.toml"
    policy.write_text('[tools.issue_refund]\napprovers = ["U_ALICE"]\n'
                      'channels = ["slack", "email"]\nttl = "1h"\nreminders = ["50%"]\n'
                      'sensitive = ["args.reason"]\non_expire = "escalate"\n'
                      'escalate = [{ approvers = ["U_BOB"], ttl = "1h" }]\n')
    clock = ManualClock(datetime.now(UTC))
    async with smtp_server() as (inbox, smtp_port), \
            web_harness(db_url, tmp_path, clock=clock, smtp_port=smtp_port,
                        APPROVALD_POLICY_FILE=str(policy)) as (h, url):
        paused = await h.pause_refund()
        [aid] = paused.approval_ids
        [first] = await wait_for(lambda: inbox.messages, what="the request's mail")
        assert first["X-Envelope-To"] == "alice@example.com"
        await wait_for(lambda: _no_mail_in_flight(h), what="the drain to mark its mail")

        clock.advance(timedelta(minutes=31))
        swept = await h.engine.sweep()
        assert swept.reminded == [aid]
        await wait_for(lambda: len(inbox.messages) == 2, what="the reminder mail")
        reminder = inbox.messages[1]
        assert reminder["X-Envelope-To"] == "alice@example.com"
        assert reminder["In-Reply-To"] == first["Message-ID"] == reminder["References"]
        assert reminder["Subject"] == "Re: " + first["Subject"]
        assert "Reminder 1" in _text(reminder) and f"{url}/review/requests/{aid}" \
            in _text(reminder)
        await wait_for(lambda: _no_mail_in_flight(h), what="the drain to mark its mail")

        clock.advance(timedelta(minutes=30))
        swept = await h.engine.sweep()
        [(_, new_id)] = swept.escalated
        await wait_for(lambda: len(inbox.messages) == 4, what="the escalation's mails")
        [told] = [m for m in inbox.messages[2:] if m["In-Reply-To"]]
        [bobs] = [m for m in inbox.messages[2:] if not m["In-Reply-To"]]
        assert told["X-Envelope-To"] == "alice@example.com"
        assert told["In-Reply-To"] == first["Message-ID"]
        assert f"was {WORDS[OutcomeName.ESCALATED].words}" in _text(told)
        assert bobs["X-Envelope-To"] == "bob@example.com"
        assert f"/review/requests/{new_id}" in _text(bobs)

        await h.engine.decide(new_id, actor=Actor("U_BOB", "slack"), verdict="deny",
                              reason="not this order")
        await wait_for(lambda: len(inbox.messages) == 5, what="the outcome mail")
        outcome = inbox.messages[4]
        assert outcome["X-Envelope-To"] == "bob@example.com"
        assert outcome["In-Reply-To"] == bobs["Message-ID"] == outcome["References"]
        assert outcome["Subject"] == "Re: " + bobs["Subject"]
        said = _text(outcome)
        assert f"(request {new_id}) was denied by U_BOB in Slack at " in said
        assert "Reason: not this order" in said
        for mail in inbox.messages:
            assert '"reason": "duplicate charge"' not in _text(mail), _text(mail)
        await wait_for(lambda: _status(h, paused.run_id, "completed"), what="completion")
        assert h.refunds() == []
        # nothing more: the decision is told once, and closed requests get no reminders
        # (once the drain has marked what it sent: a jump of the clock past a claim in
        # flight would let another drain take the row over and send it again)
        await wait_for(lambda: _no_mail_in_flight(h), what="the drain to mark its mails")
        clock.advance(timedelta(hours=2))
        await h.engine.sweep()
        await h.service.drain.drain_once()
        assert len(inbox.messages) == 5, [(m["Subject"], m["X-Envelope-To"], _text(m)[:300])
                                          for m in inbox.messages]


async def _no_mail_in_flight(h: Harness) -> bool:
    return await sql(h, "SELECT count(*) FROM outbox WHERE kind LIKE 'mail.%' AND "
                        "status = 'pending'") == [(0,)]


async def test_the_fallback_mails_no_request_decided_or_mailed_already(
        sqlite_url: str, tmp_path: Path, sqlite_template: Path) -> None:
    """Slack down past the fallback delay: a request decided meanwhile (from the command
    line) is not mailed, and one whose policy mailed it when it was made is not mailed a
    second time."""
    policy = tmp_path / "policy.toml"
    policy.write_text('[tools.issue_refund]\napprovers = ["U_ALICE"]\n')
    clock = ManualClock(datetime.now(UTC))
    async with smtp_server() as (inbox, smtp_port), \
            web_harness(sqlite_url, tmp_path, clock=clock, smtp_port=smtp_port,
                        APPROVALD_MAIL_FALLBACK_AFTER="5m",
                        APPROVALD_POLICY_FILE=str(policy)) as (h, _url):
        await h.emulator.down()
        decided = await h.pause_refund()
        [aid] = decided.approval_ids
        await h.engine.decide(aid, actor=Actor("U_ALICE", "cli"), verdict="deny",
                              reason="no")
        await wait_for(lambda: _card_tries(h), what="a first try of the card")
        clock.advance(timedelta(minutes=6))
        h.engine.notify_outbox()
        await wait_for(lambda: _card_tries(h, 2), what="a try past the delay")
        assert await mail_rows(h) == [] and await audit(h, "mailed_instead") == []
        assert inbox.messages == []

    policy.write_text('[tools.issue_refund]\napprovers = ["U_ALICE"]\n'
                      'channels = ["slack", "email"]\n')
    second = tmp_path / "second.db"  # a database of its own
    shutil.copy(sqlite_template, second)
    async with smtp_server() as (inbox, smtp_port), \
            web_harness(f"sqlite+aiosqlite:///{second}", tmp_path, clock=clock, smtp_port=smtp_port,
                        APPROVALD_MAIL_FALLBACK_AFTER="5m",
                        APPROVALD_POLICY_FILE=str(policy)) as (h, _url):
        await h.emulator.down()
        mailed = await h.pause_refund()
        [aid] = mailed.approval_ids
        await wait_for(lambda: inbox.messages, what="the request's mail")
        await wait_for(lambda: _no_mail_in_flight(h), what="the drain to mark its mail")
        tries = await wait_for(lambda: _card_tries(h, 1), what="a try of the card")
        clock.advance(timedelta(minutes=6))
        h.engine.notify_outbox()
        await wait_for(lambda: _card_tries(h, tries + 1), what="a try past the delay")
        assert len(await mail_rows(h)) == 1 and await audit(h, "mailed_instead") == []
        assert len(inbox.messages) == 1


async def test_a_request_that_fell_back_to_mail_is_reminded_and_escalated_by_mail(
        sqlite_url: str, tmp_path: Path) -> None:
    """Mail by fallback counts as the request's channel: its reminders go by mail in its
    thread, and its escalation mails the next rung's approvers at once (without waiting
    for the new card to fall back)."""
    policy = tmp_path / "policy.toml"
    policy.write_text('[tools.issue_refund]\napprovers = ["U_ALICE"]\nttl = "1h"\n'
                      'reminders = ["50%"]\non_expire = "escalate"\n'
                      'escalate = [{ approvers = ["U_BOB"], ttl = "1h" }]\n')
    clock = ManualClock(datetime.now(UTC))
    async with smtp_server() as (inbox, smtp_port), \
            web_harness(sqlite_url, tmp_path, clock=clock, smtp_port=smtp_port,
                        APPROVALD_MAIL_FALLBACK_AFTER="5m",
                        APPROVALD_POLICY_FILE=str(policy)) as (h, url):
        await h.emulator.down()
        paused = await h.pause_refund()
        [aid] = paused.approval_ids
        await wait_for(lambda: _card_tries(h), what="a first try of the card")
        clock.advance(timedelta(minutes=5, seconds=1))
        h.engine.notify_outbox()
        [first] = await wait_for(lambda: inbox.messages, what="the fallback mail")
        await wait_for(lambda: _no_mail_in_flight(h), what="the drain to mark its mail")

        clock.advance(timedelta(minutes=25))
        assert (await h.engine.sweep()).reminded == [aid]
        await wait_for(lambda: len(inbox.messages) == 2, what="the reminder mail")
        reminder = inbox.messages[1]
        assert reminder["In-Reply-To"] == first["Message-ID"]
        assert reminder["X-Envelope-To"] == "alice@example.com"
        assert "Reminder 1" in _text(reminder)
        await wait_for(lambda: _no_mail_in_flight(h), what="the drain to mark its mail")

        clock.advance(timedelta(minutes=31))
        [(_, new_id)] = (await h.engine.sweep()).escalated
        await wait_for(lambda: len(inbox.messages) == 4, what="the escalation's mails")
        [bobs] = [m for m in inbox.messages[2:] if not m["In-Reply-To"]]
        assert bobs["X-Envelope-To"] == "bob@example.com"
        assert f"{url}/review/requests/{new_id}" in _text(bobs)
        [told] = [m for m in inbox.messages[2:] if m["In-Reply-To"]]
        assert told["X-Envelope-To"] == "alice@example.com"
        assert f"was {WORDS[OutcomeName.ESCALATED].words}" in _text(told)


async def test_a_slack_click_on_a_mailed_request_is_told_in_its_mail_thread(
        sqlite_url: str, tmp_path: Path) -> None:
    """Decided with a signed click on its Slack card: the card shows it, and the mail's
    thread is told who decided, in Slack; the request's page in the queue says so too."""
    from approvald.bot.slack import cards

    from tests.integration.slack_harness import CHANNEL

    policy = tmp_path / "policy.toml"
    policy.write_text('[tools.issue_refund]\napprovers = ["U_ALICE", "U_BOB"]\n'
                      'channels = ["slack", "email"]\n')
    async with smtp_server() as (inbox, smtp_port), \
            web_harness(sqlite_url, tmp_path, smtp_port=smtp_port,
                        APPROVALD_POLICY_FILE=str(policy)) as (h, url):
        paused = await h.pause_refund()
        [aid] = paused.approval_ids
        await h.card(aid)
        [first] = await wait_for(lambda: inbox.messages, what="the request's mail")
        a = await h.approval(aid)
        await h.slack.click(cards.APPROVE, h.value(a), user_id="U_ALICE", channel_id=CHANNEL,
                            message_ts=a.message_ts)
        await wait_for(lambda: len(inbox.messages) == 2, what="the outcome mail")
        told = inbox.messages[1]
        assert told["In-Reply-To"] == first["Message-ID"]
        assert told["X-Envelope-To"] == "alice@example.com,bob@example.com"
        assert f"(request {aid}) was approved by U_ALICE in Slack at " in _text(told)
        await wait_for(lambda: _card_says(h, aid, "Approved"), what="the approved card")
        await wait_for(lambda: _status(h, paused.run_id, "completed"), what="completion")
        assert len(h.refunds()) == 1
        bob = Browser(url)
        try:
            await bob.sign_in(inbox, "bob@example.com")
            status, page = await bob.get(f"/review/requests/{aid}")
            assert status == 200 and "was approved by U_ALICE in Slack" in page
        finally:
            await bob.close()


async def test_a_request_mail_given_up_has_no_thread_to_follow(sqlite_url: str,
                                                               tmp_path: Path) -> None:
    """Nobody to mail the request to (its approver has no address): its mail is given up
    and reported once; its decision queues no outcome mail (which would only be given up
    and reported again)."""
    policy = tmp_path / "policy.toml"
    policy.write_text('[tools.issue_refund]\napprovers = ["U_CAROL"]\n'
                      'channels = ["slack", "email"]\n')
    async with smtp_server() as (inbox, smtp_port), \
            web_harness(sqlite_url, tmp_path, smtp_port=smtp_port, background=False,
                        APPROVALD_POLICY_FILE=str(policy)) as (h, _url):
        paused = await h.pause_refund()
        [aid] = paused.approval_ids
        await h.service.drain.drain_once()
        assert await sql(h, "SELECT status FROM outbox WHERE kind = 'mail.request'") \
            == [("dead",)]
        await h.engine.decide(aid, actor=Actor("U_CAROL", "slack"), verdict="deny",
                              reason="no")
        await h.service.drain.drain_once()
        assert await sql(h, "SELECT count(*) FROM outbox WHERE kind = 'mail.outcome'") \
            == [(0,)]
        assert inbox.messages == []


async def test_an_edit_of_a_mailed_request_is_told_in_its_thread(db_url: str,
                                                                  tmp_path: Path) -> None:
    """Edits of a mailed request, from any face (a Slack modal's decision here, then the
    web queue's form), are each told in the request mail's thread: who changed what,
    masked where sensitive, and that the request now binds to the new arguments; the
    approval that follows runs exactly those, once."""
    policy = tmp_path / "policy.toml"
    policy.write_text('[tools.issue_refund]\napprovers = ["U_ALICE", "U_BOB"]\n'
                      'channels = ["slack", "email"]\nedits = "propose"\n'
                      'sensitive = ["args.reason"]\n')
    async with smtp_server() as (inbox, smtp_port), \
            web_harness(db_url, tmp_path, smtp_port=smtp_port,
                        APPROVALD_POLICY_FILE=str(policy)) as (h, url):
        paused = await h.pause_refund()
        [aid] = paused.approval_ids
        [first] = await wait_for(lambda: inbox.messages, what="the request's mail")

        def thread() -> list[Any]:
            return [m for m in inbox.messages if m["In-Reply-To"] == first["Message-ID"]]

        await wait_for(lambda: _no_mail_in_flight(h), what="the drain to mark its mail")
        half = {"order_id": "A-1001", "amount_cents": 2100, "reason": "half of it"}
        await h.engine.decide(aid, actor=Actor("U_ALICE", "slack"), verdict="edit", args=half)
        [told] = await wait_for(thread, what="the edit's mail")
        assert told["X-Envelope-To"] == "alice@example.com,bob@example.com"
        assert told["References"] == first["Message-ID"]
        assert told["Subject"] == "Re: " + first["Subject"]
        said = _text(told)
        edited = await h.approval(aid)
        assert f"U_ALICE edited the arguments of issue_refund (request {aid}) in Slack at " \
            in said
        assert "  amount_cents: 4200 -> 2100\n" in said
        assert '  reason: "[masked]" -> "[masked]"\n' in said  # changed, and still secret
        assert "duplicate charge" not in said and "half of it" not in said
        assert (f"now binds to the new arguments (digest "
                f"{binding.short(edited.effective_digest)}, was {binding.short(edited.digest)})"
                ) in said
        assert "Someone other than U_ALICE must approve them." in said
        assert f"{url}/review/requests/{aid}" in said

        bob = Browser(url)
        try:
            await bob.sign_in(inbox, "bob@example.com")
            _, page = await bob.get(f"/review/requests/{aid}")
            less = {**half, "amount_cents": 2000}
            status, _ = await bob.post(f"/review/requests/{aid}", {**form_fields(
                page, action=f"/review/requests/{aid}", verdict="edit"),
                "args": json.dumps(less)})
            assert status == 303
        finally:
            await bob.close()
        second = (await wait_for(lambda: thread()[1:], what="the second edit's mail"))[0]
        said = _text(second)
        assert f"U_BOB edited the arguments of issue_refund (request {aid}) on the web " \
               "review queue at " in said
        assert "  amount_cents: 2100 -> 2000\n" in said and "reason" not in said
        assert "Someone other than U_BOB must approve them." in said

        await h.engine.decide(aid, actor=Actor("U_ALICE", "cli:ops"), verdict="approve")
        await wait_for(lambda: _status(h, paused.run_id, "completed"), what="completion")
        assert [r["args"] for r in h.refunds()] == [less]
        outcome = (await wait_for(lambda: thread()[2:], what="the outcome mail"))[0]
        assert "was approved with edits by U_ALICE from the command line" in _text(outcome)
        assert len(thread()) == 3
        for mail in inbox.messages:
            assert '"reason": "duplicate charge"' not in _text(mail)
            assert "half of it" not in _text(mail)


async def test_an_edit_of_a_request_never_mailed_queues_no_mail(sqlite_url: str,
                                                                tmp_path: Path) -> None:
    async with smtp_server() as (_inbox, smtp_port), \
            web_harness(sqlite_url, tmp_path, smtp_port=smtp_port, background=False) as (h, _):
        paused = await h.pause_refund()
        [aid] = paused.approval_ids
        await h.engine.decide(aid, actor=Actor("U_ALICE", "slack"), verdict="edit",
                              args={"order_id": "A-1001", "amount_cents": 100,
                                    "reason": "less"})
        assert await sql(h, "SELECT count(*) FROM outbox WHERE kind LIKE 'mail.%'") == [(0,)]


async def test_an_outcome_question_is_answered_on_the_queue(sqlite_url: str,
                                                            tmp_path: Path) -> None:
    """A call whose outcome is unknown (the process died before its result was recorded):
    the queue asks its approver whether it ran, with what they need to check (the
    attempt, the idempotency key, the arguments), and offers the card's answers, through
    the same decide: abort needs a reason; "mark done" continues the run without running
    the call again."""
    async with smtp_server() as (inbox, smtp_port), \
            web_harness(sqlite_url, tmp_path, smtp_port=smtp_port, background=False) as (h, url):
        paused, q = await h.outcome_question()
        alice = Browser(url)
        try:
            assert await alice.ask_link("alice@example.com") == 200
            await h.service.drain.drain_once()
            status, _ = await alice.open_and_sign_in(await inbox.link_for("alice@example.com"))
            assert status == 303
            status, page = await alice.get("/review")
            assert status == 200 and f'id="r-{q.id}"' in page
            assert "Did <code>send_customer_email</code> happen?" in page
            key = json.loads(q.packet)["idempotency_key"]
            assert key in page and "attempt 1" in page
            assert 'value="approve"' not in page  # a question's answers, not a call's
            action = f"/review/requests/{q.id}"
            status, body = await alice.post(action, {**form_fields(
                page, action=action, verdict="abort"), "reason": ""})
            assert status == 409 and "reason" in body
            assert (await h.approval(q.id)).status == "pending"
            status, _ = await alice.post(action, form_fields(page, action=action,
                                                             verdict="mark_done"))
            assert status == 303 and alice.last is not None
            assert alice.last.headers["Location"] == "/review?done=mark_done"
            status, page = await alice.get(f"/review/requests/{q.id}")
            assert "marked done by U_ALICE on the web review queue" in page
        finally:
            await alice.close()
        [resolved] = await audit(h, "outcome_resolved")
        assert (resolved.actor, resolved.via) == ("U_ALICE", "web")
        assert (await h.engine.advance(paused.run_id)).status == "completed"
        emails = [e for e in map(json.loads, h.ledger.read_text().splitlines())
                  if e["tool"] == "send_customer_email"]
        assert len(emails) == 1
