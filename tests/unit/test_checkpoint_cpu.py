"""What the checkpoint's CPU cuts keep exactly as it was (issues 47 and 50,
``tests/benchmarks/bench_checkpoint.py``): the journal of a step's reply is written where an
intent is, and made nowhere else; the masking walk's branch for no declared path masks as
the general walk does; an executed entry quotes the result as decoded; a payload encodes as
its fields."""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import asdict
from typing import Any

import pytest
from approvald.runtime.kernel.canonical import compact_json
from approvald.runtime.kernel.outcomes import Completed, NeedsAttention
from approvald.runtime.models.base import AssistantMessage
from approvald.runtime.policies.masking import Masking
from approvald.runtime.record import outbox_kinds
from approvald.runtime.record.audit import recorded_details, result_excerpt
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.unit.test_ledger import charge_agent, crash_then_resume

CARD = "4242 4242 4242 4242"
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text() | st.sampled_from([CARD, f"pay {CARD}", "sk_live_abcdefgh12", 4242424242424242]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20)


class Text(str):
    pass


# what the walks meet besides JSON's own types: tuples, other mappings, str subclasses
shaped = st.recursive(
    json_values | st.builds(Text, st.sampled_from(["x", CARD])),
    lambda inner: st.lists(inner, max_size=3).map(tuple)
    | st.dictionaries(st.text(max_size=3), inner, max_size=3).map(OrderedDict),
    max_leaves=12)


@settings(deadline=None)  # (a shared machine: no time limit per example)
@given(st.dictionaries(st.sampled_from(["tool", "args", "result", "status", "note", "list"]),
                       shaped, max_size=6))
@example({"tool": CARD, "note": CARD, "result": f"pay {CARD}", "args": {"n": 4242424242424242},
          "list": (CARD, None, True, 1.5)})
def test_details_with_nothing_declared_are_masked_as_by_the_walk_of_paths(
        details: dict[str, Any]) -> None:
    """The branch for no declared path gives what the walk of a path that never matches
    gives (the general walk), every value masked by the detectors all the same."""
    assert Masking().details(details) == Masking(["nowhere.at_all"]).details(details)
    assert recorded_details(details) == recorded_details(details, ["nowhere.at_all"])


@settings(deadline=None)  # (a shared machine: no time limit per example)
@given(shaped)
@example(CARD)
@example(OrderedDict(a=(CARD, Text(CARD), [4242424242424242, False])))
def test_data_is_masked_as_by_the_walk_of_paths(value: Any) -> None:
    assert Masking().data(value) == Masking(["nowhere"]).args(value)
    declared = Masking(["a"], ["hunter2-secret"])
    assert declared.data(value) == declared.args({"z": value})["z"]


def test_a_result_quoted_from_what_the_model_read_is_the_result_decoded() -> None:
    value = {"charged": 500, "card": CARD}
    text = compact_json(value)
    assert result_excerpt(text, value) == result_excerpt(text) == value
    long = compact_json({"pad": "x" * 600})
    assert result_excerpt(long, json.loads(long)) == result_excerpt(long) == long[:500] + "…"


def test_a_payload_encodes_as_its_fields_in_order_none_left_out() -> None:
    payloads = [
        outbox_kinds.Notice(run_id="r", call_id="c", args={"b": [1, (2, 3)], "a": None},
                            seq=3, sensitive=["a"]),
        outbox_kinds.RequestDecided(run_id="r"),
        outbox_kinds.RequestMail(approval_id="a", fallback=True),
        outbox_kinds.EditMail(approval_id="a", by="U", via="slack", at="t", mode="m",
                              previous_digest="p", digest="d", changes=[["x", 1, 2]],
                              more=0, discarded=[]),
    ]
    for p in payloads:
        assert p.encode() == compact_json(
            {k: v for k, v in asdict(p).items() if v is not None})


def _count_dumps(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    made = [0]
    dump = AssistantMessage.model_dump

    def counted(self: AssistantMessage, *args: Any, **kw: Any) -> Any:
        made[0] += 1
        return dump(self, *args, **kw)
    monkeypatch.setattr(AssistantMessage, "model_dump", counted)
    return made


async def test_a_step_that_writes_no_intent_journals_nothing(make_engine, monkeypatch):
    """An idempotent call's step writes no intent (its checkpoint is its one commit), and
    the final answer's step runs no call: neither makes the journal text of its reply."""
    made = _count_dumps(monkeypatch)
    calls: list[dict[str, Any]] = []
    engine = make_engine(agents=[charge_agent(calls, idempotent=True)])
    outcome = await engine.run("charger", "charge", requested_by="U_DANA")
    assert isinstance(outcome, Completed) and len(calls) == 1
    assert made[0] == 2  # each reply once: its event in the checkpoint, no journal


async def test_a_step_whose_call_writes_an_intent_journals_its_reply_with_it(make_engine):
    """The intent of a side effect carries the step's reply: a crash after it resumes from
    the journal (the call's outcome unknown), never from a new model reply."""
    calls: list[dict[str, Any]] = []
    agent = charge_agent(calls)
    engine = make_engine(agents=[agent])
    run_id = await crash_then_resume(engine, "after_intent")
    before = agent.model.calls  # type: ignore[attr-defined]
    outcome = await engine.advance(run_id)
    assert isinstance(outcome, NeedsAttention) and outcome.call_id == "call_0_0"
    assert agent.model.calls == before and calls == []  # type: ignore[attr-defined]

