"""Issue 50: work an auto answer of the HTTP API's and the hook's faces no longer does.

Each cut is pinned by name: the function that did the work is not called (or not called
again) when an auto request is answered, and what the request gives is what it gave:

* a caller's JSON (a request's body, a hook's event) read with a decoder made for each
  text, through ``json.loads``'s three layers: read by a scanner made once per set of
  options (``runtime.kernel.json_input``), the same value or the same error;
* a token's tools (its JSON text) parsed, and each pattern matched, for every request:
  once per tools and tool (``api_tokens.allows``);
* the policy file's decision for a tool whose entry has no rules worked out again for
  every call (its entry's fields applied, its rules looked over): once per tool
  (``PolicyFile.for_call``), and the file's default once (``default_policy``);
* the outcome's name made by the enum's call and ``value``: looked up
  (``policy_outcome_value``);
* the source of a token's requests, and its via, agent and label, worked out for each
  request: once per credential (``Source.of_credential``);
* an empty packet encoded, measured and walked for its depth; a caller's tightening
  awaited when there is none; a webhook queued when there is none to queue;
* the audit entries' request paths looked for twice, and read, when no entry holds the
  arguments of a request (``AuditTrail._chain``); an answer's entries looked at as a
  request's decision (``ExternalRequests.follow``'s id check).
"""

from __future__ import annotations

import dis
import json
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

import pytest
from approvald.runtime.engine import Engine
from approvald.runtime.kernel.json_input import TooDeep
from approvald.runtime.kernel.json_input import loads as parse_caller_json
from approvald.runtime.kernel.vocabulary import (
    ANSWERED_AT_ONCE,
    OutcomeName,
    policy_outcome,
    policy_outcome_value,
)
from approvald.runtime.policies.policy import PolicyFile
from approvald.runtime.requests import api_tokens
from approvald.runtime.runs.external import NewRequest

from tests.helpers import create_token

POLICY = PolicyFile.model_validate({"tools": {"api:*/read_metrics": {"policy": "auto"},
                                              "api:*/drop_table": {"policy": "forbidden"}}})
KEYS = api_tokens.WebhookKeys("approvald-test-secret-0123456789")


def _name(frame: FrameType) -> str:
    """``module.py:qualified.name`` of the function ``frame`` runs."""
    return f"{Path(frame.f_code.co_filename).name}:{frame.f_code.co_qualname}"


def calls_during(work: Callable[[], Any]) -> tuple[Any, Counter[str]]:
    """``work()``'s result and every Python function it called, by qualified name (each
    call once: a coroutine resumed is not counted again)."""
    seen: Counter[str] = Counter()
    started: set[int] = set()

    def profile(frame: FrameType, what: str, arg: Any) -> None:
        if what == "call" and id(frame) not in started:
            if frame.f_code.co_flags & 0x380:  # a coroutine or generator: its first entry
                started.add(id(frame))
            seen[_name(frame)] += 1

    sys.setprofile(profile)
    try:
        out = work()
    finally:
        sys.setprofile(None)
    return out, seen


def _start(code: CodeType, first: dict[CodeType, int] = {}) -> int:  # noqa: B006
    """The offset of ``code``'s first RESUME: where a fresh frame stands when called (a
    coroutine resumed stands past it)."""
    at = first.get(code)
    if at is None:
        at = first[code] = next((i.offset for i in dis.get_instructions(code)
                                 if i.opname == "RESUME"), 0)
    return at


async def acalls_during(work: Callable[[], Any]) -> tuple[Any, Counter[str]]:
    """:func:`calls_during` for a coroutine's work: each function called, a coroutine
    counted when it starts (not each time it is resumed)."""
    seen: Counter[str] = Counter()

    def profile(frame: FrameType, what: str, arg: Any) -> None:
        if what == "call" and frame.f_lasti <= _start(frame.f_code):
            seen[_name(frame)] += 1

    sys.setprofile(profile)
    try:
        out = await work()
    finally:
        sys.setprofile(None)
    return out, seen


TEXTS = ['{"tool":"x","args":{"n":1.5}}', ' {"a":1}', '{"a":1} ', '', '\ufeff{}', '{"a":}',
         '[1,2', '{"a":NaN}', '"x"', '{"a":1}x', '1e400', '{"a":"\\u00e9"}']


def _not_json(token: str) -> Any:
    raise ValueError(f"{token} is not a JSON number")


@pytest.mark.parametrize("text", TEXTS)
def test_a_callers_json_reads_as_json_loads_reads_it(text: str) -> None:
    for kw in ({}, {"parse_constant": _not_json, "parse_float": float}):
        def said(read: Callable[[], Any]) -> tuple[str, Any]:
            try:
                return "value", read()
            except ValueError as exc:
                return type(exc).__name__, str(exc)
        ours = said(lambda: parse_caller_json(text, **kw))  # noqa: B023
        theirs = said(lambda: json.loads(text, **kw))  # noqa: B023
        assert repr(ours) == repr(theirs), (text, kw)
    with pytest.raises(TooDeep):
        parse_caller_json("[" * 5000)


def test_a_callers_json_is_read_without_a_decoder_made_for_it() -> None:
    kw: dict[str, Any] = {"parse_constant": _not_json, "parse_float": float}
    parse_caller_json('{"warm": 1}', **kw)
    out, seen = calls_during(lambda: parse_caller_json('{"tool":"x","args":{"n":2.5}}', **kw))
    assert out == {"tool": "x", "args": {"n": 2.5}}
    assert seen["decoder.py:JSONDecoder.__init__"] == 0, seen
    assert seen["json_input.py:loads"] == 1, seen
    assert seen["decoder.py:JSONDecoder.decode"] == 0, seen  # (the scanner alone)


def test_a_policy_outcome_is_looked_up() -> None:
    for kind in ANSWERED_AT_ONCE:
        assert policy_outcome(kind) is OutcomeName(kind)
        assert type(policy_outcome_value(kind)) is str
        assert policy_outcome_value(kind) == OutcomeName(kind).value
    for bad in ("approve_before", "nope"):
        with pytest.raises(ValueError):
            policy_outcome_value(bad)
        with pytest.raises(ValueError):
            policy_outcome(bad)
    _, seen = calls_during(lambda: policy_outcome_value("auto"))
    assert seen["enum.py:EnumType.__call__"] == 0, seen


async def test_an_auto_request_does_none_of_the_work_taken_off(
        make_engine: Callable[..., Engine]) -> None:
    engine = make_engine(policy=POLICY)
    token = (await create_token(engine, KEYS, "fleet", created_by="test", via="test",
                                tools=["read_*", "drop_table"])).record

    async def ask(i: int, tool: str = "read_metrics") -> dict[str, Any]:
        doc, new = await engine.open_request(token, NewRequest(
            tool=tool, args={"n": i}, requested_by="api:fleet"))
        assert new
        return doc

    await ask(0)  # warm: the policy's entry, the token's tools, the source
    doc, seen = await acalls_during(lambda: ask(1))
    assert doc["status"] == "approved" and doc["outcome"] == "auto", doc
    assert type(doc["outcome"]) is str
    assert doc["decision"]["decided_by"] == "policy", doc
    assert seen["external.py:ExternalRequests._open"] == 1, seen  # (coroutines counted)
    # the token's tools: not parsed again
    assert seen["__init__.py:loads"] == 0 and seen["api_tokens.py:_allows"] == 0, seen
    # the policy's decision for a tool with no rules: not worked out again
    assert seen["policy.py:PolicyFile._decide"] == 0, seen
    assert seen["policy.py:PolicyFile.entry"] == 0, seen
    assert seen["policy.py:PolicyFile._apply"] == 0, seen
    # the outcome's name, the source and its properties: looked up
    assert seen["enum.py:EnumType.__call__"] == 0, seen
    assert seen["intake.py:Source.of_credential"] == 0, seen
    assert seen["intake.py:Source.via"] == seen["intake.py:Source.agent"] == 0, seen
    # no packet, no tightening, no webhook: nothing done for them
    assert seen["intake.py:json_text"] == 1, seen  # the arguments'
    assert seen["intake.py:Intake.tighten"] == 0 \
        and seen["external.py:ExternalRequests._queue_webhook"] == 0, seen
    # no entry holds a request's arguments: no paths looked for, none read
    assert seen["audit.py:AuditTrail._wanted"] == 1, seen
    assert seen["audit.py:AuditTrail._unknown_paths"] == 0 \
        and seen["audit.py:AuditTrail._sensitive"] == 0, seen
    assert seen["ids.py:is_external"] == 0, seen
    # and what it answers is as before: the forbidden one too, and a tool not granted
    assert not api_tokens.allows(token, "deploy")
    refused = await ask(2, "drop_table")
    assert refused["status"] == "forbidden" and refused["outcome"] == "forbidden", refused
