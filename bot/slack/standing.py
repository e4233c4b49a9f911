"""Standing approvals from Slack ("Approve, and calls like this…").

A standing approval is granted from its modal like any other decision: the request's
approval and the standing approval are both committed before the submission is
acknowledged; Revoke and Grant too on the App Home are committed before their ack, and the
Home is drawn again saying what happened."""

from __future__ import annotations

import logging
import re
from typing import Any, Literal

from approvald.bot.slack import cards, messages, texts, views
from approvald.bot.slack.decisions import Decisions
from approvald.bot.slack.listeners import Listener, name_of, why_of
from approvald.bot.slack.mrkdwn import code_span
from approvald.runtime import Actor, ApprovaldError, Decision, NotFound, StandingRefused, scope_for
from approvald.store.repos.standing import StandingRecord
from slack_bolt.async_app import AsyncAck
from slack_sdk.web.async_client import AsyncWebClient

StandingVerb = Literal["revoke", "grant"]
_STANDING_ID = re.compile(r"[A-Za-z0-9_-]{6,64}")

log = logging.getLogger("approvald.slack")


class Standing(Decisions):
    """The standing approval modal, and Revoke / Grant too on the App Home."""

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
        granted, errors = await self._grant(target, user, choice, name=name_of(body))
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
        with self.e.span("slack.standing", approval_id=target.approval_id,
                                user=user) as span:
            try:
                a = await self.e.approval(target.approval_id)
                scope = scope_for(a, choice.kind, fields=choice.fields, when=choice.when)
            except NotFound:
                return None, {cards.WINDOW_BLOCK: texts.REPLY_UNKNOWN_APPROVAL}
            except ValueError as exc:  # incomplete, not CEL, or not covering this request
                span.set(outcome="refused:scope")
                return None, {scope_block: texts.MODAL_STANDING_BAD_SCOPE.format(
                    why=why_of(exc))[:1000]}
            try:
                granted = await self.e.grant_standing(
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
                notice = await self._change_standing(verb, value, user, name=name_of(body))
            await ack()  # only now: a revocation or a grant is committed (or nothing changed)
            if channel is None:
                self._later(self.publish_home(client, user, notice=notice))
            else:
                self._later(self._tell(client, user, channel, notice))
        return handler

    async def _change_standing(self, verb: StandingVerb, standing_id: str, user: str, *,
                               name: str | None = None) -> str:
        actor = Actor(user, "slack", name=name)
        with self.e.span(f"slack.standing_{verb}", standing_id=standing_id,
                                user=user) as span:
            try:
                if verb == "revoke":
                    s = await self.e.revoke_standing(standing_id, actor=actor)
                else:
                    s = await self.e.add_standing_grant(standing_id, actor=actor)
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

