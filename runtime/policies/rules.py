"""Rules on a call's arguments: Common Expression Language conditions (the ``cel`` package,
``common-expression-language`` on PyPI), compiled when the policy file is loaded.

A condition sees ``args`` (the call's validated arguments, a map), ``tool`` (its name) and
``annotations`` (what the tool's server says of it, a map: an MCP tool's ``readOnlyHint``,
``destructiveHint``...; empty for every other tool) and must yield a boolean. Annotations
come from the server, not the operator: they are something a rule may read, and choose
nothing by themselves (a key a server did not send is a missing key: the rule fails
closed; ``has(annotations.readOnlyHint)`` tests for one). It is compiled once per text;
evaluating it is pure and takes microseconds. Anything that goes wrong while evaluating (a
missing key, a type with no such operator, a result that is not a boolean) is a
:class:`RuleError`: the caller fails closed.
"""

from __future__ import annotations

import functools
import importlib
import importlib.machinery
import importlib.util
import sys
from collections.abc import Mapping
from typing import Any

VARIABLES = frozenset({"args", "tool", "annotations"})
MAX_EXPRESSION = 2000  # characters in one condition


class RuleError(Exception):
    """A condition that cannot be evaluated on these arguments."""


@functools.cache
def cel_engine() -> Any:
    """The CEL engine: the compiled module of the ``common-expression-language`` package
    (``cel.cel``, whose names the package re-exports), loaded on first use and without the
    package's ``__init__``, which imports its command-line REPL too (typer, rich,
    prompt_toolkit: about 240 modules, a third of a second of CPU that every command whose
    policy file has a rule paid, the Claude Code hook once a tool call). The same module
    the package itself uses: where ``cel`` is imported already, or laid out otherwise, the
    package's."""
    if "cel" not in sys.modules:
        package = importlib.util.find_spec("cel")
        spec = None if package is None else importlib.machinery.PathFinder.find_spec(
            "cel.cel", package.submodule_search_locations)
        if spec is not None and spec.loader is not None:
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module  # (``import cel`` later finds it: one module)
            spec.loader.exec_module(module)
            return module
    return importlib.import_module("cel")


@functools.lru_cache(maxsize=1024)
def compile_condition(text: str) -> Any:
    """The compiled program for ``text``; ValueError (one line) if it is not a condition
    over ``args`` and ``tool``."""
    if not text.strip():
        raise ValueError("an empty condition")
    if len(text) > MAX_EXPRESSION:
        raise ValueError(f"a condition is at most {MAX_EXPRESSION} characters")
    try:
        program = cel_engine().compile(text)
    except ValueError as exc:
        raise ValueError(f"not a valid CEL expression: {_parse_error(str(exc))}") from None
    unknown = sorted(set(program.variables()) - VARIABLES)
    if unknown:
        raise ValueError(f"unknown name{'s' if len(unknown) > 1 else ''} "
                         f"{', '.join(unknown)} (a condition sees args, tool and "
                         "annotations)")
    return program


@functools.lru_cache(maxsize=1024)
def _reads(text: str) -> frozenset[str]:
    """The variables condition ``text`` (compiled) reads."""
    return frozenset(compile_condition(text).variables())


def _parse_error(text: str) -> str:
    """The parser's complaint without its echo of the input and its token list:
    "at 1:20: Syntax error: extraneous input '>'"."""
    first = text.split("\n", 1)[0]
    _, found, rest = first.partition("ERROR: <input>:")
    if not found:
        return first
    where, _, what = rest.partition(": ")
    return f"at {where}: {what.split(' expecting ', 1)[0]}"


def holds(text: str, tool: str, args: Mapping[str, Any],
          annotations: Mapping[str, Any] | None = None) -> bool:
    """Does condition ``text`` hold for a call of ``tool`` with ``args``?"""
    try:
        program, reads = compile_condition(text), _reads(text)
        # only what the condition reads is handed to it: each value is converted to CEL's
        # own on every call, about 3 us a variable it never looks at (issue 50)
        env: dict[str, Any] = {"args": dict(args)} if "args" in reads else {}
        if "tool" in reads:
            env["tool"] = tool
        if "annotations" in reads:
            env["annotations"] = dict(annotations or {})
        result = program.execute(env)
    except ValueError as exc:
        raise RuleError(str(exc)) from None
    except Exception as exc:  # KeyError (no such key), TypeError (no such overload), ...
        what = f"no argument {exc}" if isinstance(exc, KeyError) else str(exc).split(". ")[0]
        raise RuleError(what) from None
    if not isinstance(result, bool):
        raise RuleError(f"it yields {type(result).__name__} {result!r}, not true or false")
    return result


@functools.lru_cache(maxsize=1024)
def argument_fields(text: str) -> frozenset[str] | None:
    """The top-level arguments condition ``text`` can read: every use of ``args`` in it is
    ``args.NAME``, ``has(args.NAME)`` or ``args["NAME"]``, so it holds or not (or cannot be
    evaluated) alike for any two calls whose arguments agree on these names (present or
    absent, and equal in value). None when that cannot be told: ``args`` used otherwise
    (whole, indexed by a computed key, bound by a macro), or text the syntax reader
    (:mod:`runtime.policies.cel_syntax`) does not read."""
    from approvald.runtime.policies import cel_syntax as cs  # (only a replay needs the tree)

    try:
        tree = cs.parse(text)
    except cs.SyntaxUnknown:
        return None
    fields: set[str] = set()

    def walk(node: cs.Node) -> bool:
        if isinstance(node, cs.Ident):
            return node.name != "args"  # bare: the whole map
        if isinstance(node, cs.Select):
            if isinstance(node.operand, cs.Ident) and node.operand.name == "args":
                fields.add(node.field)
                return True
            return walk(node.operand)
        if isinstance(node, cs.Index):
            if isinstance(node.operand, cs.Ident) and node.operand.name == "args":
                i = node.index
                if isinstance(i, cs.Literal) and i.kind == "string" \
                        and isinstance(i.value, str):
                    fields.add(i.value)
                    return True
                return False
            return walk(node.operand) and walk(node.index)
        if isinstance(node, cs.Literal):
            return True
        if isinstance(node, cs.Call):
            return (node.target is None or walk(node.target)) and all(map(walk, node.args))
        if isinstance(node, cs.Unary):
            return walk(node.operand)
        if isinstance(node, cs.Binary):
            return walk(node.left) and walk(node.right)
        if isinstance(node, cs.Conditional):
            return walk(node.condition) and walk(node.then) and walk(node.otherwise)
        if isinstance(node, cs.ListExpr):
            return all(map(walk, node.items))
        if isinstance(node, cs.MapExpr):
            return all(walk(k) and walk(v) for k, v in node.entries)
        return False  # Opaque, or a node this does not know

    return frozenset(fields) if walk(tree) else None
