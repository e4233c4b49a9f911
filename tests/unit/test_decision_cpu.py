"""What the auto decision's CPU cuts keep exactly as it was (issue 50,
``tests/benchmarks/bench_decision_cpu.py``): the JSON texts the encoders made once write,
the masks a remembered short text gets (and that a change of detectors is not answered
from memory), the masking walk's fast path for plain dicts and strings."""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any

import pytest
from approvald.runtime.kernel.canonical import canonical_json, compact_json
from approvald.runtime.policies import detectors
from approvald.runtime.policies.detectors import Detectors, mask_text
from approvald.runtime.policies.masking import Masking
from approvald.runtime.record.audit import recorded_details
from hypothesis import given
from hypothesis import strategies as st

CARD = "4242 4242 4242 4242"
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20)


@given(json_values)
def test_the_encoders_write_what_json_dumps_writes(value: Any) -> None:
    assert canonical_json(value) == json.dumps(value, sort_keys=True, separators=(",", ":"),
                                               ensure_ascii=False, allow_nan=False)
    assert compact_json(value) == json.dumps(value, separators=(",", ":"),
                                             ensure_ascii=False, allow_nan=False)


def test_the_encoders_still_refuse_what_json_cannot_say() -> None:
    for bad in (float("nan"), {"x": float("inf")}):
        with pytest.raises(ValueError):
            canonical_json(bad)
        with pytest.raises(ValueError):
            compact_json(bad)
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(ValueError):  # a circular value, as json.dumps says it
        compact_json(loop)


@given(st.text(max_size=80) | st.sampled_from([CARD, f"pay {CARD} now", "sk_live_abcdefgh12",
                                              "DE89 3704 0044 0532 0130 00", "ls -la /srv/1"]))
def test_a_remembered_mask_is_the_mask(text: str) -> None:
    for d in (Detectors(), Detectors.without(["card"]), Detectors(frozenset())):
        want = detectors.spliced(text, detectors._found(text, d)) \
            if detectors._HINT.search(text) else text
        assert mask_text(text, d) == want
        assert mask_text(text, d) == want  # asked again: from memory, the same


def test_the_detectors_in_force_are_part_of_what_is_remembered() -> None:
    before = detectors.active()
    try:
        assert mask_text(f"card {CARD}") == "card \u2022\u2022\u2022\u2022 4242"
        detectors.configure(Detectors.without(["card"]))  # the operator turned it off
        assert mask_text(f"card {CARD}") == f"card {CARD}"
        detectors.configure(Detectors())
        assert mask_text(f"card {CARD}") == "card \u2022\u2022\u2022\u2022 4242"
    finally:
        detectors.configure(before)


def test_a_long_text_is_masked_and_not_remembered() -> None:
    detectors._mask_short.cache_clear()
    long = "x-" * 400 + CARD
    assert mask_text(long).endswith("\u2022\u2022\u2022\u2022 4242")
    assert detectors._mask_short.cache_info().currsize == 0


class Text(str):
    pass


def test_the_walk_masks_plain_and_other_mappings_and_strings_alike() -> None:
    details = {"tool": "pay", "args": {"card": CARD, "note": f"to {CARD}", "n": 1},
               "list": [CARD, {"k": CARD}], "policy": "api:x/pay"}
    plain = Masking(["note"]).details(details)
    other = Masking(["note"]).details(OrderedDict(
        (k, OrderedDict(v) if isinstance(v, dict) else v) for k, v in details.items()))
    assert plain == other
    assert plain["args"]["note"] == "[masked]" and "4242 4242" not in json.dumps(plain)
    assert Masking().data(Text(CARD)) == Masking().data(CARD) == "\u2022\u2022\u2022\u2022 4242"
    assert recorded_details(details)["masked"].keys() == {"args", "list"}


def _tool(schema: dict[str, Any], description: str = "adds") -> Any:
    import mcp_types as types

    return types.Tool(name="add", description=description, input_schema=schema)


def test_a_tool_entry_is_checked_by_its_own_schema_once_and_a_new_listing_anew() -> None:
    from approvald.bot.mcp.upstream import Checked, Upstream, identity

    ints = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    strs = {"type": "object", "properties": {"n": {"type": "string"}}, "required": ["n"]}
    checked = Checked()
    first = _tool(ints)
    made, validator = checked.of(first)
    assert made == identity(first) and checked.of(first)[1] is validator  # once per entry
    assert Upstream.invalid(first, {"n": "x"}, validator) == Upstream.invalid(first, {"n": "x"})
    assert Upstream.invalid(first, {"n": 1}, validator) is None
    again = _tool(strs, "adds, now of strings")  # the server listed it anew, changed
    made, validator = checked.of(again)
    assert made == identity(again) != identity(first)
    assert Upstream.invalid(again, {"n": "x"}, validator) is None
    assert Upstream.invalid(again, {"n": 1}, validator) == Upstream.invalid(again, {"n": 1})
    checked.forget("add")  # no longer listed
    assert checked.of(first)[0] == identity(first)


@pytest.mark.parametrize(("text", "reads"), [
    ('args.command.startsWith("ls")', {"args"}), ('tool == "Bash"', {"tool"}),
    ("has(annotations.readOnlyHint)", {"annotations"}), ("true", set()),
    ('annotations["x"] == true ? tool == "a" : args.n > 1', {"annotations", "args", "tool"})])
def test_a_rule_is_handed_only_what_it_reads(monkeypatch: pytest.MonkeyPatch, text: str,
                                             reads: set[str]) -> None:
    """Issue 50: a condition's variables are converted to CEL's values on every call; one
    it never reads (a hook's rule on ``args`` handed ``tool`` and ``annotations``) is
    not handed to it, and what it yields is what it yields handed all three."""
    from approvald.runtime.policies import rules

    handed: list[set[str]] = []
    real = rules.compile_condition(text)

    class Seen:
        def execute(self, env: dict[str, Any]) -> Any:
            handed.append(set(env))
            return real.execute(env)

        def variables(self) -> list[str]:
            return list(real.variables())

    monkeypatch.setattr(rules, "compile_condition", lambda t: Seen())
    rules._reads.cache_clear()
    try:
        args, annotations = {"command": "ls -la", "n": 2}, {"x": True}
        got = rules.holds(text, "Bash", args, annotations)
    finally:
        rules._reads.cache_clear()
    assert handed == [reads]
    assert got == real.execute({"args": args, "tool": "Bash", "annotations": annotations})
