"""Pure builders for modals, the App Home tab and the ``/approvals`` answer.

Views are built with slack_sdk's ``View`` and returned as ``.to_dict()``, so titles over 24
characters, more than 100 blocks or oversized metadata fail in tests. Modals carry in
``private_metadata`` only which request they act on and where its card is; never arguments.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple

from slack_sdk.models.blocks import Block, DividerBlock, InputBlock, PlainTextInputElement
from slack_sdk.models.views import View

from bot import texts as T
from bot.cards import (
    ARGS_BLOCK,
    ARGS_INPUT,
    DENY_MODAL,
    EDIT_MODAL,
    GUIDANCE_BLOCK,
    GUIDANCE_INPUT,
    REASON_BLOCK,
    REASON_INPUT,
    REDIRECT_MODAL,
    RESOLVE_MODAL,
    args_text,
    button_value,
    compact_blocks,
    editable_text,
    json_object,
    parse_value,
    recent_line,
)
from bot.messages import coalesce
from bot.mrkdwn import (
    CARD_TEXT_BUDGET,
    INPUT_MAX,
    MESSAGE_BLOCKS_MAX,
    REASON_MAX,
    SECTION_MAX,
    VIEW_BLOCKS_MAX,
    code_chunks,
    code_span,
    context,
    cut_plain,
    header,
    plain,
    section,
    text_length,
    units,
)
from store.records import ApprovalRecord

HOME_MAX_PENDING = 20
HOME_MAX_RECENT = 15
HOME_TEXT_BUDGET = 30_000  # no documented cap for a view; stay in a sane range anyway
LIST_MAX_PENDING = 10
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


def args_modal(a: ApprovalRecord) -> dict[str, Any]:
    """A read-only modal with the full arguments (edited and original when edited).

    The JSON is split over as many sections as needed, up to Slack's 100 blocks; what still
    does not fit is counted in a last line pointing at the CLI.
    """
    parts = [(T.SECTION_EDITED, args_text(a.edited_args)), (T.SECTION_ARGS_ORIGINAL,
             args_text(a.args))] if a.edited_args is not None else [(None, args_text(a.args))]
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
    text = editable_text(a)
    if text is None:
        size = units(args_text(a.edited_args or a.args, indent=None))
        blocks: list[Block] = [section(T.MODAL_EDIT_TOO_BIG.format(
            n=size, limit=INPUT_MAX, id=code_span(a.id, 64)))]
        return _modal(T.MODAL_EDIT_TITLE, blocks, metadata=metadata)
    propose = json_object(a.policy).get("edits") == "propose"
    intro = T.MODAL_PROPOSE_INTRO if propose else T.MODAL_EDIT_INTRO
    blocks = [
        section(intro.format(tool=code_span(a.tool, 80))),
        InputBlock(block_id=ARGS_BLOCK, label=plain(T.MODAL_EDIT_LABEL), optional=False,
                   hint=plain(cut_plain(T.MODAL_EDIT_HINT.format(tool=a.tool), 2000)),
                   element=PlainTextInputElement(action_id=ARGS_INPUT, multiline=True,
                                                 initial_value=text, min_length=2,
                                                 max_length=INPUT_MAX)),
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
        value = json.loads(text)
    except ValueError as exc:
        return None, edit_errors(str(exc))
    if not isinstance(value, dict):
        return None, edit_errors([{"loc": [], "msg": T.EDIT_ERROR_OBJECT}])
    return value, None


def _pending_blocks(pending: Sequence[tuple[ApprovalRecord, str]], *, now: datetime,
                    most: int, max_blocks: int, budget: int) -> tuple[list[dict[str, Any]], int]:
    """Compact cards with dividers while they fit in blocks and text; and how many did."""
    out: list[dict[str, Any]] = []
    size = shown = 0
    for a, token in pending[:most]:
        item = [*compact_blocks(a, token, now=now), DividerBlock().to_dict()]
        grown = text_length(item)
        if len(out) + len(item) > max_blocks or size + grown > budget:
            break
        out += item
        size += grown
        shown += 1
    return out, shown


def home_view(pending: Sequence[tuple[ApprovalRecord, str]], recent: Sequence[ApprovalRecord],
              *, now: datetime) -> dict[str, Any]:
    """The App Home tab: the viewer's pending requests with live buttons, then recent ones.

    ``pending`` pairs each request with the viewer's button token, in the order to show.
    """
    top: list[Block | dict[str, Any]] = [header(T.HOME_TITLE)]
    if not pending:
        top.append(section(T.HOME_EMPTY))
    # leave room for: the "more" note, the recent header and two recent sections
    items, shown = _pending_blocks(pending, now=now, most=HOME_MAX_PENDING,
                                   max_blocks=VIEW_BLOCKS_MAX - len(top) - 4,
                                   budget=HOME_TEXT_BUDGET)
    top += items
    if shown < len(pending):
        top.append(context([T.HOME_MORE.format(shown=shown, total=len(pending))]))
    top.append(header(T.HOME_RECENT_TITLE))
    lines = [recent_line(a) for a in recent[:HOME_MAX_RECENT]]
    chunks = coalesce(lines, SECTION_MAX)[:2]
    top += [section(c) for c in chunks] or [context([T.HOME_RECENT_EMPTY])]
    return _view(top, type="home")


def approvals_list_message(pending: Sequence[tuple[ApprovalRecord, str]], *,
                           now: datetime) -> dict[str, Any]:
    """The ephemeral answer to ``/approvals``: ``{"text", "blocks"}`` with live buttons."""
    if not pending:
        return {"text": T.LIST_EMPTY, "blocks": [section(T.LIST_EMPTY).to_dict()]}
    first = section(T.LIST_TITLE.format(n=len(pending))).to_dict()
    items, shown = _pending_blocks(pending, now=now, most=LIST_MAX_PENDING,
                                   max_blocks=MESSAGE_BLOCKS_MAX - 2,
                                   budget=CARD_TEXT_BUDGET - 1000)
    blocks = [first, *items]
    if shown < len(pending):
        blocks.append(context([T.LIST_MORE.format(n=len(pending) - shown)]).to_dict())
    return {"text": T.LIST_FALLBACK.format(n=len(pending)), "blocks": blocks}
