"""``/review``: the web review queue's routes, on serve's HTTP listener.

GET never changes anything. Every POST is refused (403, audited ``web_refused``, nothing
else changed) unless its ``Origin`` is the configured public URL's and it carries the CSRF
token of its form: bound to the session once signed in, to a pre-session cookie before.
A decision POST also needs a live session (a cookie the database does not hold is refused
the same way) and goes through the engine's one ``decide``, as ``Actor(user, "web")``,
bound to the digest of the arguments the page showed and to the same button token a card
carries: arguments edited since the page was drawn refuse it as a stale card.

Sign in with Slack, when configured, begins with a POST (from this origin, with the
pre-session CSRF token) that stores a state and sends the browser to Slack; Slack sends it
back to a GET, the one route that signs in without a POST, because that is how OpenID
Connect returns: it does nothing unless the state is this browser's, unused and fresh.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web
from approvald.bot.web import pages
from approvald.bot.web.auth import STATE_TTL, Refused, Session, WebAuth
from approvald.bot.web.refusals import ANONYMOUS
from approvald.bot.web.slack_sign_in import CALLBACK, SlackOpenId
from approvald.runtime import (
    MAX_DEPTH,
    Actor,
    DecisionRefused,
    Engine,
    NotFound,
    TooDeep,
    Verdict,
    parse_caller_json,
)
from approvald.store.records import ApprovalRecord
from multidict import MultiDictProxy

log = logging.getLogger("approvald.web")

SESSION_COOKIE = "approvald_session"
PRE_COOKIE = "approvald_pre"
SLACK_COOKIE = "approvald_slack"  # binds a sign-in with Slack's state to its browser
SLACK_PATH = "/review/sign-in/slack"
MAX_STATE = 200  # characters of a Sign in with Slack state (ours are 120)
CANDIDATES = 200  # pending requests looked at for one queue page
VERDICTS: dict[str, Verdict] = {"approve": "approve", "deny": "deny", "redirect": "redirect",
                                "edit": "edit", "retry": "retry", "mark_done": "mark_done",
                                "abort": "abort"}
KINDS = ("tool_call", "outcome_unknown")  # what the queue shows: calls, and outcome questions
DONE = {"approved": "Approved: the run goes on.", "denied": "Denied: the agent is told why.",
        "redirected": "Redirected: the agent gets your guidance.",
        "voted": "Your approval is counted; the request waits for more.",
        "edited": "Your edit is proposed; someone else must approve it.",
        "repeated": "That decision was already recorded: it stands.",
        "retry": "Retry chosen: the call runs again.",
        "mark_done": "Marked done: the run goes on without running it again.",
        "abort": "Aborted: the run was cancelled."}
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'self'; form-action 'self'; "
                               "frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    # not no-referrer: with it chromium sends "Origin: null" on the forms' own POSTs; the
    # pages link nowhere else, so a link's token (in its page's URL) stays on this origin
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
    "X-Frame-Options": "DENY",
}
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def route_of(request: web.Request) -> str:
    """The pattern of the route a request took (``/review/requests/{id}``): what a refusal
    records, never the path itself, which is the request's to make as long as it likes."""
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else "(no route)"


def origin_of(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}".lower()


def see_other(location: str) -> web.Response:
    """A 303 to ``location`` (a page of this face: never a URL a form brings)."""
    return web.Response(status=303, headers={**HEADERS, "Location": location})


def html(body: str, status: int = 200, *,
         headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(text=body, status=status, content_type="text/html", charset="utf-8",
                        headers=headers or HEADERS)


class WebRoutes:
    """The handlers of ``/review``."""

    def __init__(self, engine: Engine, auth: WebAuth, public_url: str,
                 slack: SlackOpenId | None = None) -> None:
        self.e = engine
        self.auth = auth
        self.slack = slack  # Sign in with Slack, when the operator configured it
        # the sign-in page's form goes on to Slack's authorize page (a redirect that a
        # browser holds to form-action too)
        self.sign_in_headers = HEADERS if slack is None else {
            **HEADERS, "Content-Security-Policy": HEADERS["Content-Security-Policy"].replace(
                "form-action 'self'",
                f"form-action 'self' {origin_of(slack.authorize_endpoint)}")}
        self.origin = origin_of(public_url)
        self.secure = public_url.lower().startswith("https://")

    def add_to(self, app: web.Application) -> None:
        r = app.router
        r.add_get("/review", self.queue, allow_head=False)
        r.add_get("/review/style.css", self.style, allow_head=False)
        r.add_post("/review/sign-in/mail", self._posted(self.mail_link))
        if self.slack is not None:
            r.add_post(SLACK_PATH, self._posted(self.slack_begin))
            r.add_get(CALLBACK, self.slack_callback, allow_head=False)
        r.add_get("/review/sign-in/{token}", self.open_link, allow_head=False)
        r.add_post("/review/sign-in", self._posted(self.sign_in))
        r.add_post("/review/sign-out", self._posted(self.sign_out))
        r.add_get("/review/requests/{id}", self.one, allow_head=False)
        r.add_post("/review/requests/{id}", self._posted(self.decide))

    # -- plumbing -------------------------------------------------------------------------
    def _cookie(self, resp: web.StreamResponse, name: str, value: str, max_age: int, *,
                path: str = "/review", samesite: str = "Strict") -> None:
        resp.set_cookie(name, value, max_age=max_age, path=path, httponly=True,
                        samesite=samesite, secure=self.secure)

    def _signed_in_response(self, resp: web.StreamResponse, session_id: str,
                            session: Session) -> None:
        """Set the new session's cookie on ``resp``; the pre-session cookie is done."""
        life = session.record.expires_at - session.record.created_at
        self._cookie(resp, SESSION_COOKIE, session_id, int(life.total_seconds()))
        resp.del_cookie(PRE_COOKIE, path="/review")

    def _pre(self, request: web.Request) -> tuple[str, bool]:
        """The pre-session cookie's value, and whether it has to be set."""
        pre = request.cookies.get(PRE_COOKIE)
        if pre and 20 <= len(pre) <= 100:
            return pre, False
        return secrets.token_urlsafe(32), True

    def _posted(self, handler: Callable[[web.Request, MultiDictProxy[str | bytes | Any]],
                                        Awaitable[web.StreamResponse]]) -> Handler:
        """``handler`` behind the origin check, with the form read."""
        async def guarded(request: web.Request) -> web.StreamResponse:
            origin = request.headers.get("Origin")
            if origin is None or origin.lower() != self.origin:
                # a live session's approver is named (one entry); anyone else is counted
                session = await self._session(request)
                await self.auth.refuse("cross_origin", path=route_of(request),
                                       actor=session.user if session else ANONYMOUS,
                                       source=request.remote,
                                       origin=(origin or "(none)")[:200])
                return html(pages.message("Refused", "This form was not sent from the review "
                                          "queue's own pages.", error=True), 403)
            try:
                form = await request.post()
            except ValueError:
                return html(pages.message("Refused", "The form could not be read.",
                                          error=True), 400)
            try:
                return await handler(request, form)
            except Refused as exc:
                return html(pages.message("Refused", str(exc), error=True), exc.status)
        return guarded

    async def _session(self, request: web.Request) -> Session | None:
        return await self.auth.session(request.cookies.get(SESSION_COOKIE))

    async def _pre_checked(self, request: web.Request,
                           form: MultiDictProxy[str | bytes | Any]) -> None:
        """A form shown before sign-in carries the CSRF token of this browser's cookie."""
        pre = request.cookies.get(PRE_COOKIE)
        sent = form.get("csrf")
        if not pre or not isinstance(sent, str) \
                or not self.auth.keys.same(sent, self.auth.keys.pre_csrf(pre)):
            await self.auth.refuse("csrf", path=route_of(request), source=request.remote)
            raise Refused("csrf", "This form has expired or was not sent from this browser. "
                          "Open the review queue and try again.")

    # -- pages ----------------------------------------------------------------------------
    async def style(self, request: web.Request) -> web.StreamResponse:
        return web.Response(text=pages.STYLE, content_type="text/css", charset="utf-8",
                            headers={**HEADERS, "Cache-Control": "max-age=3600"})

    async def queue(self, request: web.Request) -> web.StreamResponse:
        session = await self._session(request)
        if session is None:
            pre, new = self._pre(request)
            resp = html(pages.sign_in_form(self.auth.keys.pre_csrf(pre),
                                           slack=self.slack is not None),
                        headers=self.sign_in_headers)
            if new:
                self._cookie(resp, PRE_COOKIE, pre, 3600)
            return resp
        items = await self.actionable(session.user)
        done = request.query.get("done")
        return html(pages.queue(items, user=session.user, csrf=session.csrf,
                                now=self.e.now(), note=DONE.get(done or ""),
                                insights=await self.e.operator_insights(session.user)))

    async def one(self, request: web.Request) -> web.StreamResponse:
        """One request (a mail's link): to decide while it is open, else who decided it and
        how; nothing of it for someone who may not decide it."""
        session = await self._session(request)
        if session is None:
            return await self.queue(request)  # the sign-in form
        user, csrf = session.user, session.csrf
        try:
            a = await self.e.approval(request.match_info["id"][:64])
        except NotFound:
            a = None
        if a is None or a.kind not in KINDS:
            return html(pages.message("Not found", "There is no such request.", error=True,
                                      user=user, csrf=csrf), 404)
        try:
            await self.e.may_decide(a, Actor(user, "web"))
        except DecisionRefused:
            return html(pages.message("Not yours", "You may not decide this request.",
                                      error=True, user=user, csrf=csrf), 403)
        if a.status == "pending":
            return html(pages.queue([(a, self.e.button_token(a))], user=user, csrf=csrf,
                                    now=self.e.now()))
        return html(pages.message("Decided", pages.outcome_line(a), user=user, csrf=csrf))

    async def actionable(self, user: str) -> list[tuple[ApprovalRecord, str | None]]:
        """Pending tool calls and outcome questions ``user`` may decide, oldest first: the
        same check as a click (the requester never approves their own; approvers and user
        groups as the request was made)."""
        pending = await self.e.documents.review_candidates(limit=CANDIDATES)
        out: list[tuple[ApprovalRecord, str | None]] = []
        for a in pending:
            if a.kind not in KINDS:
                continue
            try:
                await self.e.may_decide(a, Actor(user, "web"))
            except DecisionRefused:
                continue
            out.append((a, self.e.button_token(a)))
        out.sort(key=lambda pair: (pair[0].requested_at, pair[0].id))
        return out

    async def open_link(self, request: web.Request) -> web.StreamResponse:
        """A mailed link, opened: a page with a button, and nothing else (GET never signs
        in: a mail scanner that fetches the link changes nothing)."""
        token = request.match_info["token"]
        link = await self.auth.peek(token) if len(token) <= 100 else None
        now = self.e.now()
        if link is None or link.used_at is not None or link.expires_at <= now:
            why = ("This sign-in link is not valid." if link is None
                   else "This sign-in link was used already." if link.used_at is not None
                   else "This sign-in link has expired.")
            return html(pages.message("Sign in", why + " Ask for a new one on the review "
                                      "queue.", error=True), 410 if link else 404)
        pre, new = self._pre(request)
        resp = html(pages.confirm_sign_in(token, self.auth.keys.pre_csrf(pre), link.user_id))
        if new:
            self._cookie(resp, PRE_COOKIE, pre, 3600)
        return resp

    # -- forms ----------------------------------------------------------------------------
    async def mail_link(self, request: web.Request,
                        form: MultiDictProxy[str | bytes | Any]) -> web.StreamResponse:
        await self._pre_checked(request, form)
        address = form.get("email")
        if isinstance(address, str) and 3 <= len(address) <= 320:
            await self.auth.request_link(address)
        # the same answer whether or not the address is an approver's
        return html(pages.message("Sign in", "If that address belongs to an approver, a "
                                  "sign-in link is on its way. It works once, for 15 "
                                  "minutes."))

    async def sign_in(self, request: web.Request,
                      form: MultiDictProxy[str | bytes | Any]) -> web.StreamResponse:
        await self._pre_checked(request, form)
        token = form.get("token")
        if not isinstance(token, str) or not 1 <= len(token) <= 100:
            await self.auth.refuse("unknown_link", path=route_of(request),
                                   source=request.remote)
            raise Refused("unknown_link", "This sign-in link is not valid.")
        current = await self._session(request)
        session_id, session = await self.auth.sign_in(token, current=current,
                                                      source=request.remote)
        resp = see_other("/review")
        self._signed_in_response(resp, session_id, session)
        return resp

    async def slack_begin(self, request: web.Request,
                          form: MultiDictProxy[str | bytes | Any]) -> web.StreamResponse:
        """Leave for Slack's authorize page, with a state bound to this browser."""
        assert self.slack is not None
        await self._pre_checked(request, form)
        try:
            team = await self.slack.team()
        except Refused as exc:
            await self.auth.refuse(exc.reason, path=route_of(request), source=request.remote,
                                   sign_in="slack")
            raise
        # one cookie per browser, not per attempt: two tabs may sign in at once
        browser = request.cookies.get(SLACK_COOKIE) or ""
        if not 20 <= len(browser) <= 100:
            browser = secrets.token_urlsafe(32)
        state = self.auth.begin_slack(browser)  # writes nothing: anyone may begin at will
        resp = web.Response(status=303, headers={
            **HEADERS, "Location": self.slack.authorize_url(state, self.auth.keys.nonce(state),
                                                            team)})
        # Lax, not Strict: it has to come back with Slack's redirect (a cross-site one)
        self._cookie(resp, SLACK_COOKIE, browser, int(STATE_TTL.total_seconds()),
                     path=SLACK_PATH, samesite="Lax")
        return resp

    async def slack_callback(self, request: web.Request) -> web.StreamResponse:
        """Slack sends the browser back: use the state (once, from the browser that began
        the sign-in), exchange the code, and sign in the approver Slack names."""
        assert self.slack is not None
        source = request.remote
        try:
            state = request.query.get("state", "")
            if not 1 <= len(state) <= MAX_STATE:
                await self.auth.refuse("unknown_state", source=source, sign_in="slack")
                raise Refused("unknown_state", "This sign-in with Slack was not begun here. "
                              "Start again from the review queue.")
            checked = await self.auth.check_slack_state(
                state, request.cookies.get(SLACK_COOKIE), source=source)
            code = request.query.get("code", "")
            if not code or len(code) > 500:
                error = request.query.get("error", "no code")[:100]
                await self.auth.refuse("slack_refused", source=source, sign_in="slack",
                                       error=error)
                raise Refused("slack_refused", f"Slack did not sign you in ({error}).")
            try:
                who = await self.slack.identify(code, self.auth.keys.nonce(state))
                workspace = await self.slack.team()
            except Refused as exc:
                await self.auth.refuse(exc.reason, source=source, sign_in="slack",
                                       error=str(exc)[:300])
                raise
            session_id, session = await self.auth.slack_session(
                who.user, who.team, workspace=workspace, current=await self._session(request),
                state=checked, source=source)
        except Refused as exc:
            resp = html(pages.message("Refused", str(exc), error=True), exc.status)
        else:
            # a page, not a redirect: after Slack's cross-site redirect, a browser would not
            # send the SameSite=Strict session cookie along a redirect to /review
            resp = html(pages.signed_in(session.user))
            self._signed_in_response(resp, session_id, session)
            # (the browser's cookie stays, for a sign-in begun in another tab: it signs
            # nothing in by itself, and it lapses with the states it binds)
        return resp

    async def _signed_in(self, request: web.Request,
                         form: MultiDictProxy[str | bytes | Any],
                         approval_id: str | None = None) -> Session:
        """The live session of a POST that carries its CSRF token; else refused, audited."""
        raw = request.cookies.get(SESSION_COOKIE)
        session = await self.auth.session(raw)
        if session is None:
            if raw:
                await self.auth.refuse("bad_session", path=route_of(request),
                                       source=request.remote, approval_id=approval_id)
                raise Refused("bad_session", "Your session is not valid (it may have "
                              "expired). Sign in again.", 401)
            await self.auth.refuse("no_session", path=route_of(request),
                                   source=request.remote, approval_id=approval_id)
            raise Refused("no_session", "Sign in first.", 401)
        sent = form.get("csrf")
        if not isinstance(sent, str) or not self.auth.keys.same(sent, session.csrf):
            await self.auth.refuse("csrf", actor=session.user, path=route_of(request),
                                   approval_id=approval_id)
            raise Refused("csrf", "This form has expired or was not sent from this page. "
                          "Reload the review queue and try again.")
        return session

    async def sign_out(self, request: web.Request,
                       form: MultiDictProxy[str | bytes | Any]) -> web.StreamResponse:
        session = await self._signed_in(request, form)
        await self.auth.sign_out(session)
        resp = see_other("/review")
        resp.del_cookie(SESSION_COOKIE, path="/review")
        return resp

    async def decide(self, request: web.Request,
                     form: MultiDictProxy[str | bytes | Any]) -> web.StreamResponse:
        approval_id = request.match_info["id"][:64]
        session = await self._signed_in(request, form, approval_id)
        user, csrf = session.user, session.csrf
        verdict = VERDICTS.get(str(form.get("verdict", "")))
        digest = form.get("digest")
        if verdict is None or not isinstance(digest, str) or not digest:
            return html(pages.message("Refused", "This form is incomplete.", error=True,
                                      user=user, csrf=csrf), 400)
        token = form.get("token")
        reason = form.get("reason")
        args: Any = None
        if verdict == "edit":
            try:
                args = parse_caller_json(str(form.get("args", "")), max_depth=MAX_DEPTH)
            except ValueError as exc:  # (TooDeep, nested past MAX_DEPTH, is one)
                what = f"are {exc}" if isinstance(exc, TooDeep) else f"are not JSON: {exc}"
                return html(pages.message("Not decided", f"The edited arguments {what}",
                                          error=True, user=user, csrf=csrf), 400)
            # (a masked value left as shown keeps the original: decide reads it so)
        try:
            decision = await self.e.decide(
                approval_id, actor=Actor(user, "web"), verdict=verdict,
                reason=reason if isinstance(reason, str) else None, args=args,
                token=token if isinstance(token, str) and token else None,
                expect_digest=digest)
        except NotFound:
            return html(pages.message("Not found", "There is no such request.", error=True,
                                      user=user, csrf=csrf), 404)
        except DecisionRefused as exc:  # audited by decide, like a refused click
            return html(pages.message("Not decided", str(exc), error=True, user=user,
                                      csrf=csrf), 409)
        outcome = "repeated" if decision.repeated else decision.outcome
        return see_other(f"/review?done={outcome}")
