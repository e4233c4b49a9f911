"""The Claude Code hook's wire contract and budget, in the standard library only: the
events Claude Code sends, the answer approvald prints, and how long it may take.

Importing this costs nothing, so the process that answers Claude Code can start its
clock and its watchdog (:mod:`.process`) before it imports anything that could fail or
take time; the decision itself is :mod:`.claude_code`'s.

The budget. Claude Code runs a call whose command hook outlives the hook's ``timeout`` or
exits with a status other than 0 or 2 (and one whose HTTP hook answers late or non-2xx),
unless the hook's settings say ``"onFailure": "block"``. So approvald's hook answers, at
the latest, ``--wait`` plus :data:`MARGIN` seconds after it starts, whatever the
database, the network or the input does; serve answers the HTTP hook within ``wait``
plus :data:`HTTP_MARGIN` of reading its token; the settings ``approvald hook install``
writes give Claude Code's ``timeout`` as :func:`settings_timeout` of the wait.
"""

from __future__ import annotations

import math
from typing import Any

NAME = "claude-code"
PRE, POST, POST_FAILED = "PreToolUse", "PostToolUse", "PostToolUseFailure"
EVENTS = (PRE, POST, POST_FAILED)
# how long a PreToolUse waits for a person's decision, unless --wait (or ?wait=) says
DEFAULT_WAIT = 50.0
# over HTTP (POST /v1/hooks/claude-code?wait=S): the most a request is held open
MAX_HTTP_WAIT = 55.0
# seconds past the wait by which the command hook has answered: it covers starting,
# connecting to the database, every statement, and the decision; past it, a deny
MARGIN = 5.0
# seconds past the wait by which serve has answered an HTTP hook whose token it knows
HTTP_MARGIN = 2.0
# room, in Claude Code's timeout, for starting the hook's process before its clock runs
START = 5.0
MAX_EVENT = 1_000_000  # bytes of an event taken (on stdin, or as an HTTP body)


def settings_timeout(wait: float) -> int:
    """The ``timeout`` (whole seconds) to give Claude Code for a hook that waits ``wait``
    seconds: its budget, and room to start."""
    return math.ceil(wait + MARGIN + START)


def decision(allow: bool, reason: str, updated: dict[str, Any] | None = None) -> dict[str, Any]:
    """A ``PreToolUse`` answer: allow or deny, the reason Claude reads, and the input an
    approver edited (run instead of Claude's)."""
    out: dict[str, Any] = {"hookEventName": PRE,
                           "permissionDecision": "allow" if allow else "deny",
                           "permissionDecisionReason": reason}
    if updated is not None:
        out["updatedInput"] = updated
    return {"hookSpecificOutput": out}


def fail_closed(why: str) -> dict[str, Any]:
    """The answer when approvald cannot decide: a deny that says why, never an allow."""
    return decision(False, f"approvald could not decide this call, so it is denied: {why}")
