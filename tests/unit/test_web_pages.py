"""The web review queue's pure parts: pages escape agent-written text, forms bind the
digest, settings refuse what they cannot use with one line naming the variable."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from typing import Any

import pytest
from approvald.bot.config import load_settings
from approvald.bot.web import pages
from approvald.bot.web.auth import WebKeys
from approvald.bot.web.mail import SmtpTarget
from approvald.runtime.kernel import binding
from approvald.runtime.kernel.errors import ConfigError

from tests.unit.test_cards import NOW, approval, packet

HOSTILE = '<script>alert(1)</script>"><img src=x onerror=alert(2)>'


class Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


def parsed(html: str) -> list[tuple[str, dict[str, str | None]]]:
    p = Tags()
    p.feed(html)
    return p.tags


def test_agent_written_text_is_inert_everywhere_on_the_page() -> None:
    a = approval(args={"note": HOSTILE, "amount": 42},
                 packet_=packet(doing=HOSTILE, task=HOSTILE, impact=HOSTILE, why=HOSTILE,
                                agent=HOSTILE, evidence=[{"tool": HOSTILE, "result": HOSTILE}]),
                 requested_by=HOSTILE, tool="issue_refund")
    html = pages.queue([(a, 'tok"en')], user="U0BOB", csrf='cs"rf', now=NOW)
    tags = parsed(html)
    assert not [t for t, _ in tags if t in ("script", "img")]
    assert not [attrs for _, attrs in tags if any(k.startswith("on") for k in attrs)]
    assert HOSTILE not in html and "&lt;script&gt;" in html
    # the hidden fields carry exactly the values given, escaped in their attributes
    hidden = {attrs["name"]: attrs["value"] for t, attrs in tags
              if t == "input" and attrs.get("type") == "hidden"}
    assert hidden["csrf"] == 'cs"rf' and hidden["token"] == 'tok"en'
    assert hidden["digest"] == binding.shown(a.effective_digest)  # keyed, never plain


def test_the_page_shows_the_arguments_that_will_run_beside_the_asked_ones() -> None:
    a = approval(edited_args={"order": "1234", "amount": 10})
    html = pages.request_card(a, csrf="c", token=None, now=NOW)
    assert "Arguments as originally requested" in html
    assert "Arguments that will run (edited by U0CAROL)" in html
    # bound to the edited arguments, by their binding
    assert re.search(f'name="digest" value="{binding.shown("d2")}"', html)
    assert "&quot;amount&quot;: 10" in html and "&quot;amount&quot;: 42" in html
    assert 'name="token"' not in html  # no signer: the digest alone binds it


def test_keys_are_bound_to_their_purpose() -> None:
    keys = WebKeys("0123456789abcdef-secret")
    other = WebKeys("0123456789abcdef-other!")
    assert keys.link_token("L1") != keys.link_token("L2")
    assert keys.link_token("L1") != other.link_token("L1")
    assert keys.csrf("S1") != keys.pre_csrf("S1") != keys.link_token("S1")
    assert not WebKeys.same(None, keys.csrf("S1"))


def test_smtp_urls() -> None:
    t = SmtpTarget.parse("smtp://ana%40x:p%3Ass@mail.example.com")
    assert (t.host, t.port, t.username, t.password, t.tls) == (
        "mail.example.com", 587, "ana@x", "p:ss", "starttls")
    assert (SmtpTarget.parse("smtps://m.example.com").port,
            SmtpTarget.parse("smtps://m.example.com").tls) == (465, "implicit")
    assert SmtpTarget.parse("smtp+insecure://127.0.0.1:2525").tls == "none"
    assert SmtpTarget.parse("smtp+insecure://[::1]").port == 25
    assert SmtpTarget.parse("smtp+insecure://localhost").host == "localhost"
    # a named host, as the operator allowed it
    assert SmtpTarget.parse("smtp+insecure://relay.internal",
                            insecure_host="Relay.Internal").tls == "none"


@pytest.mark.parametrize(("url", "allowed", "said"), [
    ("smtp+insecure://u:hunter2@mail.example.com", None, "loopback"),
    ("smtp+insecure://u:hunter2@10.0.0.5", None, "loopback"),
    ("smtp+insecure://u:hunter2@relay.internal", "other.internal", "loopback"),
    ("smtp+plain://u:hunter2@127.0.0.1", None, "smtp+insecure://"),
])
def test_plain_smtp_elsewhere_stops_start_up(monkeypatch: Any, url: str,
                                             allowed: str | None, said: str) -> None:
    monkeypatch.setenv("APPROVALD_SMTP_URL", url)
    if allowed:
        monkeypatch.setenv("APPROVALD_SMTP_INSECURE_HOST", allowed)
    with pytest.raises(ConfigError) as err:
        load_settings()
    assert str(err.value).startswith("APPROVALD_SMTP_URL: ") and said in str(err.value)
    assert "hunter2" not in str(err.value) and "\n" not in str(err.value)


def test_a_named_insecure_host_is_allowed(monkeypatch: Any) -> None:
    monkeypatch.setenv("APPROVALD_SMTP_URL", "smtp+insecure://relay.internal:25")
    monkeypatch.setenv("APPROVALD_SMTP_INSECURE_HOST", "relay.internal")
    target = load_settings().smtp_target()
    assert target is not None and (target.host, target.tls) == ("relay.internal", "none")


@pytest.mark.parametrize(("var", "value", "said"), [
    ("APPROVALD_SMTP_URL", "http://user:hunter2@mail.example.com", "smtp://"),
    ("APPROVALD_PUBLIC_URL", "approvals.example.com", "http(s) URL"),
    ("APPROVALD_PUBLIC_URL", "https://a.example.com/?x=1", "http(s) URL"),
    ("APPROVALD_MAIL_FROM", "not an address", "address"),
    ("APPROVALD_APPROVER_EMAILS", "U_ALICE=alice", "SLACK_USER=ADDRESS"),
    ("APPROVALD_APPROVER_EMAILS", "alice=alice@example.com", "not a Slack user id"),
    ("APPROVALD_MAIL_FALLBACK_AFTER", "soon", "duration"),
    ("APPROVALD_MAIL_FALLBACK_AFTER", "0s", "positive"),
])
def test_bad_settings_stop_with_one_line(monkeypatch: Any, var: str, value: str,
                                         said: str) -> None:
    monkeypatch.setenv(var, value)
    with pytest.raises(ConfigError) as err:
        load_settings()
    assert str(err.value).startswith(f"{var}: ") and said in str(err.value)
    assert "hunter2" not in str(err.value)


def test_settings_read_the_address_book(monkeypatch: Any) -> None:
    monkeypatch.setenv("APPROVALD_APPROVER_EMAILS", " u_alice = alice@example.com ,U_BOB=b@x.org")
    monkeypatch.setenv("APPROVALD_PUBLIC_URL", "https://approvals.example.com/")
    s = load_settings()
    assert s.emails() == {"U_ALICE": "alice@example.com", "U_BOB": "b@x.org"}
    assert s.public_url == "https://approvals.example.com"


def test_the_mail_fallback_delay(monkeypatch: Any) -> None:
    from datetime import timedelta

    assert load_settings().mail_fallback_after_value() is None
    monkeypatch.setenv("APPROVALD_MAIL_FALLBACK_AFTER", "15m")
    assert load_settings().mail_fallback_after_value() == timedelta(minutes=15)
    monkeypatch.setenv("APPROVALD_MAIL_FALLBACK_AFTER", " ")
    assert load_settings().mail_fallback_after_value() is None


def test_a_policy_mails_requests_only_beside_its_card() -> None:
    from approvald.runtime.policies.policy import ApprovalPolicy
    from pydantic import ValidationError

    assert ApprovalPolicy().channels == ["slack"]
    assert ApprovalPolicy(channels=["slack", "email", "email"]).channels == ["slack", "email"]
    with pytest.raises(ValidationError, match='must include "slack"'):
        ApprovalPolicy(channels=["email"])
    with pytest.raises(ValidationError):
        ApprovalPolicy(channels=["slack", "pager"])  # type: ignore[list-item]


def test_a_mailed_request_is_plain_text_with_its_exact_arguments() -> None:
    a = approval(args={"note": HOSTILE, "amount": 42})
    text = pages.request_text(a, "https://approvals.example.com/review#r-x", slack=True)
    assert '"note": "<script>' in text  # plain text: shown as it is, nothing to render
    assert "https://approvals.example.com/review#r-x" in text and a.id in text


def test_pages_need_nothing_the_content_security_policy_blocks() -> None:
    """CSP is default-src 'none', style-src 'self': no inline style or script, no
    external asset, on any page."""
    a = approval()
    for html in (pages.queue([(a, "t")], user="U0BOB", csrf="c", now=NOW),
                 pages.sign_in_form("c"), pages.confirm_sign_in("tok", "c", "U0BOB"),
                 pages.message("x", "y", user="U0BOB", csrf="c")):
        tags = parsed(html)
        assert not [t for t, attrs in tags if "style" in attrs or t in ("script", "style")]
        assert [attrs.get("href") for t, attrs in tags if t == "link"] == ["/review/style.css"]
        assert not [t for t, attrs in tags if t in ("img", "iframe", "object")]


def test_the_queue_masks_sensitive_arguments_as_the_card_does() -> None:
    """Issues 34 and 35: a card number (detected) and a field the request declares
    sensitive never reach the page, in the arguments, the edit form or the packet."""
    import json as _json

    card = "4242 4242 4242 4242"
    base = _json.loads(approval().policy)
    a = approval(args={"card_number": card, "pin": "917364", "amount": 42},
                 packet_=packet(doing=f"refund to card {card}"),
                 policy={**base, "sensitive": ["pin"]})
    html = pages.request_card(a, csrf="c", token=None, now=NOW)
    assert "4242" in html and not re.search(r"4242\D{0,3}4242", html)
    assert "917364" not in html


def test_an_edits_account_lists_changed_fields_masked_where_sensitive() -> None:
    from approvald.runtime.requests.packet import MAX_CHANGES, edit_changes

    a = approval(policy={"approvers": ["U0BOB"], "sensitive": ["credentials.*"]})
    before = {"order": "1234", "amount": 42, "credentials": {"user": "u", "key": "k1"},
              "card": "4242 4242 4242 4242", "note": "same"}
    after = {"order": "1234", "amount": 21, "credentials": {"user": "u", "key": "k2"},
             "card": "4000 0566 5566 5556", "memo": "new"}
    changes, more = edit_changes(a, before, after)
    assert more == 0
    assert changes == [("amount", "42", "21"),
                       ("credentials.key", '"[masked]"', '"[masked]"'),
                       ("card", '"•••• 4242"', '"•••• 5556"'),
                       ("note", '"same"', None), ("memo", None, '"new"')]
    many = {f"f{i}": i for i in range(MAX_CHANGES + 3)}
    changes, more = edit_changes(a, {}, many)
    assert len(changes) == MAX_CHANGES and more == 3
    text = pages.edit_text(a, {"by": "U0CAROL", "via": "web", "at": NOW.isoformat(),
                               "mode": "approve", "digest": "abc", "previous_digest": "def",
                               "changes": [["amount", "42", "21"]], "more": 2,
                               "discarded": ["U0BOB"]}, "https://x/review/requests/1")
    assert text.startswith("U0CAROL edited the arguments of issue_refund (request "
                           f"{a.id}) on the web review queue at ")
    assert "  amount: 42 -> 21\n  (and 2 more)\n" in text
    assert "The edit is U0CAROL's approval of them." in text
    assert "Approvals given on the old arguments (U0BOB) no longer count." in text


@pytest.mark.parametrize("slack", [True, False])
def test_a_request_mail_names_slack_only_where_cards_go_to_slack(slack: bool) -> None:
    """Issue 48 item 6: with Slack off, the mail said "Or decide on its card in Slack"."""
    a = approval(tool="issue_refund")
    text = pages.request_text(a, "https://approvals.example/review/requests/a1", slack=slack)
    assert "Review and decide (sign-in needed): https://approvals.example/review/requests/a1" \
        in text
    assert ("card in Slack" in text) is slack
