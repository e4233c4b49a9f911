"""The tables against the chain: what the audit log says of each request, replayed entry
by entry, compared with the rows the views show (issue 52).

The approvals, votes and standing approvals tables are what ``approvals show``, ``trace``
and ``runs show`` read; the chain is what the key proves. Someone who can write the
database but not the key can change a row (the decider, the edited arguments, a vote)
without touching the chain: :class:`ChainFacts` replays what the chain says of each
request (its digest, its edits, every vote, its decision and final status), and
:func:`row_disagreements` names every way a row says otherwise. ``audit verify`` runs it
over every row after the chain itself verifies; the views run it for the rows they show.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from approvald.runtime.kernel.binding import short
from approvald.runtime.kernel.canonical import call_digest
from approvald.runtime.record.sealing import DataKeyError, is_sealed
from approvald.store.records import AuditRecord, VoteRecord
from approvald.store.repos import Tx
from approvald.store.types import codec

# the entries that set a request's status, and the status they set
_STATUS = {"approved": "approved", "denied": "denied", "redirected": "redirected",
           "expired": "expired", "cancelled": "cancelled", "superseded": "superseded"}
_RESOLVED = ("outcome_resolved", "cannot_run_resolved")
# a vote's verdict as the votes table stores it, by the entry that records the vote
_VOTE = {"voted": "approve", "approved": "approve", "denied": "deny",
         "redirected": "redirect"}
_NOT_A_VOTE = ("standing", "policy")  # decisions no person's vote made


@dataclass
class Told:
    """What the chain says of one request."""

    tool: str | None = None
    digest: str | None = None  # of the arguments requested
    edits: list[tuple[str | None, str]] = field(default_factory=list)  # (digest, by)
    votes: set[tuple[str, str, str]] = field(default_factory=set)  # (actor, digest, verdict)
    status: str = "pending"
    decided_by: str | None = None
    decided_via: str | None = None
    decided_digest: str | None = None


class ChainFacts:
    """What the chain says of each request, replayed entry by entry."""

    def __init__(self) -> None:
        self.requests: dict[str, Told] = {}

    def apply(self, e: AuditRecord) -> None:
        if not e.approval_id:
            return
        a = e.action
        if a == "requested":
            told = self.requests.setdefault(e.approval_id, Told())
            told.digest = e.digest
            told.tool = _tool(e)
            return
        if a not in _STATUS and a not in _RESOLVED and a not in ("voted", "edited"):
            return
        told = self.requests.setdefault(e.approval_id, Told())
        if a == "edited":
            told.edits.append((e.digest, e.actor))
            return
        if a in _VOTE and e.via not in _NOT_A_VOTE:
            told.votes.add((e.actor, e.digest or "", _VOTE[a]))
        if a == "voted":
            return
        # only a pending request is decided, and only an expiring one superseded (its
        # expiry unaudited as such): an entry about a request already over (a run's
        # cancel after an abort) changes nothing
        if told.status not in (("pending", "expired") if a == "superseded" else ("pending",)):
            return
        if a in _RESOLVED:
            verdict = str(_details(e).get("verdict") or "")
            told.votes.add((e.actor, e.digest or "", verdict))
            told.status = "denied" if verdict == "abort" else "approved"
        else:
            told.status = _STATUS[a]
        # (an escalated request was expired, unaudited as such, then superseded: its
        # expiry's decider is the supersession's; an audited expiry keeps its own)
        if a != "superseded" or told.decided_by is None:
            told.decided_by, told.decided_via, told.decided_digest = e.actor, e.via, e.digest


def _details(e: AuditRecord) -> dict[str, Any]:
    try:
        value = json.loads(e.details)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _tool(e: AuditRecord) -> str | None:
    tool = _details(e).get("tool")
    return tool if isinstance(tool, str) else None


def opened(stored: str | None, column: str) -> tuple[Any, str | None]:
    """(the JSON value of a stored arguments column, or None when it cannot be read here;
    why it cannot be read when that is itself a sign of tampering)."""
    if stored is None:
        return None, None
    text = stored
    if is_sealed(stored):
        c = codec()
        if c is None:
            return None, None  # sealed, and no data key here: compared by digest alone
        try:
            text = c.open(stored, column)
        except DataKeyError as exc:  # no data key here: compared by digest alone
            return None, ("does not open under its data key: it was altered or moved"
                          if exc.failure == "altered" else None)
    try:
        return json.loads(text), None
    except ValueError:
        return None, "is not JSON"


def row_disagreements(row: Mapping[str, Any], votes: Iterable[VoteRecord],
                      told: Told | None) -> list[str]:
    """Each way request ``row`` (and its ``votes``) says otherwise than the chain."""
    aid = row["id"]
    if told is None or told.digest is None:
        return [f"approval {aid}: no request of it is in the audit log"]
    out: list[str] = []

    def say(text: str) -> None:
        out.append(f"approval {aid}: {text}")

    if row["digest"] != told.digest:
        say(f"its digest (binding {short(str(row['digest']))}) is not the one requested "
            f"({short(told.digest)})")
    if told.tool is not None and row["tool"] != told.tool:
        say(f"its tool {row['tool']} is not the one requested ({told.tool})")
    args, why = opened(row.get("args"), "approvals.args")
    if why:
        say(f"its arguments {why}")
    elif args is not None and call_digest(row["tool"], args) != told.digest:
        say("its arguments are not the ones requested (their digest differs from the "
            "requested entry's)")
    last_edit = told.edits[-1] if told.edits else (None, None)
    if row["edited_digest"] != last_edit[0]:
        say(f"edited_digest (binding {short(str(row['edited_digest'] or ''))}) is not the "
            f"last edit the audit log records ({short(str(last_edit[0] or '')) or 'none'})")
    if row["edited_by"] != last_edit[1]:
        say(f"edited_by {row['edited_by']} is not the editor the audit log records "
            f"({last_edit[1]})")
    edited, why = opened(row.get("edited_args"), "approvals.edited_args")
    if why:
        say(f"its edited arguments {why}")
    elif edited is not None and call_digest(row["tool"], edited) != last_edit[0]:
        say("its edited arguments are not the ones the audit log records (their digest "
            f"differs from the edited entry's {short(str(last_edit[0] or ''))})")
    if row["status"] != told.status:
        say(f"status {row['status']} is not the one the audit log records ({told.status})")
    if told.decided_by is not None and row["decided_by"] != told.decided_by:
        say(f"decided_by {row['decided_by']} is not the decider the audit log records "
            f"({told.decided_by})")
    if told.decided_by is None and row["decided_by"] is not None \
            and row["status"] != "pending":
        say(f"decided_by {row['decided_by']}, but no decision of it is in the audit log")
    if told.decided_via is not None and row["decided_via"] is not None \
            and row["decided_via"] != told.decided_via:
        say(f"decided_via {row['decided_via']} is not the one the audit log records "
            f"({told.decided_via})")
    held = {(v.actor, v.digest, v.verdict) for v in votes}
    for actor, digest, verdict in sorted(held - told.votes):
        say(f"a vote by {actor} ({verdict} on {short(digest)}) is not in the audit log")
    for actor, digest, verdict in sorted(told.votes - held):
        say(f"the audit log records a vote by {actor} ({verdict} on {short(digest)}) that "
            "the votes table lacks")
    return out


async def table_disagreements(tx: Tx, facts: ChainFacts, *, batch: int = 500,
                              votes_read: list[VoteRecord] | None = None) -> list[str]:
    """Every row of the approvals, votes and standing approvals tables that says otherwise
    than the chain (``facts``: replayed from all of it). ``votes_read``: every vote
    compared is appended to it (a caller that checks the votes itself reads them once)."""
    out: list[str] = []
    seen: set[str] = set()
    after = ""
    while True:
        rows = await tx.approvals.decided_rows(after=after, batch=batch)
        if not rows:
            break
        votes: dict[str, list[VoteRecord]] = {}
        for v in await tx.approvals.votes_of([r["id"] for r in rows]):
            votes.setdefault(v.approval_id, []).append(v)
            if votes_read is not None:
                votes_read.append(v)
        for r in rows:
            seen.add(r["id"])
            out += row_disagreements(r, votes.get(r["id"], ()), facts.requests.get(r["id"]))
        if len(rows) < batch:  # a short page is the last: no page past the end is asked
            break
        after = rows[-1]["id"]
    for aid in sorted(set(facts.requests) - seen):
        if facts.requests[aid].digest is not None:
            out.append(f"approval {aid}: the audit log records it, but its row is gone")
    return out


async def disagreements_of(tx: Tx, approval_id: str) -> list[str]:
    """How request ``approval_id``'s row and votes disagree with its audit entries (what a
    view says beside the row; the entries themselves are proven by ``audit verify``)."""
    rows = await tx.approvals.decided_rows(only=approval_id)
    if not rows:
        return []
    facts = ChainFacts()
    for e in await tx.audit.query(approval_id=approval_id):
        facts.apply(e)
    return row_disagreements(rows[0], await tx.approvals.votes(approval_id),
                             facts.requests.get(approval_id))

