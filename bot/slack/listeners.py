"""What every Slack listener shares: its engine, the work it hands off after the ack, and
how it tells the clicker.

A decision is committed before its click is acknowledged (invariant 13): Slack never
sees a 200 for a decision a crash could lose. A decision commit takes milliseconds and
Slack allows 3 seconds; a slow group lookup is bounded by the directory's own timeout.
Everything else a listener does (telling the clicker, opening a modal, refreshing the App
Home, resuming the run) happens after the ack, in a task of its own (bolt runs with
``process_before_response``: nothing waits on a polling loop). A modal submission that
is refused or fails validation answers with its errors inline: they are the ack.
Identity comes only from Slack's signed payload (its signature was
checked on the raw bytes before bolt saw the request: :mod:`.transport`; in Socket Mode,
Slack's own websocket carries it). A refused click changes nothing and gets an
ephemeral explanation; the card itself is updated through the outbox.

The listeners are split by flow, each a layer over this one: :mod:`.home` (the App Home
and ``/approvals``), :mod:`.decisions` (a card's buttons and modals), :mod:`.standing`
(standing approvals), :mod:`.batch` (Approve/Deny selected); :mod:`.handlers` registers
them all with bolt. Each reaches the runtime through the engine's verbs and views only.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any

from approvald.bot.slack import messages, texts
from approvald.bot.slack.mrkdwn import cut_plain
from approvald.runtime import DecisionRefused, NotFound
from approvald.store.records import ApprovalRecord
from pydantic import ValidationError
from slack_bolt.async_app import AsyncAck
from slack_sdk.web.async_client import AsyncWebClient

if TYPE_CHECKING:
    from approvald.runtime import Engine

log = logging.getLogger("approvald.slack")
# a bolt listener for a click or a modal's submission, as the factories build them
Listener = Callable[[AsyncAck, dict[str, Any], AsyncWebClient], Awaitable[None]]
# builds a modal for an approval: (approval, token, channel, message ts) -> view
ModalBuilder = Callable[[ApprovalRecord, str, str | None, str | None], dict[str, Any]]


class Listeners:
    """The engine, the tasks handed off after acks, and telling the clicker."""

    def __init__(self, engine: Engine) -> None:
        self.e = engine
        self._tasks: set[asyncio.Task[Any]] = set()

    def _later(self, work: Coroutine[Any, Any, Any]) -> None:
        """Run ``work`` after the ack; a failure is logged (the click already got its 200)."""
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            log.error("Slack listener work failed: %s: %s", type(exc).__name__, exc,
                      exc_info=exc)

    async def drain(self) -> None:
        """Wait for work handed off after acks (used when stopping)."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    # -- helpers -------------------------------------------------------------------------
    @staticmethod
    def _where(body: dict[str, Any]) -> tuple[str | None, str | None]:
        channel = (body.get("channel") or {}).get("id")
        ts = (body.get("message") or {}).get("ts") or (body.get("container") or {}).get(
            "message_ts")
        return channel, ts

    async def _tell(self, client: AsyncWebClient, user: str, channel: str | None,
                    text: str) -> None:
        """An ephemeral reply in the card's channel, or a DM when there is none (App Home)."""
        try:
            if channel:
                await client.chat_postEphemeral(channel=channel, user=user, text=text)
            else:
                await client.chat_postMessage(channel=user, text=text)
        except Exception as exc:  # telling is best effort: the refusal already changed nothing
            log.warning("could not tell %s: %s", user, exc)

    def _refusal(self, exc: Exception, *, mentions: bool = True,
                 viewer: str | None = None) -> str:
        """What to tell ``viewer``, whose attempt was refused (``mentions=False``: for
        plain text, a modal's errors, where a mention would show as markup)."""
        if isinstance(exc, DecisionRefused):
            return messages.refusal_of(exc, mentions=mentions, viewer=viewer)
        if isinstance(exc, NotFound):
            return texts.REPLY_UNKNOWN_APPROVAL
        return texts.REPLY_ERROR.format(error=type(exc).__name__)



def why_of(exc: ValueError) -> str:
    """A refused scope's reason in one line (a pydantic error without its wrapping), as
    plain text: a modal's errors are not mrkdwn."""
    text = str(exc)
    if isinstance(exc, ValidationError) and exc.errors():
        text = str(exc.errors()[0].get("msg") or exc).removeprefix("Value error, ")
    return cut_plain(text, 500)


def name_of(body: dict[str, Any]) -> str | None:
    """The clicker's name as Slack's signed payload gives it at the time (recorded beside
    the id in the audit entry of the decision: who a user id was, then)."""
    user = body.get("user") or {}
    name = user.get("name") or user.get("username")
    return str(name)[:200] if name else None

