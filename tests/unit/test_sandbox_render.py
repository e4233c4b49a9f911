"""The sandbox page's Block Kit -> HTML renderer: every block the app builds is drawn, and
nothing in Slack text (least of all a tool argument) becomes markup."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from typing import Any

from approvald.bot.sandbox import render
from approvald.bot.slack import cards, messages, views
from approvald.runtime.kernel.vocabulary import WORDS

from tests.unit.test_cards import HOSTILE, NOW, TOKEN, approval, decided, packet, question, run

NAMES = render.Names(users={"U0ALICE": "Alice <A>", "U0BOB": "Bob"}, groups={"S0FIN": "finance"},
                     channels={"C1": "approvals"}, workspace_url="https://sandbox.slack.com/")


class _Tags(HTMLParser):
    """Every start tag and attribute, to check what markup a rendering holds."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


def tags(html: str) -> list[tuple[str, dict[str, str | None]]]:
    parser = _Tags()
    parser.feed(html)
    return parser.tags


SAFE_TAGS = {"div", "span", "b", "i", "s", "code", "pre", "br", "h2", "h3", "hr", "a", "time",
             "button", "dialog", "label", "textarea", "input", "form", "header", "footer",
             "blockquote", "ul", "ol", "li"}


def assert_safe(html: str) -> None:
    for tag, attrs in tags(html):
        assert tag in SAFE_TAGS, tag
        assert not any(name.startswith("on") for name in attrs), attrs
        if tag == "a":
            href = attrs.get("href") or ""
            assert href == "#" or href.startswith(("http://", "https://", "mailto:")), href


# -- mrkdwn -------------------------------------------------------------------------------

def test_mrkdwn_escapes_html_and_keeps_slack_entities_as_characters() -> None:
    out = render.mrkdwn("<script>alert(1)</script> &lt;b&gt; &amp; \" '", NAMES)
    assert "<script" not in out and "<b>" not in out
    assert "&lt;b&gt;" in out and "&amp;" in out and "&quot;" in out
    assert_safe(out)


def test_mrkdwn_styles_code_and_code_blocks() -> None:
    out = render.mrkdwn("*bold* _it_ ~gone~ `x < y` and\n```\n{\"a\": \"<b>\"}\n```", NAMES)
    assert "<b>bold</b>" in out and "<i>it</i>" in out and "<s>gone</s>" in out
    assert "<code>x &lt; y</code>" in out
    assert "<pre>{&quot;a&quot;: &quot;&lt;b&gt;&quot;}</pre>" in out
    # no styling inside code, and underscores inside words stay
    assert render.mrkdwn("`*no*` snake_case_name", NAMES) == \
        "<code>*no*</code> snake_case_name"


def test_mrkdwn_tokens_become_names_links_and_dates() -> None:
    out = render.mrkdwn("<@U0ALICE> <@U9|ghost> <!subteam^S0FIN> <!channel> <#C1> "
                        "<!date^1740831900^{date}|2025-03-01 12:25 UTC> "
                        "<https://example.com/a?b=1&amp;c=2|the docs>", NAMES)
    assert '<span class="mention user">@Alice &lt;A&gt;</span>' in out
    assert "@ghost" in out and "@finance" in out and "@channel" in out and "#approvals" in out
    assert '<time datetime="2025-03-01T12:25:00+00:00"' in out and "2025-03-01 12:25 UTC" in out
    assert ('<a href="https://example.com/a?b=1&amp;c=2" target="_blank" '
            'rel="noopener noreferrer">the docs</a>') in out
    assert_safe(out)


def test_only_web_links_are_links_and_workspace_permalinks_open_on_the_page() -> None:
    out = render.mrkdwn("<javascript:alert(1)|click> <data:text/html,x|y>", NAMES)
    assert "<a" not in out and "&lt;javascript:alert(1)|click&gt;" in out
    link = render.mrkdwn("<https://sandbox.slack.com/archives/C1/p1700000000000100"
                         "?thread_ts=1700000000.000050&cid=C1|thread>", NAMES)
    assert 'data-channel="C1"' in link and 'data-thread="1700000000.000050"' in link
    top = render.mrkdwn("<https://sandbox.slack.com/archives/C1/p1700000000000100|card>", NAMES)
    assert 'data-thread="1700000000.000100"' in top
    quoted = render.mrkdwn('<https://x.example/"onmouseover="alert(1)|x>', NAMES)
    assert_safe(quoted)
    assert 'href="https://x.example/&quot;onmouseover=&quot;alert(1)"' in quoted


def drawn_emoji(out: str) -> list[str]:
    return re.findall(r'<span class="emoji"[^>]*>([^<]*)</span>', out)


def test_emoji_shortcodes() -> None:
    out = render.mrkdwn(":white_check_mark: :no_such_emoji:", NAMES)
    assert drawn_emoji(out) == ["✅"] and out.endswith(" :no_such_emoji:")
    assert 'data-text="white check mark"' in out  # the words, where no font draws it
    out = render.text_object({"type": "plain_text", "text": ":x: <i>", "emoji": True}, NAMES)
    assert drawn_emoji(out) == ["❌"] and out.endswith(" &lt;i&gt;")


# ``:name:`` in the product's strings; not a docstring role (``:class:`X```)
_SHORTCODE = re.compile(r"(?<![\w:/]):([a-z0-9_+-]+):(?![\w/`])")


def product_shortcodes() -> dict[str, str]:
    """Every emoji shortcode in a string of the product (not the sandbox), and where."""
    import ast
    from pathlib import Path

    import approvald

    found: dict[str, str] = {}
    root = Path(approvald.bot.__file__).parent.parent  # the installed package's folders
    for face in (root / "bot", root / "runtime"):
        for path in face.rglob("*.py"):
            if "sandbox" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    for m in _SHORTCODE.finditer(node.value):
                        found.setdefault(m.group(1), str(path))
    for w in WORDS.values():  # an outcome's emoji is named without colons, drawn with them
        found.setdefault(w.emoji, f"runtime/kernel/vocabulary.py ({w.name})")
    return found


def test_every_emoji_the_product_sends_is_drawn_with_its_meaning() -> None:
    """Slack draws every shortcode the product sends; so does the page (issue 33 item 5:
    a redirected card showed ``:leftwards_arrow_with_hook:``), with words for a browser
    that has no glyph for it."""
    codes = product_shortcodes()
    assert {"white_check_mark", "leftwards_arrow_with_hook", "hourglass"} <= codes.keys()
    for name, where in sorted(codes.items()):
        out = render.mrkdwn(f"a :{name}: b", NAMES)
        assert f":{name}:" not in out, f":{name}: (sent by {where}) is not drawn"
        [char] = drawn_emoji(out)
        assert char and re.search(r'data-text="[^":]+"', out), name


def test_hostile_tool_arguments_on_a_card_stay_text() -> None:
    card = cards.approval_card(approval(args={"note": HOSTILE, "html": "<img src=x onerror=1>"}),
                               token=TOKEN, now=NOW)
    out = render.blocks(card["blocks"], NAMES)
    assert_safe(out)
    assert "<img" not in out and "onerror=1&gt;" in out
    # the escaped pings in the arguments are shown, never drawn as mentions or links
    assert "@channel" not in re.sub(r"&lt;!channel&gt;", "", out)
    assert "evil" not in "".join(a.get("href") or "" for _, a in tags(out))


# -- blocks --------------------------------------------------------------------------------

def test_pending_card_draws_header_sections_context_and_buttons_with_confirm() -> None:
    card = cards.approval_card(approval(packet_=packet(risk="high")), token=TOKEN, now=NOW)
    out = render.blocks(card["blocks"], NAMES)
    assert_safe(out)
    assert '<div class="b b-header"><h3>' in out and '<div class="b b-section">' in out
    assert '<div class="b b-context">' in out and '<div class="b b-actions">' in out
    found = {a["data-action-id"]: a for t, a in tags(out)
             if t == "button" and "data-action-id" in a}
    assert set(found) == {cards.APPROVE, cards.STANDING, cards.DENY, cards.EDIT,
                          cards.REDIRECT}
    assert "primary" in (found[cards.APPROVE]["class"] or "")
    assert "danger" in (found[cards.DENY]["class"] or "")
    # the button's value (its token) is not put on the page: the server reads it
    assert TOKEN not in out
    # a high-risk Approve asks first, in a dialog with Slack's confirm texts
    assert '<span class="confirmable">' in out and '<dialog class="confirm">' in out
    assert 'data-confirm="yes"' in out and 'data-confirm="no"' in out


def test_decided_and_question_cards_draw() -> None:
    for record in (decided("approved"), decided("denied", reason="<b>no</b>"),
                   decided("expired"), question()):
        card = cards.approval_card(record, token=TOKEN, now=NOW)
        out = render.blocks(card["blocks"], NAMES)
        assert_safe(out)
        assert "b-unknown" not in out
    denied = render.blocks(cards.approval_card(decided("denied", reason="<b>no</b>"),
                                               token=TOKEN, now=NOW)["blocks"], NAMES)
    assert "&lt;b&gt;no&lt;/b&gt;" in denied and "data-action-id" not in denied
    asked = render.blocks(cards.approval_card(question(), token=TOKEN, now=NOW)["blocks"],
                          NAMES)
    assert {cards.RETRY, cards.MARK_DONE, cards.ABORT} <= {
        a.get("data-action-id") for t, a in tags(asked) if t == "button"}


def test_section_fields_accessory_divider_image_rich_text_and_unknown_blocks() -> None:
    out = render.blocks([
        {"type": "section", "fields": [{"type": "mrkdwn", "text": "*a*"},
                                       {"type": "plain_text", "text": "<b>"}],
         "accessory": {"type": "button", "action_id": "x", "text": {"type": "plain_text",
                                                                    "text": "Go"}}},
        {"type": "divider"},
        {"type": "image", "image_url": "https://x.example/i.png", "alt_text": "<chart>"},
        {"type": "rich_text", "elements": [
            {"type": "rich_text_section", "elements": [
                {"type": "text", "text": "<hi>", "style": {"bold": True}},
                {"type": "user", "user_id": "U0BOB"},
                {"type": "link", "url": "javascript:alert(1)", "text": "bad"},
                {"type": "emoji", "name": "tada"}]},
            {"type": "rich_text_list", "style": "ordered", "elements": [
                {"type": "rich_text_section", "elements": [{"type": "text", "text": "one"}]}]},
            {"type": "rich_text_preformatted", "elements": [{"type": "text", "text": "<x>"}]},
            {"type": "rich_text_quote", "elements": [{"type": "text", "text": "q"}]}]},
        {"type": "video", "title": "?"},
        "not a block",
    ], NAMES)
    assert_safe(out)
    assert '<div class="fields"><div class="field"><b>a</b></div>' in out
    assert '<div class="field">&lt;b&gt;</div>' in out
    assert '<div class="accessory"><button' in out and "<hr>" in out
    assert "[image: &lt;chart&gt;]" in out and "<img" not in out  # never fetched
    assert "<b>&lt;hi&gt;</b>" in out and "@Bob" in out and "🎉" in out
    assert "javascript" not in out and "bad" in out
    assert "<ol><li><div>one</div></li></ol>" in out and "<pre>&lt;x&gt;</pre>" in out
    assert "<blockquote>q</blockquote>" in out
    assert '<div class="b-unknown">[video block]</div>' in out


# -- views and messages --------------------------------------------------------------------

def test_deny_modal_with_an_inline_error_and_what_was_typed() -> None:
    modal = views.deny_modal("a" * 32, TOKEN, "C1", "1.2", tool="issue_refund")
    modal["id"] = "V1"
    out = render.view(modal, NAMES, errors={cards.REASON_BLOCK: "Say <why>"},
                      values={cards.REASON_BLOCK: {cards.REASON_INPUT: "</textarea><b>"}})
    assert_safe(out)
    assert '<form class="modal" data-view-id="V1"' in out and "<h2>Deny request</h2>" in out
    assert f'data-block-id="{cards.REASON_BLOCK}"' in out
    assert f'data-action-id="{cards.REASON_INPUT}"' in out
    assert '<div class="input-error" role="alert">Say &lt;why&gt;</div>' in out
    assert "&lt;/textarea&gt;&lt;b&gt;</textarea>" in out
    assert 'data-submit="1">Deny</button>' in out and 'data-close="1">Cancel</button>' in out
    assert TOKEN not in out  # private_metadata stays on the server


def test_edit_modal_shows_the_arguments_and_schema_errors() -> None:
    modal = views.edit_modal(approval(args={"amount": "<b>42</b>"}), TOKEN, "C1", "1.2")
    errors = views.edit_errors([{"loc": ["amount"], "msg": "Input should be a valid integer"}])
    out = render.view({**modal, "id": "V2"}, NAMES, errors=errors["errors"])
    assert_safe(out)
    assert "<textarea" in out and "&lt;b&gt;42&lt;/b&gt;" in out
    assert "valid integer" in out and 'class="hint"' in out


def test_home_view_args_modal_and_list_message_draw() -> None:
    pending = [(approval(), TOKEN)]
    home = views.home_view(pending, [decided("approved")], now=NOW)
    out = render.view({**home, "id": "V3"}, NAMES)
    assert_safe(out)
    assert out.startswith('<div class="home" data-view-id="V3">') and "b-unknown" not in out
    args = render.view({**views.args_modal(approval(args={"x": HOSTILE})), "id": "V4"}, NAMES)
    assert_safe(args)
    listing = views.approvals_list_message(pending, now=NOW)
    assert_safe(render.blocks(listing["blocks"], NAMES))


def test_messages_show_author_edit_mark_replies_and_only_visible_to_you() -> None:
    r = run("awaiting_approval")
    parent: dict[str, Any] = {"ts": "1700000000.000100", "text": "<b>fallback</b>",
                              "reply_count": 2, "edited": {"ts": "1"}}
    out = render.message(parent, NAMES, author="approvald <app>")
    assert_safe(out)
    assert "approvald &lt;app&gt;" in out and "(edited)" in out and "&lt;b&gt;" in out
    assert 'class="replies" data-thread="1700000000.000100">2 replies</a>' in out
    eph = render.message({"ts": "1700000000.000200", "text": "no"}, NAMES, author="app",
                         ephemeral=True)
    assert 'class="msg ephemeral"' in eph and "Only visible to you" in eph
    thread_parent = render.message({"ts": "1.000001", **messages.run_parent(r, now=NOW)}, NAMES,
                                   author="app")
    assert_safe(thread_parent)
    assert "b-unknown" not in thread_parent and "Refund &lt;!channel&gt; order" in thread_parent
