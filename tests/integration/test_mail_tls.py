"""Mail never crosses the network in clear unless the operator names it: ``smtp://``
requires STARTTLS (a server, or an attacker on the path, that does not offer it gets no
password and no sign-in link), ``smtps://`` is TLS from the first byte, both check the
server's certificate, and ``smtp+insecure://`` (no TLS) goes to loopback only unless
``APPROVALD_SMTP_INSECURE_HOST`` names the host. Real SMTP servers on loopback (aiosmtpd),
one offering STARTTLS with a self-signed certificate the test trusts, one not."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from approvald.bot.web.mail import Mailer, SmtpTarget
from approvald.runtime.kernel.clock import ManualClock
from approvald.runtime.record.outbox_kinds import Mail, RetryLater

from tests.helpers import Rows
from tests.integration.slack_harness import wait_for
from tests.integration.web_helpers import (
    Browser,
    Logins,
    self_signed,
    smtp_server,
    web_harness,
)

# aiosmtpd warns when a server offers AUTH without TLS: these tests need one that does,
# to catch a client that would send its password in clear
pytestmark = pytest.mark.filterwarnings("ignore:Requiring AUTH while not requiring TLS")
MAIL = Mail(to="ana@example.com", subject="Your approvald sign-in link",
            text="Sign in: https://approvals.example.com/review/sign-in/SECRET-LINK\n")


def mailer(url: str) -> Mailer:
    return Mailer(SmtpTarget.parse(url), "approvals@example.com", timeout=10)


async def test_smtp_without_starttls_sends_nothing() -> None:
    """A server that does not offer STARTTLS (or whose offer an attacker stripped) gets
    neither the password nor the mail: the send is refused, to be tried again."""
    logins = Logins()
    async with smtp_server(logins=logins) as (inbox, port):
        with pytest.raises(RetryLater) as refused:
            await mailer(f"smtp://ana:hunter2@127.0.0.1:{port}").send(MAIL)
    assert "did not offer STARTTLS" in str(refused.value)
    assert "hunter2" not in str(refused.value)
    assert inbox.messages == [] and logins.seen == []


async def test_smtp_upgrades_to_tls_with_a_trusted_certificate(tmp_path: Path,
                                                               monkeypatch: Any) -> None:
    cert = self_signed(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert.cert))  # the system's trust, as OpenSSL reads it
    logins = Logins()
    async with smtp_server(starttls=cert, logins=logins) as (inbox, port):
        await mailer(f"smtp://ana:hunter2@127.0.0.1:{port}").send(MAIL)
    [msg] = inbox.messages
    assert msg["X-Over-TLS"] == "yes" and msg["To"] == "ana@example.com"
    assert logins.seen == [("ana", "hunter2", True)]  # the password went over TLS only


async def test_smtp_refuses_a_certificate_nobody_trusts(tmp_path: Path) -> None:
    """STARTTLS offered with a certificate the system does not trust (an attacker's): no
    password, no mail."""
    logins = Logins()
    async with smtp_server(starttls=self_signed(tmp_path), logins=logins) as (inbox, port):
        with pytest.raises(RetryLater) as refused:
            await mailer(f"smtp://ana:hunter2@127.0.0.1:{port}").send(MAIL)
    assert "certificate does not check out" in str(refused.value)
    assert inbox.messages == [] and logins.seen == []


async def test_smtps_is_tls_from_the_first_byte(tmp_path: Path, monkeypatch: Any) -> None:
    cert = self_signed(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert.cert))
    logins = Logins()
    async with smtp_server(implicit=cert, logins=logins) as (inbox, port):
        await mailer(f"smtps://ana:hunter2@127.0.0.1:{port}").send(MAIL)
    [msg] = inbox.messages
    assert msg["X-Over-TLS"] == "yes" and logins.seen == [("ana", "hunter2", True)]


async def test_insecure_smtp_is_named_and_goes_to_loopback(tmp_path: Path) -> None:
    """``smtp+insecure://`` is plain SMTP, as the operator asked: to a relay on loopback."""
    async with smtp_server() as (inbox, port):
        await mailer(f"smtp+insecure://127.0.0.1:{port}").send(MAIL)
    [msg] = inbox.messages
    assert msg["X-Over-TLS"] == "no"


async def test_a_sign_in_mail_waits_rather_than_go_in_clear(db_url: str, tmp_path: Path,
                                                            caplog: Any) -> None:
    """Through serve: the sign-in link's mail to a server that does not offer STARTTLS
    stays in the outbox with a clear error (logged), nothing crosses in clear, and it is
    given up when the link expires, like any mail that cannot be sent; serve said at start
    that the server does not offer STARTTLS."""
    clock = ManualClock(datetime.now(UTC))
    logins = Logins()
    caplog.set_level(logging.INFO, logger="approvald")
    async with smtp_server(logins=logins) as (inbox, smtp_port), \
            web_harness(db_url, tmp_path, clock=clock,
                        APPROVALD_SMTP_URL=f"smtp://ana:hunter2@127.0.0.1:{smtp_port}"
                        ) as (h, url):
        await wait_for(lambda: "did not offer STARTTLS" in caplog.text
                       and "mails will not be sent until it does" in caplog.text,
                       what="serve's check of the SMTP server")
        b = Browser(url)
        try:
            assert await b.ask_link("alice@example.com") == 200

            async def row() -> Any:
                rows = await Rows.of(h.engine).select(
                    "SELECT status, last_error FROM outbox WHERE kind = 'mail.signin'")
                return rows if rows and rows[0][1] else None

            [(status, error)] = await wait_for(row, what="a refused try")
            assert status == "pending" and "did not offer STARTTLS" in error
            assert any("mail.signin" in r.getMessage() and "did not offer STARTTLS"
                       in r.getMessage() for r in caplog.records)  # the outbox's try, logged
            clock.advance(timedelta(minutes=15, seconds=1))
            h.engine.notify_outbox()
            await wait_for(lambda: _dead(h), what="the mail given up with its link")
        finally:
            await b.close()
    assert inbox.messages == [] and logins.seen == []
    assert "hunter2" not in caplog.text


async def _dead(h: Any) -> bool:
    rows = await Rows.of(h.engine).select(
        "SELECT status, result FROM outbox WHERE kind = 'mail.signin'")
    return rows[0][0] == "dead" if rows else False


async def test_serve_says_when_the_smtp_server_checks_out(sqlite_url: str, tmp_path: Path,
                                                         monkeypatch: Any,
                                                         caplog: Any) -> None:
    cert = self_signed(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert.cert))
    caplog.set_level(logging.INFO, logger="approvald")
    async with smtp_server(starttls=cert) as (_inbox, smtp_port), \
            web_harness(sqlite_url, tmp_path,
                        APPROVALD_SMTP_URL=f"smtp://127.0.0.1:{smtp_port}"):
        await wait_for(lambda: "STARTTLS, certificate verified" in caplog.text,
                       what="serve's check of the SMTP server")
