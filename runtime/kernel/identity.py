"""Slack identities typed by people: ``--as``, ``--requested-by`` and policy approver ids.

Authorization compares ids as strings, so every id a person types is brought to the one
form Slack's signed payloads carry (``U024BE7LH``) before it is compared or recorded:
surrounding spaces and a pasted mention (``<@U024BE7LH>``, ``<@U024BE7LH|dana>``) are
removed and letters upper-cased. Anything that is still not an id (an empty string,
``<!channel>``, a display name) is refused, never recorded.
"""

from __future__ import annotations

import re

from approvald.runtime.kernel.errors import ApprovaldError

__all__ = ["InvalidIdentity", "normalize_approver", "normalize_group_id", "normalize_user_id"]

# U/W (users) or S (user groups), then 2-30 of A-Z 0-9 _ ; the test workspace uses U_ALICE.
# ASCII is checked before upper-casing: "\u017f".upper() == "S" (long s) must not make an id.
_USER = re.compile(r"[UW][A-Z0-9_]{2,30}", re.IGNORECASE | re.ASCII)
_GROUP = re.compile(r"S[A-Z0-9_]{2,30}", re.IGNORECASE | re.ASCII)
_USER_MENTION = re.compile(r"<@([^|>]*)(?:\|[^>]*)?>")
_GROUP_MENTION = re.compile(r"<!subteam\^([^|>]*)(?:\|[^>]*)?>")
_SHOWN = 60  # how much of a refused value an error message repeats


class InvalidIdentity(ApprovaldError):
    """A value given as a Slack user or user-group id is not one."""


def _shown(raw: str) -> str:
    text = raw if len(raw) <= _SHOWN else raw[:_SHOWN] + "…"
    return repr(text)  # quoted, and control characters escaped: the message stays one line


def _match(raw: str, mention: re.Pattern[str], shape: re.Pattern[str]) -> str | None:
    text = raw.strip()
    m = mention.fullmatch(text)
    if m is not None:
        text = m.group(1)
    return text.upper() if shape.fullmatch(text) else None


def normalize_user_id(raw: str) -> str:
    """``" u_alice "`` / ``"<@U_ALICE|alice>"`` -> ``"U_ALICE"``; raise :class:`InvalidIdentity`."""
    found = _match(raw, _USER_MENTION, _USER)
    if found is None:
        raise InvalidIdentity(
            f"{_shown(raw)} is not a Slack user id (expected U… or W…, e.g. U024BE7LH)")
    return found


def normalize_group_id(raw: str) -> str:
    """``"s_finance"`` / ``"<!subteam^S_FINANCE|@finance>"`` -> ``"S_FINANCE"``."""
    found = _match(raw, _GROUP_MENTION, _GROUP)
    if found is None:
        raise InvalidIdentity(
            f"{_shown(raw)} is not a Slack user-group id (expected S…, e.g. S0614TZR7)")
    return found


def normalize_approver(raw: str) -> str:
    """A user id or a user-group id, normalised as above."""
    found = _match(raw, _USER_MENTION, _USER) or _match(raw, _GROUP_MENTION, _GROUP)
    if found is None:
        raise InvalidIdentity(
            f"{_shown(raw)} is not a Slack user or user-group id "
            "(expected U…, W… or S…, e.g. U024BE7LH or S0614TZR7)")
    return found
