"""The sandbox's mail: what ``serve`` mails lands here instead of an SMTP server.

The web review queue, its sign-in links and the request mails work in the sandbox as in
a deployment: the outbox delivers ``mail.*`` rows through the web face's own composer
(:class:`~bot.web.mail.MailDeliverer`), and only the last step, handing the message to an
SMTP server, is this mailbox's :meth:`Mailbox.send`. The page shows each person the mails
sent to their address (``<name>@example.com``), links included, so signing in to the
queue as anyone in the workspace takes no real mail.

The mailbox is kept in memory, the last :data:`KEEP` mails: a sign-in link lives 15
minutes, and every request mailed is in the queue anyway.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import make_msgid

from approvald.bot.sandbox import render
from approvald.runtime import Mail

KEEP = 200
_URL = re.compile(r"https?://[^\s<>\"']+")


@dataclass(frozen=True)
class Sent:
    """One mail as it was sent: its envelope recipients and what it said."""

    n: int
    message_id: str
    at: datetime
    to: tuple[str, ...]
    subject: str
    text: str
    in_reply_to: str | None


class Mailbox:
    """A :class:`~bot.web.mail.MailSender` that keeps what it is given."""

    def __init__(self, sender: str, *, on_change: Callable[[], None] | None = None) -> None:
        self.sender = sender
        self.clock: Callable[[], datetime] | None = None  # serve's time, once it is built
        self.on_change = on_change
        self.sent: list[Sent] = []
        self._n = 0

    async def send(self, mail: Mail) -> str:
        """Keep ``mail`` (for its envelope recipients); its Message-ID."""
        self._n += 1
        message_id = make_msgid(domain=self.sender.rpartition("@")[2] or None)
        at = self.clock() if self.clock is not None else datetime.now(UTC)
        self.sent.append(Sent(self._n, message_id, at, tuple(mail.bcc or (mail.to,)),
                              mail.subject, mail.text, mail.in_reply_to))
        del self.sent[:-KEEP]
        if self.on_change is not None:
            self.on_change()
        return message_id

    def to(self, address: str) -> list[Sent]:
        """The mails sent to ``address``, oldest first."""
        wanted = address.lower()
        return [m for m in self.sent if wanted in (t.lower() for t in m.to)]

    def html(self, address: str | None, *, origin: str) -> str:
        """``address``'s mails as the page draws them: each with its links to ``origin``
        (the review queue's) clickable, opening in a tab of their own."""
        if address is None:
            return ('<div class="empty">This person has no address in '
                    "APPROVALD_APPROVER_EMAILS, so approvald mails them nothing.</div>")
        mails = self.to(address)
        if not mails:
            return (f'<div class="empty">No mail for {render.esc(address)} yet. Mails come '
                    "when a request is mailed to its approvers, or when you ask the review "
                    "queue for a sign-in link with this address.</div>")
        return "".join(self._one(m, address, origin) for m in mails)

    def _one(self, m: Sent, address: str, origin: str) -> str:
        def link(found: re.Match[str]) -> str:
            url = found.group(0)
            if not url.startswith(origin + "/"):
                return render.esc(url)
            return (f'<a href="{render.esc(url)}" target="_blank" rel="noopener">'
                    f"{render.esc(url)}</a>")

        parts, pos = [], 0
        for found in _URL.finditer(m.text):
            parts += [render.esc(m.text[pos:found.start()]), link(found)]
            pos = found.end()
        parts.append(render.esc(m.text[pos:]))
        thread = " · in the thread of an earlier mail" if m.in_reply_to else ""
        return (f'<div class="msg mail" data-ts="mail-{m.n}">'
                f'<div class="who"><b>{render.esc(m.subject)}</b></div>'
                f'<div class="time">from approvald &lt;{render.esc(self.sender)}&gt; · to '
                f'{render.esc(address)} · {m.at.strftime("%H:%M:%S")} UTC{thread}</div>'
                f'<pre class="mail-body">{"".join(parts)}</pre></div>')
