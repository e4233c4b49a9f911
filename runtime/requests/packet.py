"""What a request will run, and what may be said about it.

A request's decision packet is written once, when the call is gated: the agent's words
about the call it asked for (``doing``) and the impact of *those* arguments (the tool's
impact hook, or an external caller's text). An approver's edit changes the arguments, not
those words. So the edit's own impact is worked out where the tool is known, when the edit
is recorded (:func:`edited_packet`), and kept in the packet under ``edited_impact``, bound
to the digest of the arguments it describes; and every face reads a request through
:func:`will_run`: the arguments that run, the impact of those, and the request's words
marked as being about the arguments first asked for.

The packet is the natural home for it: it is the request's description, it travels with
the request when an expired one is escalated (the next rung is asked about the arguments
as they stand), and its keys are read defensively, so rows written before this existed
read as "no impact worked out for the edit".
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from approvald.runtime.kernel import binding
from approvald.runtime.kernel.ids import is_external
from approvald.runtime.policies.intake import Source
from approvald.runtime.policies.sensitive import Masking, sensitive_of_snapshot
from approvald.runtime.policies.tools import Tool
from approvald.runtime.record.shown import of_request
from approvald.store.jsontext import loads
from approvald.store.records import ApprovalRecord

EDITED_IMPACT = "edited_impact"  # the packet key: {"digest", "impact", "asked_digest"}
# the packet's words (the requester's, the tool's, the operator's): masked as text derived
# from the call's arguments; its other keys are the runtime's (names, ids, times, risk)
WORDS = ("task", "doing", "code", "evidence", "impact", "why", "description", "reason",
         "reconcile", "not_executed")

Author = Literal["agent", "caller"]


def impact_of(tool: Tool, args: dict[str, Any]) -> str | None:
    """The tool's impact hook on ``args`` (None without a hook); a broken hook must not
    block a request or an edit, so its failure is told instead."""
    if tool.impact is None:
        return None
    try:
        return tool.impact(args)
    except Exception as exc:
        return f"(impact unavailable: {type(exc).__name__})"


def masked_packet(packet: dict[str, Any], masking: Masking) -> dict[str, Any]:
    """``packet`` as it is recorded: its words (:data:`WORDS`) with the call's declared
    values and what the detectors find masked (issue 46: a caller's or a face's words
    may quote the arguments, as the Claude Code hook's quote the command it gates)."""
    out = {k: masking.data(v) if k in WORDS else v for k, v in packet.items()}
    edit = out.get(EDITED_IMPACT)
    if isinstance(edit, dict) and isinstance(edit.get("impact"), str):
        out[EDITED_IMPACT] = {**edit, "impact": masking.text(edit["impact"])}
    return out


def edited_packet(packet: dict[str, Any], *, asked_digest: str, digest: str,
                  impact: str | None) -> dict[str, Any]:
    """``packet`` with the impact of edited arguments (``digest``) recorded beside the
    request's own words, which stay as they were. ``asked_digest``: the digest of the
    arguments those words describe (an earlier edit's record keeps the first one)."""
    earlier = packet.get(EDITED_IMPACT)
    if isinstance(earlier, dict) and isinstance(earlier.get("asked_digest"), str):
        asked_digest = earlier["asked_digest"]
    return {**packet, EDITED_IMPACT: {"digest": digest, "impact": impact,
                                      "asked_digest": asked_digest}}


@dataclass(frozen=True)
class WillRun:
    """A request as every face tells it.

    ``args``: the JSON text of the arguments that run if it is approved. ``edited``: an
    approver changed them (on this request or on the one it escalated from).
    ``impact``: the impact of ``args``, or None when nobody could work it out.
    ``doing``: the requester's own words about the call (``author``: an agent of
    approvald, or an external caller); ``words_current`` False: those words, and
    ``original_impact``, describe the arguments first asked for, not ``args``.
    ``original_impact`` is only set when it is all there is to say about impact (a caller's
    description, or an edit recorded before edits had impacts): shown labelled, never as
    what will happen. ``sensitive``: the argument paths the request's policy masks; the
    words and impacts come with what the detectors find in them masked already.
    ``code``: what the call runs or writes, to be shown verbatim under ``doing`` (a shell
    command, a file's content), as the requester gave it with ``doing``.
    """

    args: str
    edited: bool
    author: Author
    doing: str | None
    words_current: bool
    impact: str | None
    original_impact: str | None
    sensitive: tuple[str, ...] = ()
    code: str | None = None


def sensitive_paths(a: ApprovalRecord) -> tuple[str, ...]:
    """The argument paths ``a``'s stored policy declares sensitive."""
    return sensitive_of_snapshot(a.policy)


def shown_args(a: ApprovalRecord, raw: str | None = None) -> Any:
    """``raw`` (``a``'s arguments that run, by default) as a person may see them: the
    request's sensitive paths and whatever the detectors find, masked."""
    try:
        value = loads(raw if raw is not None else a.edited_args or a.args)
    except (TypeError, ValueError):
        return of_request(a).text(str(raw))
    return of_request(a).args(value)


_DIGESTS = ("digest", "asked_digest")


def shown_packet(a: ApprovalRecord) -> dict[str, Any]:
    """``a``'s decision packet with the call's declared values and what the detectors
    find masked (the task, the agent's words, the evidence drawn from earlier results, the
    impact), and the digests an edit recorded shown as bindings. Packets are recorded
    masked; this masks those recorded before that too."""
    shown = masked_packet(_packet(a), of_request(a))
    edit = shown.get(EDITED_IMPACT)
    if isinstance(edit, dict):  # the digests an edit's impact is about, as bindings
        shown[EDITED_IMPACT] = {k: binding.shown(v) if k in _DIGESTS and isinstance(v, str)
                                else v for k, v in edit.items()}
    return shown


def _text(a: ApprovalRecord, value: Any) -> str | None:
    if value is None or value == "":
        return None
    return of_request(a).text(value if isinstance(value, str) else json.dumps(
        value, ensure_ascii=False, default=str))


def asker(agent: Any) -> str:
    """Who asked, from a run's (or a packet's) ``agent``, as a person reads it: an agent's
    own name, or the face a caller asked through (``Claude Code``, ``MCP gateway bank``,
    ``deploy-bot (HTTP API)``), never the run's ``external:…`` id."""
    if not isinstance(agent, str) or not agent:
        return "agent"
    return Source.of_run(agent).label


def _packet(a: ApprovalRecord) -> dict[str, Any]:
    try:
        value = loads(a.packet or "{}")
    except (TypeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def will_run(a: ApprovalRecord) -> WillRun:
    """What ``a`` runs if approved, the impact of exactly that, and the request's words
    with whether they are about it. Pure: reads the row, nothing else."""
    p = _packet(a)
    edit = p.get(EDITED_IMPACT)
    edit = edit if isinstance(edit, dict) else {}
    effective = a.effective_digest
    asked = edit.get("asked_digest") if isinstance(edit.get("asked_digest"), str) else a.digest
    current = asked == effective  # an edit back to the asked arguments makes them true again
    stated = _text(a, p.get("impact"))
    if current:
        impact = stated
    elif edit.get("digest") == effective:
        impact = _text(a, edit.get("impact"))
    else:  # edited before edits had impacts recorded
        impact = None
    return WillRun(
        args=a.edited_args or a.args, edited=a.edited_args is not None or bool(edit),
        author="caller" if is_external(a.run_id) else "agent", doing=_text(a, p.get("doing")),
        words_current=current, impact=impact,
        original_impact=stated if not current and impact is None else None,
        sensitive=sensitive_paths(a), code=_text(a, p.get("code")))


MAX_CHANGES = 20  # fields an edit's account lists; past this, how many more
MAX_SHOWN = 200  # characters of one value in it


def _leaves(value: Any, at: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    """``value``'s fields by path (objects opened, lists and scalars kept whole; an empty
    object is a field's value, not the arguments')."""
    if isinstance(value, dict) and (value or not at):
        out: dict[tuple[str, ...], Any] = {}
        for k, v in value.items():
            out.update(_leaves(v, (*at, str(k))))
        return out
    return {at: value}


def _at(value: Any, path: tuple[str, ...]) -> Any:
    """What ``value`` holds at ``path``; where a masked value stands for a whole object
    on the way, that value."""
    for key in path:
        if not isinstance(value, dict):
            return value
        value = value.get(key)
    return value


def _shown(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
    return text if len(text) <= MAX_SHOWN else text[:MAX_SHOWN - 1] + "…"


def edit_changes(a: ApprovalRecord, before: Any,
                 after: Any) -> tuple[list[tuple[str, str | None, str | None]], int]:
    """What an edit of ``a`` changed, as a person may see it: (path, value before, value
    after) of each field that differs (None: absent on that side), values masked as
    ``a``'s sensitive paths and the detectors say, at most :data:`MAX_CHANGES` of them;
    and how many more there are. Compared on the real values: a secret replaced by
    another is a change even where both mask alike."""
    masking = Masking.of_call(sensitive_paths(a), before, after) | of_request(a)
    real_before, real_after = _leaves(before), _leaves(after)
    masked_before, masked_after = masking.args(before), masking.args(after)
    changed = [p for p in {**real_before, **real_after}
               if p not in real_before or p not in real_after
               or real_before[p] != real_after[p]]
    listed = [(".".join(p) or "(the arguments)",
               _shown(_at(masked_before, p)) if p in real_before else None,
               _shown(_at(masked_after, p)) if p in real_after else None)
              for p in changed[:MAX_CHANGES]]
    return listed, len(changed) - len(listed)


def card_posted(a: ApprovalRecord) -> dict[str, Any]:
    """Where and when ``a``'s card was posted, as an entry about a decision on it records
    it (its Slack ts is the post's time): what the decider was shown, from when."""
    if not (a.channel and a.message_ts):
        return {}
    try:
        at = datetime.fromtimestamp(float(a.message_ts), UTC).isoformat()
    except (ValueError, OverflowError):
        at = None
    return {"card_posted": {"channel": a.channel, "ts": a.message_ts, "at": at}}
