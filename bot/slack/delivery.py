"""Outbox rows -> Slack calls: post cards, update them, remind, notify.

Every call is about something the database already holds. A card is posted once: its
channel and ts are stored on the approval, and a retry after an unknown outcome (the post
may have landed before the process died) first looks for the card by its message
metadata, so Slack being slow, down or rate-limiting never produces a second card.

:func:`classify` tells the drain how to treat a failure: a rate limit is a wait (Slack said
when to come back), a 5xx, the network or a refused token is a failure to back off from
(retried until the row's deadline: the token may be fixed meanwhile), and an error no
retry can fix makes the row dead at once. A dead row is reported to ops (in the run's
thread when it has one) by a ``delivery.dead`` row, delivered here like any other.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import aiohttp
from approvald.bot.metrics import slack_method
from approvald.bot.slack import cards, messages, private_slack_sdk, texts
from approvald.bot.slack.log_delivery import SLACK_KINDS
from approvald.bot.slack.mrkdwn import clause, clip, code_span, safe_cut, slack_date
from approvald.bot.slack.private_slack_sdk import JsonCalls
from approvald.runtime import (
    CARD_POST,
    CARD_UPDATE,
    DEAD_REPORT,
    HEAD_POST,
    NOTICE,
    REMINDER,
    RUN_WAITING,
    ApprovalPolicy,
    CardView,
    Engine,
    Masking,
    Place,
    RetryLater,
    Undeliverable,
)
from approvald.store.records import ApprovalRecord, OutboxRecord
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient
from slack_sdk.web.async_slack_response import AsyncSlackResponse

log = logging.getLogger("approvald.slack")

CARD_EVENT = "approvald_card"
CARD_KINDS = frozenset({CARD_POST, CARD_UPDATE})  # rows that draw a request's card
_UNREAD: Any = object()  # no view was read ahead for a row
PERMALINKS_KEPT = 4096  # cached message permalinks (one chat.getPermalink each, else)
THREAD_WAIT = 0.5  # seconds a run's line waits, at a time, for its thread to tell what came first
DEAD_REPORT_MAX = 3000  # characters of a dead-delivery report (the error is clipped first)
# errors that retrying cannot fix: park the row (it stays visible as dead)
PERMANENT = {"channel_not_found", "not_in_channel", "is_archived", "msg_too_long",
             "invalid_blocks", "invalid_blocks_format", "no_text", "too_many_attachments",
             "restricted_action", "cant_update_message", "edit_window_closed"}
# the token is wrong or revoked: a failure (not a wait) until someone fixes SLACK_BOT_TOKEN
TRANSIENT_AUTH = {"invalid_auth", "not_authed", "account_inactive", "token_revoked",
                  "token_expired"}


def _retry_after(resp: Any) -> float:
    """Slack's ``Retry-After`` in seconds (1 when it is missing or unreadable)."""
    try:
        value = float(resp.headers.get("Retry-After") or 1.0)
    except (AttributeError, TypeError, ValueError):
        return 1.0
    return value if value > 0 else 1.0


def slack_error(exc: SlackApiError) -> str | None:
    """Slack's error code (``channel_not_found``...), if the answer had a JSON body (an
    edge's 5xx answers in plain text)."""
    data = getattr(exc.response, "data", None)
    error = data.get("error") if isinstance(data, dict) else None
    return str(error) if error is not None else None


def classify(exc: BaseException) -> Exception:
    """Map a Slack or network failure to RetryLater / Undeliverable for the drain.

    Only a rate limit carries ``after`` (a wait); everything transient is a failure the
    drain backs off from, and nothing but the row's deadline makes it give up.
    """
    if isinstance(exc, SlackApiError):
        resp = exc.response
        status = getattr(resp, "status_code", 0) or 0
        error = slack_error(exc)
        if status == 429 or error == "ratelimited":
            return RetryLater("Slack rate limit", after=_retry_after(resp))
        if status >= 500:
            return RetryLater(f"Slack answered HTTP {status}")
        if error in TRANSIENT_AUTH:
            return RetryLater(f"Slack refused the token ({error}); fix SLACK_BOT_TOKEN")
        if error in PERMANENT:
            return Undeliverable(f"Slack said {error}")
        return RetryLater(f"Slack said {error}")
    if isinstance(exc, aiohttp.ClientError | asyncio.TimeoutError | ConnectionError):
        return RetryLater(f"Slack unreachable: {type(exc).__name__}: {exc}")
    return RetryLater(f"{type(exc).__name__}: {exc}")


class SlackDeliverer:
    """The Slack face's outbox rows (:data:`SLACK_KINDS`) -> Slack Web API calls."""

    kinds = SLACK_KINDS

    def __init__(self, engine: Engine, client: AsyncWebClient, *, channel: str,
                 ops_channel: str, audit_channel: str | None = None,
                 fast_path: bool = True) -> None:
        self.e = engine
        self.client = client
        # a card's call with its request built once (private_slack_sdk), else api_call's
        self._json_calls = json_calls(client) if fast_path else None
        self.channel = channel
        self.ops_channel = ops_channel
        self.audit_channel = audit_channel
        # a message's permalink never changes; the cache is bounded (serve runs for months)
        self._permalinks: OrderedDict[tuple[str, str], str] = OrderedDict()
        # the card views :meth:`prepare` read for the rows of the batch being delivered
        self._ready: dict[int, CardView | None] = {}

    async def prepare(self, rows: Sequence[OutboxRecord]) -> None:
        """Read the card views a batch of rows about to be delivered will draw, in one
        read (issue 50: one read a card was most of a card's store work); :meth:`deliver`
        takes each row's view from here, or reads it itself when none was read for it (a
        failed read here fails nothing: each row then reads its own)."""
        self._ready = {}
        try:
            wanted = {row.id: str(row.payload_value()["approval_id"]) for row in rows
                      if row.kind in CARD_KINDS}
            if not wanted:
                return
            views = await self.e.views.cards(list(wanted.values()))
        except Exception:
            log.warning("reading a batch's card views failed; each card reads its own",
                        exc_info=True)
            return
        self._ready = {row_id: views[approval_id] for row_id, approval_id in wanted.items()}

    async def deliver(self, row: OutboxRecord) -> dict[str, Any] | None:
        if row.kind in CARD_KINDS:
            return await self._card(row)
        payload = row.payload_value()
        try:
            if row.kind == NOTICE:
                return await self._notice(payload)
            if row.kind == HEAD_POST:
                return await self._audit_head(payload)
            if row.kind == RUN_WAITING:
                return await self._run_waiting(payload)
            if row.kind == DEAD_REPORT:
                return await self._dead_report(payload)
            if row.kind == REMINDER:
                a = await self.e.views.approval(payload["approval_id"])
                if a is None:
                    raise Undeliverable(f"approval {payload['approval_id']} does not exist")
                return await self._remind(a)
        except (RetryLater, Undeliverable):
            raise
        except Exception as exc:
            raise self._failure(exc) from exc
        raise Undeliverable(f"unknown outbox kind {row.kind!r}")

    async def _card(self, row: OutboxRecord) -> dict[str, Any]:
        """A card's post or update, from the view :meth:`prepare` read for its row (or
        one read now): the request and what its card shows."""
        try:
            view = self._ready.pop(row.id, _UNREAD)
            if view is _UNREAD:
                view = await self.e.views.card(str(row.payload_value()["approval_id"]))
            if view is None:
                raise Undeliverable(
                    f"approval {row.payload_value()['approval_id']} does not exist")
            if row.kind == CARD_POST:
                return await self._post(row, view)
            return await self._update(row, view)
        except (RetryLater, Undeliverable):
            raise
        except Exception as exc:
            raise self._failure(exc) from exc

    def _failure(self, exc: Exception) -> Exception:
        """What the drain is told of a failed delivery (Slack's errors counted)."""
        if isinstance(exc, SlackApiError):
            self.e.note_face_error("slack", *slack_method(exc))
        return classify(exc)

    # -- cards -----------------------------------------------------------------------
    async def render(self, a: ApprovalRecord) -> dict[str, Any]:
        """The card for ``a`` as it stands in the database now (its view: one read)."""
        view = await self.e.views.card(a.id)
        if view is None:
            raise Undeliverable(f"approval {a.id} does not exist")
        return await self.draw(view)

    async def draw(self, view: CardView) -> dict[str, Any]:
        """The card a view shows, with the links Slack gives (permalinks, cached)."""
        a = view.approval
        thread_url = await self._permalink(*view.thread) if view.thread else None
        superseded_by = None
        newer, older = view.newer, view.older
        if newer is not None:
            superseded_by = (await self._permalink(newer.channel, newer.message_ts)
                             if newer.channel and newer.message_ts else None) or newer.id
        supersedes_url = None
        if older is not None and older.channel and older.message_ts:
            supersedes_url = await self._permalink(older.channel, older.message_ts)
        return cards.approval_card(a, token=view.token, now=view.now, votes=list(view.votes),
                                   thread_url=thread_url, superseded_by=superseded_by,
                                   supersedes_url=supersedes_url,
                                   standing=list(view.standing))

    def channel_for(self, a: ApprovalRecord) -> str:
        policy = ApprovalPolicy.from_snapshot(a.policy)
        return policy.channel or self.channel

    async def _post(self, row: OutboxRecord, view: CardView) -> dict[str, Any]:
        a = view.approval
        if a.channel and a.message_ts:  # posted before; only the bookkeeping was lost
            return {"channel": a.channel, "ts": a.message_ts, "reused": True}
        channel = self.channel_for(a)
        if row.attempts > 0:  # an earlier attempt was claimed: it may have posted
            found = await self._find_posted(channel, row)
            if found is not None:
                await self._remember(a, channel, found)
                return {"channel": channel, "ts": found, "reused": True}
        card = await self.draw(view)
        resp = await self._card_post(
            channel=channel, text=card["text"], blocks=card["blocks"], unfurl_links=False,
            unfurl_media=False,
            metadata={"event_type": CARD_EVENT,
                      "event_payload": {"approval_id": a.id, "outbox_id": row.id}})
        ts = str(resp["ts"])
        channel = str(resp.get("channel") or channel)
        await self._remember(a, channel, ts)
        return {"channel": channel, "ts": ts}

    async def _find_posted(self, channel: str, row: OutboxRecord) -> str | None:
        """The ts of a card an earlier attempt of ``row`` posted, if it did."""
        oldest = (row.created_at - timedelta(minutes=1)).timestamp()
        resp = await self.client.conversations_history(
            channel=channel, oldest=f"{oldest:.6f}", include_all_metadata=True, limit=200)
        for m in resp.get("messages") or []:
            meta = m.get("metadata") or {}
            if meta.get("event_type") == CARD_EVENT and \
                    (meta.get("event_payload") or {}).get("outbox_id") == row.id:
                return str(m["ts"])
        return None

    async def _remember(self, a: ApprovalRecord, channel: str, ts: str) -> None:
        await self.e.card_posted(a.id, channel=channel, ts=ts)

    async def _update(self, row: OutboxRecord, view: CardView) -> dict[str, Any]:
        a = view.approval
        if not (a.channel and a.message_ts):
            log.warning("approval %s has no card to update (its post failed); skipping", a.id)
            return {"skipped": "no card"}
        card = await self.draw(view)
        try:
            await self._card_update(channel=a.channel, ts=a.message_ts, text=card["text"],
                                    blocks=card["blocks"])
        except SlackApiError as exc:
            if slack_error(exc) == "message_not_found":
                # someone deleted the card: post it again so the decision is visible
                resp = await self._card_post(
                    channel=a.channel, text=card["text"], blocks=card["blocks"],
                    metadata={"event_type": CARD_EVENT,
                              "event_payload": {"approval_id": a.id, "outbox_id": row.id}})
                await self._remember(a, a.channel, str(resp["ts"]))
                return {"channel": a.channel, "ts": str(resp["ts"]), "reposted": True}
            raise
        return {"channel": a.channel, "ts": a.message_ts}

    # A drawn card goes out as the JSON body slack_sdk's chat_postMessage / chat_update
    # send (the same keys in the same order: the arguments are given in theirs), by its
    # api_call. The card is Block Kit JSON already, checked by slack_sdk's block models as
    # it was drawn (cards.py); those methods' own preparation turns model objects into
    # dicts (six isinstance checks against abstract classes per block, ~150 calls a card),
    # drops arguments left None and warns when text is missing: a drawn card has none of
    # those. tests/unit/test_click_cpu.py compares the bodies.
    # The request itself is built once, not per card, where slack_sdk's internals allow
    # (private_slack_sdk.JsonCalls: the same bytes, the same retries and errors).
    async def _card_post(self, **args: Any) -> AsyncSlackResponse:
        if self._json_calls is not None:
            return await self._json_calls.call("chat.postMessage", args)
        return await self.client.api_call("chat.postMessage", json=args)

    async def _card_update(self, **args: Any) -> AsyncSlackResponse:
        if self._json_calls is not None:
            return await self._json_calls.call("chat.update", args)
        return await self.client.api_call("chat.update", json=args)

    async def _remind(self, a: ApprovalRecord) -> dict[str, Any]:
        if a.status != "pending" or not (a.channel and a.message_ts):
            return {"skipped": a.status}
        url = await self._permalink(a.channel, a.message_ts)
        resp = await self.client.chat_postMessage(
            channel=a.channel, thread_ts=a.message_ts,
            text=messages.reminder_text(a, now=self.e.now(), card_url=url))
        return {"channel": a.channel, "ts": str(resp["ts"])}

    async def _notice(self, payload: dict[str, Any]) -> dict[str, Any]:
        run_id = str(payload["run_id"])
        view = await self.e.views.notice(run_id, str(payload["call_id"]), payload.get("seq"),
                                         args=payload.get("args"), has_args="args" in payload)
        if view is None:
            # an agent's run has a thread, which tells the call (from its audit entry,
            # "ran without asking": notify-after) with its result one click away: a
            # notice there said it a second time
            return {"skipped": "told in the run's thread"}
        channel, thread_ts = self._at(run_id, view.place)
        rec = view.execution
        if rec is None:
            raise Undeliverable("the notice's execution record is gone")
        args = view.args
        shown = Masking.of_call(view.sensitive, args)
        text = messages.notice_text(rec.tool, shown.args(args), shown.data(
            rec.result_value() if rec.status == "succeeded" else {"error": rec.error}))
        resp = await self.client.chat_postMessage(channel=channel, thread_ts=thread_ts, text=text)
        return {"channel": channel, "ts": str(resp["ts"])}

    def _at(self, run_id: str, place: Place) -> tuple[str, str | None]:
        """Where a line about run ``run_id`` goes: ``(channel, thread_ts)`` (see
        :func:`runtime.threads.place`: its thread, the ops channel, or not yet)."""
        if place.wait:
            raise _told_first(run_id)
        if place.channel is None:
            return self.ops_channel, None
        return place.channel, place.ts

    async def _run_waiting(self, payload: dict[str, Any]) -> dict[str, Any]:
        """A run started waiting: say why and until when, in its thread (or the ops channel)."""
        run_id = str(payload["run_id"])
        channel, thread_ts = self._at(run_id, await self.e.views.line_place(
            run_id, payload.get("seq")))
        until = datetime.fromisoformat(str(payload["until"]))
        text = texts.RUN_WAITING.format(date=slack_date(until, texts.DATE_AT),
                                        reason=clause(clip(str(payload.get("reason") or ""),
                                                           500)))
        resp = await self.client.chat_postMessage(channel=channel, thread_ts=thread_ts,
                                                  text=text, unfurl_links=False)
        return {"channel": channel, "ts": str(resp["ts"])}

    async def _audit_head(self, payload: dict[str, Any]) -> dict[str, Any]:
        if not self.audit_channel:
            raise Undeliverable("APPROVALD_AUDIT_CHANNEL is not set")
        head = f"{int(payload['seq'])}:{payload['hash']}"
        when = datetime.fromisoformat(str(payload["at"]))
        resp = await self.client.chat_postMessage(
            channel=self.audit_channel, unfurl_links=False,
            text=texts.AUDIT_HEAD.format(head=head, date=slack_date(when, texts.DATE_AT)))
        return {"channel": self.audit_channel, "ts": str(resp["ts"])}

    async def _dead_report(self, payload: dict[str, Any]) -> dict[str, Any]:
        """Tell ops that a row was given up: in its run's thread when the run has one."""
        approval_id, run_id = payload.get("approval_id"), payload.get("run_id")
        call_id = payload.get("call_id")
        dead = await self.e.views.dead(
            approval_id=str(approval_id) if approval_id else None,
            run_id=str(run_id) if run_id else None, call_id=str(call_id) if call_id else None)
        a, thread, rec = dead.approval, dead.thread, dead.execution
        tool = a.tool if a is not None else rec.tool if rec is not None else None
        text = dead_report_text(payload, tool=tool,
                                open_request=a is not None and a.status == "pending"
                                and a.expires_at > self.e.now())
        channel, thread_ts = self.ops_channel, None
        if thread is not None and thread.ts:  # a thread still being started has no ts yet
            channel, thread_ts = thread.channel, thread.ts
        resp = await self.client.chat_postMessage(channel=channel, thread_ts=thread_ts,
                                                  text=text, unfurl_links=False)
        return {"channel": channel, "ts": str(resp["ts"])}

    async def _permalink(self, channel: str | None, ts: str | None) -> str | None:
        if not channel or not ts:
            return None
        key = (channel, ts)
        link = self._permalinks.get(key)
        if link is not None:
            self._permalinks.move_to_end(key)
            return link
        try:
            resp = await self.client.chat_getPermalink(channel=channel, message_ts=ts)
        except Exception:  # a link is a nicety; never block delivery on it
            return None
        link = self._permalinks[key] = str(resp["permalink"])
        while len(self._permalinks) > PERMALINKS_KEPT:
            self._permalinks.popitem(last=False)
        return link


def json_calls(client: AsyncWebClient) -> JsonCalls | None:
    """The card calls' sender built once (None, with a warning, where the installed
    slack_sdk lacks a name it relies on: api_call then sends every card)."""
    gone = private_slack_sdk.missing()
    if gone:
        log.warning("%s lacks %s: card calls go through api_call (set "
                    "APPROVALD_SLACK_FAST_PATH=0 to silence this)",
                    private_slack_sdk.dependency(), ", ".join(gone))
        return None
    return JsonCalls(client)


def _told_first(run_id: str) -> RetryLater:
    return RetryLater(f"run {run_id}: its thread tells what came before this line first",
                      after=THREAD_WAIT)


DEAD_WHAT = {CARD_POST: texts.DEAD_CARD_POST, CARD_UPDATE: texts.DEAD_CARD_UPDATE,
             REMINDER: texts.DEAD_REMINDER, NOTICE: texts.DEAD_NOTICE,
             HEAD_POST: texts.DEAD_AUDIT_HEAD}


def dead_report_text(payload: dict[str, Any], *, tool: str | None = None,
                     open_request: bool = False) -> str:
    """What ops reads when a delivery was given up: what is missing, why, and the command
    that re-drives it (``open_request``: the card was never posted and the request is
    still pending, so it can be decided from a terminal meanwhile). The error is Slack's
    or an exception's text: shown escaped, never as markup."""
    kind = str(payload.get("kind"))
    approval = str(payload.get("approval_id") or "?")
    what = DEAD_WHAT.get(kind, texts.DEAD_OTHER).format(
        tool=code_span(tool or "?", 80), kind=code_span(kind, 40),
        approval=code_span(approval, 40))
    text = texts.DEAD_DELIVERY.format(
        what=what, error=clip(str(payload.get("error") or "?"), 500),
        attempts=int(payload.get("attempts") or 0), waits=int(payload.get("waits") or 0),
        retry=texts.DEAD_RETRY.format(id=int(payload["outbox_id"])))
    if open_request and kind == CARD_POST:
        text += texts.DEAD_DECIDE_HERE.format(approval=code_span(approval, 40))
    return safe_cut(text, DEAD_REPORT_MAX)
