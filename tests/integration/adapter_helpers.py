"""What the framework adapters' end-to-end tests share: the policy, a side effect counted
in a file, and decisions made in Slack (signed clicks and modal submissions through the
emulator, as an approver makes them)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Protocol

from approvald.bot.slack import cards
from approvald.runtime.adapters import Finished, Paused

from tests.helpers import Rows
from tests.integration.slack_harness import CHANNEL, Harness, harness, wait_for

POLICY = """
[tools."adapter:*/refund_order"]  # run by a framework agent, not by an approvald agent
approvers = ["U_ALICE"]
ttl = "30m"

[[tools."adapter:*/refund_order".rules]]
when = "args.cents <= 100"
policy = "auto"
"""


def policy_file(tmp_path: Path) -> str:
    path = tmp_path / "policy.toml"
    path.write_text(POLICY)
    return str(path)


class SideEffects:
    """The refunds that really happened, one JSON line each (appended by the tool)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def record(self, **args: Any) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(args, sort_keys=True) + "\n")

    def all(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        return [json.loads(x) for x in self.path.read_text().splitlines()]


@asynccontextmanager
async def adapter_harness(db_url: str,
                          tmp_path: Path) -> AsyncIterator[tuple[Harness, SideEffects]]:
    """The harness under POLICY, without background loops (the test drains the outbox), and
    the refunds the test's tool records."""
    async with harness(db_url, tmp_path, background=False,
                       APPROVALD_POLICY_FILE=policy_file(tmp_path)) as h:
        yield h, SideEffects(tmp_path / "refunds.jsonl")


class ConversationAdapter(Protocol):
    """An adapter whose run takes a prompt and names it by ``conversation`` (the OpenAI
    Agents SDK's and Pydantic AI's)."""

    async def run(self, prompt: str, /, *, conversation: str, requested_by: str,
                  task: str | None = None) -> Paused | Finished: ...


async def pause_three(adapter: ConversationAdapter) -> tuple[Paused, Paused, Paused]:
    """Dana's three refunds, each paused on its request: A-1 (500 cents, to approve),
    A-2 (900, to deny) and A-3 (5000, to edit)."""
    paused = await adapter.run("A-1 500", conversation="c-approve", requested_by="U_DANA",
                               task="Refund A-1")
    denied = await adapter.run("A-2 900", conversation="c-deny", requested_by="U_DANA")
    edited = await adapter.run("A-3 5000", conversation="c-edit", requested_by="U_DANA")
    assert isinstance(paused, Paused) and isinstance(denied, Paused)
    assert isinstance(edited, Paused)
    return paused, denied, edited


def said(outcome: Any) -> str:
    """What the agent finally said."""
    assert isinstance(outcome, Finished), outcome
    return str(outcome.output)


async def card_of(h: Harness, request_id: str) -> Any:
    """The request's approval, once its card is in Slack."""
    [a] = await Rows.of(h.engine).approvals(request_id)
    await h.service.drain.drain_once()
    await h.card(a.id)
    return await h.approval(a.id)


async def approve_in_slack(h: Harness, request_id: str) -> None:
    a = await card_of(h, request_id)
    await h.slack.click(cards.APPROVE, h.value(a), user_id="U_ALICE", channel_id=CHANNEL,
                        message_ts=a.message_ts)
    assert (await h.approval(a.id)).status == "approved"


async def open_modal(h: Harness, a: Any, button: str, modal: str) -> None:
    """Alice clicks ``button`` on ``a``'s card, and its modal opens: a new one (tests that
    share one emulator leave earlier modals with the same callback id behind, and the
    submission goes to the newest)."""
    before = len(h.emulator.views(callback_id=modal))
    await h.slack.click(button, h.value(a), user_id="U_ALICE", channel_id=CHANNEL,
                        message_ts=a.message_ts)
    await wait_for(lambda: len(h.emulator.views(callback_id=modal)) > before,
                   what=f"the {modal} modal")


async def deny_in_slack(h: Harness, request_id: str, reason: str) -> None:
    a = await card_of(h, request_id)
    await open_modal(h, a, cards.DENY, cards.DENY_MODAL)
    await h.slack.submit_view(cards.DENY_MODAL, {"reason": {"reason_input": reason}},
                              user_id="U_ALICE")
    assert (await h.approval(a.id)).status == "denied"


async def edit_in_slack(h: Harness, request_id: str, args: dict[str, Any]) -> None:
    """Edit the arguments in the modal: with edits = "approve" the edit approves them."""
    a = await card_of(h, request_id)
    await open_modal(h, a, cards.EDIT, cards.EDIT_MODAL)
    resp = await h.slack.submit_view(cards.EDIT_MODAL, {"args": {"args_input": json.dumps(args)}},
                                     user_id="U_ALICE")
    assert resp.status == 200
    decided = await h.approval(a.id)
    assert decided.status == "approved" and decided.effective_args() == args


async def audit_actions(h: Harness, request_id: str) -> list[dict[str, Any]]:
    entries = await Rows.of(h.engine).audit(run_id=request_id)
    return [{"action": e.action, "actor": e.actor, "details": json.loads(e.details)}
            for e in entries]


async def pending_request(h: Harness, n: int = 1) -> str:
    """The newest pending request's id (its run's), once there are ``n`` pending."""
    async def found() -> str | None:
        rows = await Rows.of(h.engine).requests(status="pending")
        return rows[0].run_id if len(rows) >= n else None
    rid: str = await wait_for(found, within=60, what="a pending request")
    return rid
