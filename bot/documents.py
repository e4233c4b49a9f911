"""The stable JSON documents the CLI prints with ``--json`` (documented in the README)."""

from __future__ import annotations

from typing import Any

from approvald.runtime.agent import run_version
from approvald.runtime.packet import sensitive_paths, shown_args, shown_packet, will_run
from approvald.runtime.policy import ApprovalPolicy
from approvald.runtime.sensitive import mask_args, mask_text
from approvald.runtime.state import RunState
from approvald.store.records import ApprovalRecord, RunRecord


def iso(value: Any) -> str | None:
    return None if value is None else value.isoformat()


def approval_document(a: ApprovalRecord) -> dict[str, Any]:
    """A request as the CLI shows it. ``effective_args`` run if it is approved and
    ``impact`` is theirs; the packet's ``doing`` (and ``impact``) are the request's words as
    asked, about other arguments when ``words_about_original`` (after an edit), and then
    ``original_impact`` is the packet's impact when nothing was worked out for the edit.
    Sensitive values (the request's declared paths, and what the detectors find) are
    masked, as on its card."""
    w = will_run(a)
    return {
        "id": a.id,
        "run_id": a.run_id,
        "call_id": a.call_id,
        "kind": a.kind,
        "tool": a.tool,
        "args": shown_args(a, a.args),
        "digest": a.digest,
        "edited_args": shown_args(a, a.edited_args) if a.edited_args else None,
        "edited_digest": a.edited_digest,
        "edited_by": a.edited_by,
        "edited_at": iso(a.edited_at),
        "status": a.status,
        "rung": a.rung,
        "supersedes": a.supersedes,
        "approvers": a.approvers_value(),
        "quorum": a.quorum,
        "approvals": a.approve_count,
        "requested_by": a.requested_by,
        "requested_at": iso(a.requested_at),
        "expires_at": iso(a.expires_at),
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


def waiting(r: RunRecord) -> dict[str, Any] | None:
    """Why a ``running`` run is not being advanced, and until when (None: it is not waiting).

    A wait is a field, not a status: the run is still running, only paused for a rate
    limit, an outage, a backoff after an error or a free slot.
    """
    if r.status != "running" or r.wait_until is None:
        return None
    return {"until": iso(r.wait_until), "reason": r.wait_reason, "failures": r.failures}


def run_summary(r: RunRecord) -> dict[str, Any]:
    return {
        "id": r.id, "agent": r.agent, "status": r.status, "step": r.step,
        "requested_by": r.requested_by, "created_at": iso(r.created_at),
        "updated_at": iso(r.updated_at), "waiting": waiting(r),
    }


def run_document(run: RunRecord, state: RunState,
                 approvals: list[ApprovalRecord]) -> dict[str, Any]:
    pending = [
        {"approval_id": a.id, "kind": a.kind, "tool": a.tool, "args": shown_args(a),
         "impact": will_run(a).impact,
         "expires_at": iso(a.expires_at) if a.kind == "tool_call" else None,
         "approvers": a.approvers_value()}
        for a in approvals if a.status == "pending"
    ]
    return {
        "id": run.id,
        "agent": run.agent,
        "status": run.status,
        "step": run.step,
        "task": mask_text(run.task),
        "requested_by": run.requested_by,
        "instructions_version": run.instructions_version,
        "agent_version": run_version(run),
        "created_at": iso(run.created_at),
        "updated_at": iso(run.updated_at),
        "result": mask_text(run.result) if run.status == "completed" and run.result is not None
        else None,
        "error": mask_text(run.error) if run.error else None,
        "cancel_requested": run.cancel_requested,
        "cancel_requested_by": run.cancel_requested_by,
        "cancel_reason": run.cancel_reason,
        "waiting": waiting(run),
        "pending": pending,
        "approvals": [{"id": a.id, "tool": a.tool, "status": a.status, "kind": a.kind,
                       "decided_by": a.decided_by, "reason": a.reason} for a in approvals],
        "transcript": [mask_args(m.model_dump(mode="json"), _call_paths(approvals))
                       for m in state.messages],
        "schema_version": state.schema_version,
    }


def _call_paths(approvals: list[ApprovalRecord]) -> list[str]:
    """Where a transcript message holds a requested call's arguments, its request's
    sensitive paths (``tool_calls.*.arguments.<path>``): masked in ``runs show``."""
    paths = {p for a in approvals for p in sensitive_paths(a)}
    return [f"{where}.{p}" for p in sorted(paths)
            for where in ("tool_calls.*.arguments", "content.arguments")]
