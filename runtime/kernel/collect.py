"""The one window rule: is an approved call still collectable?

An approval lets its call run only while the request's window is open: a call approved
under a 30-minute window and collected three days later runs on a decision whose context
is gone (the approver judged it for then, not for now). Every path that collects an
approved call asks :func:`collectable` and nothing else: the agent loop resuming a run
(:mod:`runtime.runs.runner`), and every caller-run request (:mod:`runtime.runs.external`: the HTTP
API's poll, start and report, the MCP gateway's retries and its Tasks' ``tasks/get``, the
framework adapters' resume, the coding assistants' hooks joining a request). Past it, the
approved call does not run: an agent's model reads ``{status: expired}`` with the reason,
a caller's request is cancelled (audited, actor :data:`ACTOR`) and the same call made again
is asked about afresh.

The window of an approved call is its request's window: it closes at the ``expires_at``
of the request that approved it (the last rung that decided), the same instant after
which a decision is refused. A call already started (its intent row written) is past
collection: the ledger, not the window, decides what becomes of it.
"""

from __future__ import annotations

from datetime import datetime

from approvald.store.records import ApprovalRecord

ACTOR = "system:collection-window"  # who closes an approval nobody collected in time
REASON = "window_closed"  # the stable code of a call refused for it


def collectable(a: ApprovalRecord | None, now: datetime) -> bool:
    """Whether the call ``a`` approved may still be collected (run, or allowed to run) at
    ``now``. True for anything that is not an approval (``None``: the policy answered at
    once, with nobody's judgement to outlive), and for a request not approved (its own
    status says what happens)."""
    if a is None or a.status != "approved":
        return True
    return now < a.expires_at


def why_not(a: ApprovalRecord) -> str:
    """What a caller, a model and the audit log are told about an approval nobody
    collected in time."""
    decided = f" at {a.decided_at.isoformat()}" if a.decided_at is not None else ""
    return (f"approved{decided}, but not collected before its request's window closed at "
            f"{a.expires_at.isoformat()}: the call did not run; make it again to be asked "
            "afresh")
