"""Slack listeners: buttons, modals, the /approvals command and the App Home, registered
with bolt. Split by flow (see :mod:`.listeners`): decisions, standing approvals, batches,
the App Home.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from approvald.bot.slack import cards, story
from approvald.bot.slack.batch import Batch
from approvald.bot.slack.listeners import Listener, log
from approvald.bot.slack.standing import Standing
from approvald.runtime import Verdict
from slack_bolt.async_app import AsyncApp
from slack_bolt.middleware.async_middleware import AsyncMiddleware
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_bolt.response import BoltResponse

# the buttons decided on the click itself, by action id
DIRECT: tuple[tuple[str, Verdict], ...] = (
    (cards.APPROVE, "approve"), (cards.RETRY, "retry"), (cards.MARK_DONE, "mark_done"),
    (cards.REPLAN, "replan"))


class DirectClicks(AsyncMiddleware):
    """The clicks decided at once (Approve, Retry, Mark done, Re-plan), run as a global
    middleware of the bolt app (``app.use``), after bolt's own: its context (the request's
    ``ack`` and client) and its authorization, the same as for a listener.

    Bolt finds a listener by building each candidate matcher's arguments (every one a
    listener could ask for: about 80 Python calls) and then the listener's own the same
    way; for a block action whose action id names one of these buttons, this calls the
    same listener with the three it takes. It takes exactly the requests bolt's matchers
    for these ids would (``block_actions``, the first action's ``action_id``; a malformed
    one raises where bolt's matcher did, the same 500); every other request, and the
    legacy shapes bolt also routes by these ids (attachment actions, dialogs), goes on to
    the listeners, which are registered as before. The signature was checked before bolt
    saw the request (:mod:`.transport`). ``tests/integration/test_direct_clicks.py`` pins it.
    """

    def __init__(self, listeners: Mapping[str, Listener]) -> None:
        self.listeners = dict(listeners)

    async def async_process(self, *, req: AsyncBoltRequest, resp: BoltResponse,
                            next: Callable[[], Awaitable[BoltResponse]]
                            ) -> BoltResponse | None:
        body = req.body
        if body.get("type") == "block_actions" and "actions" in body:
            action_id = body["actions"][0]["action_id"]
            listener = self.listeners.get(action_id) if isinstance(action_id, str) else None
            if listener is not None:
                context = req.context
                await listener(context.ack, body, context.client)
                return context.ack.response
        return await next()


class Handlers(Standing, Batch):
    """Every Slack listener of approvald, registered on one bolt app."""

    def direct_clicks(self) -> DirectClicks:
        """The middleware that runs the direct buttons' listeners (see :class:`DirectClicks`),
        for ``app.use`` after :meth:`register`."""
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

