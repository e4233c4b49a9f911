"""A card's buttons and modals: Approve, Retry, Mark done, Re-plan (decided on the click),
Deny, Abort, Redirect and Edit (a modal first, preflighted as the decision would be), the
arguments and a thread's "Show JSON" (read only). Each decision is committed before its
click or submission is acknowledged (see :mod:`.listeners`)."""

from __future__ import annotations

import logging
from typing import Any

from approvald.bot.slack import cards, messages, texts, views
from approvald.bot.slack.home import Home
from approvald.bot.slack.listeners import Listener, ModalBuilder, name_of
from approvald.bot.slack.mrkdwn import approver
from approvald.runtime import Actor, ApprovaldError, Decision, InvalidArguments, Verdict
from approvald.store.records import ApprovalRecord
from slack_bolt.async_app import AsyncAck
from slack_sdk.web.async_client import AsyncWebClient

log = logging.getLogger("approvald.slack")


class Decisions(Home):
    """A card's buttons and modals."""

    async def _preflight(self, approval_id: str, token: str, actor: Actor) -> ApprovalRecord:
        """Would a decision by ``actor`` be accepted now? Raises like ``decide`` would."""
        return await self.e.preflight(approval_id, token, actor)

    async def _decide(self, *, approval_id: str, token: str, user: str, verdict: Verdict,
                      reason: str | None = None, args: Any = None,
                      mentions: bool = True,
                      name: str | None = None) -> tuple[Decision | None, str | None]:
        """Record a decision now, before the caller acks: ``(decision, None)`` once it is
        committed, or ``(None, what to tell the clicker)`` when nothing was recorded
        (``mentions=False``: to be shown as plain text, in a modal)."""
        # the click's span: its decision is a child, and so are the steps of the run it
        # resumes in this process (see runtime/record/tracing.py)
        with self.e.span("slack.click", approval_id=approval_id, user=user,
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

    @staticmethod
    def _nothing_after(channel: str | None, decision: Decision | None,
                       refusal: str | None) -> bool:
        """Whether :meth:`_after` has nothing to do: a decision made at once on a card in
        a channel (the card itself tells it, through the outbox). Most clicks are that, and
        a task for nothing cost each of them."""
        return (refusal is None and decision is not None and channel is not None
                and not decision.repeated and not decision.discarded
                and decision.outcome not in ("voted", "edited"))

    async def _after(self, client: AsyncWebClient, user: str, channel: str | None,
                     decision: Decision | None, refusal: str | None) -> None:
        """After the ack: tell the clicker what happened, refresh their App Home."""
        if self._nothing_after(channel, decision, refusal):
            return
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
                                                   name=name_of(body))
            await ack()  # only now: the decision is committed (or nothing changed)
            if not self._nothing_after(channel, decision, refusal):
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
                a = await self.e.approval(approval_id)
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
                                                   mentions=False, name=name_of(body))
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
            # the box showed sensitive values masked: decide reads them back the same way
            await self.e.read_edit(target.approval_id, args)
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
                                               name=name_of(body))
        if refusal is not None:
            await ack(response_action="errors", errors={cards.ARGS_BLOCK: refusal[:1000]})
            return
        await ack()
        self._later(self._after(client, user, target.channel, decision, None))

