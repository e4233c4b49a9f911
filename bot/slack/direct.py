"""The buttons decided on the click (Approve, Retry, Mark done, Re-plan): bolt's middleware
that runs their listeners, and the same listeners answered in front of bolt's dispatch
when bolt's path to them would do nothing else.

Bolt finds a listener by building each candidate matcher's arguments (every one a listener
could ask for: about 80 Python calls) and then the listener's own the same way;
:class:`DirectClicks`, a global middleware after bolt's own, calls the listener of one of
these buttons with the three arguments it takes. :class:`DirectFront` goes one step
further for an authenticated HTTP request: before it, bolt's dispatch built the request's
context (its ids read out of the body, about 80 calls), then ran three middleware that do
nothing for such a click (an SSL check, a URL verification; the single-team
authorization, once its ``auth.test`` has answered, copies that answer into the context,
which these listeners never read), then :class:`DirectClicks`. The front runs the
listener as that middleware does, with the context's ``ack`` and Web API client (the one
``FaceApp`` makes), and only for a body whose context bolt would build without raising
(:func:`plain_context`; a body bolt would refuse keeps its 400) once bolt's authorization
has answered. What it answers is bolt's answer: the listener's ack, a 500 through bolt's
error handler when the listener raises. ``tests/integration/test_direct_clicks.py`` pins
the middleware, ``tests/integration/test_direct_front.py`` and
``tests/unit/test_direct_shape.py`` the front.

The front reads bolt's app as only this module does (its middleware list, its
``_init_context`` and error handler; slack-bolt is bounded below 2 in pyproject.toml):
its tests name each, and :attr:`DirectFront.enabled` is its switch.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, cast

from approvald.bot.slack.listeners import Listener
from slack_bolt.async_app import AsyncAck, AsyncApp
from slack_bolt.middleware.async_middleware import AsyncMiddleware
from slack_bolt.middleware.authorization.async_single_team_authorization import (
    AsyncSingleTeamAuthorization,
)
from slack_bolt.middleware.ssl_check.async_ssl_check import AsyncSslCheck
from slack_bolt.middleware.url_verification.async_url_verification import AsyncUrlVerification
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_bolt.request.internals import extract_team_id
from slack_bolt.response import BoltResponse

# bolt's global middleware in front of DirectClicks, as the face builds its app (no request
# verification: the transport checks signatures; no self-events, no function tokens)
IN_FRONT = (AsyncSslCheck, AsyncSingleTeamAuthorization, AsyncUrlVerification)
# an id field bolt reads as a string, or a dict's "id", or nothing
_IDS = (dict, str, type(None))
# what bolt's thread_ts lookup descends into, from the body and from its message
_NESTED = ("event", "assistant_thread", "message", "previous_message")
# bolt's private names the front reads, on the app (and its single-team authorization's
# ``auth_test_result``): one gone, the front stays off (tests/unit/test_direct_shape.py)
RELIES_ON = ("_async_middleware_list", "_raise_error_for_unhandled_request", "_token",
             "_init_context", "_async_middleware_error_handler")


def missing(app: AsyncApp) -> list[str]:
    """The names of :data:`RELIES_ON` that ``app`` lacks."""
    return [name for name in RELIES_ON if not hasattr(app, name)]


class DirectClicks(AsyncMiddleware):
    """The clicks decided at once, run as a global middleware of the bolt app
    (``app.use``), after bolt's own: its context (the request's ``ack`` and client) and its
    authorization, the same as for a listener.

    It takes exactly the requests bolt's matchers for these ids would (``block_actions``,
    the first action's ``action_id``; a malformed one raises where bolt's matcher did, the
    same 500); every other request, and the legacy shapes bolt also routes by these ids
    (attachment actions, dialogs), goes on to the listeners, which are registered as
    before. The signature was checked before bolt saw the request (:mod:`.transport`).
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

    def listener_for(self, body: dict[str, Any]) -> Listener | None:
        """The listener :meth:`async_process` would run for ``body``, when it would run one
        without raising on the way (``None`` otherwise: bolt's path decides)."""
        if body.get("type") != "block_actions":
            return None
        actions = body.get("actions")
        if type(actions) is not list or not actions or type(actions[0]) is not dict:
            return None
        action_id = actions[0].get("action_id")
        return self.listeners.get(action_id) if type(action_id) is str else None


def plain_context(body: dict[str, Any]) -> bool:
    """Whether bolt's ``build_async_context`` builds ``body``'s context without raising: a
    click's ids where Slack puts them (the user's and channel's ids, team and enterprise
    as ids or objects), none of the parts it descends into (an event, authorizations, a
    nested message). Conservative: ``False`` only sends the body the way bolt goes."""
    user, channel, message = body.get("user"), body.get("channel"), body.get("message")
    return (type(user) is dict and "id" in user
            and (type(channel) is str or (type(channel) is dict and "id" in channel))
            and type(body.get("team")) in _IDS and type(body.get("enterprise")) in _IDS
            and body.get("authorizations") is None and body.get("event") is None
            and "response_urls" not in body
            and type(body.get("assistant_thread")) is not dict
            and type(body.get("previous_message")) is not dict
            and (type(message) is not dict
                 or dict not in map(type, map(message.get, _NESTED))))


class DirectFront:
    """:class:`DirectClicks`' listeners, answered in front of bolt's dispatch (see the
    module docstring): used by :mod:`.transport` for an authenticated HTTP request."""

    def __init__(self, app: AsyncApp, clicks: DirectClicks) -> None:
        self.app = app
        self.clicks = clicks
        middleware = [] if missing(app) else app._async_middleware_list
        # the app as the face builds it: bolt's three, then the clicks. ``enabled`` is the
        # switch (tests turn it off to hear bolt's own answers): off, or the app built
        # otherwise, or a bolt without a name relied on, bolt's dispatch answers everything
        self.enabled = (len(middleware) == len(IN_FRONT) + 1
                        and all(type(m) is t for m, t in zip(middleware, IN_FRONT, strict=False))
                        and hasattr(middleware[1], "auth_test_result")
                        and not app._raise_error_for_unhandled_request)
        self.authorization = cast(AsyncSingleTeamAuthorization, middleware[1]) \
            if self.enabled else None
        # FaceApp's own (bot/slack/app.py imports this module: taken once it is loaded)
        from approvald.bot.slack.app import request_client

        self._client = request_client

    def _ready(self) -> bool:
        """The middleware are still bolt's three and the clicks, and bolt's authorization
        has its ``auth.test`` (until then it asks, and may refuse: bolt's path does)."""
        middleware = self.app._async_middleware_list
        return (self.enabled and self.authorization is not None
                and len(middleware) == len(IN_FRONT) + 1 and middleware[-1] is self.clicks
                and self.authorization.auth_test_result is not None)

    async def answer(self, body: dict[str, Any], request: Callable[[], AsyncBoltRequest]
                     ) -> BoltResponse | None:
        """Bolt's answer to the authenticated ``body`` when the front takes it, else
        ``None`` (bolt's dispatch answers). ``request``: the bolt request of ``body``, made
        only for bolt's error handler."""
        listener = self.clicks.listener_for(body)
        if listener is None or not plain_context(body) or not self._ready():
            return None
        # the request's client as the app's _init_context makes it (the team's id as bolt's
        # context would hold it), and an ack: all the listener takes of a context (the
        # logger, token and runner _init_context also puts there are not read)
        ack = AsyncAck()  # type: ignore[no-untyped-call]
        client = self._client(self.app.client, self.app._token, extract_team_id(body) or None)
        app = self.app
        try:
            await listener(ack, body, client)
        except Exception as error:  # what bolt's dispatch does with a middleware's error
            req = request()
            app._init_context(req)
            resp = BoltResponse(status=500, body="")
            await app._async_middleware_error_handler.handle(error=error, request=req,
                                                             response=resp)
            return resp
        # the listeners always ack; one that did not would have made bolt answer this
        return ack.response or BoltResponse(
            status=404, body={"error": "no next() calls in middleware"})
