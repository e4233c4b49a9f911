"""JSON as callers send it: the one reader every face parses a caller's JSON with, and how
deep a value may nest. Cheap to import (the standard library's ``json`` alone), so the
Claude Code hook's process reads its event with it before it imports anything else."""

from __future__ import annotations

import json
import json.scanner
import re
from collections.abc import Callable
from typing import Any, cast

# half of a UTF-16 pair, which JSON's \u escapes can write and no UTF-8 text can hold
_SURROGATE = re.compile("[\ud800-\udfff]")

# how deep a value (a call's arguments, its result, a packet) may nest; a document that
# carries one (a request's body, a hook's event, a JSON-RPC message) may be MAX_DEPTH + 2
MAX_DEPTH = 64


class TooDeep(ValueError):
    """JSON nested deeper than approvald takes: refused, saying so, before anything walks
    it (a walk of 1,000 levels is a ``RecursionError`` somewhere else)."""


def depth_over(value: Any, limit: int) -> bool:
    """Whether ``value`` nests more than ``limit`` levels (an object or array is one level
    more than what it holds; a scalar is none). Iterative, a level at a time (what a
    level holds gathered by one ``extend`` per object or array), and it stops at the
    limit."""
    level = [value]
    depth = 0
    while True:
        nested = [item for item in level if isinstance(item, _NESTS)]
        if not nested:
            return False
        if depth >= limit:
            return True
        depth += 1
        level = []
        for item in nested:
            level.extend(item.values() if isinstance(item, dict) else item)


_NESTS = (dict, list, tuple)


def loads(text: str | bytes, *, max_depth: int = MAX_DEPTH + 2, **kw: Any) -> Any:
    """``json.loads`` for what a caller sends: JSON nested deeper than ``max_depth`` levels
    is a :class:`TooDeep` (a ``ValueError``, like malformed JSON), however deep (the
    standard library's reader gives up near 1,000 levels with a ``RecursionError``); a
    string escaping half of a surrogate pair (``"\\ud800"``), which no digest or
    database can take as text, is a ``ValueError``."""
    try:
        value = _read(text, kw)
    except RecursionError:
        raise TooDeep(f"nested deeper than {max_depth} levels") from None
    if depth_over(value, max_depth):
        raise TooDeep(f"nested deeper than {max_depth} levels")
    if ("\\u" in text if isinstance(text, str) else b"\\u" in text) and _surrogate_in(value):
        raise ValueError("a string holds half of a UTF-16 surrogate pair (\\ud800-\\udfff "
                         "alone), which is not text")
    return value


def _surrogate_in(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


# the reader of each set of options a face parses with (a parse_float, a parse_constant),
# made once: ``json.loads`` with options makes a decoder and its scanner for each text, and
# goes through three Python layers around the C scanner either way (issue 50: every
# request's body, every hook's event)
_Scan = Callable[[str, int], tuple[Any, int]]
_SCANNERS: dict[tuple[tuple[str, Any], ...], _Scan] = {}


def _read(text: str | bytes, kw: dict[str, Any]) -> Any:
    """``json.loads(text, **kw)``: the same value, or the same error (anything the scanner
    alone does not read whole, whitespace around it or not JSON, is ``json.loads``'s)."""
    if not isinstance(text, str) or "cls" in kw:  # (bytes, a decoder of the caller's)
        return json.loads(text, **kw)
    key = tuple(kw.items())
    scan = _SCANNERS.get(key)
    if scan is None:  # (a caller's own hooks made for each text are not kept)
        scan = json.scanner.make_scanner(cast(Any, json.JSONDecoder(**kw)))
        if len(_SCANNERS) < 16:
            _SCANNERS[key] = scan
    try:
        value, end = scan(text, 0)
    except (StopIteration, ValueError):  # empty, whitespace first, not JSON
        return json.loads(text, **kw)
    if end != len(text):  # whitespace after it (allowed), or anything else (an error)
        return json.loads(text, **kw)
    return value
