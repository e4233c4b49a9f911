"""Slack listeners: buttons, modals, the /approvals command and the App Home.

A decision is committed before its click is acknowledged (invariant 13): Slack never
sees a 200 for a decision a crash could lose. A decision commit takes milliseconds and
Slack allows 3 seconds; a slow group lookup is bounded by the directory's own timeout.
Everything else a listener does (telling the clicker, opening a modal, refreshing the App
Home, resuming the run) happens after the ack, in a task of its own (bolt runs with
``process_before_response``: nothing waits on a polling loop). A modal submission that
is refused or fails validation answers with its errors inline: they are the ack.
Identity comes only from Slack's signed payload (bolt verified the
signature before any listener runs). A refused click changes nothing and gets an
ephemeral explanation; the card itself is updated through the outbox.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from slack_bolt.async_app import AsyncAck, AsyncApp, AsyncRespond
from slack_sdk.web.async_client import AsyncWebClient

from bot import cards, messages, texts, views
from runtime.decide import Actor, Decision, Verdict
from runtime.errors import ApprovaldError, DecisionRefused, InvalidArguments, NotFound
from store.records import ApprovalRecord

if TYPE_CHECKING:
    from bot.app import SlackService

log = logging.getLogger("approvald.slack")


class Handlers:
    def __init__(self, svc: SlackService) -> None:
        self.svc = svc
        self.e = svc.engine
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

    def register(self, app: AsyncApp) -> None:
        for action_id, verdict in ((cards.APPROVE, "approve"), (cards.RETRY, "retry"),
                                   (cards.MARK_DONE, "mark_done")):
            app.action(action_id)(self._direct(verdict))
        app.action(cards.DENY)(self.on_deny_click)
        app.action(cards.ABORT)(self.on_abort_click)
        app.action(cards.EDIT)(self.on_edit_click)
        app.action(cards.REDIRECT)(self.on_redirect_click)
        app.action(cards.VIEW_ARGS)(self.on_view_args)
        app.view(cards.DENY_MODAL)(self.on_reason_submit("deny"))
        app.view(cards.RESOLVE_MODAL)(self.on_reason_submit("abort"))
        app.view(cards.EDIT_MODAL)(self.on_edit_submit)
        app.view(cards.REDIRECT_MODAL)(self.on_reason_submit(
            "redirect", block=cards.GUIDANCE_BLOCK, field=cards.GUIDANCE_INPUT,
            missing="guidance_required"))
        app.command("/approvals")(self.on_command)
        app.event("app_home_opened")(self.on_home_opened)
        app.error(self.on_error)

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

    def _refusal(self, exc: Exception) -> str:
        if isinstance(exc, DecisionRefused):
            return messages.refusal_text(exc.reason, status=exc.status, detail=str(exc))
        if isinstance(exc, NotFound):
            return texts.REPLY_UNKNOWN_APPROVAL
        return texts.REPLY_ERROR.format(error=type(exc).__name__)

    async def _preflight(self, approval_id: str, token: str, actor: Actor) -> ApprovalRecord:
        """Would a decision by ``actor`` be accepted now? Raises like ``decide`` would."""
        a = await self.e.decider.get(approval_id)
        self.e.decider.check_open(a, token)
        await self.e.decider.authorize(a, actor)
        return a

    async def _decide(self, *, approval_id: str, token: str, user: str, verdict: Verdict,
                      reason: str | None = None,
                      args: Any = None) -> tuple[Decision | None, str | None]:
        """Record a decision now, before the caller acks: ``(decision, None)`` once it is
        committed, or ``(None, what to tell the clicker)`` when nothing was recorded."""
        # the click's span: its decision is a child, and so are the steps of the run it
        # resumes in this process (see runtime/tracing.py)
        with self.e.tracer.span("slack.click", approval_id=approval_id, user=user,
                                verdict=verdict) as span:
            try:
                decision = await self.e.decide(approval_id, actor=Actor(user, "slack"),
                                               verdict=verdict, reason=reason, args=args,
                                               token=token)
            except (ApprovaldError, ValueError) as exc:
                span.set(outcome=f"refused:{getattr(exc, 'reason', type(exc).__name__)}")
                return None, self._refusal(exc)
            except Exception as exc:  # the database failed: nothing was committed; say so
                log.error("decision on approval %s by %s failed: %s: %s", approval_id, user,
                          type(exc).__name__, exc, exc_info=exc)
                span.set(outcome=f"error:{type(exc).__name__}")
                return None, texts.REPLY_ERROR.format(error=type(exc).__name__)
            span.set(outcome=decision.outcome)
        return decision, None

    async def _after(self, client: AsyncWebClient, user: str, channel: str | None,
                     decision: Decision | None, refusal: str | None) -> None:
        """After the ack: tell the clicker what happened, refresh their App Home."""
        if refusal is not None:
            await self._tell(client, user, channel, refusal)
            return
        assert decision is not None
        reset = (texts.REPLY_VOTES_RESET.format(who=", ".join(decision.discarded))
                 if decision.discarded else "")
        if decision.outcome == "voted":
            await self._tell(client, user, channel, texts.REPLY_VOTED.format(
                count=decision.approvals, quorum=decision.quorum) + reset)
        elif decision.outcome == "edited":
            await self._tell(client, user, channel, texts.REPLY_PROPOSED + reset)
        elif reset:
            await self._tell(client, user, channel, reset.strip())
        if channel is None:
            await self.publish_home(client, user)

    # -- buttons ------------------------------------------------------------------------
    def _direct(self, verdict: Verdict) -> Any:
        async def handler(ack: AsyncAck, body: dict[str, Any], client: AsyncWebClient) -> None:
            user = body["user"]["id"]
            channel, _ = self._where(body)
            try:
                approval_id, token = cards.parse_value(body["actions"][0]["value"])
            except (ValueError, KeyError, IndexError):
                await ack()
                self._later(self._tell(client, user, channel, texts.REPLY_MALFORMED))
                return
            decision, refusal = await self._decide(approval_id=approval_id, token=token,
                                                   user=user, verdict=verdict)
            await ack()  # only now: the decision is committed (or nothing changed)
            self._later(self._after(client, user, channel, decision, refusal))
        return handler

    async def _open_for(self, body: dict[str, Any], client: AsyncWebClient,
                        build: Any, *, check: bool = True) -> None:
        user = body["user"]["id"]
        channel, ts = self._where(body)
        try:
            approval_id, token = cards.parse_value(body["actions"][0]["value"])
            if check:
                a = await self._preflight(approval_id, token, Actor(user, "slack"))
            else:
                a = await self.e.decider.get(approval_id)
        except (ValueError, KeyError, IndexError):
            await self._tell(client, user, channel, texts.REPLY_MALFORMED)
            return
        except ApprovaldError as exc:
            await self._tell(client, user, channel, self._refusal(exc))
            return
        await client.views_open(trigger_id=body["trigger_id"],
                                view=build(a, token, channel or a.channel, ts or a.message_ts))

    async def on_deny_click(self, ack: AsyncAck, body: dict[str, Any],
                            client: AsyncWebClient) -> None:
        await ack()
        self._later(self._open_for(body, client, lambda a, t, c, ts: views.deny_modal(
            a.id, t, c, ts, tool=a.tool)))

    async def on_abort_click(self, ack: AsyncAck, body: dict[str, Any],
                             client: AsyncWebClient) -> None:
        await ack()
        self._later(self._open_for(body, client, lambda a, t, c, ts: views.resolve_abort_modal(
            a.id, t, c, ts, tool=a.tool)))

    async def on_edit_click(self, ack: AsyncAck, body: dict[str, Any],
                            client: AsyncWebClient) -> None:
        await ack()
        self._later(self._open_for(body, client, views.edit_modal))

    async def on_redirect_click(self, ack: AsyncAck, body: dict[str, Any],
                                client: AsyncWebClient) -> None:
        await ack()
        self._later(self._open_for(body, client, lambda a, t, c, ts: views.redirect_modal(
            a.id, t, c, ts, tool=a.tool)))

    async def on_view_args(self, ack: AsyncAck, body: dict[str, Any],
                           client: AsyncWebClient) -> None:
        await ack()
        self._later(self._open_for(body, client, lambda a, t, c, ts: views.args_modal(a),
                                   check=False))

    # -- modals -------------------------------------------------------------------------
    def on_reason_submit(self, verdict: Verdict, *, block: str = cards.REASON_BLOCK,
                         field: str = cards.REASON_INPUT,
                         missing: str = "reason_required") -> Any:
        """A modal with one text box that the decision needs: a denial's or an abort's
        reason, a redirect's guidance (``missing``: the refusal when it is left blank)."""

        async def handler(ack: AsyncAck, body: dict[str, Any], client: AsyncWebClient) -> None:
            view = body["view"]
            value = (((view.get("state") or {}).get("values") or {}).get(block) or {}).get(
                field) or {}
            reason = (value.get("value") or "").strip()
            if not reason:
                await ack(response_action="errors", errors={block: messages.refusal_text(
                    missing)})
                return
            try:
                target = views.parse_metadata(view.get("private_metadata") or "")
            except ValueError:
                await ack(response_action="errors", errors={block: texts.REPLY_MALFORMED})
                return
            user = body["user"]["id"]
            decision, refusal = await self._decide(approval_id=target.approval_id,
                                                   token=target.token, user=user,
                                                   verdict=verdict, reason=reason)
            if refusal is not None:  # shown in the modal, which stays open to read it
                await ack(response_action="errors", errors={block: refusal[:1000]})
                return
            await ack()
            self._later(self._after(client, user, target.channel, decision, None))
        return handler

    async def on_edit_submit(self, ack: AsyncAck, body: dict[str, Any],
                             client: AsyncWebClient) -> None:
        view = body["view"]
        raw = (((view.get("state") or {}).get("values") or {}).get(cards.ARGS_BLOCK) or {}).get(
            cards.ARGS_INPUT) or {}
        args, errors = views.parse_edit(raw.get("value") or "")
        if errors is not None:
            await ack(**errors)
            return
        try:
            target = views.parse_metadata(view.get("private_metadata") or "")
            a = await self.e.decider.get(target.approval_id)
            tool = await self.e.tool_for(a)
            tool.validate(args)
        except InvalidArguments as exc:
            await ack(**views.edit_errors(exc.errors))
            return
        except (ApprovaldError, ValueError) as exc:
            await ack(response_action="errors",
                      errors={cards.ARGS_BLOCK: self._refusal(exc)[:1000]})
            return
        user = body["user"]["id"]
        decision, refusal = await self._decide(approval_id=target.approval_id,
                                               token=target.token, user=user, verdict="edit",
                                               args=args)
        if refusal is not None:
            await ack(response_action="errors", errors={cards.ARGS_BLOCK: refusal[:1000]})
            return
        await ack()
        self._later(self._after(client, user, target.channel, decision, None))

    # -- lists ----------------------------------------------------------------------------
    async def actionable(self, user: str, *, limit: int) -> list[tuple[ApprovalRecord, str]]:
        """Pending requests ``user`` may decide, with the tokens for their buttons."""
        async with self.e.db.read() as tx:
            pending = await tx.approvals.pending_for_actor_candidates(limit=500)
        out = []
        for a in pending:
            try:
                await self.e.decider.authorize(a, Actor(user, "slack"))
            except DecisionRefused:
                continue
            token = self.e.button_token(a)
            if token is not None:
                out.append((a, token))
            if len(out) >= limit:
                break
        return out

    async def on_command(self, ack: AsyncAck, body: dict[str, Any],
                         respond: AsyncRespond) -> None:
        await ack()
        self._later(self._list_for(body["user_id"], respond))

    async def _list_for(self, user: str, respond: AsyncRespond) -> None:
        pending = await self.actionable(user, limit=views.LIST_MAX_PENDING + 1)
        msg = views.approvals_list_message(pending, now=self.e.clock.now())
        await respond(response_type="ephemeral", **msg)

    async def publish_home(self, client: AsyncWebClient, user: str) -> None:
        pending = await self.actionable(user, limit=views.HOME_MAX_PENDING + 1)
        async with self.e.db.read() as tx:
            recent = [a for a in await tx.approvals.recent(limit=200)
                      if a.decided_by == user][:views.HOME_MAX_RECENT]
        await client.views_publish(user_id=user, view=views.home_view(
            pending, recent, now=self.e.clock.now()))

    async def on_home_opened(self, event: dict[str, Any], client: AsyncWebClient) -> None:
        if event.get("tab", "home") == "home":
            self._later(self.publish_home(client, event["user"]))

    async def on_error(self, error: Exception, body: dict[str, Any]) -> None:
        log.error("Slack listener failed: %s: %s", type(error).__name__, error,
                  exc_info=error)
