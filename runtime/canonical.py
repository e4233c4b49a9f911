"""Canonical JSON and digests: the exact bytes an approval binds to."""

from __future__ import annotations

import hashlib
import json
from typing import Any

JSONValue = Any  # JSON-shaped data: dict/list/str/int/float/bool/None


def canonical_json(value: JSONValue) -> str:
    """Serialize ``value`` deterministically: sorted keys, no whitespace, UTF-8 kept as is.

    Floats that are integral stay distinct from ints (``1.0`` vs ``1``) because JSON
    producers differ there and an approver saw one of them.
    """
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False)


def compact_json(value: JSONValue) -> str:
    """Compact JSON for storage (key order kept)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def value_digest(value: JSONValue) -> str:
    """SHA-256 of the canonical JSON of ``value``."""
    return sha256_hex(canonical_json(value))


def call_digest(tool: str, arguments: JSONValue) -> str:
    """SHA-256 of the canonical JSON of ``{"tool": name, "arguments": args}``."""
    return sha256_hex(canonical_json({"tool": tool, "arguments": arguments}))


# how deep a value (a call's arguments, its result, a packet) may nest; a document that
# carries one (a request's body, a hook's event, a JSON-RPC message) may be MAX_DEPTH + 2
MAX_DEPTH = 64


class TooDeep(ValueError):
    """JSON nested deeper than approvald takes: refused, saying so, before anything walks
    it (a walk of 1,000 levels is a ``RecursionError`` somewhere else)."""


def depth_over(value: JSONValue, limit: int) -> bool:
    """Whether ``value`` nests more than ``limit`` levels (an object or array is one level
    more than what it holds; a scalar is none). Iterative, and it stops at the limit."""
    stack: list[tuple[JSONValue, int]] = [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict | list | tuple):
            if level >= limit:
                return True
            stack.extend((v, level + 1) for v in (item.values() if isinstance(item, dict)
                                                  else item))
    return False


def loads(text: str | bytes, *, max_depth: int = MAX_DEPTH + 2, **kw: Any) -> JSONValue:
    """``json.loads`` for what a caller sends: JSON nested deeper than ``max_depth`` levels
    is a :class:`TooDeep` (a ``ValueError``, like malformed JSON), however deep (the
    standard library's reader gives up near 1,000 levels with a ``RecursionError``)."""
    try:
        value = json.loads(text, **kw)
    except RecursionError:
        raise TooDeep(f"nested deeper than {max_depth} levels") from None
    if depth_over(value, max_depth):
        raise TooDeep(f"nested deeper than {max_depth} levels")
    return value
