"""Slack listeners: buttons, modals, the /approvals command and the App Home, registered
with bolt. Split by flow (see :mod:`.listeners`): decisions, standing approvals, batches,
the App Home.
"""

from __future__ import annotations

from typing import Any

from approvald.bot.slack import cards, story
from approvald.bot.slack.batch import Batch
from approvald.bot.slack.direct import DirectClicks
from approvald.bot.slack.listeners import log
from approvald.bot.slack.standing import Standing
from approvald.runtime import Verdict
from slack_bolt.async_app import AsyncApp

# the buttons decided on the click itself, by action id
DIRECT: tuple[tuple[str, Verdict], ...] = (
    (cards.APPROVE, "approve"), (cards.RETRY, "retry"), (cards.MARK_DONE, "mark_done"),
    (cards.REPLAN, "replan"))


class Handlers(Standing, Batch):
    """Every Slack listener of approvald, registered on one bolt app."""

    def direct_clicks(self) -> DirectClicks:
        """The middleware that runs the direct buttons' listeners (see :mod:`.direct`), for
        ``app.use`` after :meth:`register`, and for the transport's front of it."""
        return DirectClicks({action_id: self._direct(verdict) for action_id, verdict in DIRECT})

    def register(self, app: AsyncApp) -> None:
        for action_id, verdict in DIRECT:
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

    async def on_error(self, error: Exception, body: dict[str, Any]) -> None:
        log.error("Slack listener failed: %s: %s", type(error).__name__, error,
                  exc_info=error)

