"""What ``serve`` mounts of the web face: ``/review`` on its listener, mails on its drain."""

from __future__ import annotations

import logging

from aiohttp import web
from approvald.bot.config import Settings
from approvald.bot.web import pages
from approvald.bot.web.auth import WebAuth, WebKeys
from approvald.bot.web.mail import MailDeliverer, Mailer, NoTls
from approvald.bot.web.routes import WebRoutes
from approvald.bot.web.slack_sign_in import SlackOpenId
from approvald.runtime import (
    EDIT_MAIL,
    OUTCOME_MAIL,
    REMINDER_MAIL,
    REQUEST_MAIL,
    SIGN_IN_MAIL,
    Actor,
    ConfigError,
    DecisionRefused,
    Engine,
    Mail,
    MailSender,
    Refusal,
    RetryLater,
    Undeliverable,
)
from approvald.store.records import ApprovalRecord, OutboxRecord

MIN_SECRET = 16
log = logging.getLogger("approvald.web")


def slack_open_id(settings: Settings) -> SlackOpenId | None:
    """Sign in with Slack, when the operator set the Slack app's client ID and secret."""
    if not settings.slack_client_id and not settings.slack_client_secret:
        return None
    if not settings.slack_sign_in:
        missing = ("APPROVALD_SLACK_CLIENT_SECRET" if settings.slack_client_id
                   else "APPROVALD_SLACK_CLIENT_ID")
        raise ConfigError(f"{missing}: Sign in with Slack needs both the Slack app's client "
                          "ID and its client secret")
    if settings.slack_team_id is None and settings.slack_bot_token is None:
        raise ConfigError("APPROVALD_SLACK_TEAM_ID: Sign in with Slack admits one workspace; "
                          "set it, or SLACK_BOT_TOKEN (whose workspace is then the one)")
    assert settings.slack_client_id and settings.slack_client_secret and settings.public_url
    token = settings.slack_bot_token
    return SlackOpenId(client_id=settings.slack_client_id,
                       client_secret=settings.slack_client_secret.get_secret_value(),
                       authorize_url=settings.slack_authorize_endpoint(),
                       api_url=settings.slack_api_url, public_url=settings.public_url,
                       team_id=settings.slack_team_id,
                       bot_token=token.get_secret_value() if token else None)


class WebFace:
    """The review queue (when ``APPROVALD_PUBLIC_URL`` is set) and the mailer (when
    ``APPROVALD_SMTP_URL`` and ``APPROVALD_MAIL_FROM`` are, or ``mailer``)."""

    def __init__(self, engine: Engine, settings: Settings,
                 mailer: MailSender | None = None) -> None:
        assert settings.public_url is not None
        secret = settings.token_secret()
        if not secret or len(secret.encode()) < MIN_SECRET:
            raise ConfigError("APPROVALD_PUBLIC_URL: the review queue signs its links and "
                              "forms with APPROVALD_SECRET; set it (at least 16 characters)")
        self.engine = engine
        self.public_url = settings.public_url
        self.slack_cards = settings.slack_configured  # whether requests have Slack cards
        self.keys = WebKeys(secret)
        self.auth = WebAuth(engine.review_state(), self.keys, settings.emails())
        self.slack = slack_open_id(settings)
        self.routes = WebRoutes(engine, self.auth, settings.public_url, self.slack)
        self.mailer: MailSender | None = mailer
        target = settings.smtp_target()
        if mailer is None and target is not None and settings.mail_from is not None:
            self.mailer = Mailer(target, settings.mail_from)

    def add_routes(self, app: web.Application) -> None:
        self.routes.add_to(app)

    async def check_mail(self) -> None:
        """Say (in the log) whether the SMTP server gives the TLS its URL asks for, as far
        as it can be checked at start: reachable, STARTTLS offered, certificate good. A
        server that fails it is sent nothing; its mails wait in the outbox meanwhile."""
        if not isinstance(self.mailer, Mailer):
            return
        where = self.mailer.target.where
        try:
            how = await self.mailer.check()
        except RetryLater as exc:
            if isinstance(exc, NoTls):
                log.warning("mail: %s; mails will not be sent until it does", exc)
            else:
                log.warning("mail: could not check the SMTP server at start (%s); mails "
                            "wait in the outbox until it answers", exc)
            return
        log.info("mail: SMTP server %s checked: %s", where, how)

    def deliverer(self) -> MailDeliverer:
        """The web face's outbox rows: the mails (sent when a mailer is set)."""
        return MailDeliverer(self.mailer, self.compose)

    async def compose(self, row: OutboxRecord) -> Mail | None:
        """The mail a row asks for; None when there is nothing left to send."""
        if row.kind == REQUEST_MAIL:
            return await self.request_mail(str(row.payload_value().get("approval_id")))
        if row.kind in (OUTCOME_MAIL, REMINDER_MAIL, EDIT_MAIL):
            return await self.thread_mail(row)
        if row.kind != SIGN_IN_MAIL:
            raise Undeliverable(f"no mail is known by the kind {row.kind}")
        link = await self.auth.link(str(row.payload_value().get("link_id")))
        if link is None:
            raise Undeliverable("the sign-in link of this mail does not exist")
        if link.used_at is not None:
            return None  # its mail got through once already (a re-driven row)
        if link.expires_at <= self.engine.now():  # the approver never got it
            raise Undeliverable(f"the sign-in link for {link.user_id} expired before it "
                                "could be mailed")
        url = f"{self.public_url}/review/sign-in/{self.keys.link_token(link.id)}"
        minutes = int((link.expires_at - link.created_at).total_seconds() // 60)
        text = (f"Someone (we hope you) asked to sign in to approvald's review queue as "
                f"{link.user_id}.\n\nSign in: {url}\n\nThe link works once, for {minutes} "
                "minutes. If you did not ask for it, ignore this mail: nothing happens "
                "unless the link is opened and its button pressed.\n")
        return Mail(to=link.email, subject="Your approvald sign-in link", text=text)

    async def recipients(self, a: ApprovalRecord) -> list[str]:
        """The addresses of those who may decide ``a``: each approver in the address book
        that the same check as a click lets decide it (so never its requester)."""
        out = []
        for user, address in sorted(self.auth.emails.items()):
            try:
                await self.engine.may_decide(a, Actor(user, "web"))
            except DecisionRefused as exc:
                if exc.reason == Refusal.DIRECTORY_UNAVAILABLE:
                    raise RetryLater(f"approvers of {a.id}: {exc}") from None
                continue
            out.append(address)
        return out

    async def request_mail(self, approval_id: str) -> Mail | None:
        """A pending request, mailed to its approvers: its packet, its exact arguments and
        a link to it in the review queue (deciding needs a sign-in: the link decides
        nothing). None once it is decided: the card and the queue tell the rest."""
        a = await self.engine.documents.request(approval_id)
        if a is None:
            raise Undeliverable(f"approval {approval_id} does not exist")
        if a.status != "pending":
            return None
        to = await self.recipients(a)
        if not to:
            raise Undeliverable(f"no approver of request {a.id} has an address in "
                                "APPROVALD_APPROVER_EMAILS")
        return Mail(to=self.mailer.sender if self.mailer else to[0], bcc=tuple(to),
                    subject=f"Approval needed: {a.tool} ({pages.risk_of(a)} risk)",
                    text=pages.request_text(a, self._link(a), slack=self.slack_cards))

    def _link(self, a: ApprovalRecord) -> str:
        return f"{self.public_url}/review/requests/{a.id}"

    async def thread_mail(self, row: OutboxRecord) -> Mail | None:
        """A mail in a request mail's thread (same recipients, In-Reply-To its Message-ID):
        what became of the request (``mail.outcome``: who decided it, how and when), a
        reminder while it is open (``mail.reminder``), or who edited its arguments, how,
        and that it binds to the new ones (``mail.edited``). None when there is nothing to say:
        its request mail never went out (it was decided first, or given up), or a reminder
        for a request closed since."""
        payload = row.payload_value()
        approval_id = str(payload.get("approval_id"))
        thread = await self.engine.documents.request_thread(approval_id)
        a, sent = thread.approval, thread.sent
        if a is None:
            raise Undeliverable(f"approval {approval_id} does not exist")
        to = tuple(str(t) for t in sent.get("to") or ())
        if not to or not sent.get("message_id"):
            return None  # the request was never mailed to anyone: no thread to follow
        subject = "Re: " + str(sent.get("subject") or f"Approval needed: {a.tool}")
        sender = self.mailer.sender if self.mailer else to[0]
        if row.kind == REMINDER_MAIL:
            if a.status != "pending":
                return None  # its outcome mail tells the rest
            text = (f"Reminder {payload.get('n', 1)}: this request is still waiting for a "
                    "decision.\n\n" + pages.request_text(a, self._link(a),
                                                         slack=self.slack_cards))
        elif row.kind == EDIT_MAIL:  # told even once decided: what was approved changed
            text = pages.edit_text(a, payload, self._link(a))
        else:
            text = (pages.outcome_line(a) + "\n\n"
                    + "It needs nothing more from you; this mail is only to tell you.\n"
                    + f"The request: {self._link(a)}\n")
        return Mail(to=sender, bcc=to, subject=subject, text=text,
                    in_reply_to=str(sent["message_id"]))
