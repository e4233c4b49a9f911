"""One way to name a record: its full id, or an unambiguous prefix of at least 6 characters.

Runs, requests and standing approvals are named the same way wherever a person types one
(``runs show``, ``trace``, ``approvals show``, ``standing revoke``, ``audit export --run``
and the rest), so a prefix means the same thing everywhere and a mistake is the same clear
error everywhere: nothing has that id, a prefix too short to trust, or a prefix several
records share (named, so the person can say more). A full id costs one lookup; the prefix
search runs only when no record has exactly that id.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol, TypeVar

from approvald.runtime.kernel.errors import NotFound

MIN_PREFIX = 6  # shorter prefixes match too much to be typed safely
SHOWN = 5  # candidates an ambiguity error names


class _Named(Protocol):
    @property
    def id(self) -> str: ...


R = TypeVar("R", bound=_Named)


def id_help(what: str) -> str:
    """A command's help for an argument naming a record: ``what`` (``"a run id"``), and
    that a prefix of :data:`MIN_PREFIX` characters will do."""
    return f"{what} (or a unique prefix of {MIN_PREFIX}+ characters)"


async def resolve(kind: str, text: str, exact: Callable[[str], Awaitable[R | None]],
                  find: Callable[[str, int], Awaitable[Sequence[R]]], *,
                  field: str | None = None) -> R:
    """The record of ``kind`` (``"run"``, ``"approval"``, …) whose id is ``text``, else the
    only one whose id starts with ``text``.

    ``exact(id)`` reads the record with that id (or None); ``find(prefix, limit)`` reads up
    to ``limit`` records whose ids start with ``prefix``. Raises :class:`NotFound` saying
    which mistake it was (no such record, a prefix shorter than :data:`MIN_PREFIX`, or an
    ambiguous prefix with its candidates), with ``field`` (``"run_id"``, say) set to
    ``text``.
    """
    found = await exact(text)
    if found is not None:
        return found
    fields = {field: text} if field else {}
    named = text or "''"
    if len(text) < MIN_PREFIX:  # not "no such record": there may well be one
        article = "an" if kind[:1] in "aeiou" else "a"
        raise NotFound(f"{named} is too short to name {article} {kind}: give at least {MIN_PREFIX} "
                       "characters of its id (or the whole id)", **fields)
    candidates = await find(text, SHOWN + 1)
    if not candidates:
        raise NotFound(f"no {kind} {named}", **fields)
    if len(candidates) > 1:
        shown = ", ".join(c.id for c in candidates[:SHOWN])
        more = ", and more" if len(candidates) > SHOWN else ""
        raise NotFound(f"{kind} id prefix {named} is ambiguous, say more: candidates "
                       f"{shown}{more}", **fields)
    return candidates[0]
