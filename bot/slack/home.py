"""The App Home and ``/approvals``: what a viewer may decide, drawn from the engine's
views (:meth:`runtime.views.Views.home`, :meth:`~runtime.views.Views.actionable`)."""

from __future__ import annotations

from typing import Any

from approvald.bot.slack import views
from approvald.bot.slack.listeners import Listeners
from approvald.runtime import Actor
from approvald.store.records import ApprovalRecord
from slack_bolt.async_app import AsyncAck, AsyncRespond
from slack_sdk.web.async_client import AsyncWebClient


class Home(Listeners):
    """The App Home and the ``/approvals`` list."""

    # -- lists ----------------------------------------------------------------------------
    async def actionable(self, user: str) -> list[tuple[ApprovalRecord, str]]:
        """Pending requests ``user`` may decide, oldest first, with the tokens for their
        buttons and checkboxes (see :meth:`runtime.views.Views.actionable`)."""
        return list(await self.e.views.actionable(Actor(user, "slack")))

    async def on_command(self, ack: AsyncAck, body: dict[str, Any],
                         respond: AsyncRespond) -> None:
        await ack()
        self._later(self._list_for(body["user_id"], respond))

    async def _list_for(self, user: str, respond: AsyncRespond) -> None:
        pending = await self.actionable(user)
        msg = views.approvals_list_message(pending, now=self.e.now())
        await respond(response_type="ephemeral", **msg)

    async def publish_home(self, client: AsyncWebClient, user: str, *,
                           result: views.BatchResult | None = None,
                           notice: str | None = None) -> None:
        """Draw ``user``'s App Home (with what a batch just did, when ``result`` is given,
        or what a click on a standing approval did, ``notice``)."""
        home = await self.e.views.home(Actor(user, "slack"), recent=views.HOME_MAX_RECENT)
        standing = [views.HomeStanding(i.standing, i.may_grant, i.sensitive)
                    for i in home.standing]
        insights = await self.e.operator_insights(user)  # (None: not an operator)
        await client.views_publish(user_id=user, view=views.home_view(
            list(home.pending), list(home.recent), now=home.now, result=result,
            standing=standing, notice=notice, insights=insights))

    async def on_home_opened(self, event: dict[str, Any], client: AsyncWebClient) -> None:
        if event.get("tab", "home") == "home":
            self._later(self.publish_home(client, event["user"]))

