"""Slack listeners: buttons, modals, the /approvals command and the App Home.

A decision is committed before its click is acknowledged (invariant 13): Slack never
sees a 200 for a decision a crash could lose. A decision commit takes milliseconds and
Slack allows 3 seconds; a slow group lookup is bounded by the directory's own timeout.
Everything else a listener does (telling the clicker, opening a modal, refreshing the App
Home, resuming the run) happens after the ack, in a task of its own (bolt runs with
``process_before_response``: nothing waits on a polling loop). A modal submission that
is refused or fails validation answers with its errors inline: they are the ack.
"Approve selected" and "Deny selected" (App Home, ``/approvals``) are the exception: the
button or the modal is acknowledged first and the batch decided after, one request at a
time (:func:`runtime.batch.decide_each`), because a batch may take longer than Slack's
3 seconds. Their acknowledgement claims nothing: what a batch decided is shown only once
each decision is committed, in the App Home (or the list) redrawn with the results.
A standing approval ("Approve, and calls like this…") is granted from its modal like any
other decision: the request's approval and the standing approval are both committed
before the submission is acknowledged; Revoke and Grant too on the App Home are committed
before their ack, and the Home is drawn again saying what happened.
Identity comes only from Slack's signed payload (its signature was
checked on the raw bytes before bolt saw the request: :mod:`.transport`; in Socket Mode,
Slack's own websocket carries it). A refused click changes nothing and gets an
ephemeral explanation; the card itself is updated through the outbox.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, Literal

from approvald.bot.slack import cards, messages, story, texts, views
from approvald.bot.slack.mrkdwn import REASON_MAX, approver, code_span, cut_plain
from approvald.runtime.batch import MAX_BATCH, BatchVerdict, Target, decide_each
from approvald.runtime.decide import Actor, Decision, Verdict
from approvald.runtime.errors import ApprovaldError, DecisionRefused, InvalidArguments, NotFound
from approvald.runtime.packet import sensitive_paths
from approvald.runtime.scope import scope_for
from approvald.runtime.standing import StandingRefused
from approvald.store.records import ApprovalRecord
from approvald.store.repos.standing import StandingRecord
from pydantic import ValidationError
from slack_bolt.async_app import AsyncAck, AsyncApp, AsyncRespond
from slack_sdk.web.async_client import AsyncWebClient

if TYPE_CHECKING:
    from approvald.runtime.engine import Engine

log = logging.getLogger("approvald.slack")
# a bolt listener for a click or a modal's submission, as the factories below build them
Listener = Callable[[AsyncAck, dict[str, Any], AsyncWebClient], Awaitable[None]]
# builds a modal for an approval: (approval, token, channel, message ts) -> view
ModalBuilder = Callable[[ApprovalRecord, str, str | None, str | None], dict[str, Any]]
StandingVerb = Literal["revoke", "grant"]
CANDIDATES = 500  # pending requests looked at for one viewer's lists
_STANDING_ID = re.compile(r"[A-Za-z0-9_-]{6,64}")


class Handlers:
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

    def register(self, app: AsyncApp) -> None:
        direct: tuple[tuple[str, Verdict], ...] = (
            (cards.APPROVE, "approve"), (cards.RETRY, "retry"), (cards.MARK_DONE, "mark_done"),
            (cards.REPLAN, "replan"))
        for action_id, verdict in direct:
            app.action(action_id)(self._direct(verdict))
        app.action(cards.DENY)(self.on_deny_click)
        app.action(cards.ABORT)(self.on_abort_click)
        app.action(cards.EDIT)(self.on_edit_click)
        app.action(cards.REDIRECT)(self.on_redirect_click)
        app.action(cards.VIEW_ARGS)(self.on_view_args)
        app.action(story.SHOW_JSON)(self.on_show_json)
        app.view(cards.DENY_MODAL)(self.on_reason_submit("deny"))
        app.view(cards.RESOLVE_MODAL)(self.on_reason_submit("abort"))
        app.view(cards.EDIT_MODAL)(self.on_edit_submit)
        app.view(cards.REDIRECT_MODAL)(self.on_reason_submit(
            "redirect", block=cards.GUIDANCE_BLOCK, field=cards.GUIDANCE_INPUT,
            missing="guidance_required"))
        app.action(cards.SELECT)(self.on_select)
        app.action(cards.APPROVE_SELECTED)(self.on_approve_selected)
        app.action(cards.DENY_SELECTED)(self.on_deny_selected)
        app.view(cards.DENY_SELECTED_MODAL)(self.on_deny_selected_submit)
        app.action(cards.STANDING)(self.on_standing_click)
        app.view(cards.STANDING_MODAL)(self.on_standing_submit)
        app.action(cards.STANDING_REVOKE)(self.on_standing_change("revoke"))
        app.action(cards.STANDING_GRANT)(self.on_standing_change("grant"))
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

    def _refusal(self, exc: Exception, *, mentions: bool = True,
                 viewer: str | None = None) -> str:
        """What to tell ``viewer``, whose attempt was refused (``mentions=False``: for
        plain text, a modal's errors, where a mention would show as markup)."""
        if isinstance(exc, DecisionRefused):
            return messages.refusal_of(exc, mentions=mentions, viewer=viewer)
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
                      reason: str | None = None, args: Any = None,
                      mentions: bool = True,
                      name: str | None = None) -> tuple[Decision | None, str | None]:
        """Record a decision now, before the caller acks: ``(decision, None)`` once it is
        committed, or ``(None, what to tell the clicker)`` when nothing was recorded
        (``mentions=False``: to be shown as plain text, in a modal)."""
        # the click's span: its decision is a child, and so are the steps of the run it
        # resumes in this process (see runtime/tracing.py)
        with self.e.tracer.span("slack.click", approval_id=approval_id, user=user,
                                verdict=verdict) as span:
            try:
                decision = await self.e.decide(approval_id,
                                               actor=Actor(user, "slack", name=name),
                                               verdict=verdict, reason=reason, args=args,
                                               token=token)
            except (ApprovaldError, ValueError) as exc:
                span.set(outcome=f"refused:{getattr(exc, 'reason', type(exc).__name__)}")
                return None, self._refusal(exc, mentions=mentions, viewer=user)
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
        if decision.repeated:  # audited as a repeat: say that it stands, not "too late"
            await self._tell(client, user, channel, messages.repeated_text(decision.approval))
            return
        reset = (texts.REPLY_VOTES_RESET.format(
            who=", ".join(approver(v) for v in decision.discarded[:10]))
                 if decision.discarded else "")
        if decision.outcome == "voted":
            await self._tell(client, user, channel, texts.REPLY_VOTED.format(
                count=decision.approvals, quorum=decision.quorum) + reset)
        elif decision.outcome == "edited":
            await self._tell(client, user, channel,
                             messages.proposed_text(decision.approval, reset))
        elif reset:
            await self._tell(client, user, channel, reset.strip())
        if channel is None:
            await self.publish_home(client, user)

    # -- buttons ------------------------------------------------------------------------
    def _direct(self, verdict: Verdict) -> Listener:
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
                                                   user=user, verdict=verdict,
                                                   name=_name(body))
            await ack()  # only now: the decision is committed (or nothing changed)
            self._later(self._after(client, user, channel, decision, refusal))
        return handler

    async def _open_for(self, body: dict[str, Any], client: AsyncWebClient,
                        build: ModalBuilder, *, check: bool = True) -> None:
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
            await self._tell(client, user, channel, self._refusal(exc, viewer=user))
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

    async def on_show_json(self, ack: AsyncAck, body: dict[str, Any],
                           client: AsyncWebClient) -> None:
        """A run thread's "Show JSON": the call's result, in a modal (read-only; anyone who
        sees the thread may look, as they see its words)."""
        await ack()
        self._later(self._show_json(body, client))

    async def _show_json(self, body: dict[str, Any], client: AsyncWebClient) -> None:
        user = body["user"]["id"]
        channel, _ = self._where(body)
        try:
            run_id, call_id = str(body["actions"][0]["value"]).split(" ", 1)
            result = await self.e.call_result(run_id, call_id)
        except (ValueError, KeyError, IndexError):
            await self._tell(client, user, channel, texts.REPLY_MALFORMED)
            return
        except ApprovaldError:
            result = None
        if result is None:
            await self._tell(client, user, channel, texts.MODAL_JSON_GONE)
            return
        await client.views_open(trigger_id=body["trigger_id"], view=views.result_modal(result))

    # -- modals -------------------------------------------------------------------------
    def on_reason_submit(self, verdict: Verdict, *, block: str = cards.REASON_BLOCK,
                         field: str = cards.REASON_INPUT,
                         missing: str = "reason_required") -> Listener:
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
                                                   verdict=verdict, reason=reason,
                                                   mentions=False, name=_name(body))
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
            # the box showed sensitive values masked: decide reads them back the same way
            await self.e.decider.read_edit(a, args)
        except InvalidArguments as exc:
            await ack(**views.edit_errors(exc.errors))
            return
        except (ApprovaldError, ValueError) as exc:
            await ack(response_action="errors",
                      errors={cards.ARGS_BLOCK: self._refusal(exc, mentions=False)[:1000]})
            return
        user = body["user"]["id"]
        why = (((view.get("state") or {}).get("values") or {}).get(cards.REASON_BLOCK)
               or {}).get(cards.REASON_INPUT) or {}
        decision, refusal = await self._decide(approval_id=target.approval_id,
                                               token=target.token, user=user, verdict="edit",
                                               args=args, mentions=False,
                                               reason=(why.get("value") or "").strip() or None,
                                               name=_name(body))
        if refusal is not None:
            await ack(response_action="errors", errors={cards.ARGS_BLOCK: refusal[:1000]})
            return
        await ack()
        self._later(self._after(client, user, target.channel, decision, None))

    # -- standing approvals ---------------------------------------------------------------
    async def on_standing_click(self, ack: AsyncAck, body: dict[str, Any],
                                client: AsyncWebClient) -> None:
        await ack()
        self._later(self._open_for(body, client, views.standing_modal))

    async def on_standing_submit(self, ack: AsyncAck, body: dict[str, Any],
                                 client: AsyncWebClient) -> None:
        """Approve the request and grant the standing approval, both committed before the
        ack; whatever is refused is shown in the modal, which stays open."""
        view = body["view"]
        choice, errors = views.parse_standing((view.get("state") or {}).get("values"))
        if choice is None:
            await ack(response_action="errors", errors=errors)
            return
        try:
            target = views.parse_metadata(view.get("private_metadata") or "")
        except ValueError:
            await ack(response_action="errors",
                      errors={cards.WINDOW_BLOCK: texts.REPLY_MALFORMED})
            return
        user = body["user"]["id"]
        granted, errors = await self._grant(target, user, choice, name=_name(body))
        if granted is None:
            await ack(response_action="errors", errors=errors)
            return
        await ack()
        self._later(self._after_grant(client, user, target.channel, *granted))

    async def _grant(self, target: views.ModalTarget, user: str, choice: views.StandingChoice,
                     *, name: str | None = None
                     ) -> tuple[tuple[StandingRecord, Decision] | None, dict[str, str]]:
        """``((standing approval, decision), {})`` once both are committed, else
        ``(None, the modal's errors)`` and nothing was granted."""
        scope_block = views.scope_error_block(choice.kind)
        with self.e.tracer.span("slack.standing", approval_id=target.approval_id,
                                user=user) as span:
            try:
                a = await self.e.decider.get(target.approval_id)
                scope = scope_for(a, choice.kind, fields=choice.fields, when=choice.when)
            except NotFound:
                return None, {cards.WINDOW_BLOCK: texts.REPLY_UNKNOWN_APPROVAL}
            except ValueError as exc:  # incomplete, not CEL, or not covering this request
                span.set(outcome="refused:scope")
                return None, {scope_block: texts.MODAL_STANDING_BAD_SCOPE.format(
                    why=_why(exc))[:1000]}
            try:
                granted = await self.e.standing.grant(
                    a.id, actor=Actor(user, "slack", name=name), window=choice.window,
                    scope=scope,
                    token=target.token)
            except StandingRefused as exc:
                span.set(outcome=f"refused:{exc.reason}")
                block = scope_block if exc.reason == "scope" else cards.WINDOW_BLOCK
                return None, {block: messages.standing_refusal_text(exc.reason,
                                                                    str(exc))[:1000]}
            except (ApprovaldError, ValueError) as exc:  # refused as a click would be
                span.set(outcome=f"refused:{getattr(exc, 'reason', type(exc).__name__)}")
                return None, {cards.WINDOW_BLOCK: self._refusal(exc, mentions=False)[:1000]}
            except Exception as exc:  # the database failed: nothing was granted; say so
                log.error("standing approval on %s by %s failed: %s: %s", target.approval_id,
                          user, type(exc).__name__, exc, exc_info=exc)
                span.set(outcome=f"error:{type(exc).__name__}")
                return None, {cards.WINDOW_BLOCK: texts.REPLY_ERROR.format(
                    error=type(exc).__name__)}
            span.set(outcome=f"granted:{granted[0].status}")
        return granted, {}

    async def _after_grant(self, client: AsyncWebClient, user: str, channel: str | None,
                           standing: StandingRecord, decision: Decision) -> None:
        """As after an Approve click; a quorum tool's granter also hears that their standing
        approval waits for other grants (the card says so too)."""
        if standing.status != "proposed":
            await self._after(client, user, channel, decision, None)
            return
        await self._tell(client, user, channel, texts.REPLY_STANDING_PROPOSED.format(
            id=code_span(standing.id, 64), count=len(standing.grants_value()),
            quorum=standing.quorum))
        if channel is None:
            await self.publish_home(client, user)

    def on_standing_change(self, verb: StandingVerb) -> Listener:
        """Revoke, or Grant too, from the App Home: committed before the ack, then the Home
        is drawn again saying what happened (or why nothing did)."""

        async def handler(ack: AsyncAck, body: dict[str, Any], client: AsyncWebClient) -> None:
            user = body["user"]["id"]
            channel, _ = self._where(body)
            value = (body.get("actions") or [{}])[0].get("value")
            if not isinstance(value, str) or not _STANDING_ID.fullmatch(value):
                notice = texts.REPLY_MALFORMED
            else:
                notice = await self._change_standing(verb, value, user, name=_name(body))
            await ack()  # only now: a revocation or a grant is committed (or nothing changed)
            if channel is None:
                self._later(self.publish_home(client, user, notice=notice))
            else:
                self._later(self._tell(client, user, channel, notice))
        return handler

    async def _change_standing(self, verb: StandingVerb, standing_id: str, user: str, *,
                               name: str | None = None) -> str:
        actor = Actor(user, "slack", name=name)
        with self.e.tracer.span(f"slack.standing_{verb}", standing_id=standing_id,
                                user=user) as span:
            try:
                if verb == "revoke":
                    s = await self.e.standing.revoke(standing_id, actor=actor)
                else:
                    s = await self.e.standing.add_grant(standing_id, actor=actor)
            except StandingRefused as exc:
                span.set(outcome=f"refused:{exc.reason}")
                return texts.HOME_STANDING_REFUSED.format(
                    why=messages.standing_refusal_text(exc.reason))
            except NotFound:
                span.set(outcome="refused:not_found")
                return texts.REPLY_STANDING_UNKNOWN
            except Exception as exc:  # the database failed: nothing changed; say so
                log.error("standing approval %s: %s by %s failed: %s: %s", standing_id, verb,
                          user, type(exc).__name__, exc, exc_info=exc)
                span.set(outcome=f"error:{type(exc).__name__}")
                return texts.REPLY_ERROR.format(error=type(exc).__name__)
            span.set(outcome=f"{verb}:{s.status}")
        fields = {"id": code_span(s.id, 64), "tool": code_span(s.tool, 80)}
        if verb == "revoke":
            return texts.HOME_STANDING_REVOKED.format(**fields)
        return texts.HOME_STANDING_GRANTED.format(
            count=len(s.grants_value()), quorum=s.quorum,
            active=texts.HOME_STANDING_NOW_ACTIVE if s.status == "active" else "", **fields)

    async def standing_for(self, user: str) -> list[views.HomeStanding]:
        """Live standing approvals ``user`` may revoke (granted them, or approves them),
        those still needing their grant first, then newest first."""
        items = []
        for s in await self.e.standing.listing(live_only=True):
            if await self.e.standing.may_revoke(s, user):
                async with self.e.db.read() as tx:
                    granted_on = await tx.approvals.get(s.granted_on)
                hide = sensitive_paths(granted_on) if granted_on is not None else ()
                items.append(views.HomeStanding(s, await self.e.standing.may_grant(s, user),
                                                hide))
        items.sort(key=lambda item: not item.may_grant)  # stable: newest first within
        return items

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
                                "approve", None, name=_name(body)))

    async def on_deny_selected(self, ack: AsyncAck, body: dict[str, Any],
                               client: AsyncWebClient, respond: AsyncRespond) -> None:
        await ack()
        targets, channel = self._selection(body)
        self._later(self._open_batch_deny(client, body["user"]["id"], channel, respond,
                                          body["trigger_id"], targets, name=_name(body)))

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
        async with self.e.db.read() as tx:
            found = {i: await tx.approvals.get(i) for i, _ in targets}
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
                                reason, name=_name(body)))

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
        with self.e.tracer.span("slack.batch", user=user, verdict=verdict,
                                selected=len(targets)) as span:
            try:
                outcomes = await decide_each(
                    self.e.decisions, [Target(i, token) for i, token in targets],
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
            async with self.e.db.read() as tx:
                now = {i: await tx.approvals.get(i) for i in refused}
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
        msg = views.approvals_list_message(pending, now=self.e.clock.now(), result=result)
        if respond is not None:
            await respond(response_type="ephemeral", replace_original=True, **msg)
        else:
            await client.chat_postEphemeral(channel=channel, user=user, **msg)

    # -- lists ----------------------------------------------------------------------------
    async def actionable(self, user: str) -> list[tuple[ApprovalRecord, str]]:
        """Pending requests ``user`` may decide, oldest first, with the tokens for their
        buttons and checkboxes (among the first :data:`CANDIDATES` to expire)."""
        async with self.e.db.read() as tx:
            pending = await tx.approvals.pending_for_actor_candidates(limit=CANDIDATES)
        out = []
        for a in pending:
            try:
                await self.e.decider.authorize(a, Actor(user, "slack"))
            except DecisionRefused:
                continue
            token = self.e.button_token(a)
            if token is not None:
                out.append((a, token))
        out.sort(key=lambda pair: (pair[0].requested_at, pair[0].id))
        return out

    async def on_command(self, ack: AsyncAck, body: dict[str, Any],
                         respond: AsyncRespond) -> None:
        await ack()
        self._later(self._list_for(body["user_id"], respond))

    async def _list_for(self, user: str, respond: AsyncRespond) -> None:
        pending = await self.actionable(user)
        msg = views.approvals_list_message(pending, now=self.e.clock.now())
        await respond(response_type="ephemeral", **msg)

    async def publish_home(self, client: AsyncWebClient, user: str, *,
                           result: views.BatchResult | None = None,
                           notice: str | None = None) -> None:
        """Draw ``user``'s App Home (with what a batch just did, when ``result`` is given,
        or what a click on a standing approval did, ``notice``)."""
        pending = await self.actionable(user)
        async with self.e.db.read() as tx:
            recent = [a for a in await tx.approvals.recent(limit=200)
                      if a.decided_by == user][:views.HOME_MAX_RECENT]
        standing = await self.standing_for(user)
        await client.views_publish(user_id=user, view=views.home_view(
            pending, recent, now=self.e.clock.now(), result=result, standing=standing,
            notice=notice))

    async def on_home_opened(self, event: dict[str, Any], client: AsyncWebClient) -> None:
        if event.get("tab", "home") == "home":
            self._later(self.publish_home(client, event["user"]))

    async def on_error(self, error: Exception, body: dict[str, Any]) -> None:
        log.error("Slack listener failed: %s: %s", type(error).__name__, error,
                  exc_info=error)


def _why(exc: ValueError) -> str:
    """A refused scope's reason in one line (a pydantic error without its wrapping), as
    plain text: a modal's errors are not mrkdwn."""
    text = str(exc)
    if isinstance(exc, ValidationError) and exc.errors():
        text = str(exc.errors()[0].get("msg") or exc).removeprefix("Value error, ")
    return cut_plain(text, 500)


def _name(body: dict[str, Any]) -> str | None:
    """The clicker's name as Slack's signed payload gives it at the time (recorded beside
    the id in the audit entry of the decision: who a user id was, then)."""
    user = body.get("user") or {}
    name = user.get("name") or user.get("username")
    return str(name)[:200] if name else None
