"""What the web review queue's tests share: a real SMTP server on loopback (aiosmtpd), an
in-process serve with the queue on its listener, and a browser-like HTTP client (a cookie
jar, forms read from the pages it gets)."""

from __future__ import annotations

import asyncio
import email
import email.policy
import json
import re
import ssl
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from html import unescape
from pathlib import Path
from typing import Any

import aiohttp
from aiosmtpd.controller import Controller
from approvald.runtime.kernel.clock import Clock
from approvald.runtime.kernel.errors import ConfigError

from tests.helpers import Rows, free_port
from tests.integration.slack_harness import Harness, harness, wait_for

EMAILS = {"U_ALICE": "alice@example.com", "U_DANA": "dana@example.com",
          "U_BOB": "bob@example.com"}
LINK = re.compile(r"(https?://\S+/review/sign-in/[A-Za-z0-9_-]+)")



def over_tls(server: Any, session: Any) -> bool:
    """Whether an aiosmtpd session speaks TLS (upgraded by STARTTLS, or from the start)."""
    return session.ssl is not None or \
        server.transport.get_extra_info("sslcontext") is not None


@dataclass
class Inbox:
    """What the SMTP server received: one parsed message per DATA."""

    messages: list[email.message.EmailMessage] = field(default_factory=list)

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        msg = email.message_from_bytes(envelope.content, policy=email.policy.default)
        assert isinstance(msg, email.message.EmailMessage)
        msg["X-Envelope-To"] = ",".join(envelope.rcpt_tos)
        msg["X-Over-TLS"] = "yes" if over_tls(server, session) else "no"
        self.messages.append(msg)
        return "250 OK"

    def to(self, address: str) -> list[email.message.EmailMessage]:
        return [m for m in self.messages if m["To"] == address]

    async def link_for(self, address: str, *, nth: int = 0) -> str:
        """The sign-in link of the ``nth`` mail to ``address`` (waiting for it)."""
        await wait_for(lambda: len(self.to(address)) > nth, what=f"mail to {address}")
        body = self.to(address)[nth].get_body(("plain",))
        assert body is not None
        found = LINK.search(body.get_content())
        assert found, body.get_content()
        return found.group(1)


@dataclass(frozen=True)
class TestCert:
    """A self-signed certificate for 127.0.0.1 and localhost, as PEM files."""

    cert: Path
    key: Path

    def server_context(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self.cert, self.key)
        return ctx


def self_signed(directory: Path) -> TestCert:
    """A new key and a self-signed certificate for loopback in ``directory``."""
    import ipaddress
    from datetime import UTC, datetime, timedelta

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "approvald test smtp")])
    now = datetime.now(UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(minutes=5))
            .not_valid_after(now + timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([
                x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    out = TestCert(directory / "smtp-cert.pem", directory / "smtp-key.pem")
    out.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    out.key.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                          serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    return out


@dataclass
class Logins:
    """The AUTH attempts an SMTP server saw (login, password, and whether over TLS)."""

    seen: list[tuple[str, str, bool]] = field(default_factory=list)

    def __call__(self, server: Any, session: Any, envelope: Any, mechanism: str,
                 data: Any) -> Any:
        from aiosmtpd.smtp import AuthResult, LoginPassword

        assert isinstance(data, LoginPassword)
        self.seen.append((data.login.decode(), data.password.decode(),
                          over_tls(server, session)))
        return AuthResult(success=True)


@asynccontextmanager
async def smtp_server(*, starttls: TestCert | None = None, implicit: TestCert | None = None,
                      logins: Logins | None = None) -> AsyncIterator[tuple[Inbox, int]]:
    """A real SMTP server on loopback: plain (no STARTTLS offered), offering STARTTLS
    (``starttls``), or TLS from the first byte (``implicit``); ``logins``: it offers AUTH
    (over plain too, so that a client that would send a password in clear is caught)."""
    inbox = Inbox()
    port = free_port()
    kwargs: dict[str, Any] = {}
    if starttls is not None:
        kwargs["tls_context"] = starttls.server_context()
    if implicit is not None:
        kwargs["ssl_context"] = implicit.server_context()
    if logins is not None:
        kwargs.update(authenticator=logins, auth_require_tls=False)
    controller = Controller(inbox, hostname="127.0.0.1", port=port, **kwargs)
    controller.start()
    try:
        yield inbox, port
    finally:
        controller.stop()


@asynccontextmanager
async def web_harness(db_url: str, tmp_path: Path, *, clock: Clock | None = None,
                      smtp_port: int | None = None,
                      **extra: Any) -> AsyncIterator[tuple[Harness, str]]:
    """serve with the review queue at its public URL (http on loopback, so no Secure).

    The public URL names the port before serve binds it, so the port is picked free
    first; another test process may take it in between, and then another is picked."""
    async with AsyncExitStack() as stack:
        for attempt in range(5):
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            values: dict[str, Any] = {
                "APPROVALD_PORT": port, "APPROVALD_PUBLIC_URL": url,
                "APPROVALD_MAIL_FROM": "approvals@example.com",
                "APPROVALD_APPROVER_EMAILS": ",".join(f"{u}={a}" for u, a in EMAILS.items())}
            if smtp_port is not None:
                values["APPROVALD_SMTP_URL"] = f"smtp+insecure://127.0.0.1:{smtp_port}"
            values.update(extra)
            try:
                h = await stack.enter_async_context(
                    harness(db_url, tmp_path, clock=clock, **values))
            except ConfigError as exc:
                if "cannot listen" in str(exc) and attempt < 4:
                    continue
                raise
            break
        yield h, url


def form_fields(html: str, *, action: str | None = None,
                verdict: str | None = None) -> dict[str, str]:
    """The hidden fields of the first form (posting to ``action``, with ``verdict``)."""
    for found in re.finditer(r'<form method="post" action="([^"]*)">(.*?)</form>', html,
                             re.S):
        if action is not None and unescape(found.group(1)) != action:
            continue
        fields = {unescape(m.group(1)): unescape(m.group(2)) for m in re.finditer(
            r'<input type="hidden" name="([^"]+)" value="([^"]*)">', found.group(2))}
        if verdict is not None and fields.get("verdict") != verdict:
            continue
        return fields
    raise AssertionError(f"no form for {action} {verdict} in the page")


class Browser:
    """An HTTP client with cookies that posts forms from the origin it is given."""

    def __init__(self, base: str, *, origin: str | None = None) -> None:
        self.base = base
        self.origin = base if origin is None else origin
        # behind a TLS proxy the browser speaks https; here the listener is plain http, so
        # its Secure cookies are sent as a browser would send them over https
        jar = aiohttp.CookieJar(unsafe=True, treat_as_secure_origin=[base])
        self.http = aiohttp.ClientSession(cookie_jar=jar)
        self.last: aiohttp.ClientResponse | None = None

    async def close(self) -> None:
        await self.http.close()

    async def get(self, path: str) -> tuple[int, str]:
        url = path if path.startswith("http") else self.base + path
        async with self.http.get(url, allow_redirects=False) as resp:
            self.last = resp
            return resp.status, await resp.text()

    async def post(self, path: str, data: dict[str, str], *,
                   origin: str | bool | None = True) -> tuple[int, str]:
        headers = {}
        if origin is True:
            headers["Origin"] = self.origin
        elif isinstance(origin, str):
            headers["Origin"] = origin
        async with self.http.post(self.base + path, data=data, headers=headers,
                                  allow_redirects=False) as resp:
            self.last = resp
            return resp.status, await resp.text()

    def cookie(self, name: str) -> str | None:
        for c in self.http.cookie_jar:
            if c.key == name:
                return c.value
        return None

    async def ask_link(self, address: str) -> int:
        status, page = await self.get("/review")
        assert status == 200, page
        status, _ = await self.post("/review/sign-in/mail",
                                    {**form_fields(page, action="/review/sign-in/mail"),
                                     "email": address})
        return status

    async def open_and_sign_in(self, link: str) -> tuple[int, str]:
        status, page = await self.get(link)
        assert status == 200, page
        return await self.post("/review/sign-in", form_fields(page, action="/review/sign-in"))

    async def post_token(self, link: str) -> tuple[int, str]:
        """POST a link's token from this browser's own form (what replaying it takes, once
        the link's page no longer offers the button)."""
        _, page = await self.get("/review")
        csrf = form_fields(page, action="/review/sign-in/mail")["csrf"]
        return await self.post("/review/sign-in",
                               {"csrf": csrf, "token": link.rsplit("/", 1)[1]})

    async def sign_in(self, inbox: Inbox, address: str, *, nth: int = 0) -> None:
        assert await self.ask_link(address) == 200
        status, _ = await self.open_and_sign_in(await inbox.link_for(address, nth=nth))
        assert status == 303, status


async def refusal_tally(h: Harness) -> Counter[str]:
    """Every refusal of the review queue so far, by reason: audited one by one (someone
    known), folded into a minute's count (someone unknown), or still being counted."""
    tally: Counter[str] = Counter()
    entries, counts = await Rows.of(h.engine).audit_and_refusal_counts()
    for e in entries:
        if e.action == "web_refused":
            details = json.loads(e.details)
            if "reasons" in details:
                tally.update(details["reasons"])
            else:
                tally[details["reason"]] += 1
    for _minute, _source, reason, n in counts:
        tally[reason] += n
    return tally


@dataclass
class Tally:
    """The refusals made since the last look (:meth:`new`)."""

    h: Harness
    seen: Counter[str] = field(default_factory=Counter)

    async def new(self) -> dict[str, int]:
        now = await refusal_tally(self.h)
        new, self.seen = now - self.seen, now
        return dict(new)


async def settle() -> None:
    """Let the tasks a response started (the outbox drain) take their turn."""
    await asyncio.sleep(0)
