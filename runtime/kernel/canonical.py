"""Canonical JSON and digests: the exact bytes an approval binds to."""

from __future__ import annotations

import hashlib
import json
from typing import Any

JSONValue = Any  # JSON-shaped data: dict/list/str/int/float/bool/None

# the two encoders, made once: json.dumps with any option builds a JSONEncoder per call,
# and a decision serialises a dozen values (issue 50). encode() keeps no state between
# calls, so one instance serves every caller; the text is json.dumps's with these options
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                              allow_nan=False).encode
_COMPACT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False,
                            allow_nan=False).encode


def canonical_json(value: JSONValue) -> str:
    """Serialize ``value`` deterministically: sorted keys, no whitespace, UTF-8 kept as is.

    Floats that are integral stay distinct from ints (``1.0`` vs ``1``) because JSON
    producers differ there and an approver saw one of them.
    """
    return _CANONICAL(value)


def compact_json(value: JSONValue) -> str:
    """Compact JSON for storage (key order kept)."""
    return _COMPACT(value)


def sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def value_digest(value: JSONValue) -> str:
    """SHA-256 of the canonical JSON of ``value``."""
    return sha256_hex(canonical_json(value))


def call_digest(tool: str, arguments: JSONValue) -> str:
    """SHA-256 of the canonical JSON of ``{"tool": name, "arguments": args}``."""
    return sha256_hex(canonical_json({"tool": tool, "arguments": arguments}))

