"""What the audit chain says of standing approvals, replayed entry by entry.

A standing approval's row is a convenience for finding it fast; its grants, further
grants and revocation are audit entries that carry everything the row says (subject,
scope, policy digest, window, grants). :class:`StandingState` replays them, so a use can
check the row against them (:meth:`runtime.approvals.standing.StandingApprovals.use`), and ``audit
verify`` can prove from the chain alone that every call a standing approval let run was
covered by a grant recorded before it, not revoked, not expired, within its scope, for
the same subject and under the same policy (:meth:`StandingState.covered`).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from datetime import datetime
from typing import Any

from approvald.runtime.kernel.canonical import value_digest
from approvald.runtime.policies.scope import Scope
from approvald.store.repos.standing import StandingRecord


class StandingState:
    """What the audit chain says of standing approvals: their grants, revocations and
    scope, replayed entry by entry (used at each use, and by ``audit verify``)."""

    def __init__(self) -> None:
        self.granted: dict[str, dict[str, Any]] = {}  # id -> the first grant's details
        self.grants: dict[str, list[str]] = {}
        self.revoked: dict[str, datetime] = {}
        self.uses = 0  # uses found covered (by audit verify)

    def apply(self, action: str, details: Mapping[str, Any], at: datetime, *,
              only: str | None = None) -> None:
        sid = details.get("standing_approval")
        if not isinstance(sid, str) or (only is not None and sid != only):
            return
        if action == "standing_granted":
            if sid not in self.granted and "subject" in details:
                self.granted[sid] = dict(details)
            by = details.get("granted_by")
            if isinstance(by, list):
                self.grants[sid] = [str(x) for x in by]
        elif action == "standing_revoked":
            self.revoked.setdefault(sid, at)

    def disagrees(self, s: StandingRecord, *, unread: Collection[str] = ()) -> str | None:
        """How ``s``'s row says otherwise than its grants and revocation, or None.
        ``unread``: fields not compared (a sealed scope where no data key opens it)."""
        grant = self.granted.get(s.id)
        if grant is None:
            return "no grant of it is in the audit log"
        masked = grant.get("masked") or {}
        if s.id in self.revoked and s.status != "revoked":
            return f"the audit log records its revocation at {self.revoked[s.id].isoformat()}"
        if s.status == "revoked" and s.id not in self.revoked:
            return "it reads revoked, but no revocation of it is in the audit log"
        for field, row in (("subject", s.subject), ("policy_digest", s.policy_digest),
                           ("expires_at", s.expires_at.isoformat()),
                           ("scope_value", None if "scope_value" in unread
                                            else json.loads(s.scope)),
                           ("approvers", s.approvers_value()), ("quorum", s.quorum)):
            if field in unread:
                continue
            if field in masked and isinstance(masked, dict):  # recorded masked: by digest
                if masked[field] != value_digest(row):
                    return f"its {field} is not the one granted"
            elif grant.get(field) != row:
                return f"its {field} is not the one granted"
        if sorted(self.grants.get(s.id, [])) != sorted(s.grants_value()):
            return "its grants are not the ones the audit log records"
        return None

    def covered(self, sid: str, *, at: datetime, subject: str | None, digest: str | None,
                tool: str, args: Mapping[str, Any],
                band: tuple[Any, Any] | None = None,
                call: str | None = None) -> str | None:
        """Why the use of ``sid`` at ``at`` was not covered by its audited grant, or None.
        ``band``: the call's first-rung approvers and quorum, when its entry says them.
        ``call``: the call's digest: an exact scope is judged by it, since the chain holds
        sensitive arguments masked (a fields scope compares them masked alike)."""
        grant = self.granted.get(sid)
        if grant is None:
            return "no grant of it precedes the use"
        if band is not None and (sorted(band[0] or []), band[1]) != (
                sorted(grant.get("approvers") or []), grant.get("quorum")):
            return "it was granted to other approvers or another quorum than the call's"
        if sid in self.revoked and self.revoked[sid] <= at:
            return f"it was revoked at {self.revoked[sid].isoformat()}"
        if at >= datetime.fromisoformat(str(grant.get("expires_at"))):
            return f"its window closed at {grant.get('expires_at')}"
        if len(set(self.grants.get(sid, []))) < int(grant.get("quorum") or 1):
            return "it did not have the grants its quorum needs"
        if subject != grant.get("subject"):
            return f"it covers {grant.get('subject')}, not {subject}"
        if digest != grant.get("policy_digest"):
            return "the call's policy is not the one it was granted under"
        try:
            scope = Scope.model_validate(grant.get("scope_value"))
        except ValueError:
            return "its audited scope cannot be read"
        if not (call == scope.digest if scope.kind == "exact" and call is not None
                else scope.covers(tool, args)):
            return f"the call is outside its scope ({scope.describe()})"
        return None


