"""Approve selected and Deny selected (App Home, ``/approvals``).

The button or the modal is acknowledged first and the batch decided after, one request at
a time (the engine's :meth:`~runtime.engine.Engine.decide_batch`), because a batch may take
longer than Slack's 3 seconds. Their acknowledgement claims nothing: what a batch decided
is shown only once each decision is committed, in the App Home (or the list) redrawn with
the results."""

from __future__ import annotations

import logging
from typing import Any

from approvald.bot.slack import cards, messages, texts, views
from approvald.bot.slack.home import Home
from approvald.bot.slack.listeners import name_of
from approvald.bot.slack.mrkdwn import REASON_MAX
from approvald.runtime import MAX_BATCH, Actor, BatchVerdict, Target
from approvald.store.records import ApprovalRecord
from slack_bolt.async_app import AsyncAck, AsyncRespond
from slack_sdk.web.async_client import AsyncWebClient

log = logging.getLogger("approvald.slack")


class Batch(Home):
    """Ticked requests decided together."""

    # -- batch decisions ----------------------------------------------------------------
    async def on_select(self, ack: AsyncAck) -> None:
        await ack()  # a tick is state Slack keeps in the view until a batch button reads it

    @staticmethod
    def _selection(body: dict[str, Any]) -> tuple[list[tuple[str, str]], str | None]:
        """The requests ticked where a batch button was pressed, and that list's channel
        (None: the App Home, whose state is the view's; a message's is the payload's)."""
        if (body.get("container") or {}).get("type") == "view":
            state, channel = (body.get("view") or {}).get("state"), None
        else:
            state = body.get("state")
            channel = ((body.get("channel") or {}).get("id")
                       or (body.get("container") or {}).get("channel_id"))
        values = state.get("values") if isinstance(state, dict) else None
        return views.parse_selection(values), channel

    async def on_approve_selected(self, ack: AsyncAck, body: dict[str, Any],
                                  client: AsyncWebClient, respond: AsyncRespond) -> None:
        await ack()  # first: a batch may outlast Slack's 3 s (see the module's docstring)
        targets, channel = self._selection(body)
        self._later(self._batch(client, body["user"]["id"], channel, respond, targets,
                                "approve", None, name=name_of(body)))

    async def on_deny_selected(self, ack: AsyncAck, body: dict[str, Any],
                               client: AsyncWebClient, respond: AsyncRespond) -> None:
        await ack()
        targets, channel = self._selection(body)
        self._later(self._open_batch_deny(client, body["user"]["id"], channel, respond,
                                          body["trigger_id"], targets, name=name_of(body)))

    async def _open_batch_deny(self, client: AsyncWebClient, user: str, channel: str | None,
                               respond: AsyncRespond | None, trigger_id: str,
                               targets: list[tuple[str, str]], *,
                               name: str | None = None) -> None:
        """The modal that asks one reason for every ticked request (none ticked, or too
        many: the list says so instead, and nothing changes)."""
        if not targets or len(targets) > MAX_BATCH:
            await self._batch(client, user, channel, respond, targets, "deny", None,
                              name=name)
            return
        found = await self.e.views.approvals([i for i, _ in targets])
        items = [(i, token, found.get(i)) for i, token in targets]
        await client.views_open(trigger_id=trigger_id,
                                view=views.batch_deny_modal(items, channel=channel))

    async def on_deny_selected_submit(self, ack: AsyncAck, body: dict[str, Any],
                                      client: AsyncWebClient) -> None:
        view = body["view"]
        values = (view.get("state") or {}).get("values") or {}
        targets = views.parse_selection(values)
        reason = (((values.get(cards.REASON_BLOCK) or {}).get(cards.REASON_INPUT) or {}).get(
            "value") or "").strip()
        errors: dict[str, str] = {}
        if not targets:
            errors[views.BATCH_FIRST_BLOCK] = texts.MODAL_BATCH_NONE
        if not reason:
            errors[cards.REASON_BLOCK] = messages.refusal_text("reason_required")
        elif len(reason) > REASON_MAX:
            errors[cards.REASON_BLOCK] = messages.refusal_text("reason_too_long")
        try:
            channel = views.parse_batch_metadata(view.get("private_metadata") or "")
        except ValueError:
            errors[cards.REASON_BLOCK] = texts.REPLY_MALFORMED
        if errors:
            await ack(response_action="errors", errors=errors)
            return
        await ack()  # the modal closes; the list it came from shows what was decided
        self._later(self._batch(client, body["user"]["id"], channel, None, targets, "deny",
                                reason, name=name_of(body)))

    async def _batch(self, client: AsyncWebClient, user: str, channel: str | None,
                     respond: AsyncRespond | None, targets: list[tuple[str, str]],
                     verdict: BatchVerdict, reason: str | None, *,
                     name: str | None = None) -> None:
        """Decide every ticked request as ``user``, then redraw the list with what
        became of each. Each decision is an ordinary one (its card is updated through the
        outbox and its run resumed by the engine, as for a click on the card)."""
        if not targets:
            result = views.BatchResult(verdict)
        elif len(targets) > MAX_BATCH:
            result = views.BatchResult(verdict, refused=texts.BATCH_TOO_MANY.format(
                most=MAX_BATCH, n=len(targets)))
        else:
            result = await self._decide_batch(user, targets, verdict, reason, name=name)
        await self._show_batch(client, user, channel, respond, result)

    async def _decide_batch(self, user: str, targets: list[tuple[str, str]],
                            verdict: BatchVerdict, reason: str | None, *,
                            name: str | None = None) -> views.BatchResult:
        with self.e.span("slack.batch", user=user, verdict=verdict,
                                selected=len(targets)) as span:
            try:
                outcomes = await self.e.decide_each(
                    [Target(i, token) for i, token in targets],
                    actor=Actor(user, "slack", name=name), verdict=verdict, reason=reason)
            except ValueError as exc:  # refused as a whole, before anything was decided
                span.set(outcome="refused")
                return views.BatchResult(verdict, refused=str(exc))
            except Exception as exc:  # the database failed part-way: say so, show the rest
                log.error("batch %s by %s failed: %s: %s", verdict, user, type(exc).__name__,
                          exc, exc_info=exc)
                span.set(outcome=f"error:{type(exc).__name__}")
                return views.BatchResult(verdict, error=type(exc).__name__)
            span.set(outcome=f"{sum(o.ok for o in outcomes)} of {len(outcomes)} decided")
        refused = [o.approval_id for o in outcomes if not o.ok]
        now: dict[str, ApprovalRecord | None] = {}
        if refused:  # as they are now: a refusal's wording depends on the status
            now = await self.e.views.approvals(refused)
        return views.BatchResult(verdict, [
            (o, o.decision.approval if o.decision else now.get(o.approval_id))
            for o in outcomes])

    async def _show_batch(self, client: AsyncWebClient, user: str, channel: str | None,
                          respond: AsyncRespond | None, result: views.BatchResult) -> None:
        """The App Home (``channel`` None) or the ``/approvals`` list, redrawn with
        ``result`` on top: in place through the list's response URL, else as a new one."""
        if channel is None:
            await self.publish_home(client, user, result=result)
            return
        pending = await self.actionable(user)
        msg = views.approvals_list_message(pending, now=self.e.now(), result=result)
        if respond is not None:
            await respond(response_type="ephemeral", replace_original=True, **msg)
        else:
            await client.chat_postEphemeral(channel=channel, user=user, **msg)

