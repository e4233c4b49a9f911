"""Pure Block Kit builders for approval cards: records in, Block Kit dicts out.

No I/O, no database, no clock: the caller passes ``now``. Blocks are built with
slack_sdk's models and returned as ``.to_dict()``, so a shape or length Slack would reject
fails here, in tests, and not in production; the approval card's text blocks are made as
those dicts directly (:func:`mrkdwn.section_dict`: within Slack's limits, else the models).
All wording comes from :mod:`bot.texts`;
all agent-written text goes through :mod:`bot.mrkdwn` (invariant 9).

A button carries ``"v2:{approval_id}:{token}"`` and nothing else: the arguments a click
approves are the ones stored with the approval, never something the payload brings back.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, Protocol

from approvald.bot.slack import texts as T
from approvald.bot.slack.mrkdwn import (
    CARD_TEXT_BUDGET,
    FALLBACK_MAX,
    INPUT_MAX,
    SECTION_MAX,
    approver,
    block_dict,
    clause,
    clip,
    code_block,
    code_span,
    context_dict,
    duration,
    escape_mrkdwn,
    header_dict,
    json_escapes,
    md,
    plain,
    pretty_dumps,
    safe_cut,
    safe_url,
    section,
    section_dict,
    slack_date,
    units,
    who,
    within_text_budget,
)
from approvald.runtime import (
    MAX_WINDOW,
    MIN_WINDOW,
    ApprovalPolicy,
    OutcomeName,
    Scope,
    WillRun,
    asker,
    mask_args,
    mask_text,
    masked_json,
    outcome_of,
    outcome_words,
    quorum_voters,
    sensitive_paths,
    shown_packet,
    will_run,
)
from approvald.store.jsontext import loads
from approvald.store.records import ApprovalRecord, VoteRecord
from approvald.store.repos.standing import StandingRecord
from slack_sdk.models.blocks import (
    ActionsBlock,
    ButtonElement,
    CheckboxesElement,
    ConfirmObject,
    Option,
)

__all__ = [
    "ABORT", "ACTION_IDS", "APPROVE", "APPROVE_SELECTED", "ARGS_BLOCK", "ARGS_INPUT",
    "BATCH_BLOCK", "DENY", "DENY_MODAL", "DENY_SELECTED", "DENY_SELECTED_MODAL", "EDIT",
    "EDIT_MODAL", "FIELDS_BLOCK", "FIELDS_INPUT", "GUIDANCE_BLOCK", "GUIDANCE_INPUT", "MARK_DONE",
    "REASON_BLOCK", "REASON_INPUT", "REDIRECT", "REDIRECT_MODAL", "REPLAN", "RESOLVE_MODAL",
    "RETRY", "SCOPE_BLOCK", "SCOPE_INPUT", "SELECT", "SELECT_BLOCK", "STANDING", "STANDING_GRANT",
    "STANDING_MODAL", "STANDING_REVOKE", "VIEW_ARGS", "WHEN_BLOCK", "WHEN_INPUT", "WINDOW_BLOCK",
    "WINDOW_INPUT", "approval_card", "approver_ids", "args_text", "as_text", "batch_buttons",
    "button_block", "button_value", "buttons", "compact_blocks", "doing_text", "editable_text",
    "escape_mrkdwn", "impact_line", "impact_text", "json_object", "masked", "parse_value",
    "recent_line", "risk_of", "scope_text", "select_value", "standing_cap", "standing_lines",
]

# action ids, callback ids and input ids the handlers dispatch on
APPROVE = "approvald.approve"
DENY = "approvald.deny"
EDIT = "approvald.edit"
REDIRECT = "approvald.redirect"
VIEW_ARGS = "approvald.view_args"
RETRY = "approvald.retry"
MARK_DONE = "approvald.mark_done"
ABORT = "approvald.abort"
REPLAN = "approvald.replan"  # an approved call that cannot run: hand the model the error
# batch decisions: a request's checkbox, and the buttons that decide every ticked one
SELECT = "approvald.select"
APPROVE_SELECTED = "approvald.approve_selected"
DENY_SELECTED = "approvald.deny_selected"
# standing approvals: the card's button and its modal; the App Home's buttons (value: the
# standing approval's id)
STANDING = "approvald.standing"
STANDING_REVOKE = "approvald.standing_revoke"
STANDING_GRANT = "approvald.standing_grant"
ACTION_IDS = (APPROVE, DENY, EDIT, REDIRECT, VIEW_ARGS, RETRY, MARK_DONE, ABORT, REPLAN, SELECT,
              APPROVE_SELECTED, DENY_SELECTED, STANDING, STANDING_REVOKE, STANDING_GRANT)
STANDING_MODAL = "approvald.standing_modal"
WINDOW_BLOCK, WINDOW_INPUT = "standing_window", "standing_window_input"
SCOPE_BLOCK, SCOPE_INPUT = "standing_scope", "standing_scope_input"
FIELDS_BLOCK, FIELDS_INPUT = "standing_fields", "standing_fields_input"
WHEN_BLOCK, WHEN_INPUT = "standing_when", "standing_when_input"
DENY_MODAL = "approvald.deny_modal"
DENY_SELECTED_MODAL = "approvald.deny_selected_modal"
# block ids: a checkbox's block is SELECT_BLOCK + "." + the request id (a modal's: + a number)
SELECT_BLOCK = "approvald.pick"
BATCH_BLOCK = "approvald.batch"
OPTION_VALUE_MAX = 150  # Slack's cap on an option's value (a button's is 2,000)
CODE_MAX = 1400  # units of the code block under "what the agent is doing" (a command)
EDIT_MODAL = "approvald.edit_modal"
REDIRECT_MODAL = "approvald.redirect_modal"
RESOLVE_MODAL = "approvald.resolve_modal"
REASON_BLOCK, REASON_INPUT = "reason", "reason_input"
GUIDANCE_BLOCK, GUIDANCE_INPUT = "guidance", "guidance_input"
ARGS_BLOCK, ARGS_INPUT = "args", "args_input"

class _Said(Protocol):
    """How an outcome is said (``outcome_words``' answer): read once for a card."""

    @property
    def label(self) -> str: ...

    @property
    def words(self) -> str: ...

    @property
    def emoji(self) -> str: ...


_SAFE = re.compile(r"[A-Za-z0-9_.\-]+")  # one C call, not a Python step per character


def _safe_id(text: str, limit: int) -> bool:
    return 0 < len(text) <= limit and _SAFE.fullmatch(text) is not None


VALUE_VERSION = "v2:"  # a value whose token shows the arguments' binding, not their digest


def button_value(approval_id: str, token: str) -> str:
    """``"v2:{approval_id}:{token}"``: all a button carries, far below Slack's 2,000
    characters. The token shows a keyed binding of the arguments (``runtime/kernel/binding.py``),
    never their plain digest."""
    if not _safe_id(approval_id, 128) or not _safe_id(token, 512):
        raise ValueError("an approval id and token are short and url-safe")
    return f"{VALUE_VERSION}{approval_id}:{token}"


def parse_value(value: str) -> tuple[str, str]:
    """``(approval_id, token)`` from a button value; ValueError when it is not one of ours.
    A value without the version tag is a card posted before bindings were keyed
    (``"{approval_id}:{token}"``): its token is still verified, against the digest stored
    with the request, so such a card can still be clicked."""
    text = value if isinstance(value, str) else ""
    approval_id, sep, token = text.removeprefix(VALUE_VERSION).partition(":")
    if not sep or not _safe_id(approval_id, 128) or not _safe_id(token, 512):
        raise ValueError("not an approvald button value")
    return approval_id, token


def select_value(approval_id: str, token: str) -> str | None:
    """A checkbox option's value, ``"v2:{approval_id}:{token}"`` like a button's; None when it
    would not fit Slack's 150 characters (that request keeps its own buttons only)."""
    value = button_value(approval_id, token)
    return value if len(value) <= OPTION_VALUE_MAX else None


# -- reading a record defensively: a malformed packet must not stop a card ------------------

def json_object(raw: str | None) -> dict[str, Any]:
    """A JSON-object column as a dict; {} when it is missing or malformed."""
    try:
        value = loads(raw or "{}")
    except (TypeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def risk_of(a: ApprovalRecord) -> str:
    """low, medium or high: from the packet, else the policy snapshot, else medium."""
    for source in (json_object(a.packet), json_object(a.policy)):
        if source.get("risk") in T.RISK_EMOJI:
            return str(source["risk"])
    return "medium"


def as_text(value: Any) -> str:
    """A packet field as text: strings as they are, anything else as compact JSON."""
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False,
                                                           default=str)


def args_text(raw: str | None, *, indent: int | None = 2,
              sensitive: Sequence[str] = ()) -> str:
    """A stored JSON column as display JSON (pretty, or compact with ``indent=None``),
    with the values under the ``sensitive`` paths and every secret the detectors find
    masked: what a person sees of arguments, never the secrets themselves."""
    try:
        value, _ = masked_json(raw or "{}", sensitive)
    except ValueError:
        return mask_text(raw or "")
    if indent == 2:  # json.dumps's text, by its C encoder (see mrkdwn.pretty_dumps)
        return json_escapes(pretty_dumps(value))
    separators = None if indent else (",", ":")
    return json_escapes(json.dumps(value, indent=indent, separators=separators,
                                   ensure_ascii=False, default=str))


def _args_shown(raw: str | None, sensitive: Sequence[str]) -> tuple[str, bool]:
    """``(args_text(raw, sensitive=sensitive), raw is not None and shows_masked(raw,
    sensitive))``, the stored JSON read and masked once for both (a card's arguments)."""
    if not raw:  # "" reads as "{}" for its text, as itself for whether it is masked
        return args_text(raw, sensitive=sensitive), raw is not None and shows_masked(
            raw, sensitive)
    try:
        value, changed = masked_json(raw, sensitive)
    except ValueError:
        return mask_text(raw), False
    return json_escapes(pretty_dumps(value)), changed and isinstance(value, dict)


def masked(a: ApprovalRecord) -> bool:
    """Whether any argument of ``a`` (as asked or as edited) is shown masked."""
    hide = sensitive_paths(a)
    return any(raw is not None and shows_masked(raw, hide) for raw in (a.args, a.edited_args))


def shows_masked(raw: str, sensitive: Sequence[str]) -> bool:
    """Whether the stored JSON object ``raw`` is shown with something masked in it."""
    try:
        value, changed = masked_json(raw, sensitive)
    except ValueError:
        return False
    return changed and isinstance(value, dict)


def editable_text(a: ApprovalRecord) -> str | None:
    """The edit box's starting text: pretty JSON, compact if that is too long, else None.

    Bidi controls and lone surrogates become ``\\uXXXX`` escapes, which parse back to the
    same value, so submitting an untouched box changes nothing.
    """
    for indent in (2, None):
        text = args_text(a.edited_args or a.args, indent=indent,
                         sensitive=sensitive_paths(a))
        if units(text) <= INPUT_MAX:
            return text
    return None


def approver_ids(a: ApprovalRecord) -> list[str]:
    """The request's approver ids ([] if the column is somehow not a JSON list)."""
    try:
        people = a.approvers_value()
    except (TypeError, ValueError):
        return []
    return [str(p) for p in people] if isinstance(people, list) else []


def _approvers(a: ApprovalRecord, limit: int = 10) -> str:
    people = approver_ids(a)
    if not people:
        return T.CTX_ANYONE
    more = f" +{len(people) - limit}" if len(people) > limit else ""
    return T.CTX_APPROVERS.format(who=", ".join(approver(p) for p in people[:limit]) + more)


def _voters(a: ApprovalRecord, votes: Sequence[VoteRecord]) -> list[str]:
    """Who approved the arguments that will run: a vote on a pre-edit digest does not
    count, nor a proposal's author's own (see :func:`runtime.approvals.decide.counted`)."""
    return quorum_voters(a, [v.actor for v in votes
                       if v.verdict == "approve" and v.digest == a.effective_digest])


def _edit_note(a: ApprovalRecord, votes: Sequence[VoteRecord]) -> list[str]:
    """Who edited a pending request, and whose earlier approvals stopped counting."""
    if a.status != "pending" or a.kind != "tool_call" or not a.edited_by:
        return []
    date = slack_date(a.edited_at or a.requested_at, T.DATE_AT)
    propose = json_object(a.policy).get("edits") == "propose"
    parts = [(T.CTX_PROPOSED if propose else T.CTX_EDITED).format(who=who(a.edited_by),
                                                                  date=date)]
    current = set(_voters(a, votes))
    reset = list(dict.fromkeys(v.actor for v in votes if v.verdict == "approve"
                               and v.digest != a.effective_digest and v.actor not in current))
    if reset:
        parts.append(T.CTX_VOTES_RESET.format(who=", ".join(who(n) for n in reset[:10])))
    return parts


def _quorum(a: ApprovalRecord, votes: Sequence[VoteRecord]) -> str | None:
    if a.quorum <= 1 or a.kind != "tool_call":
        return None
    names = _voters(a, votes)
    count = len(names) if votes else a.approve_count
    if not names:
        return T.CTX_QUORUM.format(count=count, quorum=a.quorum)
    return T.CTX_QUORUM_BY.format(count=count, quorum=a.quorum,
                                  who=", ".join(who(n) for n in names[:10]))


def _button(label: str, action_id: str, value: str | None, style: str | None = None,
            confirm: ConfirmObject | None = None) -> ButtonElement:
    return ButtonElement(text=label, action_id=action_id, value=value, style=style,
                         confirm=confirm)


def buttons(a: ApprovalRecord, token: str, *, view_args: bool) -> ActionsBlock:
    """Live buttons: Approve/Deny/Edit/Redirect for a call, Retry/Mark done/Abort for a
    question about an outcome, Re-plan/Abort for an approved call that cannot run."""
    return _actions(_shape(a, view_args=view_args), button_value(a.id, token))


def button_block(a: ApprovalRecord, token: str, *, view_args: bool) -> dict[str, Any]:
    """``buttons(a, token, view_args=...).to_dict()``, the same dict, key for key.

    Which buttons a card has, and what they say, depend on a handful of things (its
    :func:`_shape`); only their value differs from card to card. slack_sdk's models build
    and check (``to_dict``'s validators) each shape once, and each card puts its value in
    a copy: validating five buttons field by field took ~1,500 calls a card. The value
    is :func:`button_value`'s, which checks it (at most 644 characters, Slack takes 2,000).
    """
    value = button_value(a.id, token)
    block = _actions_dict(_shape(a, view_args=view_args))
    return {**block, "elements": [{**e, "value": value} for e in block["elements"]]}


# what decides a card's buttons: its kind, the tool a high-risk Approve's confirmation
# names, whether it offers a standing approval and Edit, and View arguments
_Shape = tuple[str, str | None, bool, bool, bool]


def _shape(a: ApprovalRecord, *, view_args: bool) -> _Shape:
    if a.kind in ("cannot_run", "outcome_unknown"):
        return a.kind, None, False, False, view_args
    return ("call", a.tool if risk_of(a) == "high" else None,
            standing_cap(a) >= MIN_WINDOW,  # max_standing = "0" (or under 15 min): none
            editable_text(a) is not None,  # longer than Slack's text box: CLI only
            view_args)


@functools.lru_cache(maxsize=256)
def _actions_dict(shape: _Shape) -> dict[str, Any]:
    block: dict[str, Any] = _actions(shape, button_value("x", "x")).to_dict()
    return block


def _actions(shape: _Shape, value: str) -> ActionsBlock:
    kind, high_risk_tool, standing, editable, view_args = shape
    if kind == "cannot_run":
        elements = [_button(T.BUTTON_REPLAN, REPLAN, value, "primary"),
                    _button(T.BUTTON_ABORT, ABORT, value, "danger")]
    elif kind == "outcome_unknown":
        retry = ConfirmObject(title=T.CONFIRM_RETRY_TITLE, text=md(T.CONFIRM_RETRY_TEXT),
                              confirm=T.CONFIRM_RETRY_YES, deny=T.CONFIRM_NO)
        elements = [_button(T.BUTTON_RETRY, RETRY, value, confirm=retry),
                    _button(T.BUTTON_MARK_DONE, MARK_DONE, value, "primary"),
                    _button(T.BUTTON_ABORT, ABORT, value, "danger")]
    else:
        confirm = None
        if high_risk_tool is not None:  # one more deliberate click for what cannot be undone
            confirm = ConfirmObject(
                title=T.CONFIRM_APPROVE_TITLE,
                text=md(T.CONFIRM_APPROVE_TEXT.format(tool=code_span(high_risk_tool, 80))),
                confirm=T.CONFIRM_APPROVE_YES, deny=T.CONFIRM_NO, style="primary")
        elements = [_button(T.BUTTON_APPROVE, APPROVE, value, "primary", confirm)]
        if standing:
            elements.append(_button(T.BUTTON_STANDING, STANDING, value))
        elements.append(_button(T.BUTTON_DENY, DENY, value, "danger"))
        if editable:
            elements.append(_button(T.BUTTON_EDIT, EDIT, value))
        elements.append(_button(T.BUTTON_REDIRECT, REDIRECT, value))
    if view_args:
        elements.append(_button(T.BUTTON_VIEW_ARGS, VIEW_ARGS, value))
    return ActionsBlock(elements=elements)


def batch_buttons() -> ActionsBlock:
    """"Approve selected" (with a confirmation) and "Deny selected" (a modal asks why).
    They carry no value: what they decide is what is ticked, read from the surface's state."""
    confirm = ConfirmObject(title=T.CONFIRM_BATCH_TITLE, text=md(T.CONFIRM_BATCH_TEXT),
                            confirm=T.CONFIRM_BATCH_YES, deny=T.CONFIRM_NO, style="primary")
    return ActionsBlock(block_id=BATCH_BLOCK, elements=[
        _button(T.BUTTON_APPROVE_SELECTED, APPROVE_SELECTED, None, "primary", confirm),
        _button(T.BUTTON_DENY_SELECTED, DENY_SELECTED, None, "danger")])


# -- standing approvals ---------------------------------------------------------------------

def standing_cap(a: ApprovalRecord) -> timedelta:
    """The longest standing approval request ``a``'s stored policy allows (at most 8 h);
    0 when it allows none or the snapshot cannot be read."""
    if a.kind != "tool_call":
        return timedelta(0)
    try:
        cap = ApprovalPolicy.from_snapshot(a.policy).max_standing
    except (TypeError, ValueError):
        return timedelta(0)
    return min(cap, MAX_WINDOW)


def _compact(value: Any) -> str:
    return json_escapes(json.dumps(value, ensure_ascii=False, separators=(",", ":"),
                                   default=str))


def scope_text(s: StandingRecord, *, here: bool = False, sensitive: Sequence[str] = ()) -> str:
    """What a standing approval covers, in words, agent-written values escaped and cut
    (``here``: on the card of the request it was granted on, "this exact call"), values
    under the ``sensitive`` paths of its tool's arguments masked."""
    try:
        scope = Scope.model_validate_json(s.scope)
    except ValueError:
        return T.STANDING_SCOPE_CONDITION.format(when=code_span(s.scope, 200))
    if scope.kind == "exact":
        if here:
            return T.STANDING_SCOPE_EXACT_HERE
        return T.STANDING_SCOPE_EXACT.format(
            args=f"`{code_span(_compact(mask_args(scope.values, sensitive)), 200)}`")
    if scope.kind == "fields":
        pairs = [T.STANDING_SCOPE_PAIR.format(name=f"`{code_span(k, 60)}`",
                                              value=f"`{code_span(_compact(v), 80)}`")
                 for k, v in list(mask_args(scope.values, sensitive).items())[:10]]
        return T.STANDING_SCOPE_FIELDS.format(pairs=", ".join(pairs))
    return T.STANDING_SCOPE_CONDITION.format(when=f"`{code_span(scope.when or '', 400)}`")


def _grants(s: StandingRecord) -> list[str]:
    try:
        return s.grants_value()
    except (TypeError, ValueError):
        return []


def standing_lines(s: StandingRecord, *, now: datetime, here: bool = True,
                   sensitive: Sequence[str] = ()) -> str:
    """A standing approval as its card tells it: who granted it, for how long, what it
    covers, and where it stands now (grants for a quorum, uses, revoked or over)."""
    grants = _grants(s)
    text = T.STANDING_ON_CARD.format(
        id=code_span(s.id, 64), who=", ".join(who(g) for g in grants[:10]) or "—",
        window=duration(s.expires_at - s.created_at),
        scope=scope_text(s, here=here, sensitive=sensitive))
    state = s.state(now)
    until = slack_date(s.expires_at, T.DATE_AT)
    if state == "proposed":
        text += "\n" + T.STANDING_PROPOSED.format(count=len(grants), quorum=s.quorum,
                                                  until=until)
    elif state == "active":
        quorum = (T.STANDING_ACTIVE_GRANTS.format(count=len(grants), quorum=s.quorum)
                  if s.quorum > 1 else "")
        text += "\n" + quorum + T.STANDING_ACTIVE.format(until=until, uses=s.uses)
    elif state == "revoked":
        text += "\n" + T.STANDING_REVOKED.format(
            who=who(s.revoked_by), date=slack_date(s.revoked_at or now, T.DATE_AT), uses=s.uses)
    else:
        text += "\n" + T.STANDING_EXPIRED.format(date=until, uses=s.uses)
    return text


# -- what the request says about its call ----------------------------------------------------
# Every face tells a request through runtime.requests.packet.will_run: the impact shown is that of
# the arguments that will run, and the requester's words, once an edit has made them about
# other arguments, only ever appear labelled as such.

def doing_text(w: WillRun, limit: int, code_limit: int = CODE_MAX) -> str | None:
    """The card's "what the agent is doing" section, or the requester's words labelled as
    being about the arguments first asked for; None when there are none. What the call
    runs or writes (``w.code``) follows as a code block: ours, so it renders as one, its
    contents escaped like every requester's text and unable to close it."""
    if not w.doing:
        return None
    text = clip(w.doing, limit)
    if w.code:
        text += "\n" + code_block(w.code, code_limit)[0]
    if w.words_current:
        return T.SECTION_DOING.format(text=text)
    return T.SECTION_DOING_BEFORE_EDIT.format(label=T.DOING_BEFORE_EDIT[w.author],
                                              text=text)


def impact_text(w: WillRun, limit: int) -> str | None:
    """The card's impact section: that of the arguments that will run; failing that, only
    a labelled description of the original arguments; None when there is neither."""
    return _impact(w, limit, T.SECTION_IMPACT, T.SECTION_IMPACT_EDITED,
                   T.SECTION_IMPACT_BEFORE_EDIT)


def impact_line(w: WillRun, limit: int) -> str | None:
    """:func:`impact_text` in one line (App Home, /approvals, modals, threads)."""
    return _impact(w, limit, T.LINE_IMPACT, T.LINE_IMPACT_EDITED, T.LINE_BEFORE_EDIT)


def _impact(w: WillRun, limit: int, current: str, edited: str, before: str) -> str | None:
    if w.impact:
        return (current if w.words_current else edited).format(text=clip(w.impact, limit))
    if w.original_impact:
        return before.format(label=T.IMPACT_BEFORE_EDIT[w.author],
                             text=clip(w.original_impact, limit))
    return None


def _doing_line(w: WillRun, limit: int) -> str | None:
    if not w.doing:
        return None
    if w.words_current:
        return clip(w.doing, limit)
    return T.LINE_BEFORE_EDIT.format(label=T.DOING_BEFORE_EDIT[w.author],
                                     text=clip(w.doing, limit))


# -- the card ---------------------------------------------------------------------------------

def _headline(a: ApprovalRecord, words: _Said | None = None) -> str:
    if a.status == "pending":
        if a.kind == "cannot_run":
            return T.HEADER_CANNOT_RUN.format(tool=a.tool)
        if a.kind == "outcome_unknown":
            return T.HEADER_QUESTION.format(tool=a.tool)
        return T.HEADER_PENDING.format(emoji=T.RISK_EMOJI[risk_of(a)], tool=a.tool, risk=risk_of(a))
    template = T.HEADER_CANNOT_RUN_DONE if a.kind == "cannot_run" else T.HEADER_DONE
    return template.format(label=(words or outcome_words(a)).label, tool=a.tool)


def _intro(a: ApprovalRecord, p: dict[str, Any], thread_url: str | None) -> str:
    template = (T.INTRO_QUESTION if a.kind == "outcome_unknown"
                else T.INTRO_CANNOT_RUN if a.kind == "cannot_run"
                else T.INTRO if a.status == "pending" else T.INTRO_DONE)
    text = template.format(agent=clip(asker(p.get("agent")), 60),
                          tool=code_span(a.tool, 80),
                          requester=who(a.requested_by or as_text(p.get("requested_by"))))
    thread = safe_url(thread_url)
    if thread:
        text += T.INTRO_THREAD.format(url=thread)
    task = as_text(p.get("task"))
    return text + ("\n" + T.INTRO_TASK.format(task=clip(task, 300)) if task else "")


def _attempt(p: dict[str, Any]) -> str:
    """For an outcome question: which attempt, when it started and was last heard from,
    and what reconcile said (what a person needs to go and check)."""
    text = ""
    started, heard = _when(p.get("started_at")), _when(p.get("heard_at"))
    if isinstance(p.get("attempt"), int) and started and heard:
        text += "\n" + T.SECTION_ATTEMPT.format(attempt=p["attempt"], started=started,
                                                heard=heard)
        if p.get("worker"):
            text += T.SECTION_WORKER.format(worker=code_span(as_text(p["worker"]), 120))
    if p.get("reconcile"):
        text += "\n" + T.SECTION_RECONCILE.format(text=clip(as_text(p["reconcile"]), 400))
    return text


def _when(value: Any) -> str | None:
    try:
        return slack_date(datetime.fromisoformat(str(value)), T.DATE_AT) if value else None
    except ValueError:
        return None


def _evidence(p: dict[str, Any]) -> str | None:
    items = p.get("evidence")
    if not isinstance(items, list) or not items:
        return None
    lines = [T.SECTION_EVIDENCE]
    for item in items[:5]:
        item = item if isinstance(item, dict) else {"result": item}
        lines.append(T.EVIDENCE_ITEM.format(tool=code_span(as_text(item.get("tool")) or "?", 60),
                                            result=clip(as_text(item.get("result")), 300)))
    return "\n".join(lines)


def _decision(a: ApprovalRecord, votes: Sequence[VoteRecord], superseded_by: str | None,
              words: _Said | None = None) -> str:
    """What happened, by whom and when, for a card without buttons."""
    words = words or outcome_words(a)
    emoji = outcome_emoji(a, words)
    when = slack_date(a.decided_at or a.expires_at, T.DATE_AT)
    fields = {"emoji": emoji, "who": who(a.decided_by), "date": when,
              "label": words.label,
              "via": T.DECIDED_VIA_CLI if (a.decided_via or "").startswith("cli")
              else T.DECIDED_VIA_WEB if a.decided_via == "web" else ""}
    if a.status == "pending":
        text = T.WAITING.format(emoji=emoji)
    elif a.kind != "tool_call" and a.verdict in ("retry", "mark_done", "abort", "replan"):
        text = {"retry": T.DECIDED_RETRY, "mark_done": T.DECIDED_MARK_DONE,
                "abort": T.DECIDED_ABORT, "replan": T.DECIDED_REPLAN}[a.verdict].format(**fields)
    elif a.status == "approved":
        edited = a.edited_args is not None
        text = (T.DECIDED_APPROVED_EDITED if edited else T.DECIDED_APPROVED).format(**fields)
        names = _voters(a, votes)
        if len(names) > 1:
            text += "\n" + T.DECIDED_VOTERS.format(who=", ".join(who(n) for n in names[:10]))
        not_run = json_object(a.packet).get("not_executed")
        if not_run:  # the deployed release could not run it: said where it was approved
            text += "\n" + T.DECIDED_NOT_EXECUTED.format(
                reason=clause(clip(as_text(not_run), 500)))
    elif a.status == "denied":
        text = T.DECIDED_DENIED.format(**fields)
    elif a.status == "redirected":  # the guidance is the point: it leads, not a "Reason:"
        return T.DECIDED_REDIRECTED.format(guidance=clip(a.reason or "", 1000), **fields)
    elif a.status == "expired":
        text = T.DECIDED_EXPIRED.format(emoji=emoji, label=fields["label"],
                                        date=slack_date(a.expires_at, T.DATE_AT))
    elif a.status == "superseded":
        text = T.DECIDED_SUPERSEDED.format(emoji=emoji, label=fields["label"],
                                           date=slack_date(a.expires_at, T.DATE_AT))
        new = safe_url(superseded_by)
        if new:
            text += T.DECIDED_SUPERSEDED_URL.format(url=new)
        elif superseded_by:
            text += T.DECIDED_SUPERSEDED_ID.format(id=code_span(superseded_by, 80))
    elif a.status == "cancelled":
        by = T.DECIDED_CANCELLED_BY.format(who=who(a.decided_by)) if a.decided_by else ""
        text = T.DECIDED_CANCELLED.format(emoji=emoji, label=fields["label"], by=by, date=when)
    else:
        text = T.DECIDED_OTHER.format(emoji=emoji, status=words.label)
    if a.reason:
        text += "\n" + T.DECIDED_REASON.format(reason=clip(a.reason, 1000))
    return text


def _context(a: ApprovalRecord, votes: Sequence[VoteRecord], now: datetime,
             supersedes_url: str | None) -> list[str]:
    """Deadline, quorum, what silence does, who may decide, and the request id."""
    parts: list[str] = []
    if a.status == "pending" and a.kind == "tool_call":
        if now < a.expires_at:
            parts.append(T.CTX_EXPIRES.format(date=slack_date(a.expires_at, T.DATE_EXPIRES)))
        else:
            parts.append(T.CTX_OVERDUE.format(date=slack_date(a.expires_at, T.DATE_EXPIRED)))
        quorum = _quorum(a, votes)
        if quorum:
            parts.append(quorum)
        parts.extend(_edit_note(a, votes))
        pol = json_object(a.policy)
        ladder = pol.get("escalate")
        escalates = (pol.get("on_expire") == "escalate" and isinstance(ladder, list)
                     and a.rung < len(ladder))
        parts.append(T.CTX_ON_EXPIRE["escalate" if escalates else "cancel"])
        rule = pol.get("rule")
        if isinstance(rule, str) and rule:
            parts.append(T.CTX_RULE.format(rule=code_span(rule, 200)))
    parts.append(_approvers(a))
    if a.supersedes:
        earlier = safe_url(supersedes_url)
        parts.append(T.CTX_ESCALATED_FROM_URL.format(url=earlier) if earlier
                     else T.CTX_ESCALATED_FROM)
    parts.append(T.CTX_ID.format(id=code_span(a.id, 64)))
    return parts


def approval_card(a: ApprovalRecord, *, token: str | None, now: datetime,
                  votes: Sequence[VoteRecord] = (), thread_url: str | None = None,
                  superseded_by: str | None = None, supersedes_url: str | None = None,
                  standing: Sequence[StandingRecord] = ()) -> dict[str, Any]:
    """The approval card: ``{"text": notification fallback, "blocks": [...]}``.

    Buttons only while ``a`` is pending and a ``token`` is given; otherwise a line saying
    what was decided, by whom, when and why. ``superseded_by`` is the permalink (or id)
    of the request that replaced this one; ``supersedes_url`` that of the one it replaces.
    ``standing``: the standing approvals granted on this request, told below the decision
    (a quorum tool's is granted while the request still waits for its other approvals).
    """
    p = shown_packet(a)
    w = will_run(a)
    live = token is not None and a.status == "pending"
    # what became of it, read once for the headline, the decision and the fallback
    words = None if a.status == "pending" else outcome_words(a)
    # the blocks as dicts, made directly: block_dict(section(...)), the same dicts
    out = [header_dict(_headline(a, words)), section_dict(_intro(a, p, thread_url))]
    optional: list[dict[str, Any]] = []  # dropped, in this order, if still too long
    doing = doing_text(w, 800)
    if doing:
        out.append(section_dict(doing))
    if a.kind == "cannot_run":
        out.append(section_dict(T.CANNOT_RUN_ASK.format(
            reason=clip(as_text(p.get("reason")), 600))))
    if a.kind == "outcome_unknown":
        out.append(section_dict(T.QUESTION_ASK + (
            "\n" + T.SECTION_QUESTION.format(key=code_span(as_text(p["idempotency_key"]), 200))
            if p.get("idempotency_key") else "") + _attempt(p)))
    evidence = _evidence(p)
    if evidence:
        optional.append(section_dict(evidence))
        out.append(optional[-1])
    impact = impact_text(w, 500)
    if impact:
        optional.append(section_dict(impact))
        out.append(optional[-1])
    if p.get("why"):
        why = T.SECTION_WHY if a.kind == "tool_call" else T.SECTION_WHY_QUESTION
        out.append(section_dict(why.format(text=clip(as_text(p["why"]), 500))))
    edited = a.edited_args is not None
    title = T.SECTION_ARGS_ORIGINAL if edited else T.SECTION_ARGS
    # each stored JSON masked once, for its text and for masked(a) (w.sensitive is
    # sensitive_paths(a), which masked(a) reads)
    asked, hidden = _args_shown(a.args, w.sensitive)
    if edited:
        will, hidden_edit = _args_shown(a.edited_args, w.sensitive)
        hidden = hidden or hidden_edit
    if hidden:
        title += "\n" + T.ARGS_MASKED
    # with an edit, the original yields room to the arguments that will actually run
    budget = (1500 if edited else SECTION_MAX) - units(title) - 1
    code, cut = code_block(asked, budget)
    out.append(section_dict(f"{title}\n{code}"))
    if edited:
        code, more = code_block(will, 2400)
        out.append(section_dict(f"{T.SECTION_EDITED}\n{code}"))
        cut += more
    if not live:
        out.append(section_dict(_decision(a, votes, superseded_by, words)))
    if standing and a.kind == "tool_call":
        lines = "\n".join(standing_lines(x, now=now, sensitive=w.sensitive)
                           for x in standing[:3])
        out.append(section_dict(lines))
    out.append(context_dict(_context(a, votes, now, supersedes_url)))
    if live and token is not None:
        out.append(button_block(a, token, view_args=cut > 0))
    for extra in optional:  # never expected with the caps above; a guard, not a plan
        if within_text_budget(out, CARD_TEXT_BUDGET):
            break
        out.remove(extra)  # the first block equal to it, as the models' == found it
    return {"text": _fallback(a, p, words), "blocks": out}


def _fallback(a: ApprovalRecord, p: dict[str, Any], words: _Said | None = None) -> str:
    tool = clip(a.tool, 80)
    if a.status != "pending":  # (no agent named: its name is read only where it is said)
        return safe_cut(T.FALLBACK_DONE.format(tool=tool, status=(
            words or outcome_words(a)).words), FALLBACK_MAX)
    agent = clip(asker(p.get("agent")), 80)
    if a.kind == "outcome_unknown":
        text = T.FALLBACK_QUESTION.format(agent=agent, tool=tool)
    elif a.kind == "cannot_run":
        text = T.FALLBACK_CANNOT_RUN.format(agent=agent, tool=tool)
    else:
        text = T.FALLBACK_PENDING.format(agent=agent, tool=tool, risk=risk_of(a))
    return safe_cut(text, FALLBACK_MAX)


# -- compact cards and lines (App Home, /approvals) -----------------------------------------

def compact_blocks(a: ApprovalRecord, token: str | None, *, now: datetime,
                   selectable: bool = False) -> list[dict[str, Any]]:
    """A short summary section of a request, plus its live buttons when ``token`` is given.

    ``selectable``: a pending call also gets a checkbox beside its summary, whose value is
    its id and ``token`` (bound to the arguments shown), for "Approve/Deny selected".
    """
    p = shown_packet(a)
    agent, requester = clip(asker(p.get("agent")), 60), who(a.requested_by)
    if a.kind in ("outcome_unknown", "cannot_run"):
        line = (T.COMPACT_QUESTION_LINE if a.kind == "outcome_unknown"
                else T.COMPACT_CANNOT_RUN_LINE)
        lines = [line.format(emoji=outcome_emoji(a),
                                                tool=code_span(a.tool, 80), agent=agent,
                                                requester=requester)]
    else:
        lines = [T.COMPACT_LINE.format(emoji=T.RISK_EMOJI[risk_of(a)], tool=code_span(a.tool, 80),
                                       risk=risk_of(a), agent=agent, requester=requester)]
    w = will_run(a)
    said = [_doing_line(w, 160), impact_line(w, 200)]
    lines += [line for line in said if line]
    code, cut = code_block(args_text(w.args, indent=None, sensitive=w.sensitive), 300)
    lines.append(code)
    tail = []
    if a.kind == "tool_call" and a.status == "pending":
        tail.append(slack_date(a.expires_at, T.DATE_EXPIRES if now < a.expires_at
                               else T.DATE_EXPIRED))
        tail.append(_quorum(a, ()) or "")  # the count only: names cost space here
    lines.append(" · ".join(t for t in tail if t) or T.CTX_ID.format(id=code_span(a.id, 64)))
    summary = section("\n".join(lines))
    live = token is not None and a.status == "pending"
    value = (select_value(a.id, token) if live and selectable and a.kind == "tool_call"
             and token is not None else None)
    if value is not None:
        summary.block_id = f"{SELECT_BLOCK}.{a.id}"
        summary.accessory = CheckboxesElement(action_id=SELECT, options=[
            Option(text=plain(T.SELECT_OPTION), value=value)])
    out: list[dict[str, Any]] = [block_dict(summary)]  # (a checkbox: to_dict makes it)
    if live and token is not None:
        out.append(button_block(a, token, view_args=cut > 0))
    return out


def status_word(a: ApprovalRecord) -> str:
    """How a request ended, in its outcome's words ("approved with edits", "re-planned")."""
    return outcome_words(a).words


def outcome_emoji(a: ApprovalRecord, words: _Said | None = None) -> str:
    """The emoji of ``a``'s outcome (``words``: its words, read already), as Slack draws
    it."""
    return T.EMOJI.format(name=(words or outcome_words(a)).emoji)


def recent_line(a: ApprovalRecord) -> str:
    """One line about a decided request: ":white_check_mark: `tool` approved by @x <date>"."""
    fields = {"emoji": outcome_emoji(a), "tool": code_span(a.tool, 80),
              "status": status_word(a), "who": who(a.decided_by),
              "date": slack_date(a.decided_at or a.expires_at, T.DATE_AT)}
    # a standing approval's words say what decided it
    named = a.decided_by and outcome_of(a) is not OutcomeName.APPROVED_STANDING
    return (T.RECENT_LINE if named else T.RECENT_LINE_NOBODY).format(**fields)
