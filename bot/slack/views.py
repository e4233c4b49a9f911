"""Pure builders for modals, the App Home tab and the ``/approvals`` answer.

Views are built with slack_sdk's ``View`` and returned as ``.to_dict()``, so titles over 24
characters, more than 100 blocks or oversized metadata fail in tests. Modals carry in
``private_metadata`` only which request they act on and where its card is; never arguments.

The App Home and ``/approvals`` list the viewer's pending requests oldest first, grouped by
tool, each with a checkbox for "Approve selected" / "Deny selected": a ticked checkbox
carries the request's id and the token of the arguments it showed, exactly like its
buttons, so a batch can only ever decide what the approver saw. The App Home also lists
the live standing approvals the viewer granted or approves, whose Revoke and Grant too
buttons carry only the standing approval's id (who may use them is checked when clicked).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from approvald.bot.slack import texts as T
from approvald.bot.slack.cards import (
    ARGS_BLOCK,
    ARGS_INPUT,
    DENY_MODAL,
    DENY_SELECTED_MODAL,
    EDIT_MODAL,
    FIELDS_BLOCK,
    FIELDS_INPUT,
    GUIDANCE_BLOCK,
    GUIDANCE_INPUT,
    REASON_BLOCK,
    REASON_INPUT,
    REDIRECT_MODAL,
    RESOLVE_MODAL,
    SCOPE_BLOCK,
    SCOPE_INPUT,
    SELECT,
    SELECT_BLOCK,
    STANDING_GRANT,
    STANDING_MODAL,
    STANDING_REVOKE,
    WHEN_BLOCK,
    WHEN_INPUT,
    WINDOW_BLOCK,
    WINDOW_INPUT,
    args_text,
    batch_buttons,
    button_value,
    compact_blocks,
    editable_text,
    impact_line,
    json_object,
    masked,
    parse_value,
    recent_line,
    scope_text,
    select_value,
    standing_cap,
)
from approvald.bot.slack.messages import coalesce, refusal_text, repeated_text
from approvald.bot.slack.mrkdwn import (
    CARD_TEXT_BUDGET,
    INPUT_MAX,
    MESSAGE_BLOCKS_MAX,
    REASON_MAX,
    SECTION_MAX,
    VIEW_BLOCKS_MAX,
    clip,
    code_block,
    code_chunks,
    code_span,
    context,
    cut_plain,
    header,
    md,
    plain,
    pretty_json,
    safe_cut,
    section,
    slack_date,
    text_length,
    units,
    who,
)
from approvald.runtime import (
    MAX_BATCH,
    MAX_DEPTH,
    MAX_EXPRESSION,
    BatchVerdict,
    CallResult,
    OperatorInsights,
    RuleError,
    TooDeep,
    condition_holds,
    mask_args,
    parse_caller_json,
    sensitive_paths,
    will_run,
)
from approvald.runtime import BatchOutcome as Outcome
from approvald.store.records import ApprovalRecord
from approvald.store.repos.standing import StandingRecord
from slack_sdk.models.blocks import (
    ActionsBlock,
    Block,
    ButtonElement,
    CheckboxesElement,
    ConfirmObject,
    DividerBlock,
    InputBlock,
    Option,
    PlainTextInputElement,
    RadioButtonsElement,
    StaticSelectElement,
)
from slack_sdk.models.views import View

HOME_MAX_PENDING = 50  # at most: Slack's 100 blocks hold fewer (the oldest that fit are shown)
HOME_MAX_RECENT = 15
HOME_TEXT_BUDGET = 30_000  # no documented cap for a view; stay in a sane range anyway
HOME_RESULT_SECTIONS = 4
LIST_MAX_PENDING = 10
LIST_RESULT_SECTIONS = 2
OPTIONS_PER_ELEMENT = 10  # Slack's cap on a checkboxes element's options
OPTION_TEXT_MAX = 75  # and on an option's text and description
EDIT_ERROR_MAX = 1000


class ModalTarget(NamedTuple):
    """What a modal acts on: the request, its button token, and its card's channel and ts."""

    approval_id: str
    token: str
    channel: str | None
    ts: str | None


def modal_metadata(approval_id: str, token: str, channel: str | None, ts: str | None) -> str:
    """The ``private_metadata`` JSON of our modals (channel/ts are None from App Home)."""
    button_value(approval_id, token)  # the same shape rules as a button value
    return json.dumps({"approval_id": approval_id, "token": token, "channel": channel,
                       "ts": ts}, separators=(",", ":"))


def parse_metadata(text: str) -> ModalTarget:
    """Read :func:`modal_metadata` back; ValueError for anything else."""
    try:
        data = json.loads(text)
    except (TypeError, ValueError):
        raise ValueError("private_metadata is not JSON") from None
    if not isinstance(data, dict):
        raise ValueError("private_metadata is not a JSON object")
    approval_id, token = data.get("approval_id"), data.get("token")
    if not isinstance(approval_id, str) or not isinstance(token, str):
        raise ValueError("private_metadata has no approval id and token")
    approval_id, token = parse_value(f"{approval_id}:{token}")
    channel, ts = data.get("channel"), data.get("ts")
    if not all(v is None or isinstance(v, str) for v in (channel, ts)):
        raise ValueError("channel and ts must be strings or null")
    return ModalTarget(approval_id, token, channel, ts)


def _view(blocks: Sequence[Block | dict[str, Any]], **kw: Any) -> dict[str, Any]:
    dicts = [b if isinstance(b, dict) else b.to_dict() for b in blocks]
    result: dict[str, Any] = View(blocks=dicts, **kw).to_dict()
    return result


def _modal(title: str, blocks: Sequence[Block], *, callback_id: str | None = None,
           submit: str | None = None, metadata: str | None = None) -> dict[str, Any]:
    return _view(blocks, type="modal", callback_id=callback_id, title=plain(title),
                 submit=plain(submit) if submit else None,
                 close=plain(T.MODAL_CANCEL if submit else T.MODAL_CLOSE),
                 private_metadata=metadata)


def result_modal(result: CallResult) -> dict[str, Any]:
    """A read-only modal with a call's result as JSON: a run thread's "Show JSON"."""
    text = pretty_json(result.value)
    attempt = T.STORY_ATTEMPT.format(n=result.attempts) if result.attempts > 1 else ""
    blocks: list[Block] = [section(T.MODAL_JSON_INTRO.format(tool=code_span(result.tool, 80),
                                                             attempt=attempt))]
    shown = 0
    for chunk, end in code_chunks(text, SECTION_MAX):
        if len(blocks) == VIEW_BLOCKS_MAX - 1:
            break
        blocks.append(section(chunk))
        shown = end
    if shown < len(text):
        blocks.append(section(T.TRUNCATED.format(n=len(text) - shown)))
    return _modal(T.MODAL_JSON_TITLE, blocks)


def args_modal(a: ApprovalRecord) -> dict[str, Any]:
    """A read-only modal with the full arguments (edited and original when edited).

    The JSON is split over as many sections as needed, up to Slack's 100 blocks; what still
    does not fit is counted in a last line pointing at the CLI.
    """
    hide = sensitive_paths(a)
    parts = [(T.SECTION_EDITED, args_text(a.edited_args, sensitive=hide)),
             (T.SECTION_ARGS_ORIGINAL, args_text(a.args, sensitive=hide))] \
        if a.edited_args is not None else [(None, args_text(a.args, sensitive=hide))]
    total = len(parts[0][1])
    blocks: list[Block] = [section(T.MODAL_ARGS_INTRO.format(
        tool=code_span(a.tool, 80), id=code_span(a.id, 64), n=total))]
    omitted = 0
    for title, text in parts:
        room = VIEW_BLOCKS_MAX - len(blocks) - 1 - (1 if title else 0)  # 1 for the note
        if room < 1:
            omitted += len(text)
            continue
        if title:
            blocks.append(section(title))
        shown = 0
        for chunk, end in code_chunks(text, SECTION_MAX):
            if room == 0:
                break
            blocks.append(section(chunk))
            room, shown = room - 1, end
        omitted += len(text) - shown
    if omitted:
        blocks.append(section(T.NOT_SHOWN.format(n=omitted, id=code_span(a.id, 64))))
    return _modal(T.MODAL_ARGS_TITLE, blocks)


def _reason_input(label: str, placeholder: str) -> InputBlock:
    return InputBlock(
        block_id=REASON_BLOCK, label=plain(label), optional=False,
        element=PlainTextInputElement(action_id=REASON_INPUT, multiline=True, min_length=1,
                                      max_length=REASON_MAX, placeholder=plain(placeholder)))


def deny_modal(approval_id: str, token: str, channel: str | None, ts: str | None, *,
               tool: str | None = None) -> dict[str, Any]:
    """Asks the denier for a reason, which the agent receives as the call's result."""
    intro = (T.MODAL_DENY_INTRO.format(tool=code_span(tool, 80)) if tool
             else T.MODAL_DENY_INTRO_NO_TOOL)
    blocks = [section(intro), _reason_input(T.MODAL_REASON_LABEL, T.MODAL_DENY_PLACEHOLDER)]
    return _modal(T.MODAL_DENY_TITLE, blocks, callback_id=DENY_MODAL, submit=T.MODAL_DENY_SUBMIT,
                  metadata=modal_metadata(approval_id, token, channel, ts))


def redirect_modal(approval_id: str, token: str, channel: str | None, ts: str | None, *,
                   tool: str | None = None) -> dict[str, Any]:
    """Asks for guidance, which the agent receives instead of the call's result."""
    intro = (T.MODAL_REDIRECT_INTRO.format(tool=code_span(tool, 80)) if tool
             else T.MODAL_REDIRECT_INTRO_NO_TOOL)
    guidance = InputBlock(
        block_id=GUIDANCE_BLOCK, label=plain(T.MODAL_GUIDANCE_LABEL), optional=False,
        element=PlainTextInputElement(action_id=GUIDANCE_INPUT, multiline=True, min_length=1,
                                      max_length=REASON_MAX,
                                      placeholder=plain(T.MODAL_REDIRECT_PLACEHOLDER)))
    return _modal(T.MODAL_REDIRECT_TITLE, [section(intro), guidance], callback_id=REDIRECT_MODAL,
                  submit=T.MODAL_REDIRECT_SUBMIT,
                  metadata=modal_metadata(approval_id, token, channel, ts))


def resolve_abort_modal(approval_id: str, token: str, channel: str | None, ts: str | None, *,
                        tool: str | None = None) -> dict[str, Any]:
    """Asks why an outcome question is answered with Abort (the runtime requires a reason)."""
    intro = (T.MODAL_ABORT_INTRO.format(tool=code_span(tool, 80)) if tool
             else T.MODAL_ABORT_INTRO_NO_TOOL)
    blocks = [section(intro), _reason_input(T.MODAL_REASON_LABEL, T.MODAL_ABORT_PLACEHOLDER)]
    return _modal(T.MODAL_ABORT_TITLE, blocks, callback_id=RESOLVE_MODAL,
                  submit=T.MODAL_ABORT_SUBMIT,
                  metadata=modal_metadata(approval_id, token, channel, ts))


def edit_modal(a: ApprovalRecord, token: str, channel: str | None,
               ts: str | None) -> dict[str, Any]:
    """A JSON editor prefilled with the arguments that would run now.

    Slack's text box holds 3,000 characters; longer arguments get a modal that explains
    how to edit them from the CLI instead (the card shows no Edit button for them).
    """
    metadata = modal_metadata(a.id, token, channel, ts)
    w = will_run(a)
    text = editable_text(a)
    if text is None:
        size = units(args_text(w.args, indent=None, sensitive=w.sensitive))
        blocks: list[Block] = [section(T.MODAL_EDIT_TOO_BIG.format(
            n=size, limit=INPUT_MAX, id=code_span(a.id, 64)))]
        return _modal(T.MODAL_EDIT_TITLE, blocks, metadata=metadata)
    propose = json_object(a.policy).get("edits") == "propose"
    intro = (T.MODAL_PROPOSE_INTRO if propose else T.MODAL_EDIT_INTRO).format(
        tool=code_span(a.tool, 80))
    if masked(a):
        intro += "\n" + T.MODAL_EDIT_MASKED
    impact = impact_line(w, 500)  # of the arguments the box starts with
    blocks = [
        section(intro + ("\n" + impact if impact else "")),
        InputBlock(block_id=ARGS_BLOCK, label=plain(T.MODAL_EDIT_LABEL), optional=False,
                   hint=plain(cut_plain(T.MODAL_EDIT_HINT.format(tool=a.tool), 2000)),
                   element=PlainTextInputElement(action_id=ARGS_INPUT, multiline=True,
                                                 initial_value=text, min_length=2,
                                                 max_length=INPUT_MAX)),
        # why: recorded beside the edit in the audit log, for whoever reviews it later
        InputBlock(block_id=REASON_BLOCK, label=plain(T.MODAL_EDIT_REASON_LABEL),
                   optional=True,
                   element=PlainTextInputElement(
                       action_id=REASON_INPUT, multiline=True, max_length=REASON_MAX,
                       placeholder=plain(T.MODAL_EDIT_REASON_PLACEHOLDER))),
    ]
    return _modal(T.MODAL_EDIT_TITLE, blocks, callback_id=EDIT_MODAL,
                  submit=T.MODAL_PROPOSE_SUBMIT if propose else T.MODAL_EDIT_SUBMIT,
                  metadata=metadata)


def _loc(loc: Any) -> str:
    if not isinstance(loc, list | tuple):
        return str(loc) if loc not in (None, "") else ""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def edit_errors(errors: Sequence[Mapping[str, Any]] | str) -> dict[str, Any]:
    """The ``view_submission`` answer that shows why edited arguments were refused.

    ``errors`` is ``InvalidArguments.errors`` (``[{"loc": [...], "msg": ...}]``) or, as a
    string, the message of a JSON parse error. Shown as plain text, only to the submitter.
    """
    if isinstance(errors, str):
        text = T.EDIT_ERROR_JSON.format(error=errors)
    elif not errors:
        text = T.EDIT_ERROR_GENERIC
    else:
        lines = []
        for e in errors[:5]:
            loc, msg = _loc(e.get("loc")), str(e.get("msg") or T.EDIT_ERROR_GENERIC)
            lines.append(T.EDIT_ERROR_ITEM.format(loc=loc, msg=msg) if loc
                         else T.EDIT_ERROR_TOP.format(msg=msg))
        text = "; ".join(lines)
        if len(errors) > 5:
            text += T.EDIT_ERROR_MORE.format(n=len(errors) - 5)
    return {"response_action": "errors", "errors": {ARGS_BLOCK: cut_plain(text, EDIT_ERROR_MAX)}}


def parse_edit(text: str) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """Read the edit box: ``(arguments, None)``, or ``(None, the error answer)`` to return
    from the ``view_submission`` (schema validation is the runtime's job, not this one's)."""
    try:
        value = parse_caller_json(text, max_depth=MAX_DEPTH)
    except TooDeep:
        return None, edit_errors([{"loc": [], "msg": T.EDIT_ERROR_DEEP.format(n=MAX_DEPTH)}])
    except ValueError as exc:
        return None, edit_errors(str(exc))
    if not isinstance(value, dict):
        return None, edit_errors([{"loc": [], "msg": T.EDIT_ERROR_OBJECT}])
    return value, None


class BatchResult(NamedTuple):
    """What "Approve/Deny selected" did, for the view drawn after it.

    ``outcomes``: each request's :class:`runtime.approvals.batch.Outcome` with the request as it is
    now (None when there is no such request). ``refused``: why the whole batch was refused
    before anything was decided. ``error``: why it stopped part-way. No outcomes and
    neither: nothing was selected.
    """

    verdict: BatchVerdict
    outcomes: Sequence[tuple[Outcome, ApprovalRecord | None]] = ()
    refused: str | None = None
    error: str | None = None


def parse_selection(values: Any) -> list[tuple[str, str]]:
    """``(approval_id, token)`` of every ticked request in a view's or a message's
    ``state.values``, each once, in the order given. Options that are not ours are skipped:
    what a ticked box may decide is checked again by the decision itself."""
    out: list[tuple[str, str]] = []
    seen: set[str] = set()
    if not isinstance(values, Mapping):
        return out
    for block in values.values():
        state = block.get(SELECT) if isinstance(block, Mapping) else None
        options = state.get("selected_options") if isinstance(state, Mapping) else None
        for option in options if isinstance(options, list) else []:
            try:
                approval_id, token = parse_value(option.get("value"))
            except (ValueError, AttributeError):
                continue
            if approval_id not in seen:
                seen.add(approval_id)
                out.append((approval_id, token))
    return out


def _label(a: ApprovalRecord | None, approval_id: str) -> str:
    """A request in one line of mrkdwn: its tool, short id and arguments (escaped)."""
    if a is None:
        return T.BATCH_LABEL_UNKNOWN.format(id=code_span(approval_id, 64))
    return T.BATCH_LABEL.format(tool=code_span(a.tool, 80), id=code_span(a.id[:8], 8),
                                args=code_span(args_text(will_run(a).args, indent=None,
                                                          sensitive=sensitive_paths(a)), 80))


def _pack(lines: Sequence[str], *, most: int) -> list[str]:
    """Lines into at most ``most`` sections' texts; a last line counts what did not fit."""
    chunks: list[list[str]] = [[]]
    size = 0
    room = SECTION_MAX - 200  # for the note
    for i, line in enumerate(lines):
        add = units(line) + 1
        if chunks[-1] and size + add > room:
            if len(chunks) == most:
                chunks[-1].append(T.BATCH_LINES_MORE.format(n=len(lines) - i))
                break
            chunks.append([])
            size = 0
        chunks[-1].append(line)
        size += add
    return ["\n".join(c) for c in chunks if c]


def batch_result_blocks(result: BatchResult, *, sections: int) -> list[Block]:
    """What a batch did: a summary, then a line per request (refused ones first, with why),
    in at most ``sections`` sections of lines."""
    blocks: list[Block] = []
    if result.refused is not None:
        blocks.append(section(T.BATCH_REFUSED.format(why=clip(result.refused, 300))))
    if result.error is not None:
        blocks.append(section(T.BATCH_ERROR.format(error=clip(result.error, 300))))
    if not result.outcomes:
        return blocks or [section(T.BATCH_NOTHING)]
    refused: list[str] = []
    done: list[str] = []
    counts: Counter[str] = Counter()
    for o, a in result.outcomes:
        label = _label(a, o.approval_id)
        if o.decision is None:
            counts["refused"] += 1
            why = refusal_text(o.code or "", status=a.status if a else None, detail=o.refused,
                               decided_by=a.decided_by if a else None,
                               approvers=a.approvers_value() if a else ())
            refused.append(T.BATCH_LINE_REFUSED.format(label=label, why=why))
        elif o.decision.repeated:  # audited as a repeat: it stands, nothing changed
            counts["repeated"] += 1
            done.append(T.BATCH_LINE_REPEATED.format(
                label=label, why=repeated_text(o.decision.approval)))
        elif o.decision.outcome == "voted":
            counts["voted"] += 1
            done.append(T.BATCH_LINE_VOTED.format(label=label, count=o.decision.approvals,
                                                  quorum=o.decision.quorum))
        elif o.decision.outcome == "denied":
            counts["denied"] += 1
            done.append(T.BATCH_LINE_DENIED.format(label=label))
        else:
            counts["approved"] += 1
            done.append(T.BATCH_LINE_APPROVED.format(label=label))
    parts = [template.format(n=counts[key]) for key, template in (
        ("approved", T.BATCH_PART_APPROVED), ("voted", T.BATCH_PART_VOTED),
        ("denied", T.BATCH_PART_DENIED), ("repeated", T.BATCH_PART_REPEATED),
        ("refused", T.BATCH_PART_REFUSED)) if counts[key]]
    blocks.append(section(T.BATCH_SUMMARY.format(total=len(result.outcomes),
                                                 parts=" · ".join(parts))))
    blocks += [section(text) for text in _pack(refused + done, most=sections)]
    return blocks


def _pending_groups(pending: Sequence[tuple[ApprovalRecord, str]], *, now: datetime,
                    most: int, max_blocks: int,
                    budget: int) -> tuple[list[dict[str, Any]], int]:
    """The first of ``pending`` that fit in blocks and text, grouped by tool in the order
    of each tool's first request: a header with the tool's count, each request's compact
    card with its checkbox, a divider. Also how many requests were shown."""
    totals = Counter(a.tool for a, _ in pending)
    groups: dict[str, list[dict[str, Any]]] = {}
    used = size = shown = 0
    for a, token in pending[:most]:
        item = compact_blocks(a, token, now=now, selectable=True)
        head = [] if a.tool in groups else [
            header(T.GROUP_HEADER.format(tool=a.tool, n=totals[a.tool])).to_dict(),
            DividerBlock().to_dict()]
        grown = text_length(item) + text_length(head)
        if used + len(item) + len(head) > max_blocks or size + grown > budget:
            break  # the oldest that fit, and no younger one in a gap
        groups.setdefault(a.tool, head[:1]).extend(item)
        used += len(item) + len(head)
        size += grown
        shown += 1
    out: list[dict[str, Any]] = []
    for blocks in groups.values():
        out += [*blocks, DividerBlock().to_dict()]
    return out, shown


def _batch_top(pending: Sequence[tuple[ApprovalRecord, str]]) -> list[Block]:
    """The hint and the batch buttons, when anything listed can be ticked."""
    if not any(a.kind == "tool_call" for a, _ in pending):
        return []
    return [context([T.BATCH_HINT]), batch_buttons()]


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def _wait(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.0f}s" if x < 90 else f"{x / 60:.1f}m" if x < 5400 else f"{x / 3600:.1f}h"


HOME_INSIGHTS_TOOLS = 8  # tools listed (the most asked first)
HOME_INSIGHTS_SUGGESTIONS = 3


def insights_blocks(view: OperatorInsights) -> list[dict[str, Any]]:
    """The insights at the foot of an operator's App Home: per tool, how often people are
    asked, what they answer and how fast, who decides; shadow rules' records; the rules
    the record supports, each a snippet to paste (the same as ``approvald insights``)."""
    out: list[Block | dict[str, Any]] = [header(T.HOME_INSIGHTS_TITLE.format(
        window=view.window))]
    found = view.insights
    if found is None:
        out.append(section(T.HOME_INSIGHTS_BROKEN.format(
            why=clip(view.broken[0] if view.broken else "", 500))))
        return _dicts(out)
    out.append(context([T.HOME_INSIGHTS_SUMMARY.format(
        requests=found.requests, at=slack_date(view.at, T.DATE_AT))]))
    lines = []
    for st in found.tools[:HOME_INSIGHTS_TOOLS]:
        d = st.document()
        line = T.HOME_INSIGHTS_TOOL.format(
            tool=code_span(st.name, 80), asked=st.asked, approve=_pct(d["approve_rate"]),
            edit=_pct(d["edit_rate"]), deny=_pct(d["deny_rate"]),
            expire=_pct(d["expire_rate"]), median=_wait(d["median_seconds"]),
            p90=_wait(d["p90_seconds"]))
        if d["top_denial_reasons"]:
            line += "\n" + T.HOME_INSIGHTS_DENIED.format(reasons="; ".join(
                f"{clip(r['reason'], 120)} ({r['count']})" for r in d["top_denial_reasons"]))
        if d["deciders"]:
            line += "\n" + T.HOME_INSIGHTS_DECIDERS.format(who=", ".join(
                f"{who(k)} ({n})" for k, n in list(d["deciders"].items())[:5]))
        lines.append(line)
    lines += [T.HOME_INSIGHTS_SHADOW.format(
        where=code_span(sh.where, 120), when=code_span(sh.when or "the entry", 200),
        matched=sh.matched, agreed=sh.agreed, settled=sh.settled) for sh in found.shadows[:5]]
    out += [section(c) for c in coalesce(lines, SECTION_MAX)[:3]] or [
        context([T.HOME_INSIGHTS_EMPTY])]
    for sg in found.suggestions[:HOME_INSIGHTS_SUGGESTIONS]:
        block, _ = code_block(sg.snippet, 1200)
        out.append(section(f"{T.HOME_INSIGHTS_SUGGESTED}\n{clip(sg.text, 1200)}\n{block}"))
    return _dicts(out)


def home_view(pending: Sequence[tuple[ApprovalRecord, str]], recent: Sequence[ApprovalRecord],
              *, now: datetime, total: int | None = None,
              result: BatchResult | None = None, standing: Sequence[HomeStanding] = (),
              standing_total: int | None = None, notice: str | None = None,
              insights: OperatorInsights | None = None) -> dict[str, Any]:
    """The App Home tab: what a batch just did (``result``) or what a click on a standing
    approval did (``notice``, mrkdwn), the viewer's pending requests with checkboxes and
    live buttons, the live standing approvals they granted or approve, then their recent
    decisions.

    ``pending`` pairs each request with the viewer's button token, oldest first: the oldest
    that fit in Slack's 100 blocks are shown, and a line says how many of ``total`` (by
    default all of ``pending``) and how to see the rest. At most
    :data:`HOME_MAX_STANDING` of ``standing`` are shown, with a line for the rest of
    ``standing_total``.
    """
    total = len(pending) if total is None else total
    top: list[Block | dict[str, Any]] = [header(T.HOME_TITLE)]
    if notice is not None:
        top += [section(notice), DividerBlock()]
    if result is not None:
        top += [*batch_result_blocks(result, sections=HOME_RESULT_SECTIONS), DividerBlock()]
    if not pending:
        top.append(section(T.HOME_EMPTY))
    top += _batch_top(pending)
    lasting = _dicts(standing_blocks(standing, now=now, total=standing_total))
    foot = insights_blocks(insights) if insights is not None else []
    # leave room for: the "more" note, the standing approvals, the recent header and two
    # recent sections, and an operator's insights
    items, shown = _pending_groups(
        pending, now=now, most=HOME_MAX_PENDING,
        max_blocks=VIEW_BLOCKS_MAX - len(top) - len(lasting) - len(foot) - 4,
        budget=HOME_TEXT_BUDGET - text_length(_dicts(top)) - text_length(lasting)
        - text_length(foot))
    top += items
    if shown < total:
        top.append(context([T.HOME_MORE.format(shown=shown, total=total)]))
    top += lasting
    top.append(header(T.HOME_RECENT_TITLE))
    lines = [recent_line(a) for a in recent[:HOME_MAX_RECENT]]
    chunks = coalesce(lines, SECTION_MAX)[:2]
    top += [section(c) for c in chunks] or [context([T.HOME_RECENT_EMPTY])]
    top += foot
    return _view(top, type="home")


def _dicts(blocks: Sequence[Block | dict[str, Any]]) -> list[dict[str, Any]]:
    return [b if isinstance(b, dict) else b.to_dict() for b in blocks]


def approvals_list_message(pending: Sequence[tuple[ApprovalRecord, str]], *, now: datetime,
                           total: int | None = None,
                           result: BatchResult | None = None) -> dict[str, Any]:
    """The ephemeral answer to ``/approvals``: ``{"text", "blocks"}`` with checkboxes and
    live buttons, the oldest of ``pending`` that fit; after a batch, what it did first."""
    total = len(pending) if total is None else total
    blocks: list[Block | dict[str, Any]] = []
    if result is not None:
        blocks += batch_result_blocks(result, sections=LIST_RESULT_SECTIONS)
    if not pending:
        blocks.append(section(T.LIST_EMPTY))
        return {"text": T.LIST_EMPTY, "blocks": _dicts(blocks)}
    blocks += [section(T.LIST_TITLE.format(n=total)), *_batch_top(pending)]
    items, shown = _pending_groups(pending, now=now, most=LIST_MAX_PENDING,
                                   max_blocks=MESSAGE_BLOCKS_MAX - len(blocks) - 1,
                                   budget=CARD_TEXT_BUDGET - 1000 - text_length(_dicts(blocks)))
    blocks += items
    if shown < total:
        blocks.append(context([T.LIST_MORE.format(n=total - shown, total=total)]))
    return {"text": T.LIST_FALLBACK.format(n=total), "blocks": _dicts(blocks)}


# -- "Deny selected": one reason for every ticked request -------------------------------------

def _option(a: ApprovalRecord | None, approval_id: str, value: str) -> Option:
    """A ticked request in the deny modal: its tool and arguments, escaped like a card's."""
    if a is None:
        return Option(text=md(code_span(approval_id, OPTION_TEXT_MAX)), value=value)
    tool = clip(a.tool, 30)
    room = OPTION_TEXT_MAX - units(tool) - 3  # a space and the span's backticks
    args = code_span(args_text(will_run(a).args, indent=None, sensitive=sensitive_paths(a)),
                     room)
    note = T.MODAL_BATCH_ITEM_NOTE.format(id=a.id[:8], who=who(a.requested_by))
    return Option(text=md(f"{tool} `{args}`"), value=value,
                  description=md(safe_cut(note, OPTION_TEXT_MAX)))


def batch_deny_modal(items: Sequence[tuple[str, str, ApprovalRecord | None]], *,
                     channel: str | None) -> dict[str, Any]:
    """Asks one reason for denying every ticked request, listed as checkboxes (ticked, ten
    to an element) so the denier sees what they deny and may untick some.

    ``items``: ``(approval_id, token, the request or None)``; ``channel``: where the list
    was (None: the App Home), the only thing ``private_metadata`` carries.
    """
    options = []
    for approval_id, token, a in items[:MAX_BATCH]:
        value = select_value(approval_id, token)
        if value is not None:
            options.append(_option(a, approval_id, value))
    blocks: list[Block] = [section(T.MODAL_BATCH_DENY_INTRO.format(n=len(options)))]
    for i in range(0, len(options), OPTIONS_PER_ELEMENT):
        chunk = options[i:i + OPTIONS_PER_ELEMENT]
        blocks.append(InputBlock(
            block_id=f"{SELECT_BLOCK}.{i // OPTIONS_PER_ELEMENT}", optional=True,
            label=plain(T.MODAL_BATCH_ITEMS if i == 0 else T.MODAL_BATCH_ITEMS_MORE),
            element=CheckboxesElement(action_id=SELECT, options=chunk, initial_options=chunk)))
    blocks.append(_reason_input(T.MODAL_REASON_LABEL, T.MODAL_DENY_PLACEHOLDER))
    return _modal(T.MODAL_BATCH_DENY_TITLE, blocks, callback_id=DENY_SELECTED_MODAL,
                  submit=T.MODAL_BATCH_DENY_SUBMIT,
                  metadata=json.dumps({"channel": channel}, separators=(",", ":")))


BATCH_FIRST_BLOCK = f"{SELECT_BLOCK}.0"  # where the modal says that nothing is ticked


def parse_batch_metadata(text: str) -> str | None:
    """The channel :func:`batch_deny_modal` was opened from (None: the App Home);
    ValueError for anything else."""
    try:
        data = json.loads(text)
    except (TypeError, ValueError):
        raise ValueError("private_metadata is not JSON") from None
    channel = data.get("channel") if isinstance(data, dict) else 0
    if channel is not None and (not isinstance(channel, str) or not 0 < len(channel) <= 64):
        raise ValueError("private_metadata names no channel")
    return channel


# -- standing approvals: the card's modal, and the App Home's list ---------------------------

WINDOWS = {"15m": timedelta(minutes=15), "30m": timedelta(minutes=30), "1h": timedelta(hours=1),
           "2h": timedelta(hours=2), "4h": timedelta(hours=4), "8h": timedelta(hours=8)}
SCOPES = ("exact", "fields", "condition")
HOME_MAX_STANDING = 10
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CEL_RESERVED = frozenset({
    "true", "false", "null", "in", "as", "break", "const", "continue", "else", "for",
    "function", "if", "import", "let", "loop", "package", "namespace", "return", "var",
    "void", "while"})
EXAMPLE_TERMS = 4
EXAMPLE_STRING_MAX = 64


def example_condition(tool: str, args: Mapping[str, Any],
                      sensitive: Sequence[str] = ()) -> str:
    """A CEL condition that holds for this call, drawn from its arguments, to start from:
    identifier-like strings and booleans must be equal, whole numbers at most as large
    (``args.order_id == "A-1001" && args.amount_cents <= 4200``). Free text, nested values,
    names CEL cannot spell and sensitive values (under the ``sensitive`` paths, or found by
    a detector) are left out; "" when nothing fits."""
    terms: list[str] = []
    shown = mask_args(args, sensitive)
    for name, value in args.items():
        if len(terms) == EXAMPLE_TERMS:
            break
        if not _IDENT.fullmatch(name) or name in _CEL_RESERVED or shown.get(name) != value:
            continue
        ref = f"args.{name}"
        if isinstance(value, bool):
            term = f"{ref} == {'true' if value else 'false'}"
        elif isinstance(value, int):
            term = f"{ref} <= {value}"
        elif (isinstance(value, str) and 0 < len(value) <= EXAMPLE_STRING_MAX
              and value.isprintable() and not any(c.isspace() for c in value)):
            term = f"{ref} == {json.dumps(value)}"
        else:
            continue
        try:  # a term CEL reads differently (a number beyond int64, …) is left out
            if condition_holds(term, tool, args):
                terms.append(term)
        except (RuleError, ValueError):
            continue
    return " && ".join(terms)


def windows_for(a: ApprovalRecord) -> list[str]:
    """The windows offered for a standing approval on ``a``: those within its policy's
    ``max_standing`` (and 8 h), shortest first; none when standing approvals are off."""
    cap = standing_cap(a)
    return [key for key, span in WINDOWS.items() if span <= cap]


def _field_options(args: Mapping[str, Any]) -> list[Option]:
    """A checkbox per argument name (the first ten that fit an option's value), with its
    current value as the description; both escaped and cut to Slack's 75 characters."""
    options: list[Option] = []
    for name, value in args.items():
        if len(options) == OPTIONS_PER_ELEMENT:
            break
        if not name or len(name) > 150:
            continue
        shown = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
        options.append(Option(
            value=name, text=md(f"`{code_span(name, OPTION_TEXT_MAX - 2)}`"),
            description=md(clip(T.MODAL_STANDING_FIELD_VALUE.format(
                value=f"`{code_span(shown, OPTION_TEXT_MAX - 8)}`"), OPTION_TEXT_MAX))))
    return options


def standing_modal(a: ApprovalRecord, token: str, channel: str | None,
                   ts: str | None) -> dict[str, Any]:
    """"Approve, and calls like this…": a window within the tool's ``max_standing``, a
    scope (this exact call, the same values for ticked arguments, or a CEL condition
    prefilled from the call's arguments) and what granting means. Submitting approves the
    request (with every check a click gets) and grants the standing approval."""
    metadata = modal_metadata(a.id, token, channel, ts)
    args = a.effective_args()
    w = will_run(a)
    code, _ = code_block(args_text(w.args, indent=None, sensitive=w.sensitive), 600)
    impact = impact_line(w, 500)
    blocks: list[Block] = [section(T.MODAL_STANDING_INTRO.format(tool=code_span(a.tool, 80))
                                   + "\n" + code + ("\n" + impact if impact else ""))]
    windows = windows_for(a)
    if not windows:  # the card draws no button then; an old card may still be clicked
        blocks.append(section(T.STANDING_REFUSAL["off"]))
        return _modal(T.MODAL_STANDING_TITLE, blocks, metadata=metadata)
    choices = [Option(value=key, text=plain(T.WINDOW_LABELS[key])) for key in windows]
    blocks.append(InputBlock(
        block_id=WINDOW_BLOCK, label=plain(T.MODAL_STANDING_WINDOW), optional=False,
        element=StaticSelectElement(action_id=WINDOW_INPUT, options=choices,
                                    initial_option=choices[0])))
    fields = _field_options(mask_args(args, w.sensitive))  # names, and values as shown
    scopes = [Option(value="exact", text=plain(T.SCOPE_EXACT),
                     description=plain(T.SCOPE_EXACT_NOTE))]
    if fields:
        scopes.append(Option(value="fields", text=plain(T.SCOPE_FIELDS),
                             description=plain(T.SCOPE_FIELDS_NOTE)))
    scopes.append(Option(value="condition", text=plain(T.SCOPE_CONDITION),
                         description=plain(T.SCOPE_CONDITION_NOTE)))
    blocks.append(InputBlock(
        block_id=SCOPE_BLOCK, label=plain(T.MODAL_STANDING_SCOPE), optional=False,
        element=RadioButtonsElement(action_id=SCOPE_INPUT, options=scopes,
                                    initial_option=scopes[0])))
    if fields:
        blocks.append(InputBlock(
            block_id=FIELDS_BLOCK, label=plain(T.MODAL_STANDING_FIELDS), optional=True,
            hint=plain(T.MODAL_STANDING_FIELDS_HINT),
            element=CheckboxesElement(action_id=FIELDS_INPUT, options=fields)))
    example = example_condition(a.tool, args, w.sensitive)
    blocks.append(InputBlock(
        block_id=WHEN_BLOCK, label=plain(T.MODAL_STANDING_WHEN), optional=True,
        hint=plain(T.MODAL_STANDING_WHEN_HINT),
        element=PlainTextInputElement(action_id=WHEN_INPUT, multiline=True,
                                      max_length=MAX_EXPRESSION,
                                      initial_value=example or None,
                                      placeholder=plain("args.amount_cents <= 5000"))))
    quorum = (T.MODAL_STANDING_QUORUM.format(n=a.quorum, more=a.quorum - 1) if a.quorum > 1
              else T.MODAL_STANDING_QUORUM_ONE)
    blocks.append(context([T.MODAL_STANDING_EXPLAIN.format(quorum=quorum)]))
    return _modal(T.MODAL_STANDING_TITLE, blocks, callback_id=STANDING_MODAL,
                  submit=T.MODAL_STANDING_SUBMIT, metadata=metadata)


class StandingChoice(NamedTuple):
    """What the standing approval modal was submitted with."""

    window: timedelta
    kind: str
    fields: list[str]
    when: str


def _state(values: Mapping[str, Any], block: str, action: str) -> Mapping[str, Any]:
    found = (values.get(block) or {}).get(action) if isinstance(values, Mapping) else None
    return found if isinstance(found, Mapping) else {}


def _chosen(state: Mapping[str, Any]) -> str | None:
    option = state.get("selected_option")
    value = option.get("value") if isinstance(option, Mapping) else None
    return value if isinstance(value, str) else None


def parse_standing(values: Any) -> tuple[StandingChoice | None, dict[str, str]]:
    """Read the modal's ``view.state.values``: the choice, or the inline errors (block id
    -> text) to answer the submission with. Whether the scope covers the request and
    the window is allowed is the runtime's to say."""
    values = values if isinstance(values, Mapping) else {}
    errors: dict[str, str] = {}
    window = WINDOWS.get(_chosen(_state(values, WINDOW_BLOCK, WINDOW_INPUT)) or "")
    if window is None:
        errors[WINDOW_BLOCK] = T.MODAL_STANDING_NO_WINDOW
    kind = _chosen(_state(values, SCOPE_BLOCK, SCOPE_INPUT))
    ticked = _state(values, FIELDS_BLOCK, FIELDS_INPUT).get("selected_options")
    fields = [str(o["value"]) for o in ticked if isinstance(o, Mapping)
              and isinstance(o.get("value"), str)] if isinstance(ticked, list) else []
    when = str(_state(values, WHEN_BLOCK, WHEN_INPUT).get("value") or "").strip()
    if kind not in SCOPES:
        errors[SCOPE_BLOCK] = T.MODAL_STANDING_NO_SCOPE
    elif kind == "fields" and not fields:
        errors[FIELDS_BLOCK if FIELDS_BLOCK in values else SCOPE_BLOCK] = \
            T.MODAL_STANDING_NO_FIELDS
    elif kind == "condition" and not when:
        errors[WHEN_BLOCK] = T.MODAL_STANDING_NO_WHEN
    if errors or window is None or kind is None:
        return None, errors
    return StandingChoice(window, kind, fields if kind == "fields" else [],
                          when if kind == "condition" else ""), {}


def scope_error_block(kind: str) -> str:
    """Where the modal shows why a scope of ``kind`` was refused."""
    return {"fields": FIELDS_BLOCK, "condition": WHEN_BLOCK}.get(kind, SCOPE_BLOCK)


class HomeStanding(NamedTuple):
    """A live standing approval on the viewer's App Home: may they add a grant to it."""

    standing: StandingRecord
    may_grant: bool
    # the sensitive paths of the request it was granted on: its scope's values masked
    sensitive: tuple[str, ...] = ()


def _standing_item(item: HomeStanding, now: datetime) -> list[Block]:
    s = item.standing
    grants = s.grants_value()
    text = T.HOME_STANDING_LINE.format(
        emoji=T.STANDING_EMOJI.get(s.state(now), T.UNKNOWN_EMOJI), tool=code_span(s.tool, 80),
        scope=scope_text(s, sensitive=item.sensitive), until=slack_date(s.expires_at,
                                                                        T.DATE_AT),
        count=len(grants),
        quorum=s.quorum, who=", ".join(who(g) for g in grants[:10]) or "—", uses=s.uses,
        id=code_span(s.id, 64))
    tool = code_span(s.tool, 80)
    revoke = ButtonElement(
        text=T.BUTTON_STANDING_REVOKE, action_id=STANDING_REVOKE, value=s.id, style="danger",
        confirm=ConfirmObject(title=T.CONFIRM_REVOKE_TITLE,
                              text=md(T.CONFIRM_REVOKE_TEXT.format(tool=tool)),
                              confirm=T.CONFIRM_REVOKE_YES, deny=T.CONFIRM_NO, style="danger"))
    if not item.may_grant:
        block = section(text)
        block.accessory = revoke
        return [block]
    grant = ButtonElement(
        text=T.BUTTON_STANDING_GRANT, action_id=STANDING_GRANT, value=s.id, style="primary",
        confirm=ConfirmObject(title=T.CONFIRM_GRANT_TITLE,
                              text=md(T.CONFIRM_GRANT_TEXT.format(tool=tool)),
                              confirm=T.CONFIRM_GRANT_YES, deny=T.CONFIRM_NO, style="primary"))
    return [section(text), ActionsBlock(elements=[grant, revoke])]


def standing_blocks(items: Sequence[HomeStanding], *, now: datetime,
                    total: int | None = None) -> list[Block]:
    """The App Home's "Standing approvals": a header, at most :data:`HOME_MAX_STANDING`
    of ``items`` (each with Revoke, and Grant too where the viewer's grant is still
    needed), and a line naming the command for the rest of ``total``; nothing at all
    without items."""
    if not items:
        return []  # nothing to act on: the Home stays as it was before the feature
    total = len(items) if total is None else total
    blocks: list[Block] = [header(T.HOME_STANDING_TITLE)]
    for item in items[:HOME_MAX_STANDING]:
        blocks += _standing_item(item, now)
    if total > min(len(items), HOME_MAX_STANDING):
        blocks.append(context([T.HOME_STANDING_MORE.format(
            n=total - min(len(items), HOME_MAX_STANDING))]))
    return blocks
