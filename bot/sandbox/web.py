"""The sandbox page: the emulated workspace drawn as Slack would, and the routes behind it.

``GET /`` is the page; ``GET /ui/state`` draws what one user sees (a channel or their App
Home, an open thread, their top modal) as HTML fragments; ``GET /ui/events`` is a
server-sent event stream that says when anything changed, so the page redraws live.
The POST routes act as that user: a button press or a modal submission becomes the signed
``block_actions`` / ``view_submission`` payload Slack would send to ``serve`` (the
emulator issues the trigger ids, so the app's ``views.open`` works), opening the App Home
is an ``app_home_opened`` event, and the demo form starts a run.

The page only says *which* button was pressed: the button's value (its approval token) is
read from the message or view the emulator holds, never from the browser. Every POST
checks its user id, its size and its fields, and answers 400 without changing anything
when they are wrong.

Only this page reaches these routes: the emulator's :class:`~bot.sandbox.guard.Guard`
refuses another ``Host`` or ``Origin``, and every ``/ui/`` request must carry the token
this start embedded in the page (a new one each start, so a page from an earlier start
must be reloaded).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import secrets
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from aiohttp import web
from approvald.bot.sandbox import render
from approvald.bot.sandbox.blocks import find_element
from approvald.bot.sandbox.client import SlackClientSim
from approvald.bot.sandbox.inputs import BadInput, surface_state
from approvald.bot.sandbox.page import page_html
from approvald.bot.sandbox.review import ReviewProxy
from approvald.bot.sandbox.server import SlackEmulator
from approvald.bot.sandbox.state import JSON
from approvald.runtime import ApprovaldError

if TYPE_CHECKING:
    from approvald.bot.sandbox.mailbox import Mailbox
    from approvald.bot.sandbox.people import Person
    from approvald.runtime import Engine

MAX_BODY = 64 * 1024  # a click or a modal's few fields; Slack's own inputs stay far below
HEARTBEAT = 15.0  # seconds between SSE comments, so proxies and browsers keep the stream
_USER = re.compile(r"U_[A-Z0-9_]{1,30}|U[A-Z0-9]{2,30}")
_TS = re.compile(r"\d{1,12}\.\d{6}")
_ID = re.compile(r"[A-Za-z0-9_.:-]{1,255}")
_ORDER = re.compile(r"[A-Z]{1,3}-\d{1,8}")
_AMOUNT = re.compile(r"\d{1,7}(\.\d{1,2})?")
AGENTS = ("demo-refund", "demo-steps")
MAX_TRIGGERS = 1000  # trigger ids remembered with the page they came from
_PAGE = re.compile(r"[A-Za-z0-9_-]{1,64}")


def _page(value: Any) -> str:
    """A page's id as it sent it; "" for none (or one that is not an id)."""
    return value if isinstance(value, str) and _PAGE.fullmatch(value) else ""


class SandboxWeb:
    """Routes of the page over one emulator; :meth:`attach` connects it to ``serve``."""

    def __init__(self, emulator: SlackEmulator, *, people: Sequence[Person],
                 channel: str) -> None:
        self.emulator = emulator
        self.state = emulator.state
        self.people = list(people)
        self.channel = channel
        self.engine: Engine | None = None
        self.slack: SlackClientSim | None = None
        self.version = 0
        self._changed = asyncio.Event()
        self._closing = False
        # (user, page) -> open modal view ids, top last: in Slack a modal belongs to the
        # client it was opened in; another page of the same person (a reload, a second
        # browser) does not show it. A page names itself by a random id per load.
        self.modals: dict[tuple[str, str], list[str]] = {}
        self._opened_from: dict[str, str] = {}  # trigger id -> the page that pressed
        self._last_page: dict[str, str] = {}  # user -> the page that acted last
        self.errors: dict[str, dict[str, str]] = {}  # view id -> block id -> inline error
        self.values: dict[str, dict[str, dict[str, str]]] = {}  # view id -> what was typed
        self.token = secrets.token_urlsafe(32)
        emulator.guard.page_token = self.token
        # the web review queue of serve, on this page's origin, and the mails it sends
        self.review = ReviewProxy()
        self.mailbox: Mailbox | None = None
        self.emails: dict[str, str] = {}  # user -> the address mails reach them at

    def app(self) -> web.Application:
        app = web.Application(client_max_size=2 * 1024 * 1024)  # the Web API shares it
        app.router.add_get("/", self.page)
        app.router.add_get("/ui/state", self.ui_state)
        app.router.add_get("/ui/events", self.events)
        app.router.add_post("/ui/action", self.post(self.action))
        app.router.add_post("/ui/submit", self.post(self.submit))
        app.router.add_post("/ui/close", self.post(self.close_modal))
        app.router.add_post("/ui/home", self.post(self.open_home))
        app.router.add_post("/ui/command", self.post(self.command))
        app.router.add_post("/ui/runs", self.post(self.start_run))
        self.review.add_to(app)
        app.on_shutdown.append(self._shutdown)
        return app

    def attach(self, engine: Engine, events_url: str) -> None:
        """Act towards ``serve``, whose Slack endpoint is ``events_url``; and tell the
        page, which may have loaded (and drawn "not ready") while the sandbox started."""
        self.engine = engine
        self.slack = self.emulator.client(events_url)
        self.changed()

    def attach_review(self, target: str, public_url: str, mailbox: Mailbox,
                      emails: dict[str, str]) -> None:
        """Serve the review queue of serve's listener at ``target`` under ``/review``, and
        show each person the mails ``mailbox`` keeps for their address in ``emails``."""
        self.review.attach(target, public_url)
        self.mailbox = mailbox
        self.emails = emails
        self.changed()

    async def close(self) -> None:
        self._closing = True
        self._changed.set()
        await self.review.close()
        if self.slack is not None:
            await self.slack.close()

    async def _shutdown(self, _app: web.Application) -> None:
        self._closing = True
        self._changed.set()  # ends every event stream, so the server can stop

    # -- change notification ------------------------------------------------------------

    def changed(self, method: str = "", params: dict[str, Any] | None = None,
                body: JSON | None = None) -> None:
        """The workspace changed (an emulator listener): track modals, wake the page."""
        if method == "views.open" and body is not None:
            view_id = str((body.get("view") or {}).get("id", ""))
            owner = self.state.view_users.get(view_id)
            trigger = str((params or {}).get("trigger_id") or "")
            page = self._opened_from.pop(trigger, None)
            if owner:
                page = page if page is not None else self._last_page.get(owner, "")
                self.modals.setdefault((owner, page), []).append(view_id)
        self.version += 1
        self._changed.set()
        self._changed = asyncio.Event()

    async def events(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                               "Cache-Control": "no-cache"})
        await response.prepare(request)
        sent = -1
        with contextlib.suppress(ConnectionError, asyncio.CancelledError):
            while not self._closing:
                if sent != self.version:
                    sent = self.version
                    await response.write(f"data: {sent}\n\n".encode())
                    continue
                waiting = self._changed
                try:
                    await asyncio.wait_for(waiting.wait(), HEARTBEAT)
                except TimeoutError:
                    await response.write(b": still here\n\n")
        return response

    # -- drawing ------------------------------------------------------------------------

    async def page(self, _request: web.Request) -> web.StreamResponse:
        # the page holds this start's token: never cached, never framed by another site
        return web.Response(text=page_html(self.token), content_type="text/html", headers={
            "Cache-Control": "no-store", "X-Frame-Options": "DENY",
            "Content-Security-Policy": "frame-ancestors 'none'",
            "Referrer-Policy": "same-origin"})

    def names(self) -> render.Names:
        return render.Names(
            users={u.id: u.real_name for u in self.state.users.values()},
            groups={g.id: g.handle for g in self.state.usergroups.values()},
            channels={c.id: c.name for c in self.state.channels.values()},
            workspace_url=self.state.workspace.url)

    def author(self, m: JSON) -> str:
        if m.get("bot_id") or not m.get("user"):  # response_url replies carry no user
            return f"{self.state.workspace.bot_name} (app)"
        user = self.state.users.get(str(m.get("user", "")))
        return user.real_name if user else str(m.get("user", "someone"))

    async def ui_state(self, request: web.Request) -> web.StreamResponse:
        try:
            user = self._user(request.query.get("user"))
        except BadInput as exc:
            return web.json_response({"ok": False, "error": str(exc)}, status=400)
        names = self.names()
        pane = request.query.get("pane") or self.channel
        thread = request.query.get("thread") or ""
        channels = [{"id": c.id, "name": c.name} for c in self.state.channels.values()
                    if not c.id.startswith("D_")]
        if pane == "home":
            main, title = self._home(user, names), "Home"
        elif pane == "mail":
            address = self.emails.get(user)
            main = (self.mailbox.html(address, origin=self.review.origin or "")
                    if self.mailbox is not None else
                    '<div class="empty">This sandbox sends no mail.</div>')
            title = f"Mail to {address}" if address else "Mail"
        elif pane in self.state.channels and not pane.startswith("D_"):
            main, title = self._channel(pane, user, names), "#" + self.state.channels[pane].name
        else:
            return web.json_response({"ok": False, "error": "no such channel"}, status=400)
        thread_html = (self._thread(pane, thread, user, names)
                       if thread and _TS.fullmatch(thread) and pane in self.state.channels else "")
        modal_html, modal_key = self._modal(user, _page(request.query.get("client")), names)
        people = [{"id": p.id, "name": p.real_name, "role": p.role} for p in self.people]
        return web.json_response({
            "ok": True, "version": self.version, "title": title, "main": main,
            "thread": thread_html, "modal": modal_html, "modal_key": modal_key,
            "channels": channels, "people": people, "ready": self.engine is not None})

    def _channel(self, channel_id: str, user: str, names: render.Names) -> str:
        channel = self.state.channels[channel_id]
        top = [(m, False) for m in channel.messages
               if m.get("thread_ts") in (None, m["ts"]) or m.get("subtype") == "thread_broadcast"]
        mine = [(m, True) for m in self.state.ephemerals.get((channel_id, user), [])
                if not m.get("thread_ts")]
        shown = sorted(top + mine, key=lambda pair: float(pair[0]["ts"]))
        if not shown:
            return '<div class="empty">Nothing here yet.</div>'
        return "".join(render.message(m, names, author=self.author(m), ephemeral=eph)
                       for m, eph in shown)

    def _thread(self, channel_id: str, ts: str, user: str, names: render.Names) -> str:
        channel = self.state.channels[channel_id]
        messages = [(m, False) for m in self.state.thread(channel, ts)]
        if not messages:
            return ""
        root = messages[0][0]["ts"]
        messages += [(m, True) for m in self.state.ephemerals.get((channel_id, user), [])
                     if m.get("thread_ts") == root]
        messages.sort(key=lambda pair: float(pair[0]["ts"]))
        return "".join(render.message(m, names, author=self.author(m), ephemeral=eph,
                                      show_replies=False) for m, eph in messages)

    def _home(self, user: str, names: render.Names) -> str:
        view_id = self.state.home_views.get(user)
        view = self.state.views.get(view_id) if view_id else None
        home = (render.view(view, names) if view is not None else
                '<div class="empty">The app has not published a Home tab for you yet.</div>')
        dm = self.state.dm(user) if user in self.state.users else None
        messages = "".join(render.message(m, names, author=self.author(m))
                           for m in (dm.messages if dm else []))
        dm_attr = f' data-channel="{render.esc(dm.id)}"' if dm else ""
        return (f'<section class="home-tab">{home}</section><h4>Messages</h4>'
                f'<section class="dm"{dm_attr}>{messages or "<div class=empty>No messages.</div>"}'
                "</section>")

    def _modal(self, user: str, page: str, names: render.Names) -> tuple[str, str]:
        stack = self.modals.get((user, page)) or []
        while stack and stack[-1] not in self.state.views:
            stack.pop()
        if not stack:
            return "", ""
        view_id = stack[-1]
        view = self.state.views[view_id]
        errors = self.errors.get(view_id, {})
        key = f"{view_id}:{view.get('hash')}:{json.dumps(errors, sort_keys=True)}"
        return render.view(view, names, errors=errors, values=self.values.get(view_id)), key

    # -- acting -------------------------------------------------------------------------

    def post(self, handler: Callable[[JSON], Awaitable[JSON]]
             ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def route(request: web.Request) -> web.StreamResponse:
            if request.content_length is not None and request.content_length > MAX_BODY:
                return web.json_response({"ok": False, "error": "request too large"},
                                         status=413)
            raw = await request.content.read(MAX_BODY + 1)
            if len(raw) > MAX_BODY:
                return web.json_response({"ok": False, "error": "request too large"},
                                         status=413)
            try:
                data = json.loads(raw or b"{}")
                if not isinstance(data, dict):
                    raise BadInput("the body must be a JSON object")
                if self.slack is None or self.engine is None:
                    return web.json_response({"ok": False, "error": "still starting"},
                                             status=503)
                result: JSON = await handler(data)
            except (BadInput, ValueError) as exc:
                return web.json_response({"ok": False, "error": str(exc)}, status=400)
            except ApprovaldError as exc:
                return web.json_response({"ok": False, "error": str(exc)}, status=400)
            return web.json_response({"ok": True, **result})
        return route

    def _page(self, data: JSON, user: str) -> str:
        """The page acting (its ``client`` id), remembered as ``user``'s latest."""
        page = self._last_page[user] = _page(data.get("client"))
        return page

    def _trigger(self, user: str, page: str) -> str:
        """A trigger id for an interaction from ``page``: a modal it opens is that page's."""
        trigger = self.emulator.issue_trigger_id(user)
        self._opened_from[trigger] = page
        while len(self._opened_from) > MAX_TRIGGERS:  # unused ones expire in seconds
            del self._opened_from[next(iter(self._opened_from))]
        return trigger

    def _user(self, value: Any) -> str:
        if not isinstance(value, str) or not _USER.fullmatch(value):
            raise BadInput("user must be a Slack user id")
        found = self.state.users.get(value)
        if found is None or found.is_bot:
            raise BadInput(f"no user {value} in this workspace")
        return value

    @staticmethod
    def _field(data: JSON, key: str, pattern: re.Pattern[str], *,
               required: bool = True) -> str | None:
        value = data.get(key)
        if value is None and not required:
            return None
        if not isinstance(value, str) or not pattern.fullmatch(value):
            raise BadInput(f"{key} is missing or malformed")
        return value

    async def action(self, data: JSON) -> JSON:
        assert self.slack is not None
        user = self._user(data.get("user"))
        trigger = self._trigger(user, self._page(data, user))
        action_id = self._field(data, "action_id", _ID)
        assert action_id is not None
        view_id = self._field(data, "view_id", _ID, required=False)
        if view_id is not None:
            view = self.state.views.get(view_id)
            if view is None or self.state.view_users.get(view_id) != user:
                raise BadInput("no such view for this user")
            _, el = find_element(view.get("blocks"), action_id)
            if el is None or el.get("type") != "button":
                raise BadInput("no such button")
            state = surface_state(view.get("blocks"), data.get("state"))
            response = await self.slack.click(action_id, el.get("value"), user_id=user,
                                              view_id=view_id, trigger_id=trigger,
                                              state=state)
            return {"status": response.status}
        channel_id = self._field(data, "channel", _ID)
        ts = self._field(data, "ts", _TS)
        assert channel_id is not None and ts is not None
        channel = self.state.channels.get(channel_id)
        if channel is None:
            raise BadInput("no such channel")
        message = channel.find(ts)
        ephemeral = None
        if message is None:
            ephemeral = next((m for m in self.state.ephemerals.get((channel_id, user), [])
                              if m["ts"] == ts), None)
        target = message or ephemeral
        if target is None:
            raise BadInput("no such message")
        # the message as this page drew it: a click that raced another one (its card
        # updated meanwhile) is the click on the card the person saw, as in Slack
        seen = channel.version(ts, str(data.get("version") or "")) if message else None
        target = seen or target
        _, el = find_element(target.get("blocks"), action_id)
        if el is None or el.get("type") != "button":
            raise BadInput("no such button")
        state = surface_state(target.get("blocks"), data.get("state"))
        container = {"type": "message", "message_ts": ts, "channel_id": channel_id,
                     "is_ephemeral": ephemeral is not None}
        response = await self.slack.click(action_id, el.get("value"), user_id=user,
                                          channel_id=channel_id, message_ts=ts,
                                          message=target, container=container,
                                          trigger_id=trigger, state=state)
        return {"status": response.status}

    async def submit(self, data: JSON) -> JSON:
        assert self.slack is not None
        user = self._user(data.get("user"))
        page = self._page(data, user)
        view_id = self._field(data, "view_id", _ID)
        assert view_id is not None
        if view_id not in (self.modals.get((user, page)) or []) \
                or view_id not in self.state.views:
            raise BadInput("no such open modal on this page")
        view = self.state.views[view_id]
        values = self._values(view, data.get("values"))
        response = await self.slack.submit_view(str(view.get("callback_id", "")), values,
                                                user_id=user, view_id=view_id)
        answer: Any = {}
        if response.body.strip():
            with contextlib.suppress(json.JSONDecodeError):
                answer = json.loads(response.body)
        if response.status != 200:
            raise BadInput(f"the app answered HTTP {response.status}")
        action = answer.get("response_action") if isinstance(answer, dict) else None
        if action == "errors" and isinstance(answer.get("errors"), dict):
            self.errors[view_id] = {str(k): str(v) for k, v in answer["errors"].items()}
            self.values[view_id] = values
            self.changed()
            return {"closed": False, "errors": self.errors[view_id]}
        if action == "update" and isinstance(answer.get("view"), dict):
            self.state.views[view_id] = {**view, **answer["view"], "id": view_id}
            self._forget(view_id)
            self.changed()
            return {"closed": False}
        if action == "clear":
            for closed in self.modals.pop((user, page), []):
                self._forget(closed)
        else:
            self._drop((user, page), view_id)
        self.changed()
        return {"closed": True}

    def _values(self, view: JSON, given: Any) -> dict[str, dict[str, Any]]:
        """The submitted inputs, checked against the view's own input blocks."""
        inputs = [b for b in view.get("blocks") or []
                  if isinstance(b, dict) and b.get("type") == "input"]
        return surface_state(inputs, given)

    def _drop(self, holder: tuple[str, str], view_id: str) -> None:
        stack = self.modals.get(holder) or []
        if view_id in stack:
            stack.remove(view_id)
        self._forget(view_id)

    def _forget(self, view_id: str) -> None:
        self.errors.pop(view_id, None)
        self.values.pop(view_id, None)

    async def close_modal(self, data: JSON) -> JSON:
        user = self._user(data.get("user"))
        holder = (user, self._page(data, user))
        view_id = self._field(data, "view_id", _ID)
        assert view_id is not None
        if view_id not in (self.modals.get(holder) or []):
            raise BadInput("no such open modal on this page")
        self._drop(holder, view_id)
        self.changed()
        return {"closed": True}

    async def open_home(self, data: JSON) -> JSON:
        assert self.slack is not None
        user = self._user(data.get("user"))
        self._page(data, user)
        dm = self.state.dm(user)
        response = await self.slack.event({"type": "app_home_opened", "user": user,
                                           "channel": dm.id, "tab": "home"})
        return {"status": response.status}

    async def command(self, data: JSON) -> JSON:
        assert self.slack is not None
        user = self._user(data.get("user"))
        self._page(data, user)  # a modal the command opens is this page's
        channel_id = self._field(data, "channel", _ID)
        assert channel_id is not None
        if channel_id not in self.state.channels:
            raise BadInput("no such channel")
        text = data.get("text")
        if not isinstance(text, str) or not text.startswith("/approvals"):
            raise BadInput("the only slash command here is /approvals")
        response = await self.slack.slash("/approvals", text.removeprefix("/approvals").strip(),
                                          user_id=user, channel_id=channel_id)
        return {"status": response.status}

    async def start_run(self, data: JSON) -> JSON:
        assert self.engine is not None
        user = self._user(data.get("user"))
        agent = data.get("agent")
        if agent not in AGENTS:
            raise BadInput(f"agent must be one of {', '.join(AGENTS)}")
        if agent == "demo-refund":
            order = str(data.get("order") or "").strip().upper()
            if not _ORDER.fullmatch(order):
                raise BadInput("order must look like A-1 or B-1042")
            amount = str(data.get("amount") or "").strip().lstrip("$")
            if amount and (not _AMOUNT.fullmatch(amount) or float(amount) <= 0):
                raise BadInput("amount must be a positive number of dollars, like 25 or 12.50")
            task = (f"Refund order {order}" + (f" for ${float(amount):.2f}" if amount else "")
                    + ", customer was double charged")
        else:
            ticks = data.get("ticks")
            if not isinstance(ticks, int | str) or not str(ticks).isdigit() \
                    or not 1 <= int(ticks) <= 100:
                raise BadInput("ticks must be a whole number from 1 to 100")
            task = str(int(ticks))
        run_id = await self.engine.start_run(str(agent), task, requested_by=user)
        self.engine.notify_ready(run_id)
        return {"run_id": run_id, "task": task, "channel": self.channel}
