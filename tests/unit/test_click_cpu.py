"""Issue 50: the click path's Python, cut with no change in what it produces.

The card's text fitting (``mrkdwn._fit``, ``units``) takes a whole-string path for text
that is shown as itself; these check it against the per-character walk it replaced, on
text chosen to hit each special case (escapes, bidi controls, surrogates, controls,
backtick runs, astral characters, combining marks at the cut).
"""

from __future__ import annotations

import random

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
