"""The insights (issue 51) on the web review queue and in the App Home, for the
deployment's operators (APPROVALD_OPERATORS) only: real HTTP against serve's listener,
the Slack emulator for the Home tab, the record read from the keyed audit chain."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from approvald.runtime.approvals.decide import Actor

from tests.integration.slack_harness import Harness, wait_for
from tests.integration.web_helpers import Browser, smtp_server, web_harness

OPERATOR = {"APPROVALD_OPERATORS": "U_BOB",
            "APPROVALD_AUDIT_KEY": "audit-key-kept-in-a-vault-0123456789"}
REASON = "duplicate <b>charge</b> & more"


async def _record(h: Harness) -> None:
    """Two refunds asked of approvers: one approved by Alice, one denied by her."""
    for verdict in ("approve", "deny"):
        paused = await h.pause_refund()
        await h.engine.decide(paused.approval_ids[0], actor=Actor("U_ALICE", "slack"),
                              verdict=verdict, reason=REASON if verdict == "deny" else None)


async def test_an_operator_sees_the_insights_under_the_web_queue(db_url: str,
                                                                 tmp_path: Path) -> None:
    async with smtp_server() as (inbox, smtp_port), \
            web_harness(db_url, tmp_path, smtp_port=smtp_port, **OPERATOR) as (h, url):
        await _record(h)
        bob, alice = Browser(url), Browser(url)
        try:
            await bob.sign_in(inbox, "bob@example.com")
            status, page = await bob.get("/review")
            assert status == 200
            assert "Insights: the last 30 days" in page
            assert "<td>issue_refund</td><td>2</td><td>50%</td><td>0%</td><td>50%</td>" in page
            # a denial's reason, as recorded, escaped: agent and people's text is data
            assert "duplicate &lt;b&gt;charge&lt;/b&gt; &amp; more (1)" in page
            assert "<b>charge" not in page
            assert "decided by: U_ALICE (2)" in page
            await alice.sign_in(inbox, "alice@example.com")
            status, page = await alice.get("/review")
            assert status == 200 and "Insights" not in page  # an approver, not an operator
        finally:
            await bob.close()
            await alice.close()


async def _home(h: Harness, user: str) -> Any:
    await h.slack.event({"type": "app_home_opened", "user": user, "channel": f"D_{user}",
                         "tab": "home"})
    return await wait_for(lambda: h.emulator.home_view(user), what=f"{user}'s App Home")


async def test_an_operator_sees_the_insights_in_the_app_home(db_url: str,
                                                             tmp_path: Path) -> None:
    async with smtp_server() as (_, smtp_port), \
            web_harness(db_url, tmp_path, smtp_port=smtp_port, **OPERATOR) as (h, _url):
        await _record(h)
        home = await _home(h, "U_BOB")
        texts = json.dumps(home["blocks"])
        assert "Insights: the last 30 days" in texts
        [tool] = [b["text"]["text"] for b in home["blocks"]
                  if b["type"] == "section" and "issue_refund" in b["text"]["text"]]
        assert tool.startswith("*`issue_refund`* · asked 2 · approve 50% · edit 0% · "
                               "deny 50% · expire 0%")
        # escaped for mrkdwn: a reason cannot ping, link or format
        assert "duplicate &lt;b&gt;charge&lt;/b&gt; &amp; more (1)" in tool
        assert "decided by: <@U_ALICE> (2)" in tool
        alice = await _home(h, "U_ALICE")
        assert "Insights" not in json.dumps(alice["blocks"])
