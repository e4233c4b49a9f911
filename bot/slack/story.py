"""What a run's thread says, from the run's audit entries: pure builders, like :mod:`cards`.

The audit log already records every event that changes who or what a run waits on (a
request and whom it asks, a reminder, a vote, a decision, an expiry and the escalation
it led to, a retry after a crash, each execution), in the order they were committed. The
thread follower (:mod:`threads`) tells each such entry once, as one line here; the run's
events add only the agent's final answer. People are mentions (or words: ``root (on the
command line)``), requests are links to their cards, a tool's result is a sentence with
its JSON one click away (a "Show JSON" button, :data:`SHOW_JSON`).

Wording comes from :mod:`texts`; agent-written text is escaped and cut by :mod:`mrkdwn`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from approvald.bot.slack import texts as T
from approvald.bot.slack.cards import approver_ids, args_text, as_text, impact_line, json_object
from approvald.bot.slack.mrkdwn import (
    MESSAGE_BLOCKS_MAX,
    SECTION_MAX,
    approver,
    clause,
    clip,
    code_span,
    safe_cut,
    safe_url,
    section,
    slack_date,
    units,
    who,
)
from approvald.runtime import WORDS, OutcomeName, RunMasking, outcome_of, will_run
from approvald.store.records import ApprovalRecord, AuditRecord, ExecutionRecord
from slack_sdk.models.blocks import ButtonElement

SHOW_JSON = "approvald.show_json"  # a thread line's button: value "run_id call_id"
_WORDS = 3  # scalar fields of a result said in words; the rest is behind "Show JSON"


@dataclass(frozen=True)
class Line:
    """One line of a reply; ``call`` (a call id): its result's JSON is one click away."""

    text: str
    call: str | None = None


def person(actor: str | None, via: str | None = None) -> str:
    """Who acted, as a reader wants it: a Slack user as a mention; an operator on the
    command line (``cli:root``) or another face in words; the system by its role."""
    if not actor:
        return "—"
    if actor in T.PERSON_SYSTEM:
        return T.PERSON_SYSTEM[actor]
    face, _, name = actor.partition(":")
    if name and face in T.PERSON_VIA:
        return T.PERSON_VIA[face].format(who=clip(name, 60))
    base = approver(actor)
    kind = (via or "").partition(":")[0]
    if kind in T.PERSON_VIA:
        return T.PERSON_VIA[kind].format(who=base)
    return base


def people(ids: Sequence[str], requested_by: str | None = None, limit: int = 10) -> str:
    """Approvers as mentions; nobody named: anyone but the requester."""
    if not ids:
        return (T.STORY_ANYONE.format(who=who(requested_by)) if requested_by
                else T.STORY_ANYONE_NOBODY)
    shown = ", ".join(approver(p) for p in ids[:limit])
    return shown + (T.STORY_MORE.format(n=len(ids) - limit) if len(ids) > limit else "")


def until(when: datetime) -> str:
    return slack_date(when, T.DATE_AT)


def _details(e: AuditRecord) -> dict[str, Any]:
    try:
        value = json.loads(e.details or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _reason(text: Any) -> str:
    said = clause(clip(as_text(text), 300)) if text else ""
    return T.STORY_REASON.format(reason=said) if said else ""


def _link(url: str | None, template: str = T.STORY_LINK) -> str:
    safe = safe_url(url)
    return template.format(url=safe) if safe else ""


def _ids(value: Any) -> list[str]:
    return [str(p) for p in value] if isinstance(value, list) else []


# what an entry of each action names, when it does not record its outcome itself
_ACTION_OUTCOME = {"approved": OutcomeName.APPROVED, "denied": OutcomeName.DENIED,
                   "redirected": OutcomeName.REDIRECTED, "expired": OutcomeName.EXPIRED,
                   "escalated": OutcomeName.ESCALATED}
_ANSWER_OUTCOME = {"retry": OutcomeName.RETRIED, "mark_done": OutcomeName.MARKED_DONE,
                   "abort": OutcomeName.ABORTED, "replan": OutcomeName.REPLANNED}


def said_outcome(name: OutcomeName) -> dict[str, str]:
    """An outcome as a line says it: ``{icon}`` and ``{outcome}`` of the one vocabulary
    (:mod:`runtime.kernel.vocabulary`), as every view and the audit log name it."""
    w = WORDS[name]
    return {"icon": f":{w.emoji}:", "outcome": w.words}


def _outcome(d: dict[str, Any], fallback: OutcomeName) -> dict[str, str]:
    """The outcome entry details ``d`` record (``outcome``), else ``fallback``."""
    try:
        name = OutcomeName(str(d["outcome"])) if d.get("outcome") else fallback
    except ValueError:  # a word a newer release wrote
        name = OutcomeName.UNKNOWN
    return said_outcome(name)


def entry_lines(e: AuditRecord, approvals: Mapping[str, ApprovalRecord],
                executions: Mapping[str, ExecutionRecord], links: Mapping[str, str | None],
                shown: RunMasking) -> list[Line]:
    """What the thread says for audit entry ``e`` of its run ([]: nothing, it changes
    neither whom nor what the run waits on). ``links``: card permalinks by approval id."""
    d = _details(e)
    a = approvals.get(e.approval_id or "")
    tool = code_span(str(d.get("tool") or (a.tool if a else "")), 80) or "?"
    link = _link(links.get(e.approval_id or ""))
    actor = person(e.actor, e.via)
    if e.action == "requested":
        return _requested(d, a, tool, link)
    if e.action == "reminded" and a is not None:
        progress = (T.REMINDER_PROGRESS.format(count=a.approve_count, quorum=a.quorum)
                    if a.quorum > 1 else "")
        return [Line(T.STORY_REMINDED.format(
            n=d.get("n", a.reminders_sent), approvers=people(approver_ids(a), a.requested_by),
            tool=tool, progress=progress, expires=slack_date(a.expires_at, T.DATE_EXPIRES),
            link=link))]
    if e.action == "voted":
        return [Line(T.STORY_VOTED.format(who=actor, tool=tool, count=d.get("approvals", "?"),
                                          quorum=d.get("quorum", "?")))]
    if e.action == "approved":
        return [Line(_approved(e, d, a, tool, actor))]
    if e.action == "denied":
        if e.actor == "system:policy":
            return []
        return [Line(T.STORY_DENIED.format(who=actor, tool=tool, reason=_reason(
            a.reason if a else d.get("reason")), **_outcome(d, OutcomeName.DENIED)))]
    if e.action == "redirected":
        return [Line(T.STORY_REDIRECTED.format(who=actor, tool=tool, reason=_reason(
            a.reason if a else d.get("guidance") or d.get("reason")),
            **_outcome(d, OutcomeName.REDIRECTED)))]
    if e.action == "edited":
        impact = impact_line(will_run(a), 300) if a is not None and a.kind == "tool_call" \
            else None
        return [Line(T.STORY_EDITED.format(who=actor, tool=tool,
                                           impact=" " + impact if impact else ""))]
    if e.action == "expired":
        return [Line(T.STORY_EXPIRED.format(tool=tool, **_outcome(d, OutcomeName.EXPIRED)))]
    if e.action == "escalated":
        when = a.expires_at if a is not None else None
        return [Line(T.STORY_ESCALATED.format(
            tool=tool, approvers=people(_ids(d.get("approvers")) or
                                        (approver_ids(a) if a else [])),
            until=until(when) if when else "—",
            link=_link(links.get(e.approval_id or ""), T.STORY_NEW_LINK),
            **_outcome(d, OutcomeName.ESCALATED)))]
    if e.action == "cancelled" and e.approval_id is None:
        return [Line(T.STORY_RUN_CANCELLED.format(who=actor, reason=_reason(d.get("reason"))))]
    if e.action == "cancel_requested":
        return [Line(T.STORY_CANCEL_REQUESTED.format(who=actor,
                                                     reason=_reason(d.get("reason"))))]
    if e.action in ("outcome_resolved", "cannot_run_resolved"):
        verdict = str(d.get("verdict"))
        template = T.STORY_RESOLVED.get(verdict, T.STORY_RESOLVED_OTHER)
        return [Line(template.format(who=actor, tool=tool, **_outcome(
            d, _ANSWER_OUTCOME.get(verdict, OutcomeName.UNKNOWN))))]
    if e.action == "not_executed":
        return [Line(T.STORY_NOT_EXECUTED.format(tool=tool, reason=clause(clip(
            as_text(d.get("reason")), 300))))]
    if e.action == "retried":
        attempt = int(d.get("attempt") or 2)
        once = T.STORY_RETRIED_ONCE if d.get("once") else \
            T.STORY_RETRIED_IDEMPOTENT.format(before=attempt - 1)
        return [Line(T.STORY_RETRIED.format(
            tool=tool, attempt=attempt, before=attempt - 1,
            why=clause(clip(as_text(d.get("why")), 300)), once=once))]
    if e.action == "executed":
        return _executed(e, d, executions, tool, shown)
    return []


def _requested(d: dict[str, Any], a: ApprovalRecord | None, tool: str,
               link: str) -> list[Line]:
    if d.get("supersedes") or a is None:  # an escalation's new rung: "escalated" tells it
        return []
    if a.decided_via == "standing" or d.get("answer") is not None:  # nobody was asked
        return []
    ids = _ids(d.get("approvers")) or approver_ids(a)
    fields = {"approvers": people(ids, a.requested_by), "tool": tool,
              "until": until(a.expires_at), "link": link}
    if a.kind == "outcome_unknown":
        return [Line(T.STORY_REQUESTED_QUESTION.format(**fields))]
    if a.kind == "cannot_run":
        reason = as_text(json_object(a.packet).get("reason")) or ""
        return [Line(T.STORY_REQUESTED_CANNOT_RUN.format(reason=clause(clip(reason, 500)),
                                                         **fields))]
    quorum = T.STORY_QUORUM.format(n=a.quorum) if a.quorum > 1 else ""
    text = T.STORY_REQUESTED.format(quorum=quorum, **fields)
    impact = impact_line(will_run(a), 300)
    return [Line(text + ("\n" + impact if impact else ""))]


def _approved(e: AuditRecord, d: dict[str, Any], a: ApprovalRecord | None, tool: str,
              actor: str) -> str:
    if e.via == "standing" or d.get("standing_approval"):
        return T.STORY_STANDING.format(tool=tool, who=people(_ids(d.get("granted_by"))),
                                       id=code_span(str(d.get("standing_approval") or ""), 64),
                                       **_outcome(d, OutcomeName.APPROVED_STANDING))
    if e.actor == "system:policy":
        return T.STORY_POLICY.format(tool=tool, **_outcome(d, OutcomeName.AUTO))
    votes = ""
    quorum = a.quorum if a is not None else 1
    if quorum > 1 and a is not None:
        voters = _ids(d.get("approvers"))  # who counted towards the quorum
        names = ", ".join(person(p) for p in voters) if voters else actor
        votes = T.STORY_VOTES.format(count=a.approve_count, quorum=quorum, who=names)
    edited = a is not None and a.edited_args is not None
    fallback = OutcomeName.APPROVED_WITH_EDITS if edited else OutcomeName.APPROVED
    text = T.STORY_APPROVED.format(who=actor, tool=tool, votes=votes,
                                   **_outcome(d, fallback))
    ran = edited_call(a) if a is not None else None
    return text + ("\n" + ran if ran else "")


def edited_call(a: ApprovalRecord) -> str | None:
    """For a request with edits, what the edited call does: the impact of the arguments
    that run, or (when nothing could work it out) those arguments; else None."""
    if a.kind != "tool_call":
        return None
    w = will_run(a)
    if not w.edited:
        return None
    if w.impact:
        return impact_line(w, 300)
    return T.STORY_EDITED_ARGS.format(args=code_span(
        args_text(w.args, indent=None, sensitive=w.sensitive), 300))


def _executed(e: AuditRecord, d: dict[str, Any], executions: Mapping[str, ExecutionRecord],
              tool: str, shown: RunMasking) -> list[Line]:
    key = str(d.get("idempotency_key") or "")
    call_id = key.partition(":")[2] if e.run_id and key.startswith(e.run_id + ":") else ""
    rec = executions.get(call_id)
    attempts = rec.attempts if rec is not None else 1
    attempt = T.STORY_ATTEMPT.format(n=attempts) if attempts > 1 else ""
    how = T.STORY_NOTIFY if d.get("answer") == "notify_after" else ""
    if d.get("status") == "failed" or (rec is not None and rec.status == "failed"):
        error = rec.error if rec is not None and rec.error else as_text(d.get("error"))
        text = T.STORY_RAN_FAILED.format(tool=tool, attempt=attempt, how=how,
                                         error=clip(shown.call(call_id).text(error or ""),
                                                    300))
        return [Line(text, call_id or None)]
    result = rec.result_value() if rec is not None and rec.status == "succeeded" else None
    words = result_words(shown.call(call_id).data(result)) if result is not None else ""
    text = T.STORY_RAN.format(tool=tool, attempt=attempt, how=how,
                              words=T.STORY_WORDS.format(words=words) if words else ".")
    return [Line(text, call_id or None if rec is not None else None)]


def result_words(result: Any) -> str:
    """A tool's result in a few words: a short string as it is; an object's first few
    plain fields as ``name value``; never the JSON (that is one click away)."""
    if isinstance(result, str):
        return clip(result, 200)
    if isinstance(result, bool | int | float):
        return clip(str(result), 60)
    if not isinstance(result, dict):
        return ""
    said = []
    for name, value in result.items():
        if isinstance(value, bool):
            value = "yes" if value else "no"
        if isinstance(value, str | int | float) and len(str(value)) <= 60:
            said.append(f"{clip(str(name).replace('_', ' '), 40)} {clip(str(value), 60)}")
        if len(said) == _WORDS:
            break
    rest = len(result) - len(said)
    return ", ".join(said) + (T.STORY_MORE.format(n=rest) if said and rest > 0 else "")


def waiting_lines(pending: Sequence[ApprovalRecord]) -> list[str]:
    """For the parent: on whom and until when the run waits, one line per request."""
    out = []
    for a in pending:
        fields = {"approvers": people(approver_ids(a), a.requested_by),
                  "tool": code_span(a.tool, 80), "until": until(a.expires_at)}
        if a.kind == "outcome_unknown":
            out.append(T.RUN_WAITS_ON_QUESTION.format(**fields))
        elif a.kind == "cannot_run":
            out.append(T.RUN_WAITS_ON_CANNOT_RUN.format(**fields))
        else:
            progress = (T.RUN_WAITS_PROGRESS.format(count=a.approve_count, quorum=a.quorum)
                        if a.quorum > 1 and a.approve_count else "")
            line = T.RUN_WAITS_ON.format(progress=progress, **fields)
            impact = will_run(a).impact
            if impact:
                line += "\n" + T.RUN_WAITS_IMPACT.format(impact=clip(impact, 300))
            out.append(line)
    return out


# the outcomes of a request whose call did not run (the run went on without it)
_DID_NOT_RUN = frozenset({OutcomeName.DENIED, OutcomeName.EXPIRED, OutcomeName.REDIRECTED})


def ended_badly(approvals: Sequence[ApprovalRecord],
                executions: Mapping[str, ExecutionRecord]) -> tuple[str, str] | None:
    """A completed run's honest ``(emoji, status)`` when a call it asked for did not run
    or failed (its last request per call denied, expired or redirected); else None."""
    last: dict[str, ApprovalRecord] = {}
    for a in approvals:
        if a.kind == "tool_call" and a.status != "superseded":
            last[a.call_id] = a
    for a in last.values():
        name = outcome_of(a)
        if name in _DID_NOT_RUN:
            said = said_outcome(name)
            return said["icon"], T.RUN_ENDED.format(tool=code_span(a.tool, 80),
                                                    outcome=said["outcome"])
    for rec in executions.values():
        if rec.status == "failed":
            emoji, words = T.RUN_ENDED_FAILED
            return emoji, words.format(tool=code_span(rec.tool, 80))
    return None


# -- one reply ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Item:
    """What one audit entry (``audit``) or run event says, in the order they are told."""

    source: str  # "audit" or "event"
    seq: int
    lines: Sequence[Line]


@dataclass(frozen=True)
class Reply:
    """The next reply: its fallback ``text`` and ``blocks``, and how far it tells."""

    text: str
    blocks: list[dict[str, Any]]
    upto: int | None  # events before this seq are told (None: no event was in it)
    told_audit: int | None  # audit entries up to this seq are told (None: none was)
    taken: int  # how many items it holds


def story_reply(run_id: str, items: Sequence[Item], *, limit: int = SECTION_MAX,
                blocks_max: int = MESSAGE_BLOCKS_MAX - 10) -> Reply:
    """Pack whole items, in order, into one reply of at most ``limit`` units of text and
    ``blocks_max`` blocks (the first item alone is cut to fit). Items without lines ride
    along; a line about a call's result carries a "Show JSON" button."""
    texts: list[str] = []
    blocks: list[dict[str, Any]] = []
    size = 0
    upto: int | None = None
    told: int | None = None
    taken = 0
    for item in items:
        lines = [ln for ln in item.lines if ln.text]
        text = safe_cut("\n".join(ln.text for ln in lines), limit)
        add = units(text) + (1 if texts else 0) if text else 0
        new = _blocks(run_id, lines) if lines else []
        if texts and (size + add > limit or len(blocks) + len(new) > blocks_max):
            break
        if text:
            texts.append(text)
            size += add
            blocks.extend(new[:blocks_max])
        if item.source == "event":
            upto = item.seq + 1
        else:
            told = item.seq
        taken += 1
    return Reply("\n".join(texts), blocks, upto, told, taken)


def _blocks(run_id: str, lines: Sequence[Line]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    plain: list[str] = []

    def flush() -> None:
        if plain:
            out.append(section("\n".join(plain)).to_dict())
            plain.clear()

    for ln in lines:
        if ln.call is None:
            plain.append(ln.text)
            continue
        flush()
        block = section(ln.text).to_dict()
        block["accessory"] = ButtonElement(
            text=T.BUTTON_SHOW_JSON, action_id=SHOW_JSON,
            value=f"{run_id} {ln.call}"[:2000]).to_dict()
        out.append(block)
    flush()
    return out
