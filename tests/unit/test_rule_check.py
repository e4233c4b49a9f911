"""Rules on arguments checked against their tool's schema before they run (issue 36,
defect 16): a condition that names an argument the tool does not have, or applies an
operator to types the evaluator does not define it for, fails on every call and so
forbids them all. Valid conditions must keep passing: a false refusal is worse than a
missed check. Each refused condition here is also evaluated on a valid call, to show it
fails (or never matches) there, as the checker claims."""

from __future__ import annotations

from typing import Any, Literal

import pytest
from approvald.runtime.kernel.errors import ConfigError
from approvald.runtime.policies.rule_check import check_rule, rule_problem
from approvald.runtime.policies.rules import RuleError, compile_condition, holds
from approvald.runtime.policies.tools import tool
from pydantic import BaseModel, ConfigDict, Field


class Customer(BaseModel):
    email: str
    name: str | None = None


class Item(BaseModel):
    sku: str
    qty: int


class Address(BaseModel):
    city: str
    post_code: str = Field(alias="zip")


class Meta(BaseModel):
    model_config = ConfigDict(extra="allow")
    source: str = "web"


@tool(permission="execute")
async def refund(order_id: str, cents: int, customer: Customer, items: list[Item],
                 tags: list[str], rate: float, address: Address, meta: Meta,
                 note: str | None = None, mode: Literal["card", "credit"] = "card",
                 limits: dict[str, int] | None = None, extra: Any = None) -> None:
    """A tool with every shape a rule meets."""


SCHEMA = refund.rule_schema()
CALL = refund.validate({
    "order_id": "A-1", "cents": 1500, "rate": 0.5, "tags": ["vip"],
    "customer": {"email": "dana@example.com"}, "items": [{"sku": "X", "qty": 2}],
    "address": {"city": "Oslo", "zip": "0150"}, "meta": {"floor": 3},
    "limits": {"day": 5}})


def problem(text: str) -> str | None:
    assert SCHEMA is not None
    return rule_problem(text, SCHEMA, tool="refund", closed=True)


@pytest.mark.parametrize("text", [
    "args.cents <= 2000",
    "args.cents > 100 && args.cents < 200 || args.order_id == 'A-1'",
    "args.cents > 100.5",  # the evaluator compares int with double
    "args.rate > 1",
    "args.rate >= args.cents",
    "args.cents > 1u",
    "args.customer.email.endsWith('@example.com')",
    "args.customer.email.size() > 3 && size(args.tags) < 4",
    "args.customer.name.startsWith('D')",  # null until given: fails closed, not always
    "has(args.note) && args.note != ''",
    "has(args.customer.name)",
    "args.note == 'urgent'",
    "args.note != null",
    "args.cents != null",
    "args.cents in [100, 200]",
    "args.rate in [0.5, 1]",
    "args.mode in ['card', 'credit']",
    "'vip' in args.tags",
    "'day' in args.limits",
    "args.limits.day > 1",
    "args.limits['day'] > 1",
    "args['cents'] > 1",
    "args.items[0].sku == 'X'",
    "args.items.all(i, i.qty > 0)",
    "args.tags.exists(t, t.startsWith('v'))",
    "args.address.city == 'Oslo'",
    "args.address.post_code.startsWith('0')",  # the dump's name, not the alias
    "args.meta.floor == 3",  # extra="allow": any field may be there
    "args.extra.anything.at_all > 1",  # Any: nothing is known, nothing is checked
    "args.order_id.matches('^A-')",
    "int(args.order_id) > 5",  # fails on 'A-1', not on '12': a value, not a type
    "string(args.cents) == '1500'",
    "double(args.cents) * 1.5 > 10.0",
    "args.cents > 100 ? args.mode == 'card' : false",
    "-args.cents < 0",
    "tool == 'refund'",
    "tool.startsWith('ref')",
    "dyn(args.cents) == 'x'",
    "true",
])
def test_valid_conditions_pass(text: str) -> None:
    assert problem(text) is None


@pytest.mark.parametrize(("text", "message"), [
    ("args.cnets > 100", "args.cnets: refund has no argument 'cnets' (arguments: order_id, "
                         "cents, customer, items, tags, rate, address, meta, note, mode, "
                         "limits, extra)"),
    ("has(args.cnets)", "args.cnets: refund has no argument 'cnets'"),
    ("args['cnets'] > 100", "args['cnets']: refund has no argument 'cnets'"),
    ("args.customer.emial == 'x'",
     "args.customer.emial: args.customer has no field 'emial' (fields: email, name)"),
    ("args.address.zip == '0150'",  # rules see field names; zip is only the alias
     "args.address.zip: args.address has no field 'zip' (fields: city, post_code)"),
    ("args.items.all(i, i.qtx > 0)", "i.qtx: i has no field 'qtx' (fields: sku, qty)"),
    ("args.cents.x == 1", "args.cents.x: args.cents is an integer, which has no fields"),
    ("args.cents <= '2000'", "args.cents <= '2000': <= is not defined for an integer "
                             "(args.cents) and a string ('2000')"),
    ("args.cents + 1.5 > 2.0", "args.cents + 1.5: + is not defined for an integer "
                               "(args.cents) and a double (1.5)"),
    ("args.cents == '2000'", "args.cents == '2000': an integer (args.cents) is never equal "
                             "to a string ('2000')"),
    ("args.cents in ['100']", "args.cents in ['100']: an integer (args.cents) is never "
                              "equal to a member of ['100'] (a string)"),
    ("args.order_id.startsWith(1)", "args.order_id.startsWith(1): startsWith is not "
                                    "defined for a string (args.order_id) and an integer (1)"),
    ("args.cents.startsWith('1')", "startsWith is not defined for an integer (args.cents)"),
    ("size(args.cents) > 1", "size(args.cents): size is not defined for an integer"),
    ("args.order_id.lowerAscii() == 'a-1'", "lowerAscii is not defined for a string"),
    ("args.note < 5", "args.note < 5: < is not defined for a string or null (args.note) "
                      "and an integer (5)"),
    ("args.cents && true", "args.cents is an integer, not true or false (&& needs true or "
                           "false)"),
    ("args.cents ? true : false", "args.cents is an integer, not true or false"),
    ("args.cents + 1", "the condition yields an integer, not true or false"),
    ("tool == 1", "tool == 1: a string (tool) is never equal to an integer (1)"),
])
def test_conditions_that_fail_on_every_call_are_named(text: str, message: str) -> None:
    found = problem(text)
    assert found is not None and message in found, found
    try:  # what the evaluator does with a valid call: it fails, or it never matches
        assert holds(text, "refund", CALL) is False
    except RuleError:
        pass


@pytest.mark.parametrize(("text", "refused"), [
    # CEL's literals and layout, read as the evaluator reads them
    ("args.cents > 0x10 && args.cents < 16u && args.cents > -5 && args.rate > 1e-3", None),
    ("args.order_id == r'A-\\d' || args.order_id == '''A-1''' || args.order_id == \"A\"",
     None),
    ("args.order_id == 'A-1' // a comment\n  && args.cents > 1", None),
    ("r'x\\' == args.order_id", None),  # a raw string: its backslash escapes nothing
    ("args.order_id != b'A-1'", "a string (args.order_id) is never equal to bytes"),
    ("(args.cnets) > 1", "args.cnets: refund has no argument 'cnets'"),
    ("args.cents <= 2000 && args.cnets // typo\n > 1", "args.cnets: refund has no"),
    ("args.cents < 1 ? 'small' == 'x' : args.cnets == 1", "args.cnets: refund has no"),
    ("{'a': args.cnets}.a == 1", "args.cnets: refund has no"),
])
def test_the_parser_reads_what_cel_reads(text: str, refused: str | None) -> None:
    compile_condition(text)  # what the policy file's loader accepts first
    found = problem(text)
    assert (found is None) if refused is None else (found is not None and refused in found), \
        found


def test_a_schema_that_allows_other_keys_allows_them() -> None:
    # JSON Schema's rule, as an MCP server's inputSchema says it: an object that does not
    # say additionalProperties may hold other keys; one that says false may not
    open_ = {"type": "object", "properties": {"path": {"type": "string"},
                                              "size": {"type": "number"}}}
    assert rule_problem("args.pth == '/etc'", open_, tool="write_file") is None
    assert rule_problem("args.size > 10", open_, tool="write_file") is None  # int or double
    assert rule_problem("args.path.startsWith('/etc/')", open_, tool="write_file") is None
    closed = {**open_, "additionalProperties": False}
    assert rule_problem("args.pth == '/etc'", closed, tool="write_file") == \
        "args.pth: write_file has no argument 'pth' (arguments: path, size)"
    assert "< is not defined for a string (args.path) and an integer (5)" in \
        (rule_problem("args.path < 5", open_, tool="write_file") or "")


def test_what_the_checker_does_not_know_it_accepts() -> None:
    assert rule_problem("args.x.y > 1", {}, tool="t") is None  # no schema worth the name
    assert rule_problem("args.a > 1", {"$ref": "https://example.com/s.json"}, tool="t") is None
    both = {"allOf": [{"type": "object"}, {"properties": {"a": {"type": "string"}}}],
            "additionalProperties": False}
    assert rule_problem("args.b > 1", both, tool="t") is None


def test_check_rule_is_one_config_error_line() -> None:
    assert SCHEMA is not None
    check_rule("args.cents <= 2000", "tools.refund.rules[0]", SCHEMA, tool="refund",
               source="p.toml", closed=True)
    with pytest.raises(ConfigError) as exc:
        check_rule("args.cnets > 100", "tools.refund.rules[3]", SCHEMA, tool="refund",
                   source="p.toml", closed=True)
    assert str(exc.value).startswith("APPROVALD_POLICY_FILE: p.toml: tools.refund.rules[3]"
                                     ".when: args.cnets: refund has no argument 'cnets' (")
    assert "\n" not in str(exc.value)


def test_a_rule_reads_a_servers_annotations_and_a_missing_one_fails_closed() -> None:
    """Issue 39: MCP tool annotations are visible to rules; a key the server did not send
    is a missing key (the rule cannot be evaluated: its call is forbidden), never true."""
    from approvald.runtime.policies.rules import RuleError, holds

    read_only = "has(annotations.readOnlyHint) && annotations.readOnlyHint"
    assert holds(read_only, "lookup", {}, {"readOnlyHint": True})
    assert not holds(read_only, "transfer", {}, {"destructiveHint": True})
    assert not holds(read_only, "deploy", {})  # not an MCP tool: no annotations
    with pytest.raises(RuleError):
        holds("annotations.readOnlyHint", "transfer", {}, {})
