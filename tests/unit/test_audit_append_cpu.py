"""Issue 50: what an approval's CPU cuts keep exactly as it was. The JSON read back by one
call into the C scanner (``store.jsontext.loads``) and written by one into the C encoder
(``canonical_json``, ``compact_json``); an audit entry's details with nothing to mask put
in JSON once and recorded as they are, not walked value by value
(``audit.recorded_text``); a call's latency kept to the microsecond."""

from __future__ import annotations

import collections
import json
import sys
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
from approvald.runtime.approvals.decide import Actor
from approvald.runtime.engine import assemble
from approvald.runtime.kernel.canonical import canonical_json, compact_json
from approvald.runtime.kernel.outcomes import Completed, Paused
from approvald.runtime.policies import detectors
from approvald.runtime.policies.detectors import mask_text, none_in_json
from approvald.runtime.policies.masking import Masking
from approvald.runtime.record import audit
from approvald.runtime.record.audit import recorded_details, recorded_text
from approvald.runtime.runs.agent import Registry
from approvald.runtime.runs.demo import REFUND_POLICY, DemoLedger, refund_agent
from approvald.store import jsontext
from approvald.store.db import Database
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.conftest import SIGNER
from tests.helpers import Rows
from tests.unit.test_decisions import card_token

CARD = "4242 4242 4242 4242"
SECRETS = [CARD, f"pay {CARD}", "sk_live_abcdefgh12", "DE89 3704 0044 0532 0130 00",
           4242424242424242, f"line\n{CARD}", f"tab\t{CARD}", f'"{CARD}"', f"\\{CARD}",
           "-----BEGIN RSA PRIVATE KEY-----\nabc\n-----END RSA PRIVATE KEY-----",
           "AKIA0123456789ABCDEF", "0.4242424242424242"]
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text() | st.sampled_from(SECRETS),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20)
# what details meet besides JSON's own types: tuples and other mappings
shaped = st.recursive(
    json_values,
    lambda inner: st.lists(inner, max_size=3).map(tuple)
    | st.dictionaries(st.text(max_size=3), inner, max_size=3).map(OrderedDict),
    max_leaves=12)
KEYS = ["tool", "args", "edited_args", "result", "status", "note", "scope_value", "policy"]


@settings(deadline=None)  # (a shared machine: no time limit per example)
@given(st.dictionaries(st.sampled_from(KEYS), shaped, max_size=6),
       st.sampled_from([(), ("card",), ("*",), ("a.*",)]))
@example({"note": f"line\n{CARD}"}, ())  # a control character escaped before a secret
@example({"note": f"\x07{CARD}"}, ())
@example({"result": "DE89 3704 0044 0532 0130 00\n"}, ())
@example({"args": {"card": "hunter2-secret"}, "note": "hunter2-secret"}, ("card",))
@example({"tool": "pay", "latency_ms": 0.4242424242424242}, ())
@example({"approvers": ("U_ALICE",), "args": {"to": ("a", "b")}}, ())  # copied, not masked
def test_details_are_recorded_as_masking_them_would_record_them(
        details: dict[str, Any], sensitive: tuple[str, ...]) -> None:
    """Details recorded as they are (nothing declared applies, the detectors find nothing
    in their JSON) are exactly what the masking walk records."""
    assert recorded_text(details, sensitive) == compact_json(recorded_details(details, sensitive))


def _spy(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> collections.Counter[str]:
    """Count ``owner.name``'s calls by the module that made them (past ``json``'s own)."""
    calls: collections.Counter[str] = collections.Counter()
    real = getattr(owner, name)

    def counted(*args: Any, **kw: Any) -> Any:
        f = sys._getframe(1)
        while f.f_back is not None and f.f_globals.get("__name__", "").startswith("json"):
            f = f.f_back
        calls[f.f_globals.get("__name__", "?")] += 1
        return real(*args, **kw)
    monkeypatch.setattr(owner, name, counted)
    return calls


def test_plain_details_are_recorded_without_the_walk(monkeypatch) -> None:
    walks = _spy(monkeypatch, Masking, "details")
    plain = {"tool": "deploy", "args": {"service": "web"}, "approvers": ["U_ALICE"],
             "quorum": 1, "edited": False, "outcome": "approved", "latency_ms": 0.119,
             "card_posted": {"channel": "C1", "ts": "1796629070.391717",
                             "at": "2026-12-07T07:37:50.391717+00:00"}}
    assert recorded_text(plain) == compact_json(plain)
    no_args = {k: v for k, v in plain.items() if k != "args"}  # the paths are under none
    assert recorded_text(no_args, ["card"]) == compact_json(no_args)
    assert not walks
    # nor a text with escapes in it: a rule's quotes, a command's, a file's line breaks
    # (issue 50: a hook's auto decision on a rule walked both its entries for the quotes)
    rule = {"tool": "Bash", "args": {"command": 'grep -n "todo" a\\b.py'},
            "rule": 'tools.hook:claude-code/Bash.rules[0]: args.command.startsWith("ls")',
            "note": "a\nb\tc\x07"}
    assert recorded_text(rule) == compact_json(rule)
    assert not walks
    # walked: a text a detector finds something in, escaped or not
    assert json.loads(recorded_text({"tool": CARD}))["tool"] == "\u2022\u2022\u2022\u2022 4242"
    assert json.loads(recorded_text({"note": f'a\n"{CARD}"'}))["note"] == \
        'a\n"\u2022\u2022\u2022\u2022 4242"'
    assert walks["approvald.runtime.policies.sensitive"] == 2


# what a string holds around a secret: the characters JSON escapes, and those a detector's
# find may hold or stand next to
PIECES = ["\"", "\\", "\n", "\t", "\x07", "\x1f", "/", " ", "-", "_", "a", "Z", "7", "é",
          "u0041", "PRIVATE", " KEY-----"]


@settings(deadline=None)
@given(st.lists(st.sampled_from(PIECES) | st.sampled_from(SECRETS).map(str), max_size=8)
       .map("".join))
@example('x"4242 4242 4242 4242"')
@example("\\sk_live_abcdefgh12\n")
@example("\x07DE89 3704 0044 0532 0130 00\x07")
def test_a_secret_in_an_escaped_text_is_never_vouched_for(text: str) -> None:
    """The JSON of a string a detector finds something in is not vouched for, whatever
    escapes stand beside or around the find (none_in_json reads each as a space)."""
    if mask_text(text) != text:
        assert not none_in_json(compact_json({"note": text, "n": [text]})), text


# an auto decision's two audit entries, as a hook's (its rule's text quoted) and the API's
HOOK_ENTRY = {"kind": "tool_call", "tool": "Bash", "args": {"command": "ls -la /srv/29"},
              "call_id": "call", "requested_by": "U_DANA",
              "task": "working in `/srv` (session `cpu-1`, HTTP hook token `hook`)",
              "policy": "hook:claude-code/Bash", "policy_file": "a67ba96b1d492b754c17fa8f"
              "ec49aec09ef1a8477ce4450e075e05acb5e8e986", "answer": "auto",
              "rule": 'tools.hook:claude-code/Bash.rules[0]: args.command.startsWith("ls")'}
API_ENTRY = {"tool": "read_metrics", "args": {"n": 10000029}, "policy": "api:fleet/read_metrics",
             "answer": "auto", "reason": None, "outcome": "auto"}


def _searches(fn: Any, *args: Any) -> tuple[Any, collections.Counter[str]]:
    """``fn(*args)``, and the searches it made with the detectors' own patterns (by
    pattern), not their hints' (the private key's, a literal, is its own hint)."""
    own = {id(p): p.pattern[:24] for p in detectors._ANY[1:]}
    seen: collections.Counter[str] = collections.Counter()

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "c_call" and getattr(arg, "__name__", "") == "search" \
                and id(getattr(arg, "__self__", None)) in own:
            seen[own[id(arg.__self__)]] += 1

    sys.setprofile(profile)
    try:
        out = fn(*args)
    finally:
        sys.setprofile(None)
    return out, seen


def test_details_without_a_secret_are_searched_with_the_detectors_hints_alone() -> None:
    """Issue 50: the detectors' own patterns (a lookaround or ``\\b`` first: tried whole at
    each character) search an entry's JSON only where a hint, searched in C a character
    at a time, matched: an auto decision's entries, none."""
    for details in (HOOK_ENTRY, API_ENTRY):
        text, seen = _searches(recorded_text, details)
        assert text == compact_json(details)
        assert not seen, seen
    text, seen = _searches(recorded_text, {"note": f"pay {CARD}"})
    assert json.loads(text)["note"] == "pay \u2022\u2022\u2022\u2022 4242"
    assert set(seen) == {detectors._CARD.pattern[:24]}, seen  # the card's hint alone matched


# what a detector's find is made of, and what stands next to one
HINTED = ["4", "2", "0", " ", "-", "DE", "NO", "X", "a", "_", ".", "\n",
          "PRIVATE KEY-----", *(pre.replace("[bpas]", "b") for pre, _ in detectors._KEY_FORMS)]


@settings(deadline=None)
@given(st.lists(st.sampled_from(HINTED) | st.sampled_from(SECRETS).map(str), max_size=30)
       .map("".join))
@example("4" * 13)  # the shortest card
@example("NO9386011117947")  # the shortest IBAN
@example("x 4242-4242 4242 4242 x")
@example("-----BEGIN PRIVATE KEY-----")
@example("AKIA0123456789ABCDEF")
@example("apd_" + "a" * 32)
@example("xoxs-" + "a" * 10)
@example("AIza" + "a" * 35)
@example("github_pat_" + "a" * 20)
@example("rk_test_" + "a" * 8)
def test_the_hints_find_what_the_detectors_find(text: str) -> None:
    """Each hint matches every text its detector finds something in (so a text none of
    them matches holds no find, and is not searched further)."""
    assert detectors.any_find(text) == any(p.search(text) for p in detectors._ANY), text


@settings(deadline=None)
@given(json_values, st.sampled_from([{}, {"indent": 1}, {"separators": (", ", ": ")}]),
       st.sampled_from(["", " ", "\n", "x", "]", "\ufeff"]), st.sampled_from(["", " ", "\t"]))
def test_json_is_read_as_json_loads_reads_it(value: Any, style: dict[str, Any], after: str,
                                             before: str) -> None:
    text = before + json.dumps(value, ensure_ascii=False, **style) + after
    try:
        want: Any = json.loads(text)
    except ValueError as exc:
        with pytest.raises(type(exc), match=__import__("re").escape(str(exc))):
            jsontext.loads(text)
    else:
        assert jsontext.loads(text) == want
    for bad in (None, 5):
        with pytest.raises(TypeError):
            jsontext.loads(bad)  # type: ignore[arg-type]


def test_compact_json_is_read_and_written_in_one_call_each(monkeypatch) -> None:
    loads = _spy(monkeypatch, json, "loads")
    encodes = _spy(monkeypatch, json.JSONEncoder, "encode")
    value = {"b": [1, 2.5, None, True, "é\n"], "a": {"z": "x"}}
    assert jsontext.loads(compact_json(value)) == value
    assert jsontext.loads(canonical_json(value)) == value
    assert canonical_json(value) == '{"a":{"z":"x"},"b":[1,2.5,null,true,"é\\n"]}'
    assert not loads and not encodes
    assert jsontext.loads(" [1]") == [1] and loads["approvald.store.jsontext"] == 1


async def test_an_approval_reads_writes_and_masks_in_one_go(
        db: Database, tmp_path: Path, monkeypatch) -> None:
    """From the click to the completed run: no stored JSON read by ``json.loads``, none
    written by ``JSONEncoder.encode``, no audit entry's details walked to be masked (none
    has anything to mask), each call's latency to the microsecond."""
    ledger = DemoLedger(str(tmp_path / "ledger.json"))
    engine = assemble(db, Registry([refund_agent(ledger, approval=REFUND_POLICY)]),
                      signer=SIGNER)
    loads = _spy(monkeypatch, json, "loads")
    encodes = _spy(monkeypatch, json.JSONEncoder, "encode")
    walks = _spy(monkeypatch, Masking, "details")
    texts = _spy(monkeypatch, audit, "recorded_text")
    for i in range(2):
        paused = await engine.run("demo-refund", f"Refund order A-100{i}, customer was "
                                  "double charged", requested_by="U_DANA")
        assert isinstance(paused, Paused)
        approval = await engine.approval(paused.approval_ids[0])
        for c in (loads, encodes, walks, texts):
            c.clear()
        await engine.decide(approval.id, actor=Actor("U_ALICE", "slack"), verdict="approve",
                            token=card_token(approval))
        assert isinstance(await engine.advance(approval.run_id), Completed)
        demo = "approvald.runtime.runs.demo"  # the demo tool's own file of refunds
        assert set(loads) <= {demo} and set(encodes) <= {demo}, (loads, encodes)
        assert texts["approvald.runtime.record.audit"] == 3 and not walks  # decided, 2 runs
        latencies = [e.latency_ms for e in (await Rows(db).executions(approval.run_id)).values()]
        assert latencies and all(ms == round(ms, 3) for ms in latencies), latencies


def test_a_click_body_and_a_card_column_are_read_in_one_call(monkeypatch) -> None:
    from urllib.parse import quote_plus

    from approvald.bot.slack.body import parse_body
    from approvald.bot.slack.cards import json_object

    payload = {"type": "block_actions", "actions": [{"value": "v2:a:t"}], "n": 1.5}
    form = "payload=" + quote_plus(compact_json(payload))
    loads = _spy(monkeypatch, json, "loads")
    assert parse_body(form, "application/x-www-form-urlencoded") == payload
    assert parse_body(compact_json(payload), "application/json") == payload
    assert json_object('{"risk":"high"}') == {"risk": "high"}
    assert json_object("[1]") == json_object("not json") == json_object(None) == {}
    assert sum(loads.values()) == 1  # ("not json": json.loads says why)


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_a_decisions_one_statement_is_read_by_position(
        db: Database, tmp_path: Path, monkeypatch) -> None:
    """PostgreSQL: the row of the statement that votes, closes the request and wakes its
    run (about 80 columns) is split by position into the request and the run, not by
    looking at each column's name; both read back as they are stored."""
    from approvald.store import fastsql

    readers: collections.Counter[str] = collections.Counter()
    mapping = fastsql.Row._mapping

    def spied(row: Any) -> dict[str, Any]:
        readers[sys._getframe(1).f_code.co_name] += 1
        return mapping.fget(row)  # type: ignore[no-any-return,misc]
    monkeypatch.setattr(fastsql.Row, "_mapping", property(spied))
    engine = assemble(db, Registry([refund_agent(DemoLedger(str(tmp_path / "l.json")),
                                                 approval=REFUND_POLICY)]), signer=SIGNER)
    paused = await engine.run("demo-refund", "Refund order A-1000, customer was double "
                              "charged", requested_by="U_DANA")
    assert isinstance(paused, Paused)
    approval = await engine.approval(paused.approval_ids[0])
    readers.clear()
    await engine.decide(approval.id, actor=Actor("U_ALICE", "slack"), verdict="approve",
                        token=card_token(approval))
    assert "vote_and_close" not in readers, readers
    rows = Rows(db)
    decided, run = await rows.approval(approval.id), await rows.run(approval.run_id)
    assert decided.status == "approved" and decided.decided_by == "U_ALICE"
    assert run.status == "running"  # woken (it was awaiting approval)
    assert isinstance(await engine.advance(approval.run_id), Completed)
