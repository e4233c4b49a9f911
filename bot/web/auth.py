"""Passwordless sign-in to the web review queue, sessions, and CSRF tokens.

An approver asks for a link with their address (``APPROVALD_APPROVER_EMAILS`` maps Slack
users to addresses); the answer is the same whether or not the address is known. The link
is single-use and lives :data:`LINK_TTL`: its row stores only the SHA-256 of its token, the
token being derived from the row's random id and the deployment's secret when the mail is
sent, so neither the row nor the outbox holds anything that signs in. Using a link is a
compare-and-set on ``used_at`` (one winner, across replicas).

Opening a link (GET) changes nothing: a mail scanner that prefetches it signs nobody in.
The page it shows has a button that POSTs the token, with a CSRF token bound to a
pre-session cookie, from this deployment's own origin.

A session id is 256 random bits in an ``HttpOnly``, ``SameSite=Strict`` cookie (``Secure``
when the public URL is https); only its SHA-256 is stored, and it lives
:data:`SESSION_TTL`. Each state-changing form carries a CSRF token, the HMAC of the
session id under the deployment's secret: bound to the session, stored nowhere.

Sign in with Slack (:mod:`bot.web.slack_sign_in`), where the operator configured it, ends
in the same kind of session. Its ``state`` is single-use and lives :data:`STATE_TTL`, and
beginning a sign-in writes nothing (anyone may begin as many as they like): the state
carries its expiry and two MACs under the deployment's secret, one saying this deployment
made it, one binding it to a random cookie of the browser that began it, which only that
browser's cookie passes. Its row (the SHA-256 of the state and of that cookie) is written
when Slack has signed the browser in, in the transaction that opens the session: that
insert is the compare-and-set that uses it once. The cookie is ``SameSite=Lax`` (a
``Strict`` one would not come back with Slack's redirect) and is sent only to the sign-in's
own paths. The same approvers may sign in either way: those ``APPROVALD_APPROVER_EMAILS``
lists, by their Slack user id.

Every refusal (a link used again, expired or unknown, a link for another approver than
the one signed in, a session the database does not hold, a POST without its CSRF token or
from another origin; a Slack state forged, used again, expired or another browser's, a
code Slack will not exchange, another workspace, someone who is not an approver) changes
nothing else and is audited as ``web_refused`` with its reason: one entry each for
someone known, counted per minute and source for someone unknown
(:mod:`bot.web.refusals`).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from approvald.bot.web.refusals import ANONYMOUS, Refusals
from approvald.runtime import OTHER_APPROVER, ReviewState, new_id
from approvald.store.repos.web import LinkRecord, SessionRecord

LINK_TTL = timedelta(minutes=15)
STATE_TTL = timedelta(minutes=10)  # from leaving for Slack's authorize page to coming back
SESSION_TTL = timedelta(minutes=30)
MAX_LIVE_LINKS = 5  # unused links per approver at once: a cap on mails anyone can trigger
VIA = "web"


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class Refused(Exception):
    """A sign-in or a request refused (and audited); ``reason`` is a stable code."""

    def __init__(self, reason: str, message: str, status: int = 403) -> None:
        super().__init__(message)
        self.reason = reason
        self.status = status


class WebKeys:
    """The secrets of the web face, derived from the deployment's secret."""

    def __init__(self, master: str) -> None:
        raw = master.encode()
        self._key = hashlib.sha256(b"approvald-web-v1\x00" + raw).digest()

    def _mac(self, purpose: str, value: str) -> str:
        return _b64(hmac.new(self._key, f"{purpose}\x00{value}".encode(),
                             hashlib.sha256).digest())

    def link_token(self, link_id: str) -> str:
        """The token of sign-in link ``link_id`` (what its mail carries)."""
        return self._mac("link", link_id)

    def csrf(self, session_id: str) -> str:
        """The CSRF token of a session's forms."""
        return self._mac("csrf", session_id)

    def nonce(self, state: str) -> str:
        """The OpenID Connect ``nonce`` of a sign-in with Slack (stored nowhere)."""
        return self._mac("nonce", state)

    def pre_csrf(self, pre_id: str) -> str:
        """The CSRF token of the forms shown before sign-in (bound to a pre-session cookie)."""
        return self._mac("pre", pre_id)

    def state(self, body: str) -> str:
        """The MAC that says this deployment made a Sign in with Slack state."""
        return self._mac("state", body)

    def state_browser(self, body: str, browser: str) -> str:
        """The MAC that binds a state to the cookie of the browser that began it."""
        return self._mac("state-browser", f"{body}\x00{browser}")

    @staticmethod
    def same(a: str | None, b: str) -> bool:
        return a is not None and hmac.compare_digest(a.encode(), b.encode())


@dataclass(frozen=True)
class SlackState:
    """A Sign in with Slack state this deployment made for this browser, fresh and not
    used yet: what its row will say once it is used."""

    id_hash: str
    browser_hash: str
    created_at: datetime
    expires_at: datetime


@dataclass(frozen=True)
class Session:
    """A signed-in browser: who, and the CSRF token its forms carry."""

    record: SessionRecord
    csrf: str

    @property
    def user(self) -> str:
        return self.record.user_id


class WebAuth:
    """Links, sessions and the audit entries of both."""

    def __init__(self, state: ReviewState, keys: WebKeys, emails: dict[str, str]) -> None:
        self.state = state  # the face's own rows (links, sessions), never the database
        self.keys = keys
        self.emails = emails
        self.users = {address.lower(): user for user, address in emails.items()}
        self.refusals = Refusals(state)

    # -- links ----------------------------------------------------------------------------
    async def request_link(self, address: str) -> bool:
        """Mail a sign-in link to ``address`` if it is an approver's (True when one was
        queued). The caller answers the same either way."""
        user = self.users.get(address.strip().lower())
        if user is None:
            return False
        email = self.emails[user]
        link_id = new_id()
        token = self.keys.link_token(link_id)
        return await self.state.add_link(link_id=link_id, token_hash=sha256(token),
                                         user=user, email=email, ttl=LINK_TTL,
                                         max_live=MAX_LIVE_LINKS)

    async def link(self, link_id: str) -> LinkRecord | None:
        return await self.state.link(link_id)

    async def peek(self, token: str) -> LinkRecord | None:
        """The link ``token`` opens, as it stands (reading changes nothing)."""
        return await self.state.link_by_hash(sha256(token))

    async def sign_in(self, token: str, *, current: Session | None,
                      source: str | None = None) -> tuple[str, Session]:
        """Use the link ``token`` (once): a new session's id (for the cookie) and the
        session. :class:`Refused` (audited) for a link used before, expired, unknown, or
        for another approver than the one this browser is signed in as."""
        session_id = _b64(secrets.token_bytes(32))
        used = await self.state.use_link(sha256(token), session_hash=sha256(session_id),
                                         current=current.user if current else None,
                                         ttl=SESSION_TTL)
        result: SessionRecord | Refused | None = (
            Refused("other_approver", "This link is for another approver than the one "
                    "signed in here. Sign out first.") if used == OTHER_APPROVER
            else used if isinstance(used, SessionRecord) else None)
        if not isinstance(result, SessionRecord):
            link = await self.peek(token)
            if result is None:
                result = (Refused("unknown_link", "This sign-in link is not valid.")
                          if link is None else
                          Refused("link_used", "This sign-in link was used already: links "
                                  "work once. Ask for a new one.")
                          if link.used_at is not None else
                          Refused("link_expired", "This sign-in link has expired. Ask for a "
                                  "new one."))
            await self.refuse(result.reason, actor=current.user if current else ANONYMOUS,
                              source=source, link=link.id if link else None,
                              link_user=link.user_id if link else None)
            raise result
        return session_id, Session(result, self.keys.csrf(session_id))

    # -- Sign in with Slack ---------------------------------------------------------------
    def may_sign_in(self, user: str) -> bool:
        """Whether ``user`` is an approver the review queue signs in (the same book for a
        mailed link and for Slack)."""
        return user in self.emails

    def begin_slack(self, browser: str) -> str:
        """A new ``state`` for a sign-in with Slack from the browser whose cookie holds
        ``browser``: ``NONCE.EXPIRES.MAC.BROWSER_MAC``. Nothing is stored."""
        expires = int((self.state.now() + STATE_TTL).timestamp())
        body = f"{_b64(secrets.token_bytes(16))}.{expires}"
        return f"{body}.{self.keys.state(body)}.{self.keys.state_browser(body, browser)}"

    async def check_slack_state(self, state: str, browser: str | None, *,
                                source: str | None = None) -> SlackState:
        """``state`` as this deployment made it for this browser, fresh and unused (it is
        used by :meth:`slack_session`); :class:`Refused` (audited) for a state forged,
        used before, expired, or another browser's."""
        parts = state.split(".")
        body = ".".join(parts[:2])
        made = len(parts) == 4 and bool(parts[0]) and parts[1].isdigit() \
            and len(parts[1]) <= 12 and self.keys.same(parts[2], self.keys.state(body))
        refusal: Refused | None = Refused(
            "unknown_state", "This sign-in with Slack was not begun here. Start again from "
            "the review queue.")
        until = self.state.now()
        if made:
            until = datetime.fromtimestamp(int(parts[1]), UTC)
            used = await self.state.slack_state_used(sha256(state))
            refusal = (
                Refused("state_used", "This sign-in with Slack was completed already. Start "
                        "again from the review queue.") if used else
                Refused("state_expired", "This sign-in with Slack took too long. Start again "
                        "from the review queue.") if until <= self.state.now() else
                Refused("state_no_cookie", "This browser did not begin this sign-in with "
                        "Slack (or its cookie is gone). Start again from the review queue.")
                if not browser else
                Refused("state_other_browser", "This sign-in with Slack was begun in another "
                        "browser. Start again from the review queue.")
                if not self.keys.same(parts[3], self.keys.state_browser(body, browser))
                else None)
        if refusal is not None:
            await self.refuse(refusal.reason, source=source, sign_in="slack")
            raise refusal
        assert browser
        return SlackState(id_hash=sha256(state), browser_hash=sha256(browser),
                          created_at=until - STATE_TTL, expires_at=until)

    async def slack_session(self, user: str, team: str, *, workspace: str,
                            current: Session | None, state: SlackState,
                            source: str | None = None) -> tuple[str, Session]:
        """A session for the Slack user ``user`` of ``team``, who signed in with Slack
        under ``state`` (used here, once): the same kind as a mailed link's.
        :class:`Refused` (audited) for another workspace than ``workspace``, someone who is
        not an approver, another approver than the one this browser is signed in as, or a
        state used meanwhile."""
        refusal = (
            Refused("wrong_team", "You signed in to another Slack workspace than this "
                    "deployment's.") if team != workspace else
            Refused("not_an_approver", "Your Slack account is not an approver's here.")
            if not self.may_sign_in(user) else
            Refused("other_approver", "You signed in with Slack as another approver than "
                    "the one signed in here. Sign out first.")
            if current is not None and current.user != user else None)
        if refusal is not None:
            await self.refuse(refusal.reason, actor=user if refusal.reason != "wrong_team"
                              else ANONYMOUS, source=source, sign_in="slack",
                              slack_user=user, slack_team=team)
            raise refusal
        session_id = _b64(secrets.token_bytes(32))
        record = await self.state.use_slack_state(
            id_hash=state.id_hash, browser_hash=state.browser_hash,
            created_at=state.created_at, expires_at=state.expires_at,
            session_hash=sha256(session_id), user=user, team=team, ttl=SESSION_TTL)
        if record is None:
            used = Refused("state_used", "This sign-in with Slack was completed already. "
                           "Start again from the review queue.")
            await self.refuse(used.reason, source=source, sign_in="slack")
            raise used
        return session_id, Session(record, self.keys.csrf(session_id))

    # -- sessions -------------------------------------------------------------------------
    async def session(self, session_id: str | None) -> Session | None:
        """The live session a cookie names, or None."""
        if not session_id:
            return None
        record = await self.state.session(sha256(session_id))
        return None if record is None else Session(record, self.keys.csrf(session_id))

    async def sign_out(self, session: Session) -> None:
        await self.state.end_session(session.record.id_hash, user=session.user)

    # -- refusals -------------------------------------------------------------------------
    async def refuse(self, reason: str, *, actor: str = ANONYMOUS, source: str | None = None,
                     approval_id: str | None = None, **details: str | None) -> None:
        """Audit a refusal: one entry for someone known, a count for someone unknown
        (``source``: the request's address; see :mod:`bot.web.refusals`)."""
        await self.refusals.refuse(reason, actor=actor, source=source,
                                   approval_id=approval_id, **details)
