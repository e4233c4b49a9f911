"""JSON as callers send it (issue 45): the reader every face parses with refuses JSON
nested deeper than it takes, however deep (the standard library's reader raises a
``RecursionError`` near 1,000 levels, and a walk of 900 levels fails somewhere else), and
the intake refuses a value nested past :data:`MAX_DEPTH`, for every way in."""

from __future__ import annotations

import json
from typing import Any

import pytest
from approvald.runtime.kernel.canonical import compact_json
from approvald.runtime.kernel.json_input import MAX_DEPTH, TooDeep, depth_over, loads
from approvald.runtime.policies.intake import IntakeError, check_json, json_text
from hypothesis import given
from hypothesis import strategies as st


def nested(depth: int, *, array: bool = False) -> str:
    return ("[" * depth + "1" + "]" * depth) if array else \
        ('{"a":' * depth + "1" + "}" * depth)


@pytest.mark.parametrize("depth", [MAX_DEPTH + 3, 900, 1000, 100_000])
@pytest.mark.parametrize("array", [False, True])
def test_the_reader_refuses_deep_json_naming_the_limit(depth: int, array: bool) -> None:
    with pytest.raises(TooDeep, match=f"nested deeper than {MAX_DEPTH + 2} levels"):
        loads(nested(depth, array=array))


def test_the_reader_takes_what_is_within_the_limit_and_is_json_loads_otherwise() -> None:
    assert loads(nested(MAX_DEPTH + 2)) == json.loads(nested(MAX_DEPTH + 2))
    assert loads(b'{"a": [1, 2.5, "x", null]}') == {"a": [1, 2.5, "x", None]}
    with pytest.raises(ValueError) as raised:
        loads("{not json")
    assert not isinstance(raised.value, TooDeep)
    assert loads(nested(5), max_depth=5) is not None
    with pytest.raises(TooDeep):
        loads(nested(6), max_depth=5)


def test_depth_counts_objects_and_arrays_not_scalars() -> None:
    assert not depth_over("x", 0) and not depth_over(1, 0)
    assert depth_over({}, 0) and not depth_over({}, 1)
    assert depth_over({"a": [1]}, 1) and not depth_over({"a": [1]}, 2)
    assert not depth_over([{"a": 1}, [2], 3], 2)


def test_the_intake_refuses_a_value_nested_past_the_limit() -> None:
    check_json(json.loads(nested(MAX_DEPTH)), "args")
    with pytest.raises(IntakeError, match=f"args: nested deeper than {MAX_DEPTH} levels") \
            as refused:
        check_json(json.loads(nested(MAX_DEPTH + 1)), "args")
    assert (refused.value.code, refused.value.field) == ("invalid_request", "args")


def test_the_reader_refuses_half_a_surrogate_pair() -> None:
    """``"\\ud800"`` is JSON, but no text: a digest of it (UTF-8) fails, a 500 on the API."""
    for text in ('{"a": "\\ud800"}', '{"\\udfff": 1}', b'["x", {"b": ["\\udbff"]}]'):
        with pytest.raises(ValueError, match="half of a UTF-16 surrogate pair"):
            loads(text)
    assert loads('{"a": "\\ud83d\\ude00 \\u00e9"}') == {"a": "\U0001f600 \u00e9"}


def test_the_intake_stores_what_it_checked_and_names_what_it_refuses() -> None:
    """The intake encodes a call's arguments once (checked, capped and stored from one
    text); what it refuses it still refuses naming the field: too deep, and a number JSON
    cannot round-trip, found where the encoder stopped."""
    value = {"b": [1, 2.5, "é", None], "a": {"z": True}}
    assert json_text(value, "args") == compact_json(value) \
        == '{"b":[1,2.5,"é",null],"a":{"z":true}}'
    with pytest.raises(IntakeError, match=f"args: nested deeper than {MAX_DEPTH} levels"):
        json_text(json.loads(nested(MAX_DEPTH + 1)), "args")
    for bad, where in (({"a": [1, float("nan")]}, "args.a[1]"),
                       ({"x": {"y": float("-inf")}}, "args.x.y")):
        with pytest.raises(IntakeError, match="a number JSON cannot round-trip") as refused:
            json_text(bad, "args")
        assert (refused.value.code, refused.value.field) == ("invalid_request", where)


def _depth(value: Any) -> int:
    """How deep ``value`` nests, as the definition says (recursive: small values only)."""
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list | tuple):
        return 1 + max(map(_depth, value), default=0)
    return 0


@given(st.recursive(st.none() | st.integers() | st.text(max_size=3),
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=2), inner, max_size=3), max_leaves=12),
       st.integers(0, 6))
def test_depth_over_is_the_depth_past_the_limit(value: Any, limit: int) -> None:
    assert depth_over(value, limit) == (_depth(value) > limit)
