"""Detectors: secrets recognised wherever they appear, declared or not, and their masks.

A Luhn-valid card number, an IBAN whose check digits hold, a PEM private key, or an API
key of a well-known form is recognised in any text. Masking keeps what a person needs to
decide (``•••• 4242``, ``sk_live_…9f2a``, ``[private key, 3.2 kB]``, ``DE•• •••• 3000``)
and nothing that would let anyone use the value. Which detectors run is the operator's
(``APPROVALD_SECRET_DETECTORS_OFF``), set once per process with :func:`configure`.

What a call declares sensitive, and the one funnel that masks both together, is
:mod:`runtime.policies.sensitive`.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

DETECTOR_NAMES: tuple[str, ...] = ("card", "iban", "private_key", "api_key")
DOT = "\u2022"  # •
ELLIPSIS = "\u2026"  # …
MASKED = "[masked]"  # a declared value no detector recognises

# a card number: 13-19 digits, single spaces or dashes between; issuers' numbers start 2-6
# (so a 13-digit millisecond timestamp, which starts with 1, is not one)
_CARD = re.compile(r"(?<![\dA-Za-z])[2-6](?:[ -]?\d){12,18}(?![\dA-Za-z])")
_IBAN = re.compile(r"\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]){11,30}\b")
_PEM = re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----"
                  r"(?:.*?-----END [A-Z0-9 ]*PRIVATE KEY-----|.*\Z)", re.DOTALL)
# (prefix kept when masked, the rest): the forms well-known providers issue keys in
_KEY_FORMS: tuple[tuple[str, str], ...] = (
    ("sk_live_|sk_test_|rk_live_|rk_test_", "[A-Za-z0-9]{8,}"),  # Stripe
    ("AKIA", r"[0-9A-Z]{16}\b"),  # AWS access key id
    ("ghp_|gho_|ghs_|github_pat_", "[A-Za-z0-9_]{20,}"),  # GitHub
    ("xox[bpas]-", "[A-Za-z0-9-]{10,}"),  # Slack
    ("AIza", r"[0-9A-Za-z_\-]{35}"),  # Google
    ("apd_", r"[A-Za-z0-9_\-]{32,}"),  # approvald's own API tokens
)
_KEYS = re.compile("|".join(rf"\b(?P<k{i}>{pre}){rest}"
                            for i, (pre, rest) in enumerate(_KEY_FORMS)))
# what every text with a secret in it matches (most texts have none): one search a
# detector, not one of their alternation, which tried every detector at every character,
# about 2.5 times the CPU on a long text without a secret
_ANY = (re.compile("PRIVATE KEY-----"), _IBAN, _CARD, _KEYS)
# for each of _ANY, what every one of its finds holds: a literal, or a class of characters
# first and no lookaround before it, which the regex engine looks for a character at a
# time in C, where a lookaround or a ``\b`` first makes it try its whole pattern at each
# (issue 50: an audit entry's JSON searched in about a third of the CPU). Only a text one
# of them matches is searched with the detector's own
_HINTS = (_ANY[0], re.compile(r"[A-Z][A-Z]\d\d(?: ?[A-Z0-9]){11}"),
          re.compile(r"[2-6](?:[ -]?\d){12}"),
          re.compile("|".join(pre for pre, _ in _KEY_FORMS)))
_HINTED = tuple(zip(_HINTS, _ANY, strict=True))


def any_find(text: str) -> bool:
    """Whether any detector (of all four) finds something in ``text``."""
    for hint, search in _HINTED:  # (a loop, not any() over a generator: two calls fewer)
        if hint.search(text) and search.search(text):
            return True
    return False


@dataclass(frozen=True)
class Detectors:
    """The detectors that run (all of :data:`DETECTOR_NAMES` unless the operator turned
    some off)."""

    on: frozenset[str] = frozenset(DETECTOR_NAMES)

    @classmethod
    def without(cls, off: Iterable[str]) -> Detectors:
        """All detectors but ``off``; a ValueError names one that does not exist."""
        names = {n.strip().lower().replace("-", "_") for n in off if n.strip()}
        unknown = sorted(names - set(DETECTOR_NAMES))
        if unknown:
            raise ValueError(f"unknown detector {unknown[0]!r} (known: "
                             f"{', '.join(DETECTOR_NAMES)})")
        return cls(frozenset(DETECTOR_NAMES) - names)

    @classmethod
    def from_setting(cls, text: str | None) -> Detectors:
        """``APPROVALD_SECRET_DETECTORS_OFF``: comma-separated names, e.g. ``iban,card``."""
        return cls.without((text or "").split(","))


_active = Detectors()
_ALL = Detectors()  # every detector (what a declared value is masked with)


def configure(detectors: Detectors) -> None:
    """Set the detectors this process masks with (once, from the settings)."""
    global _active
    _active = detectors


def active() -> Detectors:
    """The detectors this process masks with."""
    return _active


# -- recognising -----------------------------------------------------------------------------

def luhn_ok(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def iban_ok(text: str) -> bool:
    s = text.replace(" ", "")
    if not 15 <= len(s) <= 34 or not s[:2].isalpha() or not s[2:4].isdigit():
        return False
    moved = s[4:] + s[:4]
    try:
        number = int("".join(str(int(c, 36)) for c in moved))
    except ValueError:
        return False
    return number % 97 == 1


def _card_mask(digits: str) -> str:
    return f"{DOT * 4} {digits[-4:]}"


def _iban_mask(compact: str) -> str:
    return f"{compact[:2]}{DOT * 2} {DOT * 4} {compact[-4:]}"


def _pem_mask(text: str) -> str:
    return f"[private key, {len(text.encode('utf-8')) / 1000:.1f} kB]"


def _key_mask(m: re.Match[str]) -> str:
    prefix = next(v for v in m.groupdict().values() if v)
    return f"{prefix}{ELLIPSIS}{m.group(0)[-4:]}"


def _cards(text: str) -> Iterable[tuple[int, int, str]]:
    """(start, end, mask) of each card number in ``text``: the longest Luhn-valid run of
    13-19 digits a match holds, ending where its digits end or at a separator."""
    for m in _CARD.finditer(text):
        span = m.group(0)
        ends = [i + 1 for i, ch in enumerate(span) if ch.isdigit()]
        for n in range(min(19, len(ends)), 12, -1):
            end = ends[n - 1]
            if end < len(span) and span[end].isdigit():
                continue  # cut inside a run of digits: not a number of its own
            digits = "".join(ch for ch in span[:end] if ch.isdigit())
            if luhn_ok(digits):
                yield m.start(), m.start() + end, _card_mask(digits)
                break


def _ibans(text: str) -> Iterable[tuple[int, int, str]]:
    for m in _IBAN.finditer(text):
        span = m.group(0)
        for end in range(len(span), 14, -1):  # a greedy match may take a word after it
            if span[end - 1] != " " and iban_ok(span[:end]):
                yield m.start(), m.start() + end, _iban_mask(span[:end].replace(" ", ""))
                break


def _found(text: str, detectors: Detectors) -> list[tuple[int, int, str]]:
    return _spans(text, detectors.on)


def _spans(text: str, on: frozenset[str]) -> list[tuple[int, int, str]]:
    """(start, end, mask) of each secret the detectors named ``on`` find in ``text``."""
    if not any_find(text):
        return []
    spans: list[tuple[int, int, str]] = []
    if "private_key" in on and "PRIVATE KEY-----" in text:
        spans += [(m.start(), m.end(), _pem_mask(m.group(0))) for m in _PEM.finditer(text)]
    if "api_key" in on:
        spans += [(m.start(), m.end(), _key_mask(m)) for m in _KEYS.finditer(text)]
    if "iban" in on:
        spans += list(_ibans(text))
    if "card" in on:
        spans += list(_cards(text))
    spans.sort(key=lambda s: (s[0], -s[1]))
    kept: list[tuple[int, int, str]] = []
    for s in spans:  # the first (and longest) of overlapping finds wins
        if not kept or s[0] >= kept[-1][1]:
            kept.append(s)
    return kept


# a JSON string's escapes: each stands for one character (a quote, a backslash, a slash, a
# control character), none of them a letter, a digit or ``_``
_ESCAPE = re.compile(r'\\(?:u[0-9A-Fa-f]{4}|.)')


def none_in_json(text: str) -> bool:
    """Whether no detector can find anything in any string (or number) of the value whose
    compact JSON (``ensure_ascii=False``) is ``text``: so masking it by the detectors
    alone changes nothing, and it need not be walked string by string (issue 50: an audit
    entry's details, most of them without a secret).

    Each string stands in the text as it is, between quotes, but for the characters JSON
    escapes (a quote, a backslash, a control character: ``\\"``, ``\\\\``, ``\\n``,
    ``\\u0007``): looked for with each escape as one space, a secret in a string is found
    in the text as well. No detector's find holds any of those characters
    (a card's digits and separators, an IBAN's letters, digits and spaces, a key's
    letters, digits, ``_`` and ``-``, ``PRIVATE KEY-----``), and where one stands next to
    a find, a space does as well: not a letter, a digit or ``_``, the detectors' bounds
    (issue 50: a rule's text and a shell command hold quotes, a file's content line
    breaks, and were walked for them). A space can join what the escaped character kept
    apart, or a find in the text be in no string (across two of them, in a key): that
    only says "not vouched for"."""
    return not any_find(_ESCAPE.sub(" ", text) if "\\" in text else text)


# what masking gives a value: masking it again changes nothing
_MASKED_FORM = re.compile(
    rf"{DOT}{{4}} \d{{4}}|{re.escape(MASKED)}|\[private key, \d+\.\d kB\]"
    rf"|[A-Z]{{2}}{DOT}{{2}} {DOT}{{4}} [A-Z0-9]{{4}}"
    rf"|(?:{'|'.join(pre for pre, _ in _KEY_FORMS)}){ELLIPSIS}.{{1,4}}")

def is_mask(text: str) -> bool:
    """Whether ``text`` is what masking gives a value (masking it again changes nothing)."""
    return bool(_MASKED_FORM.fullmatch(text))


# nothing any detector looks for can be in a text without one of these
_HINT = re.compile(r"\d|_|-|AIza|PRIVATE KEY")


def mask_text(text: str, detectors: Detectors | None = None) -> str:
    """``text`` with every secret a detector recognises replaced by its masked form."""
    if not _HINT.search(text):
        return text
    on = (detectors or _active).on
    if len(text) <= _SHORT:
        return _mask_short(text, on)
    return spliced(text, _spans(text, on))


# A short text's masked form is remembered, by the text and the detectors that ran (a
# pure function of both): a decision's two audit entries, its document and its card say
# the same names, ids and arguments again, and a fleet's calls repeat most of them
# (issue 50). Bounded in entries and in length, so at most a few MB. Keyed by the names
# of the detectors (a frozenset hashes in C, a dataclass in Python).
_SHORT = 512


@functools.lru_cache(maxsize=4096)
def _mask_short(text: str, on: frozenset[str]) -> str:
    return spliced(text, _spans(text, on))


def spliced(text: str, spans: Sequence[tuple[int, int, str]]) -> str:
    """``text`` with each of ``spans`` (start, end, mask: in order, not overlapping)
    replaced by its mask."""
    if not spans:
        return text
    out, pos = [], 0
    for start, end, mask in spans:
        out += [text[pos:start], mask]
        pos = end
    out.append(text[pos:])
    return "".join(out)


def mask_value(value: Any) -> Any:
    """A declared-sensitive value as a person sees it: the form a detector would give it
    (all detectors: the operator turns detection off, never masking of what is declared),
    ``•••• 1234`` for a number of 8 digits or more, else ``[masked]``. None stays None."""
    if value is None:
        return None
    if isinstance(value, str):
        if is_mask(value):
            return value  # masked already (a record masked when written, masked again)
        shown = mask_text(value, _ALL)
        if shown != value and _spans(value, _ALL.on)[0][:2] == (0, len(value)):
            return shown
        digits = "".join(ch for ch in value if ch.isdigit())
        if len(digits) >= 8 and len(digits) >= len(value.replace(" ", "").replace("-", "")):
            return _card_mask(digits)
        return MASKED
    if isinstance(value, int | float) and not isinstance(value, bool):
        digits = str(value).lstrip("-")
        if digits.isdigit() and len(digits) >= 8:
            return _card_mask(digits)
    return MASKED
