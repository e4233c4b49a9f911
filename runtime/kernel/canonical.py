"""Canonical JSON and digests: the exact bytes an approval binds to."""

from __future__ import annotations

import hashlib
import json
from typing import Any

JSONValue = Any  # JSON-shaped data: dict/list/str/int/float/bool/None

# the two encoders, made once: json.dumps with any option builds a JSONEncoder per call,
# and a decision serialises a dozen values (issue 50). encode() keeps no state between
# calls, so one instance serves every caller; the text is json.dumps's with these options
_CANONICAL_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"),
                                      ensure_ascii=False, allow_nan=False)
_COMPACT_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False,
                                    allow_nan=False)
# encode() is two Python calls (encode, iterencode) that make the C encoder from the same
# options each time and call it: about eight calls a value. Where the interpreter has the
# C encoder, it is made here as iterencode makes it (its arguments, in its order, a fresh
# markers dict each time: the circular-reference check), in one call (issue 50)
_MAKE: Any = getattr(json.encoder, "c_make_encoder", None)


def _options(encoder: json.JSONEncoder) -> tuple[Any, ...]:
    return (encoder.default, json.encoder.encode_basestring, encoder.indent,
            encoder.key_separator, encoder.item_separator, encoder.sort_keys,
            encoder.skipkeys, encoder.allow_nan)


_CANONICAL = _options(_CANONICAL_ENCODER)
_COMPACT = _options(_COMPACT_ENCODER)


def canonical_json(value: JSONValue) -> str:
    """Serialize ``value`` deterministically: sorted keys, no whitespace, UTF-8 kept as is.

    Floats that are integral stay distinct from ints (``1.0`` vs ``1``) because JSON
    producers differ there and an approver saw one of them.
    """
    if _MAKE is None:
        return _CANONICAL_ENCODER.encode(value)
    return "".join(_MAKE({}, *_CANONICAL)(value, 0))


def compact_json(value: JSONValue) -> str:
    """Compact JSON for storage (key order kept)."""
    if _MAKE is None:
        return _COMPACT_ENCODER.encode(value)
    return "".join(_MAKE({}, *_COMPACT)(value, 0))


def sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def value_digest(value: JSONValue) -> str:
    """SHA-256 of the canonical JSON of ``value``."""
    return sha256_hex(canonical_json(value))


def call_digest(tool: str, arguments: JSONValue) -> str:
    """SHA-256 of the canonical JSON of ``{"tool": name, "arguments": args}``."""
    return sha256_hex(canonical_json({"tool": tool, "arguments": arguments}))

