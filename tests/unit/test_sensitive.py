"""Detecting and masking sensitive argument values (runtime/policies/sensitive.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from approvald.runtime.kernel.errors import ConfigError
from approvald.runtime.policies.policy import ApprovalPolicy, PolicyFile, load_policy_file
from approvald.runtime.policies.sensitive import (
    MASKED,
    Detectors,
    Masking,
    iban_ok,
    is_masked,
    luhn_ok,
    mask_args,
    mask_text,
    normalize_path,
    unmask_edit,
)
from approvald.runtime.policies.tools import Tool

CARD = "4242 4242 4242 4242"
DIGITS = re.compile(r"4242[ -]?4242")  # 8 digits of the card, in any of its spellings
IBAN = "DE89 3704 0044 0532 0130 00"
PEM = ("-----BEGIN RSA PRIVATE KEY-----\n" + "MIIEowIBAAKCAQEA7bq" * 160
       + "\n-----END RSA PRIVATE KEY-----")
KEY = "sk_live_51HqLyjWDarjtT1zdp7dc9f2a"


def test_checksums() -> None:
    assert luhn_ok("4242424242424242") and not luhn_ok("4242424242424241")
    assert iban_ok(IBAN) and not iban_ok(IBAN.replace("89", "88"))


@pytest.mark.parametrize(("value", "shown"), [
    (CARD, "•••• 4242"),
    ("4242-4242-4242-4242", "•••• 4242"),
    ("4242424242424242", "•••• 4242"),
    ("378282246310005", "•••• 0005"),  # Amex, 15 digits
    (IBAN, "DE•• •••• 3000"),
    ("DE89370400440532013000", "DE•• •••• 3000"),
    (KEY, "sk_live_…9f2a"),
    ("rk_live_abcdefgh12345678", "rk_live_…5678"),
    ("AKIAIOSFODNN7EXAMPLE", "AKIA…MPLE"),
    ("ghp_" + "a1B2" * 9, "ghp_…a1B2"),
    ("github_pat_11ABCDEFG0123456789_abcdefghijkl", "github_pat_…ijkl"),
    ("xoxb-1234567890-abcdefghij", "xoxb-…ghij"),
    ("AIza" + "SyA1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q", "AIza…5p6Q"),
    ("apd_" + "Z" * 43, "apd_…ZZZZ"),
    (PEM, f"[private key, {len(PEM) / 1000:.1f} kB]"),
])
def test_detected_values_are_masked_keeping_what_a_person_decides_on(value: str,
                                                                      shown: str) -> None:
    assert mask_text(value) == shown


def test_secrets_inside_free_text_are_masked_and_the_rest_is_kept() -> None:
    text = f"refund to card {CARD} and 12 more; key={KEY}; iban {IBAN} NOW"
    masked = mask_text(text)
    assert masked == ("refund to card •••• 4242 and 12 more; key=sk_live_…9f2a; "
                      "iban DE•• •••• 3000 NOW")


@pytest.mark.parametrize("value", [
    "4242424242424241",  # not Luhn-valid
    "1733377253000",  # a millisecond timestamp (13 digits, Luhn-valid, starts with 1)
    "order A-1001 for $42.00",
    "DE88 3704 0044 0532 0130 00",  # bad check digits
    "sk_live_short",
    "424242424242424242424",  # 21 digits: no card
])
def test_lookalikes_are_left_alone(value: str) -> None:
    assert mask_text(value) == value


def test_a_card_as_a_json_number_is_masked() -> None:
    assert mask_args({"card": 4242424242424242, "cents": 4200}) == {"card": "•••• 4242",
                                                                    "cents": 4200}


def test_declared_paths_mask_whatever_is_there() -> None:
    args = {"card_number": "4000056655665556", "cvc": "123", "note": "hi",
            "credentials": {"user": "bob", "password": "hunter2"},
            "payees": [{"iban": "x-1", "name": "A"}, {"iban": "x-2", "name": "B"}],
            "account": 12345678901}
    masked = mask_args(args, ["cvc", "credentials.*", "payees.*.iban", "account",
                              "card_number"])
    assert masked == {"card_number": "•••• 5556", "cvc": "[masked]", "note": "hi",
                      "credentials": {"user": "[masked]", "password": "[masked]"},
                      "payees": [{"iban": "[masked]", "name": "A"},
                                 {"iban": "[masked]", "name": "B"}],
                      "account": "•••• 8901"}
    assert args["cvc"] == "123"  # a copy: the real arguments are untouched
    assert is_masked(args, ["cvc"]) and not is_masked({"note": "hi"}, ["cvc"])


def test_a_detector_switched_off_stops_masking_its_kind_only() -> None:
    off = Detectors.from_setting("api_key, iban")
    assert mask_text(f"{KEY} {IBAN} {CARD}", off) == f"{KEY} {IBAN} •••• 4242"
    # a declared value is masked whatever the detectors
    assert mask_args({"k": KEY}, ["k"], off) == {"k": "sk_live_…9f2a"}
    with pytest.raises(ValueError, match="unknown detector 'cards'"):
        Detectors.from_setting("cards")


def test_an_edit_that_leaves_a_masked_value_as_shown_keeps_the_original() -> None:
    original = {"card": CARD, "cents": 4200, "token": "secret-1", "memo": f"card {CARD}"}
    shown = mask_args(original, ["token"])
    assert not DIGITS.search(str(shown))
    edited = {**shown, "cents": 2000}
    assert unmask_edit(edited, original, ["token"]) == {**original, "cents": 2000}
    typed = {**shown, "card": "5555 5555 5555 4444", "token": "secret-2"}
    assert unmask_edit(typed, original, ["token"]) == {
        **original, "card": "5555 5555 5555 4444", "token": "secret-2"}


def test_paths() -> None:
    assert normalize_path("args.credentials.*", prefix=True) == "credentials.*"
    assert normalize_path("card_number") == "card_number"
    with pytest.raises(ValueError, match=r"starts with 'args\.'"):
        normalize_path("card_number", prefix=True)
    with pytest.raises(ValueError, match="not a path"):
        normalize_path("args.a..b", prefix=True)


# -- declared sensitivity: the tool's own, and what the operator's policy file adds ------------

def _refund_tool(**kw: object) -> Tool:
    async def refund(order_id: str, card_number: str, credentials: dict[str, str]) -> str:
        return "ok"

    return Tool(refund, permission="execute", **kw)  # type: ignore[arg-type]


def _policy(tmp_path: Path, text: str) -> PolicyFile:
    path = tmp_path / "policy.toml"
    path.write_text(text)
    return load_policy_file(path)


def test_a_tool_declares_its_sensitive_fields_and_they_ride_in_its_requests_policy() -> None:
    t = _refund_tool(sensitive=["card_number", "args.credentials.*"])
    assert t.approval.sensitive == ["card_number", "credentials.*"]
    assert t.approval.snapshot()["sensitive"] == ["card_number", "credentials.*"]
    assert "sensitive" not in ApprovalPolicy().snapshot()  # as before: same digest
    with pytest.raises(ConfigError, match="tool 'refund': sensitive: not a path"):
        _refund_tool(sensitive=["card..number"])


def test_the_policy_file_adds_sensitive_paths_and_never_removes_the_tools(
        tmp_path: Path) -> None:
    t = _refund_tool(sensitive=["card_number"])
    policy = _policy(tmp_path, """
[tools.refund]
sensitive = ["args.credentials.*", "args.card_number"]

[[tools.refund.rules]]
when = "args.order_id == 'VIP'"
approvers = ["U_CFO"]
sensitive = ["args.order_id"]
""")
    _, approval = policy.effective("refund", t.policy, t.approval)
    assert approval.sensitive == ["card_number", "credentials.*"]
    ruled = policy.for_call("refund", t.policy, t.approval,
                            {"order_id": "VIP", "card_number": "x", "credentials": {}})
    assert ruled.approval.sensitive == ["card_number", "credentials.*", "order_id"]
    # an entry that says nothing of sensitivity, or says less, leaves the tool's own
    quiet = _policy(tmp_path, '[tools.refund]\nsensitive = []\n')
    assert quiet.effective("refund", t.policy, t.approval)[1].sensitive == ["card_number"]


def test_a_sensitive_path_in_the_policy_file_is_checked_at_load(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"tools\.refund\.sensitive: .*starts with 'args\.'"):
        _policy(tmp_path, '[tools.refund]\nsensitive = ["card_number"]\n')


def test_an_error_recorded_on_an_opentelemetry_span_has_its_secrets_masked() -> None:
    from approvald.runtime.record.tracing import OtelTracer
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = OtelTracer(provider)
    with pytest.raises(ValueError), tracer.span("tool.call", tool="refund", note=f"card {CARD}"):
        raise ValueError(f"card {CARD} declined")
    with tracer.steps("run-1") as steps:
        steps.next(step=1)
        steps.close(RuntimeError(f"key {KEY} refused"))
    provider.shutdown()
    spans = exporter.get_finished_spans()
    shown = json.dumps([[dict(s.attributes or {}), [dict(e.attributes or {}) for e in s.events]]
                        for s in spans], ensure_ascii=False)
    assert "card •••• 4242 declined" in shown and "sk_live_…9f2a refused" in shown
    assert not DIGITS.search(shown) and KEY not in shown
    assert [s.status.description for s in spans] == ["ValueError", "RuntimeError"]


def test_masking_a_masked_value_again_changes_nothing() -> None:
    declared = ["card_number", "code", "iban", "key", "pem", "account"]
    args = {"card_number": CARD, "code": "AUTH-ZQX-7731", "iban": IBAN, "key": KEY,
            "pem": PEM, "account": 123456789012}
    once = mask_args(args, declared)
    assert once["card_number"] == "•••• 4242" and once["code"] == "[masked]"
    assert mask_args(once, declared) == once  # an audit entry masked when written, exported


def test_an_audit_entry_records_the_masked_form_and_the_real_values_digest() -> None:
    from approvald.runtime.kernel.canonical import value_digest
    from approvald.runtime.record.audit import MASKED, recorded_details

    args = {"order_id": "A-1", "card_number": CARD, "auth": {"code": "AUTH-ZQX-7731"}}
    details = {"tool": "refund_card", "args": args, "result": {"card": CARD},
               "error": f"card {CARD} declined", "reason": "ok"}
    recorded = recorded_details(details, ["card_number", "auth.*"])
    text = json.dumps(recorded, ensure_ascii=False)
    assert not DIGITS.search(text) and "ZQX" not in text
    assert recorded["args"] == {"order_id": "A-1", "card_number": "•••• 4242",
                                "auth": {"code": "[masked]"}}
    assert recorded[MASKED] == {k: value_digest(details[k])
                                for k in ("args", "result", "error")}
    assert recorded["reason"] == "ok" and recorded["tool"] == "refund_card"
    plain = {"tool": "lookup_order", "args": {"order_id": "A-1"}}
    assert recorded_details(plain) == plain  # nothing masked: nothing named


# -- the funnel: declared values in text derived from the call (issue 46) ----------------

PIN = "4821"
TOKEN = "vault-token-Zq81xLw73"


def test_a_declared_value_is_masked_wherever_text_quotes_it() -> None:
    m = Masking.of_call(["pin", "auth.*"], {"pin": PIN, "auth": {"token": TOKEN},
                                            "memo": "ok"})
    said = f"Logging in with PIN {PIN} and token {TOKEN} (card {CARD})"
    assert m.text(said) == f"Logging in with PIN {MASKED} and token {MASKED} (card •••• 4242)"
    # JSON-escaped, inside a quoted result
    quoted = json.dumps({"stdout": f'token "{TOKEN}"\n'})
    assert TOKEN not in m.text(quoted)
    # an undeclared field that quotes a declared value is masked where it quotes it
    assert m.args({"pin": PIN, "memo": f"pin {PIN}"}) == {"pin": MASKED, "memo": f"pin {MASKED}"}
    # what the runtime records about the call, its results and errors included
    details = {"tool": "login", "args": {"pin": PIN, "auth": {"token": TOKEN}},
               "result": {"echo": TOKEN}, "error": f"bad pin {PIN}"}
    shown = json.dumps(Masking(["pin", "auth.*"]).details(details))
    assert PIN not in shown and TOKEN[:12] not in shown and '"tool": "login"' in shown


def test_parts_of_a_declared_value_are_masked_the_start_of_a_cut_one_and_a_run_of_12() -> None:
    content = "DB_PASSWORD=" + TOKEN + "\n" + "x" * 3000
    m = Masking.of_call(["content"], {"content": content})
    cut = content[:1200] + "… (3033 characters in all)"
    assert m.text(cut) == MASKED + "… (3033 characters in all)"
    assert m.text("first line: " + content[:10]) == "first line: " + MASKED  # cut at the end
    # a part of it that a tool's output echoes
    assert m.text(f"stored {TOKEN} ok") == f"stored {MASKED} ok"
    # less of it than that says nothing: left alone
    assert m.text("DB_PASS") == "DB_PASS"


def test_short_declared_values_are_masked_only_as_words_and_small_numbers_not_at_all() -> None:
    m = Masking.of_call(["code", "n"], {"code": "ab", "n": 7})
    assert m.text("ab about tab ab.") == f"{MASKED} about tab {MASKED}."
    assert m.text("7 days") == "7 days"  # a small number is no secret worth every digit
    assert m.data({"quorum": 7}) == {"quorum": 7}
    big = Masking.of_call(["account"], {"account": 48213579})
    assert big.text("account 48213579 found") == "account •••• 3579 found"
    assert big.data({"echo": 48213579}) == {"echo": "•••• 3579"}


def test_a_record_keeps_the_runtimes_own_words_as_recorded() -> None:
    """The audit chain's verifier reads names, ids and counts: a declared value that
    happens to spell one (a tool's name) does not change them."""
    m = Masking(["name"])
    details = {"tool": "refund", "args": {"name": "refund"}, "quorum": 1,
               "approvers": ["U_ALICE"], "reason": "refund it"}
    shown = m.details(details)
    assert shown["tool"] == "refund" and shown["approvers"] == ["U_ALICE"]
    assert shown["args"] == {"name": MASKED} and shown["reason"] == f"{MASKED} it"


def test_no_declared_value_leaves_the_detectors_alone() -> None:
    m = Masking()
    assert m.text(f"card {CARD}") == "card •••• 4242"
    assert m.args({"a": "b"}) == {"a": "b"}
