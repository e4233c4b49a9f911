"""Issue 50: the click path's Python, cut with no change in what it produces.

The card's text fitting (``mrkdwn._fit``, ``units``) takes a whole-string path for text
that is shown as itself; these check it against the per-character walk it replaced, on
text chosen to hit each special case (escapes, bidi controls, surrogates, controls,
backtick runs, astral characters, combining marks at the cut).
"""

from __future__ import annotations

import contextlib
import json
import random
import sys
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from approvald.bot.slack import mrkdwn
from approvald.bot.slack.mrkdwn import _fit, _joins, _piece, units


def reference_units(text: str) -> int:
    return len(text) + sum(1 for ch in text if ord(ch) > 0xFFFF)


def reference_fit(text: str, start: int, budget: int, code: bool) -> tuple[str, int]:
    """``_fit`` as it was: one character at a time."""
    out: list[str] = []
    used, i, n = 0, start, len(text)
    while i < n:
        piece = _piece(text, i, code)
        size = reference_units(piece)
        if used + size > budget:
            break
        out.append(piece)
        used += size
        i += 1
    end = i
    if i < n:
        while end > start and i - end < 32 and _joins(text, end):
            end -= 1
        if end == start or _joins(text, end):
            end = i
        out = out[:end - start]
    return "".join(out), end


ALPHABET = [*"abc xyz\n\t{}\":,", "&", "<", ">", "`", "\u202e", "\u2067", "\ud800",
            "\x00", "\x1f", "\x7f", "é", "\u0301", "\u200d", "\ufe0f", "😀", "\U0001f3fd",
            "\U000e0041", "中", "\u2028"]


def test_fit_and_units_match_the_per_character_walk() -> None:
    rnd = random.Random(50)
    for _ in range(4000):
        plain_only = rnd.random() < 0.5
        pool = [*ALPHABET[:15], "é", "\u0301", "\u200d", "中"] if plain_only else ALPHABET
        text = "".join(rnd.choice(pool) for _ in range(rnd.randint(0, 60)))
        assert units(text) == reference_units(text), text
        for _ in range(3):
            start = rnd.randint(0, len(text))
            budget = rnd.randint(-2, 70)
            code = rnd.random() < 0.5
            assert _fit(text, start, budget, code) == reference_fit(text, start, budget, code), (
                text, start, budget, code)


def test_the_whole_string_path_is_taken_only_for_text_shown_as_itself() -> None:
    # each of these is shown differently from itself or is two units wide
    for ch in ("&", "<", ">", "``", "\u202e", "\ud800", "\x01", "😀"):
        assert mrkdwn._NOT_ITSELF.search("plain " + ch) is not None, repr(ch)
    for text in ("plain text, é 中 \u0301\n\t{\"a\": 1}", "a`b", "\x7f"):
        assert mrkdwn._NOT_ITSELF.search(text) is None or "`" in text
    # a combining mark at the cut is still not split from its letter
    assert _fit("abcde\u0301f", 0, 5, code=False) == ("abcd", 4)


def test_block_dict_is_to_dict_and_raises_where_it_did() -> None:
    from approvald.bot.slack.mrkdwn import block_dict, context, header, md, plain, section
    from slack_sdk.errors import SlackObjectFormationError
    from slack_sdk.models.blocks import (
        ActionsBlock,
        ButtonElement,
        ContextBlock,
        DividerBlock,
        HeaderBlock,
        ImageElement,
        MarkdownTextObject,
        SectionBlock,
    )
    same = [
        section("hello *there*"), section("x", block_id="b1"), section("é" * 3000),
        header("A header"), header("h" * 150), context(["a", "b `c`"]),
        context([str(i) for i in range(10)]),
        SectionBlock(text=md("with a button"), accessory=ButtonElement(text="Go", action_id="a")),
        SectionBlock(fields=[md("f1"), md("f2")]),
        SectionBlock(text=MarkdownTextObject(text="not verbatim")),
        SectionBlock(text=plain("plain section")),
        HeaderBlock(text=plain("h"), block_id="h1"),
        ContextBlock(elements=[ImageElement(image_url="https://x/y.png", alt_text="y"),
                               md("beside")]),
        ActionsBlock(elements=[ButtonElement(text="Approve", action_id="approve")]),
        DividerBlock(),
    ]
    for b in same:
        assert block_dict(b) == b.to_dict(), b
        assert list(block_dict(b)) == list(b.to_dict())  # the same keys, in the same order
    # out of Slack's bounds: to_dict's validators still raise
    for b in (SectionBlock(text=md("x" * 3001)), HeaderBlock(text=plain("h" * 151)),
              ContextBlock(elements=[md(str(i)) for i in range(11)]),
              SectionBlock(text=md("x"), block_id="b" * 256)):
        with pytest.raises(SlackObjectFormationError):
            b.to_dict()
        with pytest.raises(SlackObjectFormationError):
            block_dict(b)
    # empty text is left to to_dict (which drops the key)
    empty = SectionBlock(text=md(""))
    assert block_dict(empty) == empty.to_dict()
    # and the blocks section(), header() and context() make are not left to to_dict
    for b in same[:7]:
        monkeypatched = type(b).to_dict
        try:
            type(b).to_dict = None  # type: ignore[assignment,method-assign]
            assert block_dict(b)["type"] in ("section", "header", "context")
        finally:
            type(b).to_dict = monkeypatched  # type: ignore[method-assign]


def test_approval_cards_are_the_dicts_to_dict_made(monkeypatch: pytest.MonkeyPatch) -> None:
    from approvald.bot.slack import cards

    from tests.unit.test_cards import (
        NOW,
        TOKEN,
        approval,
        cannot_run,
        decided,
        packet,
        question,
        vote,
    )
    high = packet(risk="high")
    examples = [
        (approval(), TOKEN, []),
        (approval(args={"note": "a <b> & `c` ``d`` \u202e 😀 é\u0301"}), TOKEN, []),
        (approval(edited_args={"order": "1234", "amount": 40}), TOKEN, []),
        (decided("approved", reason="fine"), None, [vote("U0BOB")]),
        (decided("denied", reason="x" * 3000), None, [vote("U0BOB", verdict="deny")]),
        # each shape of buttons: high risk (a confirmation naming the tool), standing
        # approvals offered, no Edit (arguments past the text box), View arguments
        (approval(packet_=high), TOKEN, []),
        (approval(packet_=high, tool="other_tool", id="b" * 32), "t" * 40, []),
        (approval(policy={"approvers": ["U0BOB"], "quorum": 1, "ttl": "30m", "risk": "medium",
                          "on_expire": "cancel", "escalate": [], "max_standing": "0"}),
         TOKEN, []),
        (approval(args={"blob": "y" * 6000}), TOKEN, []),
        (question(), TOKEN, []), (cannot_run(), TOKEN, []),
    ]
    fast = [cards.approval_card(a, token=t, now=NOW, votes=v) for a, t, v in examples]
    fast += [cards.compact_blocks(a, t, now=NOW) for a, t, _ in examples]
    # the same again: the button blocks of a shape already made
    fast += [cards.approval_card(a, token=t, now=NOW, votes=v) for a, t, v in examples]
    monkeypatch.setattr(cards, "block_dict", lambda b: b.to_dict())
    monkeypatch.setattr(cards, "button_block", lambda a, t, view_args: cards.buttons(
        a, t, view_args=view_args).to_dict())
    slow = [cards.approval_card(a, token=t, now=NOW, votes=v) for a, t, v in examples]
    slow += [cards.compact_blocks(a, t, now=NOW) for a, t, _ in examples]
    slow += slow[:len(examples)]
    assert json.dumps(fast) == json.dumps(slow)  # the same keys in the same order too
    assert sum(any(b["type"] == "actions" for b in c["blocks"]) for c in fast[:11]) == 9
    shapes = {cards._shape(a, view_args=False) for a, t, _ in examples if t is not None}
    assert len(shapes) == 7 and {s[2] for s in shapes} == {s[3] for s in shapes} == {
        True, False}


@contextlib.contextmanager
def counting_calls() -> Iterator[Counter[str]]:
    """The Python functions called inside the block, by name, as ``module:function``."""
    seen: Counter[str] = Counter()

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            seen[f"{frame.f_globals.get('__name__')}:{frame.f_code.co_name}"] += 1

    sys.setprofile(profile)
    try:
        yield seen
    finally:
        sys.setprofile(None)


def _calls_during(fn: Any, *args: Any) -> Counter[str]:
    """The Python functions ``fn(*args)`` called, by name, as ``module:function``."""
    with counting_calls() as seen:
        fn(*args)
    return seen


def test_a_click_becomes_bolt_s_request_in_one_pass() -> None:
    """The body is parsed once (not by bolt's urllib loop), the headers normalized once,
    bolt's context built once (bolt's constructor, given an empty body so as not to parse,
    built one of nothing first)."""
    from approvald.bot.slack.transport import parse

    from tests.unit.test_slack_transport import BODIES
    raw, content_type = BODIES["click"]
    headers = {"Content-Type": content_type, "X-Slack-Request-Timestamp": "1700000000",
               "X-Slack-Signature": "v0=" + "0" * 64, "Host": "x", "Accept": "*/*"}
    seen = _calls_during(parse, raw.encode(), content_type, "", headers)
    assert seen["slack_bolt.request.async_internals:build_async_context"] == 1
    assert seen["slack_bolt.request.internals:build_normalized_headers"] == 0
    assert seen["slack_bolt.request.internals:parse_body"] == 0
    assert not any(name.startswith("urllib.parse:") for name in seen), seen


def test_the_slack_loggers_carry_the_level_they_inherit() -> None:
    """slack_sdk and bolt build a debug line when ``logger.level <= DEBUG``: a logger left
    at NOTSET (0) made every Web API call format its whole request and answer for nobody.
    The face's loggers take the level they inherit when it is built; built at DEBUG, the
    face still logs everything."""
    import logging

    from approvald.bot.config import Settings
    from approvald.bot.slack.app import SlackWeb, _bolt_logger, _socket_logger

    settings = Settings(SLACK_BOT_TOKEN="xoxb-test", SLACK_SIGNING_SECRET="s" * 32,
                        APPROVALD_CHANNEL="C1", APPROVALD_SECRET="k" * 32)
    root = logging.getLogger()
    before = root.level
    try:
        for level in (logging.WARNING, logging.DEBUG, logging.ERROR):
            root.setLevel(level)
            web = SlackWeb(settings)
            assert web.client.logger.name == "approvald.slack.web"
            for logger in (web.client.logger, _bolt_logger(), _socket_logger()):
                assert logger.level == level, (logger.name, logger.level)
    finally:
        root.setLevel(before)
        for name in ("approvald.slack.web", "approvald.slack.bolt", "approvald.slack.socket"):
            logging.getLogger(name).setLevel(logging.NOTSET)


async def test_a_card_is_sent_as_chat_update_and_post_send_it_without_their_model_walk(
        ) -> None:
    """The delivery's card calls send the JSON body slack_sdk's chat_update and
    chat_postMessage send, byte for byte, without their walk that turns block models into
    dicts (a drawn card is dicts already)."""
    import json
    from collections.abc import Awaitable, Callable
    from dataclasses import replace

    from approvald.bot.slack import cards
    from approvald.bot.slack.delivery import CARD_EVENT, SlackDeliverer
    from approvald.runtime import CardView
    from approvald.store.records import OutboxRecord
    from slack_sdk.web.async_client import AsyncWebClient
    from slack_sdk.web.async_slack_response import AsyncSlackResponse

    from tests.unit.test_cards import NOW, TOKEN, approval, decided

    class Recorder(AsyncWebClient):
        sent: list[tuple[str, str]]

        async def api_call(self, api_method: str, **kw: Any) -> AsyncSlackResponse:
            self.sent.append((api_method, json.dumps(kw)))
            return AsyncSlackResponse(client=self, http_verb="POST", api_url=api_method,
                                      req_args=kw, data={"ok": True, "ts": "9.9"},
                                      headers={}, status_code=200)

    class Posted:
        async def card_posted(self, approval_id: str, *, channel: str, ts: str) -> None:
            pass

    client = Recorder(token="xoxb-test")
    client.sent = []
    delivery = SlackDeliverer(Posted(), client, channel="C1",  # type: ignore[arg-type]
                              ops_channel="C2")
    row = OutboxRecord(id=7, kind="card.update", group_key="g", payload="{}", status="x",
                       attempts=0, not_before=NOW, claimed_by=None, claimed_until=None,
                       created_at=NOW, delivered_at=None, last_error=None, result=None,
                       give_up_at=None, waits=0)

    async def sent(call: Callable[[], Awaitable[Any]]) -> tuple[tuple[str, str], list[str]]:
        """The one Web API call ``call`` makes; slack_sdk's model walk must not run."""
        client.sent.clear()
        walked: list[str] = []

        def profile(frame: Any, event: str, arg: Any) -> None:
            if event == "call" and frame.f_code.co_name == "_parse_web_class_objects":
                walked.append(frame.f_code.co_name)

        sys.setprofile(profile)
        try:
            await call()
        finally:
            sys.setprofile(None)
        assert len(client.sent) == 1
        return client.sent[0], walked

    # an update: a decided card
    a = replace(decided("approved"), channel="C1", message_ts="1.2")
    card = cards.approval_card(a, token=None, now=NOW)
    ours, walked = await sent(lambda: delivery._update(
        row, CardView(a, None, NOW, (), None, None, None, ())))
    theirs, _ = await sent(lambda: client.chat_update(
        channel="C1", ts="1.2", text=card["text"], blocks=card["blocks"]))
    assert ours == theirs and ours[0] == "chat.update" and not walked
    # a post: a live card, its buttons too
    b = approval(channel=None, message_ts=None)
    card = cards.approval_card(b, token=TOKEN, now=NOW)
    ours, walked = await sent(lambda: delivery._post(
        row, CardView(b, TOKEN, NOW, (), None, None, None, ())))
    theirs, _ = await sent(lambda: client.chat_postMessage(
        channel="C1", text=card["text"], blocks=card["blocks"], unfurl_links=False,
        unfurl_media=False, metadata={"event_type": CARD_EVENT, "event_payload": {
            "approval_id": b.id, "outbox_id": 7}}))
    assert ours == theirs and ours[0] == "chat.postMessage" and not walked


def test_the_face_listens_to_no_event_bolt_s_switched_off_middleware_would_act_on() -> None:
    """The app runs without bolt's IgnoringSelfEvents and AttachingFunctionToken (every
    click went through both for nothing): that holds while no listener hears an event its
    own bot sends (a message) or a workflow step (a function). A listener for either needs
    them back on in bot/slack/app.py."""
    from approvald.bot.slack.handlers import Handlers

    registered: list[tuple[str, Any]] = []

    class Recorder:
        def __getattr__(self, kind: str) -> Any:
            def register(*args: Any, **kwargs: Any) -> Any:
                registered.append((kind, args[0] if args else None))
                return lambda listener: listener

            return register

    Handlers(None).register(Recorder())  # type: ignore[arg-type]
    kinds = {kind for kind, _ in registered}
    assert kinds <= {"action", "view", "command", "event", "error"}, kinds
    assert [what for kind, what in registered if kind == "event"] == ["app_home_opened"]


def test_a_button_value_s_characters_are_checked_as_before() -> None:
    from approvald.bot.slack import cards

    safe = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")
    rnd = random.Random(14)
    pool = [*"aZ09_.-", "\n", " ", ":", "/", "é", "٣", "\u200b", "$", "\x00", "-"]
    for _ in range(3000):
        text = "".join(rnd.choice(pool) for _ in range(rnd.randint(0, 8)))
        want = 0 < len(text) <= 6 and all(c in safe for c in text)
        assert cards._safe_id(text, 6) is want, repr(text)


def test_json_escapes_matches_the_per_character_walk() -> None:
    """``json_escapes`` (a card's arguments, every card) escapes what the per-character
    walk it replaced escaped: the bidi controls and lone surrogates, nothing else."""
    bidi = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"

    def reference(text: str) -> str:
        return "".join(f"\\u{ord(c):04x}" if c in bidi or "\ud800" <= c <= "\udfff" else c
                       for c in text)

    near = ["\u2029", "\u202f", "\u2065", "\u206a", "\ud7ff", "\ue000", "\U0001f600"]
    pool = [*ALPHABET, *bidi, "\udfff", "\udc00", "\udbff", *near]
    rnd = random.Random(215)
    for _ in range(4000):
        text = "".join(rnd.choice(pool) for _ in range(rnd.randint(0, 30)))
        assert mrkdwn.json_escapes(text) == reference(text), repr(text)


def test_the_card_budget_check_is_the_walk_s_answer_mostly_without_the_walk() -> None:
    import json

    from approvald.bot.slack import cards
    from approvald.bot.slack.mrkdwn import text_length, within_text_budget

    from tests.unit.test_cards import NOW, TOKEN, approval
    rnd = random.Random(661)
    pool = [*ALPHABET, '"', "\\", "/", "\u2028", "\U0001f3fd"]
    for _ in range(2000):
        texts = ["".join(rnd.choice(pool) for _ in range(rnd.randint(0, 40)))
                 for _ in range(rnd.randint(1, 4))]
        if rnd.random() < 0.1:  # two units a character, outside the BMP
            texts.append("\U0001f600" * rnd.randint(100, 300))
        blocks = [{"type": "section", "text": {"type": "mrkdwn", "text": t}} for t in texts]
        blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": texts[0]}]})
        size = text_length(blocks)
        assert len(json.dumps(blocks)) >= size  # the bound the shortcut rests on
        for budget in (size - 1, size, size + 1, rnd.randint(0, 400)):
            assert within_text_budget(blocks, budget) is (size <= budget)
    # a card with blocks it may drop (evidence, impact) that fits: drawn without the walk
    seen = _calls_during(lambda: cards.approval_card(approval(), token=TOKEN, now=NOW))
    assert seen["approvald.bot.slack.mrkdwn:within_text_budget"] == 1
    assert seen["approvald.bot.slack.mrkdwn:text_length"] == 0


def test_a_live_card_s_buttons_are_made_and_checked_once_per_shape() -> None:
    from approvald.bot.slack import cards

    from tests.unit.test_cards import NOW, TOKEN, approval
    cards.approval_card(approval(), token=TOKEN, now=NOW)
    other = approval(id="c" * 32, requested_by="U0DANA")  # another request, the same shape
    seen = _calls_during(lambda: cards.approval_card(other, token="t" * 20, now=NOW))
    assert seen["slack_sdk.models.basic_objects:to_dict"] == 0
    assert seen["slack_sdk.models.basic_objects:validate_json"] == 0
    card = cards.approval_card(other, token="t" * 20, now=NOW)
    assert {e["value"] for e in card["blocks"][-1]["elements"]} == {
        cards.button_value(other.id, "t" * 20)}


async def test_a_decision_reads_its_request_s_approvers_once(
        db: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The request's approvers (JSON text in its row) are parsed once a decision: whether
    a group must be looked up first and whether the actor may decide read the same list
    (issue 50). Who may decide, and every refusal, as before (tests/unit/test_decisions)."""
    from approvald.runtime.approvals.decide import Actor
    from approvald.store.records import ApprovalRecord

    from tests.unit.test_click_statements import paused_refund
    from tests.unit.test_decisions import card_token

    engine, paused = await paused_refund(db, tmp_path)
    approval = await engine.approval(paused.approval_ids[0])
    parsed = []
    plain = ApprovalRecord.approvers_value

    def approvers_value(self: ApprovalRecord) -> list[str]:
        parsed.append(self.id)
        return plain(self)

    monkeypatch.setattr(ApprovalRecord, "approvers_value", approvers_value)
    decision = await engine.decide(approval.id, actor=Actor("U_ALICE", "slack"),
                                   verdict="approve", token=card_token(approval))
    assert decision.outcome == "approved"
    assert parsed == [approval.id]


async def test_a_decision_builds_no_sweep_result(db: Any, tmp_path: Any) -> None:
    """A decision made no expiry on its way: the result of one (a refusal's, which may
    settle an overdue request) is not built for it (issue 50); a refusal still announces
    the expiry it applied (tests/unit/test_decisions)."""
    from approvald.runtime.approvals.decide import Actor

    from tests.unit.test_click_statements import paused_refund
    from tests.unit.test_decisions import card_token

    engine, paused = await paused_refund(db, tmp_path)
    approval = await engine.approval(paused.approval_ids[0])
    with counting_calls() as seen:
        decision = await engine.decide(approval.id, actor=Actor("U_ALICE", "slack"),
                                       verdict="approve", token=card_token(approval))
    assert decision.outcome == "approved"
    assert seen["approvald.runtime.requests.expiry:__init__"] == 0, seen
