"""The web review queue in the sandbox (issue 35): ``approvald sandbox`` serves serve's own
queue on the page's origin (``/review``) and keeps what serve mails in a mailbox the page
shows each person. A refund's request is mailed to its approvers; Alice reads it in her
Mail pane, follows its link, asks the queue for a sign-in link, reads that mail too, signs
in through it and approves on the queue: the refund runs once.

The sandbox runs in this process, as ``approvald sandbox`` runs it: the emulator, its
page, and a real serve (its outbox, its web face) on a SQLite file."""

from __future__ import annotations

import gc
import json
import re
from html import unescape
from pathlib import Path
from typing import Any

import aiohttp
from approvald.bot.config import Settings
from approvald.bot.sandbox.guard import TOKEN_HEADER
from approvald.bot.sandbox.workspace import Sandbox

from tests.helpers import Rows
from tests.integration.slack_harness import wait_for
from tests.integration.web_helpers import Browser, form_fields

HREF = re.compile(r'<a href="([^"]+)" target="_blank" rel="noopener">')


class Page:
    """The sandbox page's own routes, with this start's token."""

    def __init__(self, sandbox: Sandbox) -> None:
        assert sandbox.web is not None
        self.base = sandbox.url.rstrip("/")
        self.headers = {TOKEN_HEADER: sandbox.web.token}
        self.http = aiohttp.ClientSession()

    async def state(self, user: str, pane: str) -> dict[str, Any]:
        async with self.http.get(f"{self.base}/ui/state", params={"user": user, "pane": pane},
                                 headers=self.headers) as r:
            data: dict[str, Any] = await r.json()
        assert data["ok"], data
        return data

    async def links(self, user: str, subject: str) -> list[str]:
        """The queue's links in ``user``'s mails whose subject has ``subject``, in order."""
        main = (await self.state(user, "mail"))["main"]
        mails = main.split('<div class="msg mail"')[1:]
        return [unescape(h) for m in mails if subject in m for h in HREF.findall(m)]

    async def start_refund(self, user: str, order: str) -> str:
        async with self.http.post(f"{self.base}/ui/runs", headers=self.headers, json={
                "user": user, "agent": "demo-refund", "order": order}) as r:
            data = await r.json()
        assert data["ok"], data
        return str(data["run_id"])


def refunds(ledger: Path) -> list[dict[str, Any]]:
    if not ledger.exists():
        return []
    return [e for e in (json.loads(x) for x in ledger.read_text().splitlines() if x.strip())
            if e["tool"] == "issue_refund"]


async def test_a_mailed_request_is_approved_on_the_queue_through_the_sandbox_mailbox(
        tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    settings = Settings(APPROVALD_DATABASE_URL=f"sqlite+aiosqlite:///{tmp_path / 's.db'}",
                        APPROVALD_DEMO_LEDGER=str(ledger))
    sandbox = Sandbox(settings, port=0)
    page: Page | None = None
    alice: Browser | None = None
    try:
        await sandbox.start()
        page = Page(sandbox)
        run_id = await page.start_refund("U_DANA", "A-7")
        # the request, mailed to its approvers: in Alice's Mail pane, with its link
        [request_link] = await wait_for(lambda: page.links("U_ALICE", "Approval needed"),
                                        within=30, what="the request's mail")
        assert request_link.startswith(f"{page.base}/review/requests/")
        assert await page.links("U_DANA", "Approval needed") == []  # she asked: never hers
        alice = Browser(page.base)
        status, html = await alice.get(request_link)
        assert status == 200 and "Mail me a sign-in link" in html  # it decides nothing
        assert await alice.ask_link("alice@example.com") == 200
        [sign_in] = await wait_for(lambda: page.links("U_ALICE", "sign-in link"), within=30,
                                   what="the sign-in mail")
        status, _ = await alice.open_and_sign_in(sign_in)
        assert status == 303
        status, html = await alice.get(request_link)
        assert status == 200 and "Approve" in html
        approval_id = request_link.rsplit("/", 1)[1]
        # another site's form never reaches the queue: the sandbox's guard refuses it
        form = form_fields(html, action=f"/review/requests/{approval_id}", verdict="approve")
        status, _ = await alice.post(f"/review/requests/{approval_id}", form,
                                     origin="http://evil.example")
        assert status == 403
        # nor does one with no Origin: the queue's own check
        status, _ = await alice.post(f"/review/requests/{approval_id}", form, origin=None)
        assert status == 403
        status, _ = await alice.post(f"/review/requests/{approval_id}", form_fields(
            html, action=f"/review/requests/{approval_id}", verdict="approve"))
        assert status == 303
        assert sandbox.service is not None
        engine = sandbox.service.engine

        async def completed() -> bool:
            run = await Rows.of(engine).run(run_id)
            return run is not None and run.status == "completed"

        await wait_for(completed, within=30, what="the run to complete")
        [refund] = refunds(ledger)
        assert refund["args"]["order_id"] == "A-7"
        a = await Rows.of(engine).approval(approval_id)
        assert a is not None and (a.decided_by, a.decided_via) == ("U_ALICE", "web")
        # the page opened as localhost works too: its own origin is the queue's
        bob = Browser(page.base.replace("127.0.0.1", "localhost"))
        try:
            assert await bob.ask_link("bob@example.com") == 200
            await wait_for(lambda: page.links("U_BOB", "sign-in link"), within=30,
                           what="Bob's sign-in mail")
        finally:
            await bob.close()
        # the outcome, in the request mail's thread
        await wait_for(lambda: page.links("U_ALICE", "Re: Approval needed"), within=30,
                       what="the outcome mail")
        assert len(refunds(ledger)) == 1
    finally:
        gc.unfreeze()
        if alice is not None:
            await alice.close()
        if page is not None:
            await page.http.close()
        await sandbox.stop()
