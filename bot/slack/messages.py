"""Pure builders for the text messages around approvals: refusals, reminders, notices, and a
run's ops-channel parent message and thread replies.

Like :mod:`bot.cards`, nothing here reads a clock or does I/O, wording comes from
:mod:`bot.texts`, and agent-written text (tasks, results, errors, answers, reasons) is
escaped and cut by :mod:`bot.mrkdwn`. A run's thread lines are built by :mod:`bot.story`
from its audit entries; :func:`coalesce` packs any lines into as few messages as Slack
allows.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from approvald.bot.slack import texts as T
from approvald.bot.slack.cards import (
    approver_ids,
    as_text,
    impact_line,
    json_object,
)
from approvald.bot.slack.mrkdwn import (
    FALLBACK_MAX,
    SECTION_MAX,
    approver,
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
from approvald.bot.slack.story import person, waiting_lines
from approvald.runtime import ANSWERS, WORDS, DecisionRefused, Masking, OutcomeName, asker, will_run
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

def run_parent(run: RunRecord, *, now: datetime, pending: Sequence[ApprovalRecord] = (),
               ended: tuple[str, str] | None = None,
               shown: Masking | None = None) -> dict[str, Any]:
    """The ops-channel message a run's thread hangs from: ``{"text", "blocks"}``; its
    task, error and result masked by ``shown`` (the run's calls' declared values).

    Updated in place as the run moves, and always true: its icon and status say how the
    run stands (``ended``: a completed run's ``(emoji, status)`` when a call it asked for
    was denied, expired, redirected or failed: never a green check), and while requests
    are ``pending`` on whom it waits, for what and until when. A run still going says
    when it started (a date Slack renders for each reader), never how long it has run:
    that would be true only at the moment of the update. ``now`` is kept for callers.
    """
    emoji, status = T.RUN_STATUS.get(run.status, (T.UNKNOWN_EMOJI, clip(run.status, 40)))
    if run.status == "completed" and ended is not None:
        emoji, status = ended
    agent = clip(asker(run.agent), 80)
    mask = (shown or Masking()).text
    lines = [T.RUN_HEADLINE.format(emoji=emoji, agent=agent, status=status),
             T.RUN_TASK.format(task=clip(mask(run.task), 600))]
    if run.status not in TERMINAL_RUN_STATUSES:
        lines.extend(waiting_lines(pending))
    if run.error and run.status != "completed":
        lines.append(T.RUN_ERROR.format(error=clip(mask(_actor_words(run.error)), 600)))
    if run.result and run.status == "completed":
        lines.append(T.RUN_RESULT.format(result=clip(mask(run.result), 900)))
    if run.status in TERMINAL_RUN_STATUSES:
        elapsed = T.RUN_TOOK.format(elapsed=duration(run.updated_at - run.created_at))
    else:
        elapsed = T.RUN_STARTED.format(date=slack_date(run.created_at, T.DATE_AT))
    parts = [T.RUN_REQUESTED_BY.format(who=who(run.requested_by)),
             T.RUN_STEP.format(step=run.step), elapsed]
    if run.cancel_requested and run.status not in TERMINAL_RUN_STATUSES:
        parts.append(T.RUN_CANCEL_REQUESTED)
    parts.append(T.RUN_ID.format(id=code_span(run.id, 64)))
    blocks: list[Block] = [section("\n".join(lines)), context(parts)]
    return {"text": safe_cut(T.RUN_FALLBACK.format(agent=agent, status=status), FALLBACK_MAX),
            "blocks": [b.to_dict() for b in blocks]}


def _actor_words(error: str) -> str:
    """A run's error names who cancelled it by id (``cancelled by cli:root``): in words."""
    head, sep, rest = error.partition("cancelled by ")
    if not sep or head:
        return error
    actor, colon, reason = rest.partition(": ")
    return f"cancelled by {person(actor)}{colon}{reason}"


# -- thread replies ---------------------------------------------------------------------------

def thread_error(error: str) -> str:
    """A run's error, escaped and cut."""
    return T.THREAD_ERROR.format(error=clip(error, 1000))


def thread_final(answer: Any) -> str:
    """The agent's final answer."""
    text = answer if isinstance(answer, str) else as_text(answer)
    return T.THREAD_FINAL.format(answer=clip(text, SECTION_MAX - 100))


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
