"""Checking a rule's condition against the JSON schema of its tool's arguments, at start-up.

A condition that selects an argument the tool does not have (``args.cnets``) or applies
an operator to types it is not defined for (``args.amount_cents <= '2000'``) compiles, and
then fails on every call it is evaluated on: the call is forbidden (fail closed), so a rule
meant to send calls to a person forbids them all. Where the tool's schema is known, such a
rule is refused at start-up instead, with one line naming the rule and the field.

How. The ``cel`` package has no type checker that takes declarations (it compiles and
evaluates, and exposes no syntax tree), so the condition is parsed here
(:mod:`runtime.policies.cel_syntax`) and each node's possible types are inferred from the schema:
``args`` is the schema's object; ``tool`` a string; a literal its own type. What an
operator or function accepts is not written down here but asked of the evaluator itself:
the operation is evaluated on a sample value of each possible operand type (a literal
operand is used as written), and it is refused only if it fails with a type error
(``TypeError``, or "Undefined variable or function", the evaluator's no-such-overload for
functions) for *every* combination. So the checker agrees with the evaluator on what it
does: int and double compare (``args.amount_cents > 100.5`` is accepted), but do not add.
Besides type errors it refuses:

- a field the schema rules out: not among ``properties`` while ``additionalProperties``
  (or ``unevaluatedProperties``) is false, or, with ``closed=True``, not declared at all
  (pydantic's dump holds exactly the declared fields, whatever the schema says of extras);
  inside ``has()`` too, where it is always false;
- ``==``, ``!=`` and ``in`` between types that are never equal (an integer and a string):
  the evaluator says false rather than fail, so the rule never matches. A comparison with
  ``null`` is always accepted;
- ``&&``, ``||``, ``!``, ``? :`` on an operand that is never a boolean, and a condition
  that never yields one.

Limits. False refusals are worse than missed checks, so whatever is not known is accepted:
a schema without a type (``{}``, ``allOf`` of several parts, a ``$ref`` outside the
document) is "any type" and checks nothing below it; a value-dependent failure
(``int(args.note)``, a division by zero, a missing optional key) is not a type error; a
field that may be absent (not ``required``) or null is accepted; text this parser does
not read is accepted whole. Both branches of ``&&``/``||``/``? :`` are checked although
the evaluator may skip one, as CEL's own type checker does.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from approvald.runtime.kernel.errors import ConfigError
from approvald.runtime.policies.cel_syntax import (
    Binary,
    Call,
    Conditional,
    Ident,
    Index,
    ListExpr,
    Literal,
    MapExpr,
    Node,
    Opaque,
    Select,
    SyntaxUnknown,
    Unary,
    parse,
)
from approvald.runtime.policies.rules import cel_engine


@dataclass(frozen=True, eq=False)
class _Kind:
    """One type a value may have; a list or map from the schema keeps its schema, read
    lazily (schemas may be recursive)."""

    name: str  # int uint double string bytes bool null list map timestamp duration type
    schema: Mapping[str, Any] | None = None
    elem: tuple[_Kind, ...] | None = None  # a literal list's items, a literal map's values


# the types a value may have; None: any (nothing is known, nothing is checked)
Type = tuple[_Kind, ...] | None

_BOOL: Type = (_Kind("bool"),)
_STRING: Type = (_Kind("string"),)
_JSON = {"integer": ("int",), "number": ("int", "double"), "string": ("string",),
         "boolean": ("bool",), "null": ("null",)}
_EQUALITY = {"int": "number", "uint": "number", "double": "number"}  # else: its own class
_SAMPLE = {"int": "7", "uint": "7u", "double": "2.5", "string": "'a'", "bytes": "b'a'",
           "bool": "true", "null": "null", "list": "[1]", "map": "{'a': 1}",
           "timestamp": "timestamp('2020-01-01T00:00:00Z')", "duration": "duration('1h')",
           "type": "type(1)"}
_TYPE_NAMES = {"null_type": "null", "google.protobuf.Timestamp": "timestamp",
               "google.protobuf.Duration": "duration"}
_WORDS = {"int": "an integer", "uint": "an unsigned integer", "double": "a double",
          "string": "a string", "bytes": "bytes", "bool": "a boolean", "null": "null",
          "list": "a list", "map": "an object", "timestamp": "a timestamp",
          "duration": "a duration", "type": "a type"}
# what these return when a sample value cannot show it (int('a') fails; int('12') does not)
_CONVERSIONS = {"int", "uint", "double", "string", "bytes", "timestamp", "duration"}
_MACROS = {"all", "exists", "exists_one", "map", "filter"}
_MAX_COMBINATIONS = 64
_TYPE_ERROR = "!"  # a probe's outcome: no operand types it is defined for
_MISSING = object()


class _Refused(Exception):
    """The first definite problem found; its text is the message."""


def rule_problem(text: str, schema: Mapping[str, Any], *, tool: str,
                 closed: bool = False) -> str | None:
    """What is wrong with condition ``text`` on arguments described by JSON ``schema``
    (one line starting with the offending expression), or None if nothing is known to be.

    ``closed``: an object that does not say what other keys it allows allows none (true
    of pydantic's dumps); by default such an object allows any (JSON Schema's rule)."""
    try:
        root = parse(text)
    except SyntaxUnknown:
        return None  # the evaluator's parser accepted it; this one judges nothing
    checker = _Checker(text, schema, tool=tool, closed=closed)
    try:
        result = checker.infer(root, {})
        if result is not None and not any(k.name == "bool" for k in result):
            raise _Refused(f"the condition yields {_words(result)}, not true or false")
    except _Refused as exc:
        return str(exc)
    except RecursionError:
        return None
    return None


def check_rule(text: str, where: str, schema: Mapping[str, Any], *, tool: str,
               source: str = "", closed: bool = False) -> None:
    """Refuse rule ``where`` (``tools.NAME.rules[i]``) of the policy file ``source`` if its
    condition ``text`` fails on arguments described by ``schema``: a :class:`ConfigError`
    line naming the file, the rule and the field. See :func:`rule_problem`."""
    problem = rule_problem(text, schema, tool=tool, closed=closed)
    if problem is not None:
        raise ConfigError(f"APPROVALD_POLICY_FILE: {source or 'policy'}: {where}.when: "
                          f"{problem}")


class _Checker:
    def __init__(self, text: str, schema: Mapping[str, Any], *, tool: str,
                 closed: bool) -> None:
        self.text = text
        self.root = schema
        self.tool = tool
        self.closed = closed

    # -- types from the schema ------------------------------------------------------------
    def kinds(self, s: object, depth: int = 0) -> Type:
        if not isinstance(s, Mapping) or depth > 32:
            return None
        if "$ref" in s:
            return self.kinds(self._resolve(s["$ref"]), depth + 1)
        for key in ("anyOf", "oneOf"):
            members = s.get(key)
            if isinstance(members, list):
                union: list[_Kind] = []
                for m in members:
                    t = self.kinds(m, depth + 1)
                    if t is None:
                        return None
                    union.extend(t)
                return tuple(union) or None
        if "allOf" in s:  # one part (pydantic's wrapping of a $ref) is that part
            parts = s["allOf"]
            only = isinstance(parts, list) and len(parts) == 1 and "type" not in s
            return self.kinds(parts[0], depth + 1) if only else None
        if "const" in s:
            return _of_values([s["const"]])
        if isinstance(s.get("enum"), list):
            return _of_values(s["enum"])
        declared = s.get("type")
        names = [declared] if isinstance(declared, str) else declared
        if names is None:
            if "properties" in s or "additionalProperties" in s:
                names = ["object"]
            elif "items" in s:
                names = ["array"]
        if not isinstance(names, list) or not names:
            return None
        out: list[_Kind] = []
        for name in names:
            if name == "object":
                out.append(_Kind("map", schema=s))
            elif name == "array":
                out.append(_Kind("list", schema=s))
            elif isinstance(name, str) and name in _JSON:
                out.extend(_Kind(n) for n in _JSON[name])
            else:
                return None
        return tuple(out)

    def _resolve(self, ref: object) -> object:
        if not isinstance(ref, str) or not ref.startswith("#"):
            return None
        node: object = self.root
        for part in filter(None, ref[1:].split("/")):
            key = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(node, Mapping) or key not in node:
                return None
            node = node[key]
        return node

    def element(self, k: _Kind) -> Type:
        if k.schema is not None:
            return self.kinds(k.schema.get("items"))
        return k.elem

    def field(self, k: _Kind, name: str) -> Type | object:
        """The type of field ``name`` of map ``k``, or _MISSING if it cannot have one."""
        s = k.schema
        if s is None:
            return k.elem
        props = s.get("properties")
        if isinstance(props, Mapping) and name in props:
            return self.kinds(props[name])
        if s.get("patternProperties"):
            return None
        extra = s.get("additionalProperties", s.get("unevaluatedProperties", _MISSING))
        if extra is False or (extra is _MISSING and self.closed):
            return _MISSING
        return self.kinds(extra) if isinstance(extra, Mapping) else None

    # -- inference ------------------------------------------------------------------------
    def infer(self, n: Node, env: Mapping[str, Type]) -> Type:
        if isinstance(n, Literal):
            return (_Kind(n.kind),)
        if isinstance(n, Ident):
            if n.name in env:
                return env[n.name]
            if n.name == "args":
                return self.kinds(self.root)
            return _STRING if n.name == "tool" else None
        if isinstance(n, Select):
            return self.select(n, self.infer(n.operand, env), n.field)
        if isinstance(n, Index):
            return self.index(n, env)
        if isinstance(n, Call):
            return self.call(n, env)
        if isinstance(n, Unary):
            t = self.infer(n.operand, env)
            if n.op == "!":
                self.need_bool(t, n.operand, "!")
                return _BOOL
            return self.probe(n, "-{}", [n.operand], [t], n.op)
        if isinstance(n, Binary):
            return self.binary(n, env)
        if isinstance(n, Conditional):
            self.need_bool(self.infer(n.condition, env), n.condition, "? :")
            return _union(self.infer(n.then, env), self.infer(n.otherwise, env))
        if isinstance(n, ListExpr):
            items = [self.infer(x, env) for x in n.items]
            return (_Kind("list", elem=_union(*items) if items else None),)
        if isinstance(n, MapExpr):
            values = []
            for key, value in n.entries:
                self.infer(key, env)
                values.append(self.infer(value, env))
            return (_Kind("map", elem=_union(*values) if values else None),)
        if isinstance(n, Opaque):
            for part in n.parts:
                self.infer(part, env)
        return None

    def select(self, n: Select | Index, t: Type, name: str) -> Type:
        operand = n.operand
        test_only = isinstance(n, Select) and n.test_only
        if t is None:
            return _BOOL if test_only else None
        found: list[_Kind] = []
        anything = reachable = False
        problem = None
        for k in t:
            if k.name == "null":
                continue  # a null fails at run time; its other types may not
            if k.name != "map":
                problem = problem or f"{self.quote(operand)} is {_words((k,))}, " \
                                     "which has no fields"
                continue
            ft = self.field(k, name)
            if ft is _MISSING:
                problem = problem or self.no_field(operand, k, name)
                continue
            reachable = True
            if ft is None:
                anything = True
            else:
                assert isinstance(ft, tuple)
                found.extend(ft)
        if not reachable:
            path = self.quote(n) if isinstance(n, Index) else \
                f"{self.quote(operand)}.{name}"
            raise _Refused(f"{path}: " + (problem or f"{self.quote(operand)} is null"))
        if test_only:
            return _BOOL
        return None if anything else tuple(found)

    def no_field(self, operand: Node, k: _Kind, name: str) -> str:
        props = k.schema.get("properties") if k.schema is not None else None
        names = ", ".join(props) if isinstance(props, Mapping) and props else "none"
        if isinstance(operand, Ident) and operand.name == "args":
            return f"{self.tool} has no argument {name!r} (arguments: {names})"
        return f"{self.quote(operand)} has no field {name!r} (fields: {names})"

    def index(self, n: Index, env: Mapping[str, Type]) -> Type:
        t = self.infer(n.operand, env)
        key = n.index
        if isinstance(key, Literal) and key.kind == "string" and isinstance(key.value, str):
            return self.select(n, t, key.value)
        self.probe(n, "{}[{}]", [n.operand, key], [t, self.infer(key, env)], "[]")
        if t is not None and all(k.name == "list" for k in t):
            return _union(*(self.element(k) for k in t))
        return None

    def call(self, n: Call, env: Mapping[str, Type]) -> Type:
        if n.function in _MACROS and n.target is not None and n.args \
                and isinstance(n.args[0], Ident):
            return self.comprehension(n, env)
        operands = ([n.target] if n.target is not None else []) + list(n.args)
        types = [self.infer(x, env) for x in operands]
        slots = ", ".join("{}" for _ in n.args)
        template = f"{{}}.{n.function}({slots})" if n.target is not None else \
            f"{n.function}({slots})"
        result = self.probe(n, template, operands, types, n.function)
        if n.function == "dyn":
            return None
        if result is None and n.function in _CONVERSIONS and n.target is None:
            return (_Kind(n.function),)
        return result

    def comprehension(self, n: Call, env: Mapping[str, Type]) -> Type:
        assert n.target is not None and isinstance(n.args[0], Ident)
        t = self.infer(n.target, env)
        item: Type = None
        if t is not None:
            # a list's items; an object's keys (strings); a literal map's keys: unknown
            items = [self.element(k) if k.name == "list" else
                     _STRING if k.schema is not None else None
                     for k in t if k.name in ("list", "map")]
            if not items and any(k.name != "null" for k in t):
                raise _Refused(f"{self.quote(n)}: {n.function} needs a list or an object, "
                               f"and {self.quote(n.target)} is {_words(t)}")
            item = _union(*items) if items else None
        inner = {**env, n.args[0].name: item}
        body = [self.infer(x, inner) for x in n.args[1:]]
        if n.function in ("map", "filter"):
            for pred, node in zip(body[:-1] if n.function == "map" else body,
                                  n.args[1:], strict=False):
                self.need_bool(pred, node, n.function)
            return (_Kind("list", elem=body[-1] if n.function == "map" else item),)
        for pred, node in zip(body, n.args[1:], strict=False):
            self.need_bool(pred, node, n.function)
        return _BOOL

    def binary(self, n: Binary, env: Mapping[str, Type]) -> Type:
        left, right = self.infer(n.left, env), self.infer(n.right, env)
        if n.op in ("&&", "||"):
            self.need_bool(left, n.left, n.op)
            self.need_bool(right, n.right, n.op)
            return _BOOL
        if n.op in ("==", "!="):
            if _never_equal(left, right):
                raise _Refused(f"{self.quote(n)}: {_words(left)} ({self.quote(n.left)}) is "
                               f"never equal to {_words(right)} ({self.quote(n.right)})")
            return _BOOL
        if n.op == "in":
            self.probe(n, "{} in {}", [n.left, n.right], [left, right], "in")
            members = self.members(right)
            if _never_equal(left, members):
                raise _Refused(f"{self.quote(n)}: {_words(left)} ({self.quote(n.left)}) is "
                               f"never equal to a member of {self.quote(n.right)} "
                               f"({_words(members)})")
            return _BOOL
        return self.probe(n, f"{{}} {n.op} {{}}", [n.left, n.right], [left, right], n.op)

    def members(self, t: Type) -> Type:
        """What ``x in t`` compares ``x`` with: a list's items, an object's keys."""
        if t is None:
            return None
        found: list[_Kind] = []
        for k in t:
            if k.name == "list":
                elem = self.element(k)
                if elem is None:
                    return None
                found.extend(elem)
            elif k.name == "map" and k.schema is not None:
                found.append(_Kind("string"))  # JSON object keys
            elif k.name != "null":
                return None
        return tuple(found) or None

    def need_bool(self, t: Type, n: Node, op: str) -> None:
        if t is not None and not any(k.name == "bool" for k in t):
            raise _Refused(f"{self.quote(n)} is {_words(t)}, not true or false "
                           f"({op} needs true or false)")

    def probe(self, n: Node, template: str, operands: Sequence[Node], types: Sequence[Type],
              op: str) -> Type:
        """The result type of ``template`` on operands of these types, as the evaluator
        computes it on samples; refused if it has a type error on every combination."""
        if any(t is None for t in types):
            return None
        # a sample stands for its type: one per type name
        choices = [list({k.name: k for k in t or ()}.values()) for t in types]
        if math.prod(len(c) for c in choices) > _MAX_COMBINATIONS:
            return None
        results: list[_Kind] = []
        for combo in itertools.product(*choices):
            texts = [x.text if isinstance(x, Literal) else _SAMPLE[k.name]
                     for x, k in zip(operands, combo, strict=True)]
            outcome = _outcome(template.format(*texts))
            if outcome == _TYPE_ERROR:
                continue
            if outcome is None:
                return None  # failed on this value only, or an unknown type: accept
            results.append(_Kind(outcome))
        if results:
            return tuple(results)
        if not operands:
            raise _Refused(f"{self.quote(n)}: CEL here has no function {op}()")
        described = " and ".join(f"{_words(t)} ({self.quote(x)})"
                                 for x, t in zip(operands, types, strict=True))
        raise _Refused(f"{self.quote(n)}: {op} is not defined for {described}")

    def quote(self, n: Node) -> str:
        text = " ".join(self.text[n.start:n.end].split())
        return text if len(text) <= 60 else text[:59] + "…"


def _never_equal(a: Type, b: Type) -> bool:
    if a is None or b is None:
        return False
    left = {_EQUALITY.get(k.name, k.name) for k in a if k.name != "null"}
    right = {_EQUALITY.get(k.name, k.name) for k in b if k.name != "null"}
    return bool(left) and bool(right) and not left & right


@functools.lru_cache(maxsize=1024)
def _outcome(expression: str) -> str | None:
    """The type name of ``expression``'s value, _TYPE_ERROR, or None if it failed some
    other way (a value error: it may work on other values)."""
    try:
        name = cel_engine().evaluate(f"type({expression})")
    except TypeError:
        return _TYPE_ERROR
    except RuntimeError as exc:  # no overload of a function is "Undefined ... function"
        return _TYPE_ERROR if str(exc).startswith("Undefined variable or function") else None
    except Exception:
        return None
    name = _TYPE_NAMES.get(str(name), str(name))
    return name if name in _SAMPLE else None


def _of_values(values: Sequence[object]) -> Type:
    """The types of a ``const`` or ``enum``'s values (None if one is a list or object)."""
    names: dict[str, None] = {}
    for v in values:
        if isinstance(v, bool):  # before int: a bool is an int to Python
            name = "bool"
        elif isinstance(v, int):
            name = "int"
        elif isinstance(v, float):
            name = "double"
        elif isinstance(v, str):
            name = "string"
        elif v is None:
            name = "null"
        else:
            return None
        names[name] = None
    return tuple(_Kind(n) for n in names) or None


def _union(*types: Type) -> Type:
    if any(t is None for t in types):
        return None
    return tuple(k for t in types for k in (t or ()))


def _words(t: Type) -> str:
    if t is None:
        return "anything"
    names = list(dict.fromkeys(k.name for k in t))
    if "int" in names and "double" in names:
        names[names.index("int")] = "number"
        names.remove("double")
    return " or ".join("a number" if n == "number" else _WORDS.get(n, n) for n in names)

