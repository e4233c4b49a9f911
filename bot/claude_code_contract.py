"""The Claude Code hook's wire contract and budget: the event Claude Code sends, the answer
approvald gives, and how long it may take.

Importing this costs next to nothing (the standard library, approvald's JSON reader and
its error root), so the process that answers Claude Code can start its clock and its
watchdog (:mod:`bot.hooks.process`) and read the event before it imports anything that
could fail or take time; the decision itself is :mod:`bot.claude_code`'s. Claude Code's
command hook (:mod:`bot.hooks`) and its HTTP hook (:mod:`bot.api`) both serve it, so it
lives beside them, in no face.

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
from typing import Any, NamedTuple

from approvald.runtime import MAX_DEPTH, ApprovaldError, TooDeep, parse_caller_json

NAME = "claude-code"
PRE, POST, POST_FAILED = "PreToolUse", "PostToolUse", "PostToolUseFailure"
EVENTS = (PRE, POST, POST_FAILED)
# how long a PreToolUse waits for a person's decision, unless --wait (or ?wait=) says: with
# the margin and room to start, inside the 60 s timeout older Claude Code releases default to
DEFAULT_WAIT = 45.0
# over HTTP (POST /v1/hooks/claude-code?wait=S): the most a request is held open
MAX_HTTP_WAIT = 55.0
# seconds past the wait by which the command hook has answered: it covers importing what
# it runs, connecting to the database, every statement and the decision, on a laptop busy
# with other things too (importing the decision path alone can take seconds then); past
# it, a deny
MARGIN = 10.0
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


class HookEventError(ApprovaldError):
    """The event on stdin is not one this hook can decide: denied, saying why."""


class HookEvent(NamedTuple):  # (not a dataclass: importing dataclasses costs the hook 9 ms)
    """One event as Claude Code sends it (only the fields the hook uses)."""

    event: str
    session_id: str
    cwd: str
    tool_name: str
    tool_input: dict[str, Any]
    tool_use_id: str
    tool_response: Any = None
    error: str | None = None

    @classmethod
    def read(cls, raw: bytes) -> HookEvent:
        """The event from its bytes, as Claude Code sends them (UTF-8 JSON, whatever the
        locale of the process reading them says)."""
        if len(raw) > MAX_EVENT:
            raise HookEventError(f"the event is larger than {MAX_EVENT} bytes")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise HookEventError(f"the event is not UTF-8 ({exc.reason} at byte "
                                 f"{exc.start})") from None
        return cls._of_text(text)  # its size in bytes checked above: not encoded again

    @classmethod
    def parse(cls, text: str) -> HookEvent:
        """The event from its text (see :meth:`read`)."""
        if len(text) > MAX_EVENT or len(text.encode("utf-8", "replace")) > MAX_EVENT:
            raise HookEventError(f"the event is larger than {MAX_EVENT} bytes")
        return cls._of_text(text)

    @classmethod
    def _of_text(cls, text: str) -> HookEvent:
        """The event from its text, whose size is checked."""
        try:
            doc = parse_caller_json(text)
        except TooDeep as exc:
            raise HookEventError(f"the event is {exc} (a tool's input may nest "
                                 f"{MAX_DEPTH})") from None
        except ValueError as exc:
            raise HookEventError(f"the event is not JSON ({exc})") from None
        if not isinstance(doc, dict):
            raise HookEventError("the event is not a JSON object")
        event = doc.get("hook_event_name")
        if event not in EVENTS:
            raise HookEventError(f"hook_event_name {event!r} is not one of "
                                 f"{', '.join(EVENTS)}")

        def text_field(name: str, *, limit: int = 200, required: bool = True) -> str:
            value = doc.get(name)
            if value is None and not required:
                return ""
            if not isinstance(value, str) or not value or len(value) > limit:
                raise HookEventError(f"{name}: expected a string of 1 to {limit} characters")
            return value

        tool_input = doc.get("tool_input")
        if not isinstance(tool_input, dict):
            raise HookEventError("tool_input: expected a JSON object")
        error = doc.get("error")
        return cls(event=str(event), session_id=text_field("session_id"),
                   cwd=text_field("cwd", limit=4096, required=False),
                   tool_name=text_field("tool_name", limit=100), tool_input=tool_input,
                   tool_use_id=text_field("tool_use_id"),
                   tool_response=doc.get("tool_response"),
                   error=error if isinstance(error, str) else None)

    @property
    def owner(self) -> str:
        """The execution ledger's owner of the call this event is about."""
        return f"{NAME}:{self.session_id}:{self.tool_use_id}"[:200]
