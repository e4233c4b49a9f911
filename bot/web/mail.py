"""Mail: outbox rows of kind ``mail.*`` -> one message through SMTP (aiosmtplib).

A mail is queued in the transaction that makes what it tells (a sign-in link), so the
outbox delivers it like a card: retried with backoff, given up at its row's deadline (a
sign-in mail when its link expires) and then parked as dead and reported like a dead card.
A 5xx answer (an address the server refuses for good) is dead at once.

The row never holds a secret: a sign-in mail's row names the link, and the link's token is
derived here from its id and the deployment's secret (:func:`bot.web.auth.link_token`),
so reading the database (or its outbox) gives nobody a way to sign in.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from email.message import EmailMessage
from email.utils import formataddr, make_msgid
from typing import Any, Protocol
from urllib.parse import unquote, urlsplit

import aiosmtplib
from approvald.runtime.outbox import Deliverer, RetryLater, Undeliverable
from approvald.store.records import OutboxRecord

log = logging.getLogger("approvald.mail")

SIGN_IN_MAIL = "mail.signin"  # outbox kind: a sign-in link for the web review queue
TIMEOUT = 30.0  # s for one try
SCHEMES = {"smtp": 587, "smtps": 465, "smtp+plain": 25}


@dataclass(frozen=True)
class SmtpTarget:
    """Where and how mails are sent (``APPROVALD_SMTP_URL``)."""

    host: str
    port: int
    username: str | None
    password: str | None
    use_tls: bool  # TLS from the first byte (smtps)
    start_tls: bool | None  # None: upgrade when the server offers it; False: never

    @classmethod
    def parse(cls, url: str) -> SmtpTarget:
        """``smtp://[USER:PASSWORD@]HOST[:PORT]``, ``smtps://...`` or ``smtp+plain://...``;
        ValueError (never echoing the password) for anything else."""
        parts = urlsplit(url.strip())
        if parts.scheme not in SCHEMES or not parts.hostname:
            raise ValueError("must be smtp://[USER:PASSWORD@]HOST[:PORT] (or smtps://, "
                             "smtp+plain://)")
        try:
            port = parts.port or SCHEMES[parts.scheme]
        except ValueError:
            raise ValueError("the port is not a number from 1 to 65535") from None
        return cls(host=parts.hostname, port=port,
                   username=unquote(parts.username) if parts.username else None,
                   password=unquote(parts.password) if parts.password else None,
                   use_tls=parts.scheme == "smtps",
                   start_tls=False if parts.scheme != "smtp" else None)


@dataclass(frozen=True)
class Mail:
    """One message: ``to`` is its To header; ``bcc``, when given, are its envelope
    recipients instead (approvers do not see each other's addresses)."""

    to: str
    subject: str
    text: str
    bcc: tuple[str, ...] = ()
    # a follow-up: the Message-ID of the mail it answers (In-Reply-To and References)
    in_reply_to: str | None = None


class MailSender(Protocol):
    """What sends a mail: :class:`Mailer` (SMTP), or the sandbox's mailbox."""

    sender: str  # the From address

    async def send(self, mail: Mail) -> str:
        """Send ``mail``; its Message-ID. RetryLater / Undeliverable as the outbox reads
        them."""
        ...


class Mailer:
    """Sends one message through SMTP; the outbox decides when to try again."""

    def __init__(self, target: SmtpTarget, sender: str, *, timeout: float = TIMEOUT) -> None:
        self.target = target
        self.sender = sender
        self.timeout = timeout

    async def send(self, mail: Mail) -> str:
        """Send ``mail``; returns its Message-ID (follow-ups answer it)."""
        msg = EmailMessage()
        msg["From"] = formataddr(("approvald", self.sender))
        msg["To"] = mail.to
        msg["Subject"] = mail.subject
        message_id = make_msgid(domain=self.sender.rpartition("@")[2] or None)
        msg["Message-ID"] = message_id
        if mail.in_reply_to:  # mail clients thread it under the mail it answers
            msg["In-Reply-To"] = mail.in_reply_to
            msg["References"] = mail.in_reply_to
        msg["Auto-Submitted"] = "auto-generated"
        msg.set_content(mail.text)
        t = self.target
        try:
            await aiosmtplib.send(msg, sender=self.sender, recipients=list(mail.bcc or [mail.to]),
                                  hostname=t.host, port=t.port, username=t.username,
                                  password=t.password, use_tls=t.use_tls,
                                  start_tls=t.start_tls, timeout=self.timeout)
        except aiosmtplib.SMTPRecipientsRefused as exc:
            codes = [r.code for r in exc.recipients]
            if codes and all(500 <= c < 600 for c in codes):
                raise Undeliverable(f"mail to {mail.to} refused: "
                                    f"{'; '.join(str(r) for r in exc.recipients)[:300]}") from None
            raise RetryLater(f"mail to {mail.to} deferred: {exc}") from None
        except aiosmtplib.SMTPResponseException as exc:
            if 500 <= exc.code < 600 and exc.code not in (530, 535):  # not a login to fix
                raise Undeliverable(f"mail to {mail.to}: SMTP {exc.code} {exc.message}"
                                    [:300]) from None
            raise RetryLater(f"mail to {mail.to}: SMTP {exc.code} {exc.message}"[:300]) from None
        except (aiosmtplib.SMTPException, OSError, TimeoutError) as exc:
            raise RetryLater(f"SMTP server {t.host}:{t.port} unreachable: "
                             f"{type(exc).__name__}: {exc}"[:300]) from None
        return message_id


class MailDeliverer:
    """Delivers ``mail.*`` rows (composed by ``compose``) and hands every other row to
    ``inner``."""

    def __init__(self, inner: Deliverer, mailer: MailSender | None,
                 compose: Callable[[OutboxRecord], Awaitable[Mail | None]]) -> None:
        self.inner = inner
        self.mailer = mailer
        # the mail a row asks for (None: nothing left to send); Undeliverable: never
        self.compose = compose

    async def deliver(self, row: OutboxRecord) -> dict[str, Any] | None:
        if not row.kind.startswith("mail."):
            return await self.inner.deliver(row)
        if self.mailer is None:  # a setting someone can still fix: keep trying till then
            raise RetryLater("APPROVALD_SMTP_URL and APPROVALD_MAIL_FROM are not set: "
                             "mail cannot be sent")
        mail: Mail | None = await self.compose(row)
        if mail is None:
            return {"skipped": True}
        message_id = await self.mailer.send(mail)
        to = list(mail.bcc or [mail.to])
        log.info("outbox %d: mailed %s to %s", row.id, row.kind, ", ".join(to))
        return {"to": to, "message_id": message_id, "subject": mail.subject}
