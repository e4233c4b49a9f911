"""The stable JSON documents the CLI prints with ``--json`` (documented in the README)."""

from __future__ import annotations

from typing import Any

from approvald.runtime import (
    ApprovalPolicy,
    AssistantMessage,
    Masking,
    RunMasking,
    RunState,
    ToolMessage,
    binding,
    deadline,
    outcome_of,
    run_version,
    shown_args,
    shown_packet,
    will_run,
)
from approvald.store.records import ApprovalRecord, RunRecord


def iso(value: Any) -> str | None:
    return None if value is None else value.isoformat()


def approval_document(a: ApprovalRecord) -> dict[str, Any]:
    """A request as the CLI shows it. ``effective_args`` run if it is approved and
    ``impact`` is theirs; the packet's ``doing`` (and ``impact``) are the request's words as
    asked, about other arguments when ``words_about_original`` (after an edit), and then
    ``original_impact`` is the packet's impact when nothing was worked out for the edit.
    Sensitive values (the request's declared paths, and what the detectors find) are
    masked, as on its card; its digests are shown as bindings (``runtime/kernel/binding.py``).
    ``outcome`` is what became of it, named as every view names it
    (``status`` is where it is in its life: a question answered is stored approved or
    denied); ``expires_at`` is null for a question, which has no deadline."""
    w = will_run(a)
    return {
        "id": a.id,
        "run_id": a.run_id,
        "call_id": a.call_id,
        "kind": a.kind,
        "tool": a.tool,
        "args": shown_args(a, a.args),
        "digest": binding.shown(a.digest),
        "edited_args": shown_args(a, a.edited_args) if a.edited_args else None,
        "edited_digest": binding.shown_opt(a.edited_digest),
        "edited_by": a.edited_by,
        "edited_at": iso(a.edited_at),
        "status": a.status,
        "outcome": outcome_of(a).value,
        "rung": a.rung,
        "supersedes": a.supersedes,
        "approvers": a.approvers_value(),
        "quorum": a.quorum,
        "approvals": a.approve_count,
        "requested_by": a.requested_by,
        "requested_at": iso(a.requested_at),
        "expires_at": iso(deadline(a)),
        "decided_at": iso(a.decided_at),
        "decided_by": a.decided_by,
        "decided_via": a.decided_via,
        "verdict": a.verdict,
        "reason": a.reason,
        "packet": shown_packet(a),
        "rule": ApprovalPolicy.from_snapshot(a.policy).rule,
        "effective_args": shown_args(a),
        "impact": w.impact,
        "words_about_original": not w.words_current,
        "original_impact": w.original_impact,
    }


def waiting(r: RunRecord, masking: RunMasking | None = None) -> dict[str, Any] | None:
    """Why a ``running`` run is not being advanced, and until when (None: it is not waiting).

    A wait is a field, not a status: the run is still running, only paused for a rate
    limit, an outage, a backoff after an error or a free slot. Its reason may quote an
    error: masked (by ``masking``, else by the detectors).
    """
    if r.status != "running" or r.wait_until is None:
        return None
    shown = masking.run if masking is not None else Masking()
    return {"until": iso(r.wait_until),
            "reason": shown.text(r.wait_reason) if r.wait_reason else None,
            "failures": r.failures}


def run_summary(r: RunRecord) -> dict[str, Any]:
    return {
        "id": r.id, "agent": r.agent, "status": r.status, "step": r.step,
        "requested_by": r.requested_by, "created_at": iso(r.created_at),
        "updated_at": iso(r.updated_at), "waiting": waiting(r),
    }


def run_document(run: RunRecord, state: RunState, approvals: list[ApprovalRecord],
                 masking: RunMasking) -> dict[str, Any]:
    """A run as ``runs show --json`` prints it: its task, result, error and transcript
    masked by ``masking`` (each call's declared paths and values, and the detectors)."""
    shown = masking.run
    pending = [
        {"approval_id": a.id, "kind": a.kind, "tool": a.tool, "args": shown_args(a),
         "impact": will_run(a).impact,
         "expires_at": iso(deadline(a)),
         "approvers": a.approvers_value()}
        for a in approvals if a.status == "pending"
    ]
    return {
        "id": run.id,
        "agent": run.agent,
        "status": run.status,
        "step": run.step,
        "task": shown.text(run.task),
        "requested_by": run.requested_by,
        "instructions_version": run.instructions_version,
        "agent_version": run_version(run),
        "created_at": iso(run.created_at),
        "updated_at": iso(run.updated_at),
        "result": shown.text(run.result) if run.status == "completed"
        and run.result is not None else None,
        "error": shown.text(run.error) if run.error else None,
        "cancel_requested": run.cancel_requested,
        "cancel_requested_by": run.cancel_requested_by,
        "cancel_reason": run.cancel_reason,
        "waiting": waiting(run, masking),
        "pending": pending,
        "approvals": [{"id": a.id, "tool": a.tool, "status": a.status,
                       "outcome": outcome_of(a).value, "kind": a.kind,
                       "decided_by": a.decided_by,
                       "reason": shown.text(a.reason) if a.reason else None}
                      for a in approvals],
        "transcript": [_message(m, masking) for m in state.messages],
        "schema_version": state.schema_version,
    }


def _message(m: Any, masking: RunMasking) -> dict[str, Any]:
    """A transcript message as shown: a call's arguments under its own declared paths,
    every other word with the run's declared values and the detectors masked."""
    doc: dict[str, Any] = m.model_dump(mode="json")
    if isinstance(m, AssistantMessage):
        calls = doc.pop("tool_calls", [])
        doc = masking.run.data(doc)
        doc["tool_calls"] = [{**c, "arguments": masking.call(c["id"]).args(c["arguments"])}
                             for c in calls]
        return doc
    if isinstance(m, ToolMessage):
        return {**doc, "content": masking.call(m.call_id).data(m.content)}
    shown: dict[str, Any] = masking.run.data(doc)
    return shown
