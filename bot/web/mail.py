"""Mail: outbox rows of kind ``mail.*`` -> one message through SMTP (aiosmtplib).

A mail is queued in the transaction that makes what it tells (a sign-in link), so the
outbox delivers it like a card: retried with backoff, given up at its row's deadline (a
sign-in mail when its link expires) and then parked as dead and reported like a dead card.
A 5xx answer (an address the server refuses for good) is dead at once.

The row never holds a secret: a sign-in mail's row names the link, and the link's token is
derived here from its id and the deployment's secret (:func:`bot.web.auth.link_token`),
so reading the database (or its outbox) gives nobody a way to sign in.

On the wire a mail is read by whoever is on the path unless it is sent over TLS, and it
carries the SMTP password and sign-in links (each signs its holder in as an approver). So
``smtp://`` requires STARTTLS and a certificate that checks out before anything else is
said (a stripped offer gets no login and no mail: :class:`NoTls`), ``smtps://`` is TLS
from the first byte, and plain SMTP is only what the operator names (``smtp+insecure://``),
to a loopback relay unless ``APPROVALD_SMTP_INSECURE_HOST`` names another host.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from email.message import EmailMessage
from email.utils import formataddr, make_msgid
from typing import Any, Literal
from urllib.parse import unquote, urlsplit

import aiosmtplib
from approvald.runtime import MAIL_KINDS, Mail, MailSender, RetryLater, Undeliverable
from approvald.store.records import OutboxRecord

log = logging.getLogger("approvald.mail")
Tls = Literal["starttls", "implicit", "none"]

TIMEOUT = 30.0  # s for one try
# scheme -> (default port, how TLS is had): STARTTLS required, TLS from the first byte,
# or none (only where the operator named it so: see SmtpTarget.parse)
SCHEMES: dict[str, tuple[int, Tls]] = {"smtp": (587, "starttls"), "smtps": (465, "implicit"),
                                       "smtp+insecure": (25, "none")}
FORMS = "smtp://[USER:PASSWORD@]HOST[:PORT] (or smtps://, smtp+insecure://)"
LOOPBACK_NAMES = frozenset({"localhost"})


class NoTls(RetryLater):
    """The server did not give the TLS the URL asks for (no STARTTLS offered, or a
    certificate that does not check out): nothing was sent, not even the login."""


def is_loopback(host: str) -> bool:
    """Whether ``host`` is this machine: a loopback address, or ``localhost``."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class SmtpTarget:
    """Where and how mails are sent (``APPROVALD_SMTP_URL``)."""

    host: str
    port: int
    username: str | None
    password: str | None
    # starttls: the server must offer STARTTLS, or nothing is sent; implicit: TLS from
    # the first byte (smtps); none: plain SMTP, only where the operator named it
    tls: Tls

    @classmethod
    def parse(cls, url: str, *, insecure_host: str | None = None) -> SmtpTarget:
        """``smtp://[USER:PASSWORD@]HOST[:PORT]``, ``smtps://...`` or
        ``smtp+insecure://...``, the last to a loopback host only unless
        ``insecure_host`` (``APPROVALD_SMTP_INSECURE_HOST``) names it; ValueError (never
        echoing the password) for anything else."""
        parts = urlsplit(url.strip())
        if parts.scheme == "smtp+plain":
            raise ValueError("smtp+plain:// is now called smtp+insecure:// (it sends the "
                             "password and every sign-in link in clear)")
        if parts.scheme not in SCHEMES or not parts.hostname:
            raise ValueError(f"must be {FORMS}")
        default_port, tls = SCHEMES[parts.scheme]
        try:
            port = parts.port or default_port
        except ValueError:
            raise ValueError("the port is not a number from 1 to 65535") from None
        host = parts.hostname
        if tls == "none" and not is_loopback(host) \
                and host.lower() != (insecure_host or "").strip().lower():
            raise ValueError(
                f"smtp+insecure:// sends the password and every sign-in link in clear, so it "
                f"goes to a loopback host only (127.0.0.1, ::1, localhost), not {host}: use "
                "smtp:// (STARTTLS) or smtps://, or name the host in "
                "APPROVALD_SMTP_INSECURE_HOST if its network is yours alone")
        return cls(host=host, port=port,
                   username=unquote(parts.username) if parts.username else None,
                   password=unquote(parts.password) if parts.password else None, tls=tls)

    @property
    def where(self) -> str:
        return f"{self.host}:{self.port}" if ":" not in self.host \
            else f"[{self.host}]:{self.port}"


class Mailer:
    """Sends one message through SMTP; the outbox decides when to try again.

    With ``smtp://`` the server must offer STARTTLS and pass the certificate check before
    anything else is said: no login, no message otherwise (:class:`NoTls`, a
    :class:`RetryLater` with the reason, so the mail waits in the outbox and is given up
    at its deadline like any mail that cannot be sent)."""

    def __init__(self, target: SmtpTarget, sender: str, *, timeout: float = TIMEOUT) -> None:
        self.target = target
        self.sender = sender
        self.timeout = timeout

    async def _connect(self) -> aiosmtplib.SMTP:
        """A connection in the TLS the target asks for (the login not made yet)."""
        t = self.target
        client = aiosmtplib.SMTP(hostname=t.host, port=t.port, use_tls=t.tls == "implicit",
                                 start_tls=False, timeout=self.timeout)
        try:
            await client.connect()
            if t.tls == "starttls":
                await client.ehlo()
                if not client.supports_extension("starttls"):
                    raise NoTls(f"SMTP server {t.where} did not offer STARTTLS: nothing sent "
                                "(smtp:// requires it, so that the password and sign-in links "
                                "never cross the network in clear)")
                await client.starttls()
        except ssl.SSLError as exc:
            client.close()
            raise NoTls(f"TLS with SMTP server {t.where} failed, nothing sent: "
                        f"{_tls_reason(exc)}"[:300]) from None
        except BaseException:
            client.close()
            raise
        return client

    async def check(self) -> str:
        """Connect as a send would (TLS included, no login, nothing sent) and say how the
        server answered; :class:`RetryLater` (:class:`NoTls`) when a send would fail."""
        try:
            client = await self._connect()
        except RetryLater:
            raise
        except (aiosmtplib.SMTPException, OSError, TimeoutError) as exc:
            raise RetryLater(f"SMTP server {self.target.where} unreachable: "
                             f"{type(exc).__name__}: {exc}"[:300]) from None
        with contextlib.suppress(aiosmtplib.SMTPException, OSError, TimeoutError):
            await client.quit()
        return {"starttls": "STARTTLS, certificate verified",
                "implicit": "TLS from the first byte, certificate verified",
                "none": "no TLS (smtp+insecure://)"}[self.target.tls]

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
            client = await self._connect()
            try:
                if t.username is not None:
                    await client.login(t.username, t.password or "")
                await client.send_message(msg, sender=self.sender,
                                          recipients=list(mail.bcc or [mail.to]))
            finally:
                with contextlib.suppress(aiosmtplib.SMTPException, OSError, TimeoutError):
                    await client.quit()
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
            raise RetryLater(f"SMTP server {t.where} unreachable: "
                             f"{type(exc).__name__}: {exc}"[:300]) from None
        return message_id


def _tls_reason(exc: ssl.SSLError) -> str:
    if isinstance(exc, ssl.SSLCertVerificationError):
        return (f"its certificate does not check out ({exc.verify_message or exc.reason}); "
                "a certificate from a private CA is trusted through SSL_CERT_FILE")
    return str(exc.reason or exc)


class MailDeliverer:
    """Delivers the mail rows (:data:`~approvald.runtime.record.outbox_kinds.MAIL_KINDS`), each
    composed by ``compose``."""

    kinds = MAIL_KINDS

    def __init__(self, mailer: MailSender | None,
                 compose: Callable[[OutboxRecord], Awaitable[Mail | None]]) -> None:
        self.mailer = mailer
        # the mail a row asks for (None: nothing left to send); Undeliverable: never
        self.compose = compose

    async def deliver(self, row: OutboxRecord) -> dict[str, Any] | None:
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
