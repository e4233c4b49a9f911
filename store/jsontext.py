"""JSON text read back: what ``json.loads`` gives, in one call into the C scanner.

``json.loads`` is three Python calls deep (``loads``, ``JSONDecoder.decode``, ``raw_decode``)
around one call of the C scanner, and checks the whitespace on each side with two more
regular-expression calls: about ten calls for each text, and an approval reads a dozen
stored texts (its arguments, approvers, packet, events, outbox payload; issue 50). What
this process stored itself has no whitespace around it, so :func:`loads` asks the scanner
alone, and leaves anything else (whitespace, trailing text, not JSON, not a str) to
``json.loads``, which gives the same value or raises the same error.
"""

from __future__ import annotations

import json
import json.scanner
from typing import Any, cast

# the scanner of the decoder json.loads uses by default (no hooks), made as JSONDecoder
# makes its own: the C one where the interpreter has it. It holds no state between calls
# (its memo is cleared after each)
_SCAN = json.scanner.make_scanner(cast(Any, json.JSONDecoder()))  # (typeshed: its own type)


def loads(text: str) -> Any:
    """``json.loads(text)``: the same value, or the same error."""
    try:
        value, end = _SCAN(text, 0)
    except (StopIteration, TypeError):  # empty, whitespace first, not JSON, not a str
        return json.loads(text)
    if end != len(text):  # whitespace after it (allowed), or anything else (an error)
        return json.loads(text)
    return value
