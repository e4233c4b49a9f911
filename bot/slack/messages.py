"""Pure builders for the text messages around approvals: refusals, reminders, notices, and a
run's ops-channel parent message and thread replies.

Like :mod:`bot.cards`, nothing here reads a clock or does I/O, wording comes from
:mod:`bot.texts`, and agent-written text (tasks, results, errors, answers, reasons) is
escaped and cut by :mod:`bot.mrkdwn`. Thread lines are short on purpose; :func:`thread_reply`
packs a burst of them, whole events at a time, into one reply, and :func:`coalesce` packs
any lines into as few messages as Slack allows.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from approvald.bot.slack import texts as T
from approvald.bot.slack.cards import (
    approver_ids,
    args_text,
    as_text,
    impact_line,
    json_object,
    outcome_emoji,
    status_word,
)
from approvald.bot.slack.mrkdwn import (
    FALLBACK_MAX,
    SECTION_MAX,
    approver,
    clause,
    clip,
    code_block,
    code_span,
    context,
    duration,
    pretty_json,
    safe_cut,
    safe_url,
    section,
    sentence,
    slack_date,
    units,
    who,
)
from approvald.runtime.errors import DecisionRefused
from approvald.runtime.packet import asker, sensitive_paths, will_run
from approvald.runtime.sensitive import Masking
from approvald.runtime.vocabulary import ANSWERS, WORDS, OutcomeName
from approvald.store.records import ApprovalRecord, RunRecord
from slack_sdk.models.blocks import Block

TERMINAL_RUN_STATUSES = ("completed", "failed", "cancelled")


def proposed_text(a: ApprovalRecord, reset: str = "") -> str:
    """The ephemeral reply to an approver whose edit awaits someone else's approval, with
    what the proposed arguments will do (the proposer checks the edit says what they
    meant); ``reset``: the sentence about votes the edit discarded, if any."""
    impact = impact_line(will_run(a), 500)
    return T.REPLY_PROPOSED + reset + ("\n" + impact if impact else "")


# refusals whose runtime message carries what the wording cannot: a schema's complaint, the
# rule an edit would move the call to. Every other refusal is worded whole from its code and
# fields: the runtime's message says the same thing again, in raw ids, for logs and the CLI.
DETAILED = frozenset({"invalid_arguments", "rule_changed"})


def refusal_text(code: str, *, status: str | None = None, detail: str | None = None,
                 decided_by: str | None = None, approvers: Sequence[str] = (),
                 mentions: bool = True, viewer: str | None = None,
                 outcome: str | None = None) -> str:
    """The reply to a refused decision, one wording per ``DecisionRefused.reason``, said
    once: ``status`` (the approval's status now) and ``decided_by`` word a late click,
    ``approvers`` a stranger's; people are Slack mentions, or (``mentions=False``, for
    plain text such as a modal's errors, where a mention shows as its raw markup) left out.
    ``detail``, the runtime's message, is added (escaped) only where the wording needs it.
    ``viewer``: who reads it; the one who decided is told that their decision stands.
    ``outcome``: the request's outcome's name; an answered question is told by it (its
    status, approved or denied, is not what it was answered).
    """
    answered = WORDS[OutcomeName(outcome)] if outcome in ANSWERS else None
    if code == "not_pending" and answered is not None:
        text = (T.REFUSAL_ANSWERED_BY.format(who=who(decided_by), words=answered.words)
                if mentions and decided_by else
                T.REFUSAL_ANSWERED.format(words=answered.words))
    elif code == "not_pending":
        text = T.REFUSAL_NOT_PENDING.get(status or "", T.REFUSAL_NOT_PENDING_OTHER)
        if viewer and decided_by == viewer and status in T.REPLY_REPEATED:
            text = T.REPLY_REPEATED[status]
        elif mentions and decided_by and status in T.REFUSAL_NOT_PENDING_BY:
            text = T.REFUSAL_NOT_PENDING_BY[status].format(who=who(decided_by))
    elif code == "not_authorized" and mentions and approvers:
        text = T.REFUSAL_NOT_AUTHORIZED_WHO.format(
            who=", ".join(approver(p) for p in approvers[:10]))
    else:
        text = T.REFUSAL.get(code, T.REFUSAL_UNKNOWN)
    if detail and (code in DETAILED or (code not in T.REFUSAL and code != "not_pending")):
        text = T.REFUSAL_DETAIL.format(text=text.rstrip().removesuffix("."),
                                       detail=sentence(clip(detail, 500)))
    return text


def refusal_of(exc: DecisionRefused, *, mentions: bool = True,
               viewer: str | None = None) -> str:
    """:func:`refusal_text` for a refusal the runtime raised, from its fields."""
    return refusal_text(exc.reason, status=exc.status, detail=str(exc),
                        outcome=exc.fields.get("outcome"),
                        decided_by=exc.fields.get("decided_by"),
                        approvers=exc.fields.get("approvers") or (), mentions=mentions,
                        viewer=viewer)


# standing-approval refusals whose runtime message says what the wording cannot
STANDING_DETAILED = frozenset({"window"})  # the windows the tool allows


def standing_refusal_text(code: str, detail: str | None = None) -> str:
    """The reply to a refused grant, revocation or standing-approval change, said once:
    the runtime's message is added only where it says what the wording cannot."""
    text = T.STANDING_REFUSAL.get(code, T.REFUSAL_UNKNOWN)
    if detail and (code in STANDING_DETAILED or code not in T.STANDING_REFUSAL):
        text = T.REFUSAL_DETAIL.format(text=text.rstrip().removesuffix("."),
                                       detail=sentence(clip(detail, 500)))
    return text


def repeated_text(a: ApprovalRecord) -> str:
    """The reply to the person who decided ``a`` deciding it the same way again."""
    if a.kind != "tool_call":
        return T.REPLY_REPEATED_OTHER
    return T.REPLY_REPEATED.get(a.status, T.REPLY_REPEATED_OTHER)


def reminder_text(a: ApprovalRecord, *, now: datetime, card_url: str | None = None) -> str:
    """A reminder about a still-pending request; it mentions the approvers, so it notifies."""
    agent = clip(asker(json_object(a.packet).get("agent")), 60)
    tool = code_span(a.tool, 80)
    if a.kind == "outcome_unknown":
        text = T.REMINDER_QUESTION.format(tool=tool, agent=agent)
    elif a.kind == "cannot_run":
        text = T.REMINDER_CANNOT_RUN.format(tool=tool, agent=agent)
    elif now >= a.expires_at:
        text = T.REMINDER_OVERDUE.format(tool=tool, agent=agent)
    else:
        progress = (T.REMINDER_PROGRESS.format(count=a.approve_count, quorum=a.quorum)
                    if a.quorum > 1 else "")
        text = T.REMINDER.format(tool=tool, agent=agent, progress=progress,
                                 expires=slack_date(a.expires_at, T.DATE_EXPIRES),
                                 left=duration(a.expires_at - now))
    people = approver_ids(a)[:10]
    if people:
        text += T.REMINDER_WHO.format(who=" ".join(approver(p) for p in people))
    url = safe_url(card_url)
    if url:
        text += T.REMINDER_LINK.format(url=url)
    impact = impact_line(will_run(a), 300) if a.kind == "tool_call" else None
    if impact:  # of the arguments that run now, an edit's included
        text += "\n" + impact
    return safe_cut(text, FALLBACK_MAX)


def notice_text(tool: str, args: Any, result: Any) -> str:
    """What a ``notify_after`` tool did: posted after it ran, so nobody is asked anything."""
    shown_args, _ = code_block(pretty_json(args), 1500)
    shown_result, _ = code_block(_result_text(result), 1000)
    text = (f"{T.NOTICE.format(tool=code_span(tool, 80))}\n{T.NOTICE_ARGS}\n{shown_args}\n"
            f"{T.NOTICE_RESULT}\n{shown_result}")
    return safe_cut(text, FALLBACK_MAX)


def _result_text(result: Any) -> str:
    return result if isinstance(result, str) else pretty_json(result)


# -- a run's parent message in the ops channel ---------------------------------------------

def run_parent(run: RunRecord, *, now: datetime, approvals_pending: int = 0,
               shown: Masking | None = None) -> dict[str, Any]:
    """The ops-channel message a run's thread hangs from: ``{"text", "blocks"}``; its
    task, error and result masked by ``shown`` (the run's calls' declared values).

    Updated in place as the run moves. A run still going says when it started (a date
    Slack renders for each reader), never how long it has run: that would be true only at
    the moment of the update. ``now`` is kept for callers; nothing here depends on it.
    """
    emoji, status = T.RUN_STATUS.get(run.status, (T.UNKNOWN_EMOJI, clip(run.status, 40)))
    agent = clip(asker(run.agent), 80)
    mask = (shown or Masking()).text
    lines = [T.RUN_HEADLINE.format(emoji=emoji, agent=agent, status=status),
             T.RUN_TASK.format(task=clip(mask(run.task), 600))]
    if run.error and run.status != "completed":
        lines.append(T.RUN_ERROR.format(error=clip(mask(run.error), 600)))
    if run.result and run.status == "completed":
        lines.append(T.RUN_RESULT.format(result=clip(mask(run.result), 900)))
    if run.status in TERMINAL_RUN_STATUSES:
        elapsed = T.RUN_TOOK.format(elapsed=duration(run.updated_at - run.created_at))
    else:
        elapsed = T.RUN_STARTED.format(date=slack_date(run.created_at, T.DATE_AT))
    parts = [T.RUN_REQUESTED_BY.format(who=who(run.requested_by)),
             T.RUN_STEP.format(step=run.step), elapsed]
    if approvals_pending > 0:
        parts.append(T.RUN_PENDING.format(n=approvals_pending))
    if run.cancel_requested and run.status not in TERMINAL_RUN_STATUSES:
        parts.append(T.RUN_CANCEL_REQUESTED)
    parts.append(T.RUN_ID.format(id=code_span(run.id, 64)))
    blocks: list[Block] = [section("\n".join(lines)), context(parts)]
    return {"text": safe_cut(T.RUN_FALLBACK.format(agent=agent, status=status), FALLBACK_MAX),
            "blocks": [b.to_dict() for b in blocks]}


# -- thread replies ---------------------------------------------------------------------------

def thread_tool_call(tool: str, result: Any, *, failed: bool = False) -> str:
    """One line for a tool call that ran: its name and the start of its result."""
    text = clip(result if isinstance(result, str) else as_text(result), 300)
    template = T.THREAD_TOOL_FAILED if failed else T.THREAD_TOOL_OK
    return template.format(tool=code_span(tool, 80), result=text)


def thread_approval_requested(a: ApprovalRecord, *, card_url: str | None = None) -> str:
    """The run is waiting for this request (or asking whether a call took effect)."""
    tool = code_span(a.tool, 80)
    if a.kind == "outcome_unknown":
        text = T.THREAD_REQUESTED_QUESTION.format(tool=tool)
    elif a.kind == "cannot_run":
        reason = as_text(json_object(a.packet).get("reason")) or ""
        text = T.THREAD_REQUESTED_CANNOT_RUN.format(tool=tool,
                                                    reason=clause(clip(reason, 500)))
    else:
        progress = T.REMINDER_PROGRESS.format(count=a.approve_count, quorum=a.quorum) \
            if a.quorum > 1 else ""
        text = T.THREAD_REQUESTED.format(tool=tool, progress=progress)
    url = safe_url(card_url)
    return text + (T.THREAD_CARD_LINK.format(url=url) if url else "")


def thread_approval_decided(a: ApprovalRecord) -> str:
    """How a request ended: approved, denied (with the reason), expired, escalated…"""
    status = status_word(a)
    reason = T.THREAD_REASON.format(reason=clip(a.reason, 300)) if a.reason else ""
    fields = {"emoji": outcome_emoji(a),
              "tool": code_span(a.tool, 80), "status": status, "reason": reason}
    if a.decided_via == "standing" and a.decided_by:  # no card: say what allowed it
        return T.THREAD_STANDING.format(emoji=fields["emoji"], tool=fields["tool"],
                                        reason=clip(a.reason or "", 300))
    if a.decided_by and a.status not in ("expired", "superseded"):
        text = T.THREAD_DECIDED.format(who=who(a.decided_by), **fields)
    else:
        text = T.THREAD_DECIDED_NOBODY.format(**fields)
    ran = thread_edited_call(a) if a.status == "approved" else None
    return text + "\n" + ran if ran else text


def thread_edited_call(a: ApprovalRecord) -> str | None:
    """For a request with edits, what the edited call does: the impact of the arguments
    that run, or (when nothing could work it out) those arguments; else None."""
    if a.kind != "tool_call":
        return None
    w = will_run(a)
    if not w.edited:
        return None
    if w.impact:
        return impact_line(w, 300)
    return T.THREAD_EDITED_ARGS.format(args=code_span(args_text(w.args, indent=None,
                                                                     sensitive=w.sensitive),
                                                           300))


def thread_edited_args(a: ApprovalRecord) -> str | None:
    """The edited arguments of a request approved with edits, as a code block; else None."""
    if a.edited_args is None:
        return None
    return code_block(args_text(a.edited_args, sensitive=sensitive_paths(a)), 2000)[0]


def thread_error(error: str) -> str:
    """A run's error, escaped and cut."""
    return T.THREAD_ERROR.format(error=clip(error, 1000))


def thread_final(answer: Any) -> str:
    """The agent's final answer."""
    text = answer if isinstance(answer, str) else as_text(answer)
    return T.THREAD_FINAL.format(answer=clip(text, SECTION_MAX - 100))


def thread_reply(groups: Sequence[tuple[int, Sequence[str]]], *,
                 limit: int = SECTION_MAX) -> tuple[str, int]:
    """The next thread reply for a run's untold events, and the seq it tells up to.

    ``groups`` are ``(seq, lines)`` per event, in order. The reply holds whole events
    only, as many as fit in ``limit`` units (one event's lines are cut to fit alone), so
    "events before the returned seq are told" is true after the reply and false before
    it. Events without lines ride along for free; with no lines at all the text is empty.
    """
    parts: list[str] = []
    size = 0
    upto = groups[0][0] if groups else 0
    for seq, lines in groups:
        text = safe_cut("\n".join(line for line in lines if line), limit)
        if text:
            add = units(text) + (1 if parts else 0)
            if parts and size + add > limit:
                break
            parts.append(text)
            size += add
        upto = seq + 1
    return "\n".join(parts), upto


def thread_status(lines: Sequence[str], *, limit: int = SECTION_MAX) -> str:
    """What a run now waits for (or why it stopped), as one reply cut to ``limit``."""
    return safe_cut("\n".join(line for line in lines if line), limit)


def coalesce(lines: Sequence[str], limit: int = SECTION_MAX) -> list[str]:
    """Pack lines, in order, into as few newline-joined messages of ``limit`` units as fit.

    A line longer than ``limit`` is split where no entity (``&lt;``) or markup (``<@U1>``)
    is cut in two. Empty lines are dropped: Slack refuses an empty message.
    """
    if limit < 16:
        raise ValueError("limit too small")
    messages: list[str] = []
    current: list[str] = []
    size = 0
    for line in lines:
        for piece in _split(line, limit):
            add = units(piece) + (1 if current else 0)
            if current and size + add > limit:
                messages.append("\n".join(current))
                current, size, add = [], 0, units(piece)
            current.append(piece)
            size += add
    if current:
        messages.append("\n".join(current))
    return messages


def _split(line: str, limit: int) -> list[str]:
    pieces: list[str] = []
    while units(line) > limit:
        cut, used = 0, 0
        for i, ch in enumerate(line):
            used += 2 if ord(ch) > 0xFFFF else 1
            if used > limit:
                cut = i
                break
        head = line[:cut]
        # step back over a half-written entity or <…> markup
        amp, lt = head.rfind("&"), head.rfind("<")
        back = min([p for p in (amp if amp > head.rfind(";") else -1,
                                lt if lt > head.rfind(">") else -1) if p > 0], default=cut)
        pieces.append(line[:back])
        line = line[back:]
    if line:
        pieces.append(line)
    return pieces
