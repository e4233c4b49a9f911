"""Block Kit and mrkdwn to HTML, for the sandbox page: messages, modals and the App Home
drawn from the JSON the app really sent.

Everything that came from Slack text is escaped before it becomes markup: a tool argument
holding ``<script>``, ``<!channel>`` or a fake link shows as the characters it is. Slack's
own tokens (``<@U1>``, ``<!subteam^S1>``, ``<#C1>``, ``<!date^…|fallback>``, ``<url|label>``)
are drawn the way Slack draws them; links are only ever http(s) or mailto, and links to
the sandbox workspace's own messages open the thread on the page. Unknown blocks and
elements are shown as a placeholder, never dropped silently.
"""

from __future__ import annotations

import functools
import html
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs, urlsplit

from approvald.runtime import WORDS

JSON = dict[str, Any]

EMOJI = {
    "alarm_clock": "⏰", "arrow_double_up": "⏫", "arrows_counterclockwise": "🔄",
    "ballot_box_with_check": "☑️", "checkered_flag": "🏁", "grey_question": "❔",
    "heavy_multiplication_x": "✖️", "hourglass": "⌛", "hourglass_flowing_sand": "⏳",
    "information_source": "\u2139\ufe0f", "large_green_circle": "🟢", "large_yellow_circle": "🟡",
    "lock": "🔒", "no_entry": "⛔", "no_entry_sign": "🚫", "octagonal_sign": "🛑",
    "pencil2": "✏️", "red_circle": "🔴", "rotating_light": "🚨", "small_red_triangle": "🔺",
    "sparkles": "✨", "warning": "⚠️", "white_check_mark": "✅", "white_small_square": "▫️",
    "x": "❌", "tada": "🎉", "wave": "👋", "+1": "👍", "eyes": "👀",
    "leftwards_arrow_with_hook": "↩️", "outbox_tray": "📤", "repeat": "🔁",
    # each outcome's emoji, as the one vocabulary pairs its short name with its character
    **{w.emoji: w.icon for w in WORDS.values()},
}
# what an emoji means, in words: drawn instead of it where the browser has no glyph for it
EMOJI_WORDS = {"+1": "thumbs up", "pencil2": "pencil", "x": "cross",
               "leftwards_arrow_with_hook": "redirected", "white_small_square": "-"}

_CODE_BLOCK = re.compile(r"```(.*?)```", re.DOTALL)
_CODE = re.compile(r"`([^`\n]+)`")
_TOKEN = re.compile(r"<([^<>\n]{1,2000})>")
_HELD = re.compile(r"\x00(\d+)\x00")
_EMOJI = re.compile(r":([a-z0-9_+-]{1,40}):")
_STYLES = ((re.compile(r"(?<![\w*])\*(?![\s*])([^*\n]*?[^\s*])\*(?![\w*])"), "b"),
           (re.compile(r"(?<![\w_])_(?![\s_])([^_\n]*?[^\s_])_(?![\w_])"), "i"),
           (re.compile(r"(?<![\w~])~(?![\s~])([^~\n]*?[^\s~])~(?![\w~])"), "s"))
_PERMALINK = re.compile(r"/archives/([A-Z0-9_]+)/p(\d{7,})$")


@dataclass
class Names:
    """How ids are shown: users, user groups and channels by name; the workspace's URL
    (links into it open on the page instead)."""

    users: Mapping[str, str] = field(default_factory=dict)
    groups: Mapping[str, str] = field(default_factory=dict)
    channels: Mapping[str, str] = field(default_factory=dict)
    workspace_url: str = "https://sandbox.slack.com/"


def esc(text: Any) -> str:
    """HTML-escape anything (quotes too: the result may sit in an attribute)."""
    return html.escape(str(text), quote=True)


def slack_unescape(text: str) -> str:
    """Slack's three entities back to characters (the only escaping Slack text has)."""
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def emoji(text: str) -> str:
    """``:name:`` shortcodes to emoji (see :func:`emoji_html`); unknown ones stay as written."""
    return _EMOJI.sub(lambda m: emoji_html(m.group(1)) or m.group(0), text)


def emoji_html(name: str) -> str | None:
    """The emoji ``name`` as the page draws it, or None if the page does not know it.

    The character, with its meaning in words beside it for the page's script: where the
    browser has no glyph for the character (a machine without an emoji font), the page
    shows the words instead of an empty box (see :mod:`bot.sandbox.page`)."""
    char = EMOJI.get(name)
    if char is None:
        return None
    words = esc(EMOJI_WORDS.get(name, name.replace("_", " ")))
    return (f'<span class="emoji" role="img" aria-label="{words}" title="{words}" '
            f'data-name="{esc(name)}" data-text="{words}">{char}</span>')


def mrkdwn(text: str, names: Names) -> str:
    """Slack mrkdwn to safe HTML."""
    held: list[str] = []

    def hold(markup: str) -> str:
        held.append(markup)
        return f"\x00{len(held) - 1}\x00"

    text = text.replace("\x00", "")
    text = _CODE_BLOCK.sub(
        lambda m: hold(f"<pre>{esc(slack_unescape(m.group(1).strip(chr(10))))}</pre>"), text)
    text = _CODE.sub(lambda m: hold(f"<code>{esc(slack_unescape(m.group(1)))}</code>"), text)
    text = _TOKEN.sub(lambda m: hold(_token(m.group(1), names)), text)
    out = esc(slack_unescape(text))
    for pattern, tag in _STYLES:
        out = pattern.sub(functools.partial(_styled, tag), out)
    out = emoji(out).replace("\n", "<br>")
    # a held piece never holds another one's marker: \x00 was removed from the input
    return _HELD.sub(lambda m: held[int(m.group(1))], out)


def _styled(tag: str, m: re.Match[str]) -> str:
    return f"<{tag}>{m.group(1)}</{tag}>"


def _token(inner: str, names: Names) -> str:
    target, _, label = inner.partition("|")
    shown = slack_unescape(label) if label else ""
    if target.startswith("@"):
        uid = target[1:]
        return _mention("@" + (names.users.get(uid) or shown.lstrip("@") or uid), "user")
    if target.startswith("#"):
        cid = target[1:]
        return _mention("#" + (names.channels.get(cid) or shown.lstrip("#") or cid), "channel")
    if target.startswith("!subteam^"):
        gid = target.removeprefix("!subteam^")
        return _mention("@" + (names.groups.get(gid) or shown.lstrip("@") or gid), "group")
    if target in ("!channel", "!here", "!everyone"):
        return _mention("@" + target[1:], "broadcast")
    if target.startswith("!date^"):
        return _date(target, shown)
    if target.startswith(("http://", "https://", "mailto:")):
        return _link(slack_unescape(target), shown, names)
    return esc("<" + slack_unescape(inner) + ">")  # not a token Slack knows: literal text


def _mention(text: str, kind: str) -> str:
    return f'<span class="mention {kind}">{esc(text)}</span>'


def _date(target: str, fallback: str) -> str:
    parts = target.split("^")
    try:
        when = datetime.fromtimestamp(int(parts[1]), UTC)
    except (IndexError, ValueError, OverflowError, OSError):
        return esc(fallback or target)
    return (f'<time datetime="{esc(when.isoformat())}" title="{esc(fallback)}">'
            f"{esc(fallback or when.strftime('%Y-%m-%d %H:%M UTC'))}</time>")


def _link(url: str, label: str, names: Names) -> str:
    shown = esc(label or url)
    parts = urlsplit(url)
    if url.startswith(names.workspace_url):
        found = _PERMALINK.search(parts.path)
        if found:
            channel, digits = found.group(1), found.group(2)
            ts = f"{digits[:-6]}.{digits[-6:]}"
            # a reply opens its thread; a top-level message opens as a thread of its own
            thread = parse_qs(parts.query).get("thread_ts", [ts])[0]
            return (f'<a href="#" class="permalink" data-channel="{esc(channel)}" '
                    f'data-thread="{esc(thread)}">{shown}</a>')
    return f'<a href="{esc(url)}" target="_blank" rel="noopener noreferrer">{shown}</a>'


def text_object(obj: Any, names: Names) -> str:
    """A composition text object (plain_text or mrkdwn) to HTML."""
    if not isinstance(obj, dict):
        return ""
    text = str(obj.get("text", ""))
    if obj.get("type") == "mrkdwn":
        return mrkdwn(text, names)
    rendered = esc(text)
    return (emoji(rendered) if obj.get("emoji", True) else rendered).replace("\n", "<br>")


def plain(obj: Any) -> str:
    """The text of a plain_text object, escaped (labels, titles, placeholders)."""
    return text_object(obj, Names()) if isinstance(obj, dict) else ""


# -- blocks -------------------------------------------------------------------------------

def blocks(items: Any, names: Names, *, errors: Mapping[str, str] | None = None,
           values: Mapping[str, Mapping[str, Any]] | None = None) -> str:
    """A list of blocks to HTML. ``errors`` (block_id -> message) are shown under inputs,
    as Slack shows a ``response_action: errors`` answer; ``values`` refill inputs."""
    if not isinstance(items, list):
        return ""
    return "".join(block(b, names, errors=errors or {}, values=values or {}) for b in items)


def block(b: Any, names: Names, *, errors: Mapping[str, str] | None = None,
          values: Mapping[str, Mapping[str, Any]] | None = None) -> str:
    if not isinstance(b, dict):
        return ""
    kind = str(b.get("type", ""))
    draw = _BLOCKS.get(kind)
    if draw is None:
        return f'<div class="b-unknown">[{esc(kind or "untyped")} block]</div>'
    inner = draw(b, names, errors or {}, values or {})
    block_id = f' data-block-id="{esc(b["block_id"])}"' if isinstance(b.get("block_id"),
                                                                        str) else ""
    return f'<div class="b b-{esc(kind)}"{block_id}>{inner}</div>'


Drawer = Callable[[JSON, Names, Mapping[str, str], Mapping[str, Mapping[str, Any]]], str]


def _header(b: JSON, names: Names, *_: Any) -> str:
    return f"<h3>{text_object(b.get('text'), names)}</h3>"


def _section(b: JSON, names: Names, *_: Any) -> str:
    out = ""
    if b.get("text"):
        out += f'<div class="text">{text_object(b["text"], names)}</div>'
    fields = b.get("fields")
    if isinstance(fields, list) and fields:
        out += '<div class="fields">' + "".join(
            f'<div class="field">{text_object(f, names)}</div>' for f in fields) + "</div>"
    if isinstance(b.get("accessory"), dict):
        out += f'<div class="accessory">{element(b["accessory"], names)}</div>'
    return out


def _context(b: JSON, names: Names, *_: Any) -> str:
    items = b.get("elements") if isinstance(b.get("elements"), list) else []
    return "".join(f'<span class="ctx">{element(e, names)}</span>' for e in items or [])


def _divider(*_: Any) -> str:
    return "<hr>"


def _actions(b: JSON, names: Names, *_: Any) -> str:
    items = b.get("elements") if isinstance(b.get("elements"), list) else []
    return "".join(element(e, names) for e in items or [])


def _image(b: JSON, *_: Any) -> str:
    # never fetched: the sandbox makes no request outside the machine
    return f'<span class="image">[image: {esc(b.get("alt_text", ""))}]</span>'


def _input(b: JSON, names: Names, errors: Mapping[str, str],
           values: Mapping[str, Mapping[str, Any]]) -> str:
    block_id = str(b.get("block_id", ""))
    el = b.get("element") if isinstance(b.get("element"), dict) else {}
    assert isinstance(el, dict)
    action_id = str(el.get("action_id", ""))
    optional = ' <span class="optional">(optional)</span>' if b.get("optional") else ""
    out = f'<label class="label">{plain(b.get("label"))}{optional}</label>'
    given = (values.get(block_id) or {}).get(action_id)
    if el.get("type") == "plain_text_input":
        value = given if isinstance(given, str) else str(el.get("initial_value", ""))
        attrs = (f'name="{esc(block_id)}/{esc(action_id)}" data-block-id="{esc(block_id)}" '
                 f'data-action-id="{esc(action_id)}" '
                 f'placeholder="{esc(_plain_text(el.get("placeholder")))}"')
        if isinstance(el.get("max_length"), int):
            attrs += f' maxlength="{el["max_length"]}"'
        if el.get("multiline"):
            out += f'<textarea {attrs} rows="6">{esc(value)}</textarea>'
        else:
            out += f'<input type="text" {attrs} value="{esc(value)}">'
    else:
        out += element(_refilled(el, given), names)
    if block_id in errors:
        out += f'<div class="input-error" role="alert">{esc(errors[block_id])}</div>'
    if b.get("hint"):
        out += f'<div class="hint">{plain(b["hint"])}</div>'
    return out


def _refilled(el: JSON, given: Any) -> JSON:
    """A choice element as submitted (a modal answered with errors is drawn again with
    what was chosen, as Slack keeps it)."""
    if not isinstance(given, dict):
        return el
    if "selected_option" in given:
        return {**el, "initial_option": given["selected_option"]}
    if "selected_options" in given:
        return {**el, "initial_options": given["selected_options"]}
    return el


def _plain_text(obj: Any) -> str:
    return str(obj.get("text", "")) if isinstance(obj, dict) else ""


def _rich_text(b: JSON, names: Names, *_: Any) -> str:
    items = b.get("elements") if isinstance(b.get("elements"), list) else []
    return "".join(_rich_part(e, names) for e in items or [])


def _rich_part(part: Any, names: Names) -> str:
    if not isinstance(part, dict):
        return ""
    kind = part.get("type")
    inner = "".join(_rich_inline(e, names) for e in part.get("elements") or []
                    if isinstance(e, dict)) if kind != "rich_text_list" else ""
    if kind == "rich_text_section":
        return f"<div>{inner}</div>"
    if kind == "rich_text_preformatted":
        return f"<pre>{inner}</pre>"
    if kind == "rich_text_quote":
        return f"<blockquote>{inner}</blockquote>"
    if kind == "rich_text_list":
        tag = "ol" if part.get("style") == "ordered" else "ul"
        items = "".join(f"<li>{_rich_part(e, names)}</li>" for e in part.get("elements") or [])
        return f"<{tag}>{items}</{tag}>"
    return f'<span class="b-unknown">[{esc(kind)}]</span>'


def _rich_inline(e: JSON, names: Names) -> str:
    kind = e.get("type")
    if kind == "text":
        out = esc(e.get("text", "")).replace("\n", "<br>")
    elif kind == "link":
        url = str(e.get("url", ""))
        out = (_link(url, str(e.get("text") or ""), names)
               if url.startswith(("http://", "https://", "mailto:")) else esc(e.get("text", url)))
    elif kind == "user":
        uid = str(e.get("user_id", ""))
        out = _mention("@" + (names.users.get(uid) or uid), "user")
    elif kind == "usergroup":
        gid = str(e.get("usergroup_id", ""))
        out = _mention("@" + (names.groups.get(gid) or gid), "group")
    elif kind == "channel":
        cid = str(e.get("channel_id", ""))
        out = _mention("#" + (names.channels.get(cid) or cid), "channel")
    elif kind == "broadcast":
        out = _mention("@" + str(e.get("range", "here")), "broadcast")
    elif kind == "emoji":
        name = str(e.get("name", ""))
        out = emoji_html(name) or esc(f":{name}:")
    else:
        return f'<span class="b-unknown">[{esc(kind)}]</span>'
    style = e.get("style") if isinstance(e.get("style"), dict) else {}
    assert isinstance(style, dict)
    for key, tag in (("code", "code"), ("bold", "b"), ("italic", "i"), ("strike", "s")):
        if style.get(key):
            out = f"<{tag}>{out}</{tag}>"
    return out


_BLOCKS: dict[str, Drawer] = {
    "header": _header, "section": _section, "context": _context, "divider": _divider,
    "actions": _actions, "image": _image, "input": _input, "rich_text": _rich_text,
}


# -- elements -----------------------------------------------------------------------------

def element(e: Any, names: Names) -> str:
    """An element: a text object, a button (with its confirm dialog), or a placeholder."""
    if not isinstance(e, dict):
        return ""
    kind = e.get("type")
    if kind in ("mrkdwn", "plain_text"):
        return text_object(e, names)
    if kind == "image":
        return _image(e)
    if kind == "button":
        return button(e, names)
    if kind == "checkboxes":
        return checkboxes(e, names)
    if kind == "radio_buttons":
        return radio_buttons(e, names)
    if kind == "static_select":
        return static_select(e)
    return f'<span class="b-unknown">[{esc(kind)} element]</span>'


def _options(e: JSON) -> list[JSON]:
    return [o for o in e.get("options") or [] if isinstance(o, dict)]


def _choice(o: JSON, names: Names, *, kind: str, name: str, chosen: bool) -> str:
    """One option of a checkboxes or radio_buttons element: its input, text, description."""
    note = (f' <span class="hint">{text_object(o["description"], names)}</span>'
            if isinstance(o.get("description"), dict) else "")
    checked = " checked" if chosen else ""
    return (f'<label class="check"><input type="{kind}" name="{esc(name)}" '
            f'value="{esc(o.get("value", ""))}"{checked}> '
            f'{text_object(o.get("text"), names)}{note}</label>')


def checkboxes(e: JSON, names: Names) -> str:
    """Checkboxes, ticked as their ``initial_options`` say; the page sends what is ticked
    with the surface's state (a button press, a modal's submission), as Slack does."""
    ticked = {o.get("value") for o in e.get("initial_options") or [] if isinstance(o, dict)}
    action_id = str(e.get("action_id", ""))
    out = "".join(_choice(o, names, kind="checkbox", name=action_id,
                          chosen=o.get("value") in ticked) for o in _options(e))
    return f'<span class="checkboxes" data-action-id="{esc(action_id)}">{out}</span>'


def radio_buttons(e: JSON, names: Names) -> str:
    """Radio buttons, one of them chosen as ``initial_option`` says."""
    initial = e.get("initial_option")
    chosen = initial.get("value") if isinstance(initial, dict) else None
    action_id = str(e.get("action_id", ""))
    out = "".join(_choice(o, names, kind="radio", name=f"radio:{action_id}",
                          chosen=o.get("value") == chosen) for o in _options(e))
    return f'<span class="radios" data-action-id="{esc(action_id)}">{out}</span>'


def static_select(e: JSON) -> str:
    """A select menu: ``initial_option`` chosen, else its placeholder shown."""
    initial = e.get("initial_option")
    chosen = initial.get("value") if isinstance(initial, dict) else None
    out = ("" if chosen is not None else
           f'<option value="" disabled selected>{plain(e.get("placeholder")) or "Select"}'
           "</option>")
    for o in _options(e):
        selected = " selected" if o.get("value") == chosen else ""
        out += (f'<option value="{esc(o.get("value", ""))}"{selected}>'
                f'{plain(o.get("text"))}</option>')
    return (f'<select class="b-select" data-action-id="{esc(e.get("action_id", ""))}">'
            f"{out}</select>")


def button(e: JSON, names: Names) -> str:
    style = e.get("style") if e.get("style") in ("primary", "danger") else ""
    attrs = (f'type="button" class="btn {style}" data-action-id="{esc(e.get("action_id", ""))}"')
    url = e.get("url")
    if isinstance(url, str) and url.startswith(("http://", "https://")):
        attrs += f' data-url="{esc(url)}"'
    out = f"<button {attrs}>{plain(e.get('text'))}</button>"
    confirm = e.get("confirm")
    if isinstance(confirm, dict):
        ok_style = "danger" if confirm.get("style") == "danger" else "primary"
        out += (f'<dialog class="confirm"><h3>{plain(confirm.get("title"))}</h3>'
                f'<div class="text">{text_object(confirm.get("text"), names)}</div>'
                f'<div class="buttons"><button type="button" class="btn" data-confirm="no">'
                f'{plain(confirm.get("deny")) or "Cancel"}</button>'
                f'<button type="button" class="btn {ok_style}" data-confirm="yes">'
                f'{plain(confirm.get("confirm")) or "Yes"}</button></div></dialog>')
        return f'<span class="confirmable">{out}</span>'
    return out


# -- messages and views -----------------------------------------------------------------

def message(m: JSON, names: Names, *, author: str, ephemeral: bool = False,
            show_replies: bool = True) -> str:
    """One message as Slack shows it: author, time, blocks (or its text), reply count."""
    ts = str(m.get("ts", ""))
    body = (blocks(m["blocks"], names) if isinstance(m.get("blocks"), list) and m["blocks"]
            else f'<div class="text">{mrkdwn(str(m.get("text", "")), names)}</div>')
    for attachment in m.get("attachments") or []:
        if isinstance(attachment, dict):
            said = str(attachment.get("text") or attachment.get("fallback") or "")
            body += (f'<div class="attachment">{mrkdwn(said, names)}'
                     f"{blocks(attachment.get('blocks'), names)}</div>")
    meta = f'<span class="time">{esc(_clock(ts))}</span>'
    if m.get("edited"):
        meta += ' <span class="edited">(edited)</span>'
    if ephemeral:
        meta += ' <span class="only-you">Only visible to you</span>'
    replies = ""
    count = m.get("reply_count")
    if show_replies and isinstance(count, int) and count > 0:
        word = "reply" if count == 1 else "replies"
        replies = (f'<a href="#" class="replies" data-thread="{esc(ts)}">'
                   f"{count} {word}</a>")
    kind = "msg ephemeral" if ephemeral else "msg"
    flag = ' data-ephemeral="1"' if ephemeral else ""
    metadata = m.get("metadata")
    payload = metadata.get("event_payload") if isinstance(metadata, dict) else None
    if isinstance(payload, dict) and isinstance(payload.get("run_id"), str) \
            and m.get("thread_ts") in (None, ts):  # a run's thread parent: the page opens it
        flag += f' data-run="{esc(payload["run_id"])}"'
    edited = m.get("edited")
    if isinstance(edited, dict) and edited.get("ts"):  # which version the page shows
        flag += f' data-version="{esc(edited["ts"])}"'
    return (f'<div class="{kind}" data-ts="{esc(ts)}"{flag}>'
            f'<div class="who"><b>{esc(author)}</b> {meta}</div>{body}{replies}</div>')


def view(v: JSON, names: Names, *, errors: Mapping[str, str] | None = None,
         values: Mapping[str, Mapping[str, Any]] | None = None) -> str:
    """A modal (title, blocks with inline errors, Close and Submit) or an App Home view."""
    view_id = esc(v.get("id", ""))
    inner = blocks(v.get("blocks"), names, errors=errors, values=values)
    if v.get("type") != "modal":
        return f'<div class="home" data-view-id="{view_id}">{inner}</div>'
    close = plain(v.get("close")) or "Close"
    submit = (f'<button type="submit" class="btn primary" data-submit="1">'
              f'{plain(v.get("submit"))}</button>' if v.get("submit") else "")
    return (f'<form class="modal" data-view-id="{view_id}" '
            f'data-callback-id="{esc(v.get("callback_id", ""))}">'
            f'<header><h2>{plain(v.get("title"))}</h2></header>'
            f'<div class="modal-body">{inner}</div>'
            f'<footer><button type="button" class="btn" data-close="1">{close}</button>'
            f"{submit}</footer></form>")


def _clock(ts: str) -> str:
    try:
        return datetime.fromtimestamp(float(ts), UTC).strftime("%H:%M:%S")
    except (ValueError, OverflowError, OSError):
        return ""


def pretty(value: Any) -> str:
    """JSON for showing (``<pre>``), escaped."""
    return esc(json.dumps(value, indent=2, ensure_ascii=False))
