"""Issue 50: the Slack face's Python per approval, cut with no change in what it sends.

Each cut is pinned twice: what it produces is what the slower way produced (for every
value a property test can think of), and the calls it saves stay saved (exact counts,
taken with ``sys.setprofile``, never timings).
"""

from __future__ import annotations

import json
import math
import sys
from collections import Counter
from typing import Any

from approvald.bot.slack import cards
from approvald.bot.slack.mrkdwn import pretty_dumps
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.test_cards import NOW, TOKEN, approval, decided


def _calls_during(fn: Any, *args: Any, **kwargs: Any) -> Counter[str]:
    """The Python functions ``fn(*args, **kwargs)`` called, by name, as
    ``module:function``."""
    seen: Counter[str] = Counter()

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            seen[f"{frame.f_globals.get('__name__')}:{frame.f_code.co_name}"] += 1

    sys.setprofile(profile)
    try:
        fn(*args, **kwargs)
    finally:
        sys.setprofile(None)
    return seen


def _dumps(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


# keys and strings that need escapes: quotes, backslashes, controls, bidi controls, lone
# surrogates, astral characters, line separators
TEXT = st.text(st.one_of(st.characters(), st.sampled_from(
    ['"', "\\", "\n", "\x00", "\x1f", "\x7f", "\u2028", "\u202e", "\ud800", "\udfff", "😀",
     "é", ",", ":", "{", "[", " "])), max_size=12)
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.integers(-2**80, 2**80),
                    st.floats(allow_nan=True, allow_infinity=True), TEXT)
JSON = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=5), st.dictionaries(TEXT, inner, max_size=5)), max_leaves=40)


@settings(max_examples=500, deadline=None)
@given(JSON)
def test_pretty_dumps_is_json_dumps_indented_for_every_json_value(value: Any) -> None:
    assert pretty_dumps(value) == _dumps(value)


@settings(max_examples=300, deadline=None)
@given(st.recursive(
    st.one_of(SCALARS, st.just(NOW), st.just(b"x"), st.just(math.pi)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.lists(inner, max_size=4).map(tuple),
        st.dictionaries(st.one_of(TEXT, st.integers(), st.floats(), st.booleans(),
                                  st.none()), inner, max_size=4)), max_leaves=20))
def test_pretty_dumps_is_json_dumps_indented_beyond_json_too(value: Any) -> None:
    """Tuples, keys that are numbers, true or null, values that ``default=str`` turns into
    text: what json.dumps writes of them too."""
    assert pretty_dumps(value) == _dumps(value)


def test_pretty_dumps_leaves_the_rest_to_json_dumps_and_raises_what_it_raises() -> None:
    class Sub(dict[str, Any]):
        pass

    class Items(list[Any]):  # json's Python encoder iterates it; its C one would not
        def __iter__(self) -> Any:
            return iter([9])

    for value in (Sub(a=[1]), [Sub(a=1)], {"a": Items([1, 2])}, {1: [2]}, [{None: [2]}]):
        assert pretty_dumps(value) == _dumps(value)
    cycle: list[Any] = [1]
    cycle.append(cycle)
    for bad in (cycle, {"a": cycle}, {(1, 2): 1}, {"a": [{(1, 2): [1]}]}):
        raised: list[tuple[type, str]] = []
        for dumps in (_dumps, pretty_dumps):
            try:
                dumps(bad)
            except (TypeError, ValueError) as exc:
                raised.append((type(exc), str(exc)))
        assert len(raised) == 2 and raised[0] == raised[1], (bad, raised)


PURE_PYTHON_ENCODER = {f"json.encoder:{name}" for name in (
    "_make_iterencode", "_iterencode", "_iterencode_dict", "_iterencode_list")}


def test_a_card_s_arguments_are_written_by_json_s_c_encoder() -> None:
    """The card's pretty arguments do not run json's pure-Python encoder (json.dumps with
    ``indent`` does: a generator resumed for every piece), and read as they did."""
    args = {"order": "1234", "amount": 40.5, "note": "é \u202e <b>", "items": [
        {"sku": "a", "qty": 2}, {"sku": "b", "tags": []}], "ok": True, "none": None}
    raw = json.dumps(args)
    assert cards.args_text(raw) == cards.json_escapes(_dumps(args))
    for a in (approval(args=args), decided("approved")):
        seen = _calls_during(cards.approval_card, a, token=None, now=NOW)
        assert not set(seen) & PURE_PYTHON_ENCODER, seen
    live = approval(args=args)
    seen = _calls_during(cards.approval_card, live, token=TOKEN, now=NOW)
    assert not set(seen) & PURE_PYTHON_ENCODER, seen
