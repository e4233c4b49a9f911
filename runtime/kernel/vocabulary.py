"""The one vocabulary of outcomes (design invariant 24): what became of a request, of a
question about a call, or of a call the policy answered without asking, named once.

Every view (Slack cards, App Home and threads, the web review queue, mail, the CLI, the
trace, the JSON documents, the HTTP API) and the audit log name an outcome by
:func:`outcome_of` (or :func:`policy_outcome`) and say it with the :class:`Word` of
:data:`WORDS`; none keeps words of its own. A request's stored ``status`` is its place in
its life (pending, or closed as approved, denied, ...); its outcome is what a person
reads: a question answered "re-plan" is stored ``approved`` but its outcome is
``replanned``, never "approved".
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from approvald.store.records import ApprovalRecord
from approvald.store.repos.approvals import Match

# the kinds of request (``ApprovalRecord.kind``), and a call nobody was asked about
TOOL_CALL, OUTCOME_UNKNOWN, CANNOT_RUN = "tool_call", "outcome_unknown", "cannot_run"
QUESTIONS = frozenset({OUTCOME_UNKNOWN, CANNOT_RUN})
CALL = "call"  # a call the policy answered at once: no request was made
KINDS = frozenset({TOOL_CALL, OUTCOME_UNKNOWN, CANNOT_RUN, CALL})


class OutcomeName(StrEnum):
    """An outcome's name: the token the JSON documents, the CLI and the audit log carry."""

    PENDING = "pending"
    APPROVED = "approved"
    APPROVED_WITH_EDITS = "approved_with_edits"
    APPROVED_STANDING = "approved_standing"
    DENIED = "denied"
    REDIRECTED = "redirected"
    EXPIRED = "expired"
    ESCALATED = "escalated"
    CANCELLED = "cancelled"
    RETRIED = "retried"
    MARKED_DONE = "marked_done"
    ABORTED = "aborted"
    REPLANNED = "replanned"
    AUTO = "auto"
    NOTIFY_AFTER = "notify_after"
    FORBIDDEN = "forbidden"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Word:
    """How every view says one outcome.

    ``words``: in a sentence ("`pay` was {words}"); ``label``: a heading or a badge;
    ``icon``: one emoji character (mail, the web queue, the CLI may show it), ``emoji``:
    the same emoji's short name (``:name:`` in Slack); ``kinds``: the kinds of request it
    ends (``call``: a call nobody was asked about); ``meaning``: one line for the docs.
    The audit entry that records an outcome carries its name under ``details.outcome``.
    """

    name: OutcomeName
    words: str
    label: str
    icon: str
    emoji: str
    kinds: frozenset[str]
    meaning: str


def _w(name: OutcomeName, words: str, label: str, icon: str, emoji: str, kinds: set[str],
       meaning: str) -> Word:
    return Word(name, words, label, icon, emoji, frozenset(kinds), meaning)


_ALL_REQUESTS = {TOOL_CALL, OUTCOME_UNKNOWN, CANNOT_RUN}
N = OutcomeName
WORDS: dict[OutcomeName, Word] = {w.name: w for w in (
    _w(N.PENDING, "waiting for a decision", "Waiting", "⏳", "hourglass_flowing_sand",
       _ALL_REQUESTS, "nobody has decided yet"),
    _w(N.APPROVED, "approved", "Approved", "✅", "white_check_mark", {TOOL_CALL},
       "approved as asked; the call runs"),
    _w(N.APPROVED_WITH_EDITS, "approved with edits", "Approved with edits", "✅",
       "white_check_mark", {TOOL_CALL},
       "approved with arguments an approver edited; exactly those run"),
    _w(N.APPROVED_STANDING, "approved by a standing approval", "Approved (standing)", "✅",
       "white_check_mark", {TOOL_CALL},
       "a standing approval covered the call; nobody was asked this time"),
    _w(N.DENIED, "denied", "Denied", "⛔", "no_entry", {TOOL_CALL},
       "denied with a reason; the model reads it"),
    _w(N.REDIRECTED, "redirected", "Redirected", "↩️", "leftwards_arrow_with_hook",
       {TOOL_CALL},
       "not run; the model re-plans on the approver's guidance"),
    _w(N.EXPIRED, "expired", "Expired", "⌛", "hourglass", {TOOL_CALL},
       "nobody decided in time; silence never approves"),
    _w(N.ESCALATED, "expired and escalated", "Expired and escalated", "⏫", "arrow_double_up",
       {TOOL_CALL},
       "nobody decided in time; a new request went to the next approvers"),
    _w(N.CANCELLED, "cancelled", "Cancelled", "✖️", "heavy_multiplication_x",
       _ALL_REQUESTS, "the run was cancelled before a decision"),
    _w(N.RETRIED, "retried", "Retried", "🔁", "repeat", {OUTCOME_UNKNOWN},
       "the call whose outcome was unknown did not happen: it runs once more"),
    _w(N.MARKED_DONE, "marked done", "Marked done", "☑️", "ballot_box_with_check",
       {OUTCOME_UNKNOWN},
       "the call whose outcome was unknown did happen: the run goes on as if it succeeded"),
    _w(N.ABORTED, "aborted", "Aborted", "🛑", "octagonal_sign", {OUTCOME_UNKNOWN, CANNOT_RUN},
       "the run ends; the call is not run"),
    _w(N.REPLANNED, "re-planned", "Re-planned", "🔀", "twisted_rightwards_arrows",
       {CANNOT_RUN},
       "the approved call cannot run on the deployed agent: the model reads why and "
       "plans again"),
    _w(N.AUTO, "run without asking", "Auto", "▶️", "arrow_forward", {CALL},
       "the policy runs the call without asking anyone"),
    _w(N.NOTIFY_AFTER, "run, then announced", "Notify after", "📣", "mega", {CALL},
       "the policy runs the call without asking, then tells the channel"),
    _w(N.FORBIDDEN, "forbidden by policy", "Forbidden", "🚫", "no_entry_sign", {CALL},
       "the policy never runs this call; nobody is asked"),
    _w(N.UNKNOWN, "closed", "Closed", "❔", "grey_question", _ALL_REQUESTS,
       "closed in a way this release does not know (a newer release wrote it)"),
)}

# how a question's answer (its ``verdict``) ends it
_ANSWERS = {"retry": N.RETRIED, "mark_done": N.MARKED_DONE, "abort": N.ABORTED,
            "replan": N.REPLANNED}
ANSWERS = frozenset(_ANSWERS.values())  # the outcomes of an answered question
_CLOSED = {"denied": N.DENIED, "redirected": N.REDIRECTED, "expired": N.EXPIRED,
           "superseded": N.ESCALATED, "cancelled": N.CANCELLED, "pending": N.PENDING}
# the policies that answer a call without asking anyone (their outcomes' names are theirs)
ANSWERED_AT_ONCE = frozenset({"auto", "notify_after", "forbidden"})
STANDING_VIA = "standing"  # decided_via of a request a standing approval approved


def outcome_of(a: ApprovalRecord) -> OutcomeName:
    """What became of request ``a`` (or that it is still waiting)."""
    if a.kind in QUESTIONS and a.status in ("approved", "denied"):
        # a question is stored closed as approved or denied; its answer is its outcome
        return _ANSWERS.get(a.verdict or "", N.UNKNOWN)
    if a.status in _CLOSED:
        return _CLOSED[a.status]
    if a.status != "approved":  # a status a newer release wrote: said, never guessed
        return N.UNKNOWN
    if a.decided_via == STANDING_VIA:
        return N.APPROVED_STANDING
    return N.APPROVED_WITH_EDITS if a.edited_args is not None else N.APPROVED


def policy_outcome(kind: str) -> OutcomeName:
    """What became of a call the policy answered without asking (``auto``,
    ``notify_after``, ``forbidden``)."""
    found = _AT_ONCE.get(kind)
    if found is None:
        raise ValueError(f"{kind!r} is not a policy that answers without asking")
    return found


def policy_outcome_value(kind: str) -> str:
    """:func:`policy_outcome`'s name, as documents and audit entries carry it (a plain
    string, looked up: the enum's call and its ``value`` are four Python calls each, twice
    an auto answer; issue 50)."""
    found = _AT_ONCE_NAMES.get(kind)
    if found is None:
        raise ValueError(f"{kind!r} is not a policy that answers without asking")
    return found


_AT_ONCE = {kind: OutcomeName(kind) for kind in ANSWERED_AT_ONCE}
_AT_ONCE_NAMES = {kind: name.value for kind, name in _AT_ONCE.items()}


def word(a: ApprovalRecord) -> Word:
    """The words of ``a``'s outcome."""
    return WORDS[outcome_of(a)]


def deadline(a: ApprovalRecord) -> datetime | None:
    """When ``a`` expires, or None: a question has no deadline (silence must not answer
    it); every view shows this, never the far date a question is stored with."""
    return None if a.kind in QUESTIONS else a.expires_at


def outcome_details(a: ApprovalRecord) -> dict[str, str]:
    """What an audit entry that closes ``a`` records of its outcome."""
    return {"outcome": outcome_of(a).value}


# the outcomes a request can have (what ``approvals list --status`` takes)
REQUEST_OUTCOMES = tuple(n for n in OutcomeName if not WORDS[n].kinds <= {CALL})


def match_of(name: OutcomeName) -> Match:
    """The stored columns of the requests whose outcome is ``name`` (the inverse of
    :func:`outcome_of`, for a query: a list filtered by an outcome's word shows exactly the
    requests every view names with it)."""
    tool = frozenset({TOOL_CALL})
    answers = {o: v for v, o in _ANSWERS.items()}
    if name in ANSWERS:
        return Match(statuses=frozenset({"approved", "denied"}), kinds=QUESTIONS,
                     verdicts=frozenset({answers[name]}))
    if name is N.APPROVED:
        return Match(statuses=frozenset({"approved"}), kinds=tool, edited=False,
                     not_via=STANDING_VIA)
    if name is N.APPROVED_WITH_EDITS:
        return Match(statuses=frozenset({"approved"}), kinds=tool, edited=True,
                     not_via=STANDING_VIA)
    if name is N.APPROVED_STANDING:
        return Match(statuses=frozenset({"approved"}), kinds=tool, via=STANDING_VIA)
    if name is N.UNKNOWN:  # a status this release does not know
        return Match(statuses=frozenset({*_CLOSED, "approved"}), exclude=True)
    stored = [s for s, o in _CLOSED.items() if o is name]
    if not stored:
        raise ValueError(f"{name.value!r} is not an outcome of a request")
    # a question is stored approved or denied: its answer is its outcome, never these
    kinds = tool if {"approved", "denied"} & set(stored) else None
    return Match(statuses=frozenset(stored), kinds=kinds)
