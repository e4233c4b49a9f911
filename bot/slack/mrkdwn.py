"""Safe mrkdwn and Block Kit primitives shared by the card, view and thread builders.

Invariant 9, agent-written text is data: everything that comes from the agent or from tool
results goes through :func:`clip` or :func:`code_block`, which escape ``& < >`` (so no
``<!channel>``, ``<@U…>`` or ``<http://evil|bank.com>`` can ping or fake a link), break up
runs of backticks (so no input opens or closes a code block), show bidi overrides instead of
obeying them, and cut
to a length budget without splitting an entity, a character or a grapheme. Every mrkdwn
text object is ``verbatim`` so Slack does not auto-link URLs or auto-parse mentions in it.

Lengths are budgeted in UTF-16 code units, never fewer than characters, so a limit holds
whichever way Slack counts. Everything here is pure.
"""

from __future__ import annotations

import functools
import json
import json.encoder
import re
import unicodedata
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from itertools import repeat
from typing import Any
from urllib.parse import quote

from approvald.bot.slack import texts as T
from approvald.runtime import mask_args, mask_text
from slack_sdk.models.blocks import (
    ContextBlock,
    HeaderBlock,
    MarkdownTextObject,
    PlainTextObject,
    SectionBlock,
)

# Slack's limits, and our own budgets below them
SECTION_MAX = 3000
HEADER_MAX = 150
MESSAGE_BLOCKS_MAX = 50
VIEW_BLOCKS_MAX = 100
CARD_TEXT_BUDGET = 12_000  # Slack answers msg_blocks_too_long a little above 13,000
BUTTON_VALUE_MAX = 2000
FALLBACK_MAX = 3000
INPUT_MAX = 3000  # a plain_text_input holds at most 3,000 characters
REASON_MAX = 2000  # runtime.approvals.decide.MAX_REASON

_USER = re.compile(r"[UW][A-Z0-9_]{2,31}")  # U_ALICE as the README writes ids, too
_GROUP = re.compile(r"S[A-Z0-9_]{2,31}")
# explicit direction overrides, embeddings and isolates can make text read differently from
# what it is ("‮moc.knab"); plain right-to-left letters and marks are left alone
_BIDI = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
_ZWSP = "\u200b"
_ZWJ = "\u200d"
_ESCAPES = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}


def units(text: str) -> int:
    """Length in UTF-16 code units: what a JavaScript ``length`` says, never below ``len``."""
    if text.isascii():  # the usual case, without a Python step per character
        return len(text)
    return len(text) + sum(1 for ch in text if ord(ch) > 0xFFFF)


def escape_mrkdwn(text: str) -> str:
    """Escape ``&``, ``<`` and ``>`` so text can only ever render as itself in mrkdwn."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _joins(text: str, i: int) -> bool:
    """True when a cut just before ``text[i]`` would split a grapheme (accent, emoji, ZWJ)."""
    ch = text[i]
    if i > 0 and text[i - 1] == _ZWJ:
        return True
    return (ch == _ZWJ or "\ufe00" <= ch <= "\ufe0f" or "\U0001f3fb" <= ch <= "\U0001f3ff"
            or "\U000e0020" <= ch <= "\U000e007f" or unicodedata.combining(ch) > 0
            or unicodedata.category(ch) in ("Mn", "Me", "Mc"))


def _piece(text: str, i: int, code: bool) -> str:
    """How ``text[i]`` is shown: escaped, neutralized, or as itself."""
    ch = text[i]
    if ch in _ESCAPES:
        return _ESCAPES[ch]
    o = ord(ch)
    # a lone surrogate (valid in JSON, "\\ud800") cannot even be encoded to send
    if ch in _BIDI or 0xD800 <= o <= 0xDFFF:
        return f"\\u{o:04x}" if code else f"[U+{o:04X}]"
    if o < 0x20 and ch not in "\n\t":
        return f"\\u{o:04x}" if code else "\ufffd"
    if ch == "`" and i > 0 and text[i - 1] == "`":
        # no run of backticks, so input can neither close our code fence nor open one
        return _ZWSP + ch
    return ch


# characters _piece shows as something else, or wider than one unit (a backtick only after
# another, astral characters two units): text without any is shown as itself
_NOT_ITSELF = re.compile("[&<>`\u202a-\u202e\u2066-\u2069\ud800-\udfff"
                         "\x00-\x08\x0b-\x1f\U00010000-\U0010ffff]")


def _fit(text: str, start: int, budget: int, code: bool) -> tuple[str, int]:
    """Display form of ``text[start:end]`` within ``budget`` units, and ``end``."""
    n = len(text)
    if _NOT_ITSELF.search(text, start) is None:  # one unit a character, each as itself
        i = min(n, start + max(budget, 0))
        end = i
        if i < n:  # as below
            while end > start and i - end < 32 and _joins(text, end):
                end -= 1
            if end == start or _joins(text, end):
                end = i
        return text[start:end], end
    out: list[str] = []
    used, i = 0, start
    while i < n:
        piece = _piece(text, i, code)
        size = units(piece)
        if used + size > budget:
            break
        out.append(piece)
        used += size
        i += 1
    end = i
    if i < n:  # back off so that no grapheme is split, unless it is pathologically long
        while end > start and i - end < 32 and _joins(text, end):
            end -= 1
        if end == start or _joins(text, end):
            end = i
        out = out[:end - start]
    return "".join(out), end


def clip(text: str, limit: int) -> str:
    """Escape prose for mrkdwn and cut it to ``limit`` units, ending in "…" when cut;
    secrets the detectors recognise are masked first (no Slack text ever carries one)."""
    text = mask_text(text)
    if len(text) <= limit and _NOT_ITSELF.search(text) is None:
        return text  # _fit's answer for text within the limit, shown as itself
    shown, end = _fit(text, 0, limit, code=False)
    if end == len(text):
        return shown
    shown, _ = _fit(text, 0, limit - 1, code=False)
    return shown + T.ELLIPSIS


def code_block(text: str, limit: int) -> tuple[str, int]:
    """A fenced block of ``text`` within ``limit`` units, and how many characters were cut.

    A cut block ends with a visible "… truncated, N more characters" note. Secrets the
    detectors recognise are masked first.
    """
    text = mask_text(text)
    fence = 8  # "```\n" and "\n```"
    shown, end = _fit(text, 0, limit - fence, code=True)
    cut = len(text) - end
    if cut:
        note = "\n" + T.TRUNCATED.format(n=len(text))  # as long as any real note
        shown, end = _fit(text, 0, limit - fence - units(note), code=True)
        cut = len(text) - end
        return f"```\n{shown}\n```\n{T.TRUNCATED.format(n=cut)}", cut
    return f"```\n{shown}\n```", 0


def code_chunks(text: str, size: int) -> Iterable[tuple[str, int]]:
    """Successive fenced blocks of at most ``size`` units showing all of ``text``.

    Yields each block with the index of ``text`` it shows up to, so a caller that must
    stop early can say how much was left out.
    """
    start = 0
    while start < len(text):
        shown, end = _fit(text, start, size - 8, code=True)
        if end == start:  # no single piece is longer than 7 units
            raise ValueError("chunk size too small")
        yield f"```\n{shown}\n```", end
        start = end


def code_span(text: str, limit: int) -> str:
    """Escaped text for inside a template's `…` span: a backtick could end the span early."""
    return clip(text, limit).replace("`", "\u02cb")


def duration(delta: timedelta) -> str:
    """``timedelta(hours=2, minutes=5)`` -> ``"2h 5m"``: the two largest units."""
    seconds = max(0, int(delta.total_seconds()))
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size:
            parts.append(f"{seconds // size}{unit}")
            seconds %= size
    return " ".join(parts[:2]) or "0s"


def safe_cut(text: str, limit: int) -> str:
    """Cut already-built mrkdwn to ``limit`` units without leaving half an entity or tag."""
    if 2 * len(text) <= limit or units(text) <= limit:  # (never more units than 2 * len)
        return text
    head, _ = _fit_raw(text, limit - 1)
    amp, lt = head.rfind("&"), head.rfind("<")
    if amp > head.rfind(";"):
        head = head[:amp]
    if lt > head.rfind(">"):
        head = head[:lt]
    return head + T.ELLIPSIS


def _fit_raw(text: str, budget: int) -> tuple[str, int]:
    used = 0
    for i, ch in enumerate(text):
        used += 2 if ord(ch) > 0xFFFF else 1
        if used > budget:
            return text[:i], i
    return text, len(text)


def json_escapes(text: str) -> str:
    """JSON text with bidi controls and lone surrogates as ``\\uXXXX`` escapes.

    Only valid inside JSON strings, where they mean exactly the same value: the text still
    parses to the same data, but can neither reorder what is shown nor fail to encode.
    """
    if text.isascii():  # the usual case: nothing to escape, and no Python step per character
        return text
    return _JSON_ESCAPED.sub(_json_escape, text)


# what json_escapes escapes: the bidi controls of _BIDI and the surrogates
_JSON_ESCAPED = re.compile("[\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def _json_escape(m: re.Match[str]) -> str:
    return f"\\u{ord(m.group()):04x}"


def pretty_json(value: Any) -> str:
    """Indented JSON as approvers read it, non-ASCII kept (see :func:`json_escapes`), what
    the detectors recognise masked."""
    return json_escapes(pretty_dumps(mask_args(value)))


# json's encoder in C, which CPython's json.dumps uses only without ``indent``: with it,
# json.dumps runs its pure-Python encoder, a generator resumed for every piece of every
# container (most of a card's JSON cost). None where there is no C encoder.
_C_ENCODER: Any = getattr(json.encoder, "c_make_encoder", None)
_CONTAINERS = (list, tuple, dict)
_LEVELS: list[Callable[[Any, int], list[str]]] = []  # the C encoder of each depth


class _NotPlain(Exception):
    """A container :func:`pretty_dumps` leaves to json.dumps: a subclass of one of json's."""


def pretty_dumps(value: Any) -> str:
    """``json.dumps(value, indent=2, ensure_ascii=False, default=str)``, the same text (and
    the same exception, raised by json.dumps itself), through json's C encoder: only the
    containers that hold containers are walked here; any other (a scalar, or a container
    of scalars) is one C call, its items separated by a comma, a newline and its depth's
    indentation, which is what the indented encoder writes between them."""
    if _C_ENCODER is not None:
        try:
            return _pretty(value, 0)
        except (_NotPlain, TypeError, ValueError, RecursionError):
            pass
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


def _level(depth: int) -> Callable[[Any, int], list[str]]:
    while len(_LEVELS) <= depth:  # (markers None: a cycle recurses, json.dumps says so)
        _LEVELS.append(_C_ENCODER(None, str, json.encoder.encode_basestring, None, ": ",
                                  ",\n" + "  " * (len(_LEVELS) + 1), False, False, True))
    return _LEVELS[depth]


def _pretty(value: Any, depth: int) -> str:
    t = type(value)
    if t is dict:
        items = value.values()
    elif t is list or t is tuple:
        items = value
    elif isinstance(value, _CONTAINERS):
        raise _NotPlain
    else:  # a scalar, or what default=str makes one of
        return "".join(_level(0)(value, 0))
    if not value:
        return "{}" if t is dict else "[]"
    inner = "\n" + "  " * (depth + 1)
    if not any(map(isinstance, items, repeat(_CONTAINERS))):
        text = "".join(_level(depth)(value, 0))
        return f"{text[0]}{inner}{text[1:-1]}\n{'  ' * depth}{text[-1]}"
    if t is dict:  # (a key that is not text: encode_basestring raises, json.dumps writes)
        parts = [f"{json.encoder.encode_basestring(k)}: {_pretty(v, depth + 1)}"
                 for k, v in value.items()]
        return f"{{{inner}{(',' + inner).join(parts)}\n{'  ' * depth}}}"
    parts = [_pretty(v, depth + 1) for v in value]
    return f"[{inner}{(',' + inner).join(parts)}\n{'  ' * depth}]"


def who(actor: str | None) -> str:
    """A Slack user id as a mention; anything else (``cli:alice``) as escaped text."""
    if not actor:
        return "—"
    if _USER.fullmatch(actor):
        return f"<@{actor}>"
    return clip(actor, 80)


def sentence(text: str) -> str:
    """``text`` ending once: a full stop added only where it does not end a sentence yet."""
    text = text.rstrip()
    return text if not text or text[-1] in ".!?…" else text + "."


def clause(text: str) -> str:
    """``text`` without its full stop, for a template that ends the sentence itself
    (``"{reason}. A person decides…"``): the sentence ends once."""
    text = text.rstrip()
    return text[:-1] if text.endswith(".") and not text.endswith("..") else text


def approver(actor: str) -> str:
    """Like :func:`who`, but a user-group id (``S…``) becomes a group mention."""
    return f"<!subteam^{actor}>" if _GROUP.fullmatch(actor) else who(actor)


# what each of Slack's date tokens stands for in the fallback text (UTC)
_DATE_TOKENS = re.compile(r"\{(date_num|date|date_short|date_long|date_pretty|"
                          r"date_short_pretty|date_long_pretty|time|time_secs)\}")
_DATE_FORMATS = {"time": "%H:%M UTC", "time_secs": "%H:%M:%S UTC"}


def slack_date(when: datetime, tokens: str) -> str:
    """``<!date^…>``: Slack renders it in each reader's time zone. The fallback, shown
    where the date cannot be formatted (notifications, old clients, other readers), is the
    same words with UTC in place of each token (``expires 2026-12-05 at 18:39 UTC``), so
    the sentence around it reads the same either way."""
    when = (when if when.tzinfo else when.replace(tzinfo=UTC)).astimezone(UTC)
    template = _fallback_template(tokens)
    if template is None or when.year < 1000:  # (strftime's %Y is the platform's there)
        fallback = _strftime_fallback(when, tokens)
    else:  # what strftime writes for each token, without its per-call format parsing
        fallback = template.format(
            date=f"{when.year}-{when.month:02d}-{when.day:02d}",
            time=f"{when.hour:02d}:{when.minute:02d} UTC",
            time_secs=f"{when.hour:02d}:{when.minute:02d}:{when.second:02d} UTC")
    fallback = fallback.replace("|", "/").replace(">", "")
    return f"<!date^{int(when.timestamp())}^{tokens}|{fallback}>"


def _strftime_fallback(when: datetime, tokens: str) -> str:
    if _DATE_TOKENS.search(tokens):
        return _DATE_TOKENS.sub(
            lambda m: when.strftime(_DATE_FORMATS.get(m.group(1), "%Y-%m-%d")), tokens)
    return when.strftime(T.DATE_FALLBACK)


@functools.lru_cache(maxsize=64)
def _fallback_template(tokens: str) -> str | None:
    """``tokens`` as a ``str.format`` template of ``date``, ``time`` and ``time_secs`` (the
    three things :data:`_DATE_FORMATS` writes); None when it has no token."""
    if not _DATE_TOKENS.search(tokens):
        return None
    parts, last = [], 0
    for m in _DATE_TOKENS.finditer(tokens):
        parts.append(tokens[last:m.start()].replace("{", "{{").replace("}", "}}"))
        name = m.group(1)
        parts.append("{" + (name if name in _DATE_FORMATS else "date") + "}")
        last = m.end()
    parts.append(tokens[last:].replace("{", "{{").replace("}", "}}"))
    return "".join(parts)


def safe_url(url: str | None) -> str | None:
    """An http(s) URL we produced (a permalink), ready for ``<url|label>``; else None.

    Characters that would end the link markup are percent-encoded, ``&`` is escaped.
    """
    if not url or not re.match(r"https?://\S", url, re.IGNORECASE) or len(url) > 500:
        return None
    return escape_mrkdwn(re.sub(r"[\s|<>]", lambda m: quote(m.group(), safe=""), url))


def md(text: str) -> MarkdownTextObject:
    """A verbatim mrkdwn text object: our markup works, nothing is auto-linked or pinged."""
    return MarkdownTextObject(text=text, verbatim=True)


def plain(text: str) -> PlainTextObject:
    return PlainTextObject(text=text, emoji=True)


def section(text: str, block_id: str | None = None) -> SectionBlock:
    """A mrkdwn section; the cut is a last resort, builders budget below it."""
    return SectionBlock(text=md(safe_cut(text, SECTION_MAX)), block_id=block_id)


def header(text: str) -> HeaderBlock:
    return HeaderBlock(text=plain(cut_plain(text, HEADER_MAX)))


def context(parts: Sequence[str]) -> ContextBlock:
    return ContextBlock(elements=[md(safe_cut(p, SECTION_MAX)) for p in parts[:10]])


def section_dict(text: str) -> dict[str, Any]:
    """``block_dict(section(text))``, the same dict, without making slack_sdk's models
    first (eight Python calls a block, of which to_dict would have used none)."""
    text = safe_cut(text, SECTION_MAX)
    if 0 < len(text) <= SectionBlock.text_max_length:
        return {"text": {"text": text, "type": "mrkdwn", "verbatim": True}, "type": "section"}
    return block_dict(SectionBlock(text=md(text)))  # (empty: to_dict decides)


def header_dict(text: str) -> dict[str, Any]:
    """``block_dict(header(text))``, the same dict, without the models."""
    text = cut_plain(text, HEADER_MAX)
    if 0 < len(text) <= HeaderBlock.text_max_length:
        return {"text": {"emoji": True, "text": text, "type": "plain_text"}, "type": "header"}
    return block_dict(HeaderBlock(text=plain(text)))


def context_dict(parts: Sequence[str]) -> dict[str, Any]:
    """``block_dict(context(parts))``, the same dict, without the models."""
    texts = [safe_cut(p, SECTION_MAX) for p in parts[:10]]
    if texts and all(texts):
        return {"elements": [{"text": t, "type": "mrkdwn", "verbatim": True} for t in texts],
                "type": "context"}
    return block_dict(ContextBlock(elements=[md(t) for t in texts]))


def _text_dict(obj: object, limit: int) -> dict[str, Any] | None:
    """``obj.to_dict()`` for a text object as :func:`md` and :func:`plain` make them, with
    text of 1 to ``limit`` characters; else None (``to_dict`` then decides)."""
    t = type(obj)
    if t is MarkdownTextObject:
        m: MarkdownTextObject = obj  # type: ignore[assignment]
        if (m.verbatim is True and m.emoji is None and type(m.text) is str
                and 0 < len(m.text) <= limit):
            return {"text": m.text, "type": "mrkdwn", "verbatim": True}
    elif t is PlainTextObject:
        p: PlainTextObject = obj  # type: ignore[assignment]
        if p.emoji is True and type(p.text) is str and 0 < len(p.text) <= limit:
            return {"emoji": True, "text": p.text, "type": "plain_text"}
    return None


def block_dict(block: Any) -> dict[str, Any]:
    """``block.to_dict()``, the same dict, for the section, header and context blocks
    :func:`section`, :func:`header` and :func:`context` build, without slack_sdk's
    generic walk and its validators: only for blocks within the limits those validators
    check (text length, element count, ``block_id``); any other block, or one out of
    bounds, goes through ``to_dict`` (which validates, and raises as before)."""
    t = type(block)
    bid = block.block_id if t in (SectionBlock, HeaderBlock, ContextBlock) else None
    if bid is not None and not (type(bid) is str and 0 < len(bid) <= 255):
        return block.to_dict()  # type: ignore[no-any-return]
    head = {"block_id": bid} if bid else {}
    if t is SectionBlock:
        if not block.fields and block.accessory is None and block.expand is None:
            text = _text_dict(block.text, SectionBlock.text_max_length)
            if text is not None:
                return {**head, "text": text, "type": "section"}
    elif t is HeaderBlock:
        text = _text_dict(block.text, HeaderBlock.text_max_length)
        if text is not None:
            return {**head, "text": text, "type": "header"}
    elif t is ContextBlock:
        elements = block.elements
        if type(elements) is list and 0 < len(elements) <= ContextBlock.elements_max_length:
            out = [_text_dict(e, 1 << 62) for e in elements]
            if all(x is not None for x in out):
                return {**head, "elements": out, "type": "context"}
    return block.to_dict()  # type: ignore[no-any-return]


def cut_plain(text: str, limit: int) -> str:
    """Cut plain text (never parsed by Slack, so not escaped) to ``limit`` units."""
    if units(text) <= limit:
        return text
    return _fit_raw(text, limit - 1)[0] + T.ELLIPSIS


def within_text_budget(blocks: list[dict[str, Any]], budget: int) -> bool:
    """``text_length(blocks) <= budget``, mostly without walking the blocks: their JSON in
    ASCII is one C call and never counts fewer characters than their texts count units
    (each character of a text is in it as itself, a two-character escape, a six-character
    ``\\uXXXX``, or, outside the BMP, two of those for two units), so the walk is left
    for blocks whose JSON is over ``budget``."""
    return len(json_dumps(blocks)) <= budget or text_length(blocks) <= budget


# json.dumps(value)'s encoder, made once (json.dumps makes one a call, in three Python
# calls); without the check for cycles: a cycle recurses, and json.dumps then says so
_ASCII = None if _C_ENCODER is None else _C_ENCODER(
    None, json.JSONEncoder().default, json.encoder.encode_basestring_ascii, None, ": ", ", ",
    False, False, True)


def json_dumps(value: Any) -> str:
    """``json.dumps(value)``, the same text (or what json.dumps raises), in one C call: the
    length of a card's JSON, and the bodies the Slack session sends (``json_serialize``)."""
    if _ASCII is not None:
        try:
            return "".join(_ASCII(value, 0))
        except (TypeError, ValueError, RecursionError):
            pass
    return json.dumps(value)


def text_length(value: Any) -> int:
    """Units of every ``text`` string in a block tree: what Slack's size limit counts."""
    if isinstance(value, Mapping):
        return sum(units(v) if k == "text" and isinstance(v, str) else text_length(v)
                   for k, v in value.items())
    if isinstance(value, list | tuple):
        return sum(text_length(v) for v in value)
    return 0
