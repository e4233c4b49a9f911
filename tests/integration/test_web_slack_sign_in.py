"""Sign in with Slack on the web review queue, end to end: real HTTP against serve's
listener, the Slack emulator playing Slack's authorize page and its ``openid.connect.*``
methods, real databases. A full sign-in ends in the same kind of session as a mailed link,
and a decision made with it is the Slack user's, ``via: web``; every refusal (a state
forged, used again, from another browser; a code that is not one, another nonce's;
another workspace; someone who is not an approver; Cancel at Slack) is a status, an audit
entry and nothing else."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from approvald.bot.web.routes import SESSION_COOKIE, SLACK_COOKIE
from approvald.bot.web.slack_sign_in import CALLBACK
from approvald.runtime.kernel.clock import ManualClock

from tests.integration.slack_harness import Harness, wait_for
from tests.integration.test_web_review import (
    _status,
    audit,
    counts,
    one_session,
    refusals,
    sql,
)
from tests.integration.web_helpers import Browser, form_fields, refusal_tally, web_harness

SLACK = {"APPROVALD_SLACK_CLIENT_ID": "1111.2222",
         "APPROVALD_SLACK_CLIENT_SECRET": "sandbox-client-secret"}


async def begin(b: Browser) -> str:
    """Press "Sign in with Slack" on the sign-in page: the authorize URL it sends to."""
    status, page = await b.get("/review")
    assert status == 200 and "Sign in with Slack" in page
    status, _ = await b.post("/review/sign-in/slack",
                             form_fields(page, action="/review/sign-in/slack"))
    assert status == 303 and b.last is not None
    return str(b.last.headers["Location"])


async def at_slack(b: Browser, authorize: str) -> str:
    """The emulated Slack's authorize step: where it sends the browser back."""
    status, body = await b.get(authorize)
    assert status == 302 and b.last is not None, body
    return str(b.last.headers["Location"])


async def sign_in_with_slack(b: Browser) -> tuple[int, str]:
    return await b.get(await at_slack(b, await begin(b)))


def query(url: str) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()}


async def test_sign_in_with_slack_and_approve_on_the_queue(db_url: str, tmp_path: Path) -> None:
    async with web_harness(db_url, tmp_path, **SLACK) as (h, url):
        paused = await h.pause_refund()  # requested by U_DANA
        [aid] = paused.approval_ids
        await h.card(aid)
        h.emulator.openid.sign_in_as("U_ALICE")
        assert "; Sign in with Slack on" in h.service.describe()
        alice = Browser(url)
        try:
            # the sign-in page's form may go on to Slack's authorize page, and only there
            await alice.get("/review")
            assert alice.last is not None
            assert "form-action 'self' " + h.emulator.root_url.rstrip("/") + ";" \
                in alice.last.headers["Content-Security-Policy"]
            authorize = await begin(alice)
            assert alice.last is not None
            bound = next(c for c in alice.last.headers.getall("Set-Cookie")
                         if c.startswith(SLACK_COOKIE + "="))
            assert "HttpOnly" in bound and "SameSite=Lax" in bound
            assert "Path=/review/sign-in/slack" in bound
            assert authorize.startswith(h.emulator.root_url + "openid/connect/authorize?")
            q = query(authorize)
            assert q["scope"] == "openid profile email" and q["response_type"] == "code"
            assert q["client_id"] == "1111.2222" and q["team"] == "T_TEST"
            assert q["redirect_uri"] == url + CALLBACK
            assert q["state"] and q["nonce"] and q["nonce"] != q["state"]
            # beginning stores nothing (the state is checked by its MACs)
            assert await sql(h, "SELECT * FROM web_slack_states") == []
            before = await counts(h)
            callback = await at_slack(alice, authorize)
            assert callback.startswith(url + CALLBACK + "?")
            assert await counts(h) == before  # nothing yet: Slack only sent the browser back
            status, page = await alice.get(callback)
            assert status == 200 and "Signed in as" in page and "U_ALICE" in page
            assert 'http-equiv="refresh"' in page
            [exchange] = h.emulator.calls("openid.connect.token")
            assert exchange.ok and exchange.params["redirect_uri"] == url + CALLBACK
            assert "client_secret" not in exchange.params  # sent as HTTP Basic credentials
            assert h.emulator.calls("openid.connect.userInfo")[0].ok
            # the same kind of session as a mailed link's
            signed_in = await one_session(h, alice, "U_ALICE")
            assert json.loads(signed_in.details)["slack_team"] == "T_TEST"
            assert await refusal_tally(h) == {}
            # the state, used, is stored hashed only
            [stored] = await sql(h, "SELECT id_hash, used_at FROM web_slack_states")
            assert q["state"] not in str(stored) and stored[1] is not None

            status, page = await alice.get("/review")
            assert status == 200 and f'id="r-{aid}"' in page
            fields = form_fields(page, action=f"/review/requests/{aid}", verdict="approve")
            status, _ = await alice.post(f"/review/requests/{aid}", fields)
            assert status == 303
            await wait_for(lambda: _status(h, paused.run_id, "completed"),
                           what="the run to complete")
            assert len(h.refunds()) == 1
            [approved] = await audit(h, "approved")
            assert approved.actor == "U_ALICE" and approved.via == "web"
            assert (await h.approval(aid)).decided_via == "web"
            # the callback again (a reload, history): refused, nothing runs twice
            status, body = await alice.get(callback)
            assert status == 403 and "completed already" in body
            assert await refusal_tally(h) == {"state_used": 1}
            assert len(h.refunds()) == 1
        finally:
            await alice.close()


async def test_the_sign_in_page_offers_slack_only_when_configured(sqlite_url: str,
                                                                  tmp_path: Path) -> None:
    async with web_harness(sqlite_url, tmp_path) as (h, url):
        b = Browser(url)
        try:
            status, page = await b.get("/review")
            assert status == 200 and "Mail me a sign-in link" in page
            assert "Slack" not in page and b.last is not None
            assert "Sign in with Slack" not in h.service.describe()
            assert "form-action 'self';" in b.last.headers["Content-Security-Policy"]
            status, _ = await b.get(CALLBACK + "?state=x&code=y")
            assert status == 404
            assert await audit(h, "web_signed_in") == []
        finally:
            await b.close()


async def refused(h: Harness, b: Browser, target: str, reason: str,
                  before: dict[str, int], *, known: bool = False) -> dict[str, Any]:
    """GET ``target``: refused with ``reason``, audited (an entry of its own when the
    person is ``known``, else counted), and nothing else changed."""
    seen = await refusal_tally(h)
    status, body = await b.get(target)
    assert status == 403, (status, body)
    assert await refusal_tally(h) - seen == {reason: 1}
    assert b.cookie(SESSION_COOKIE) is None
    assert await counts(h) == before
    if not known:
        return {}
    details = (await refusals(h))[-1]
    assert details["reason"] == reason and details["sign_in"] == "slack", details
    return details


async def test_slack_sign_in_refusals_are_audited_and_change_nothing(db_url: str,
                                                                     tmp_path: Path) -> None:
    clock = ManualClock(datetime.now(UTC))
    async with web_harness(db_url, tmp_path, clock=clock, **SLACK) as (h, url):
        paused = await h.pause_refund()
        [aid] = paused.approval_ids
        alice, mallory = Browser(url), Browser(url)
        try:
            before = await counts(h)
            h.emulator.openid.sign_in_as("U_ALICE")
            # a forged state (and a callback with none)
            await refused(h, mallory, CALLBACK + "?" + urlencode(
                {"state": "forged-" + "A" * 40, "code": "x"}), "unknown_state", before)
            await refused(h, mallory, CALLBACK + "?code=x", "unknown_state", before)

            # Alice's callback, taken to a browser that did not begin it (no cookie): refused,
            # and Alice's sign-in is untouched by it
            callback = await at_slack(alice, await begin(alice))
            await refused(h, mallory, callback, "state_no_cookie", before)
            # ... or one that began a sign-in of its own (another browser's cookie)
            await begin(mallory)
            await refused(h, mallory, callback, "state_other_browser", before)
            assert h.emulator.calls("openid.connect.token") == []  # no code was exchanged
            # in another tab of Alice's browser, Dana signs in at Slack
            h.emulator.openid.sign_in_as("U_DANA")
            as_dana = await at_slack(alice, await begin(alice))
            status, _ = await alice.get(callback)
            assert status == 200
            # ... and comes back after Alice is signed in here: refused, Alice stays
            sid = alice.cookie(SESSION_COOKIE)
            before = await counts(h)
            status, body = await alice.get(as_dana)
            assert status == 403 and "another approver" in body
            assert (await refusals(h))[-1]["reason"] == "other_approver"
            assert await counts(h) == before and alice.cookie(SESSION_COOKIE) == sid
            # the same state again: used
            seen = await refusal_tally(h)
            status, _ = await alice.get(callback)
            assert status == 403 and await refusal_tally(h) - seen == {"state_used": 1}
            assert await counts(h) == before and alice.cookie(SESSION_COOKIE) == sid

            # a code Slack does not know: the exchange fails
            dana = Browser(url)
            try:
                h.emulator.openid.sign_in_as("U_DANA")
                state = query(await begin(dana))["state"]
                await refused(h, dana, CALLBACK + "?" + urlencode(
                    {"state": state, "code": "not-a-code"}), "token_exchange", before)
                # another sign-in's code, under this one's state: its nonce is not this one's
                first = query(await at_slack(dana, await begin(dana)))
                second = query(await begin(dana))
                await refused(h, dana, CALLBACK + "?" + urlencode(
                    {"state": second["state"], "code": first["code"]}), "nonce", before)
                # a sign-in that took longer than its ten minutes
                late = await at_slack(dana, await begin(dana))
                clock.advance(timedelta(minutes=10, seconds=1))
                await refused(h, dana, late, "state_expired", before)
                # Cancel at Slack
                h.emulator.openid.deny()
                back = await at_slack(dana, await begin(dana))
                await refused(h, dana, back, "slack_refused", before)
                # a member of another workspace
                h.emulator.openid.sign_in_as("U_DANA", team="T_OTHER")
                await refused(h, dana, await at_slack(dana, await begin(dana)), "wrong_team",
                              before)
                # a member of this one who is not an approver: Slack vouched for who it is,
                # so the refusal names them
                h.emulator.openid.sign_in_as("U_CAROL")
                details = await refused(h, dana, await at_slack(dana, await begin(dana)),
                                        "not_an_approver", before, known=True)
                assert details["slack_user"] == "U_CAROL"
                [*_, last] = await audit(h, "web_refused")
                assert last.actor == "U_CAROL"
                # Slack unreachable when the code is to be exchanged
                h.emulator.openid.sign_in_as("U_DANA")
                back = await at_slack(dana, await begin(dana))
                seen = await refusal_tally(h)
                await h.emulator.down()
                try:
                    status, body = await dana.get(back)
                finally:
                    await h.emulator.up()
                assert status == 503 and "could not be reached" in body
                assert await refusal_tally(h) - seen == {"slack_unreachable": 1}
                assert await counts(h) == before
            finally:
                await dana.close()
            # one sign-in in all (Alice's), nothing decided, nothing ran
            assert len(await audit(h, "web_signed_in")) == 1
            assert (await h.approval(aid)).status == "pending" and h.refunds() == []
        finally:
            await alice.close()
            await mallory.close()
