"""A caller's calls gated as external requests: what the MCP gateway and the coding
assistants' hooks share (no MCP, no Slack in this module). It lives in the runtime and goes through
the engine's front door like any face: its verbs, and its documents
(:mod:`runtime.documents`).

A caller face (``mcp-proxy``, ``approvald hook claude-code``) makes each call it is about to
run an external request of :mod:`runtime.runs.external` under approvald's own credential for
that face (``mcp.<name>``, ``hook.<name>``: no bearer token exists for either, and an
operator's token is never taken for one). Its :class:`~runtime.policies.intake.Source` names the
call for the operator's policy (``mcp:<name>/<tool>``, ``hook:<name>/<tool>``), with its
rules on arguments, and a tool the file does not name gets the file's ``[default]``, which
always asks.

Idempotency. A caller's retry of a call carries no id of its own, so the key is derived
from the call itself: ``<face>:<call key>:<n>`` (:meth:`CallerGate.call_key`: the tool and
its arguments, and for a hook the session too: the join key). The first request for a call
is generation 0; generation n+1 is made only once generation n is over. A request answers
the call that waited for it, and is over once that call has its answer:

* still open (pending, escalated): the same call made again joins it (one card, one
  decision), however often it is retried;
* decided without its call running (denied, redirected, expired, cancelled): the first
  call told so has its answer, the approver's reason with it (a call that had given up
  waiting and is made again is that call); a call made after that is asked about again;
* approved: the call that takes the approval (its start recorded, or its result) runs
  it, once; a call made after that is asked about again. An approval nobody collected
  before its request's window closed is not used later: that request is cancelled
  (audited) and the call is asked about again;
* answered by the policy at once (auto, forbidden): nobody waited for it, so it answers
  only the call that made it (an auto call is allowed, and recorded, each time it is
  made); two calls that raced for one auto request each get their own.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from approvald.runtime.engine import Engine
from approvald.runtime.kernel import binding
from approvald.runtime.kernel.canonical import call_digest
from approvald.runtime.kernel.errors import ApprovaldError
from approvald.runtime.kernel.vocabulary import WORDS, OutcomeName
from approvald.runtime.policies.intake import Source
from approvald.runtime.record.state import FINAL_STATUSES
from approvald.runtime.requests.api_tokens import check_name
from approvald.runtime.requests.gate import Where
from approvald.runtime.runs.external import ExternalError, NewRequest, started_at_once
from approvald.store.repos.external import TokenRecord

OPEN = frozenset({"pending", "superseded"})
# told each heartbeat while a call waits for its decision (a progress message)
Waiting = Callable[[dict[str, Any]], Awaitable[None]]
HEARTBEAT = 10.0  # s between "still waiting" signals to the client (and looks at expiry)
CURSORS = 100_000  # calls whose first generation maybe open a face keeps in memory


class CallerOff(ApprovaldError):
    """The face is switched off (its credential revoked, or its kill switch off): it lets
    nothing through. ``token``: the face's credential, to audit the refusal under."""

    def __init__(self, message: str, *, token: TokenRecord | None = None) -> None:
        super().__init__(message)
        self.token = token


@dataclass(frozen=True)
class Refused:
    """The call did not run (or its outcome is unknown): what the client is told."""

    status: str  # forbidden, denied, expired, redirected, cancelled, unknown, ran, off
    message: str
    request_id: str | None = None


def idempotency_key(prefix: str, digest: str, generation: int) -> str:
    return f"{prefix}{digest}:{generation}"


def when(text: str | None) -> str:
    return text or "?"


def refusal(doc: dict[str, Any]) -> Refused:
    """What the client is told about a request that ended without running its call."""
    status, rid = str(doc["status"]), str(doc["id"])
    d = doc.get("decision") or {}
    by, reason = d.get("decided_by") or "?", d.get("reason")
    tool = doc["tool"]
    if status == "forbidden":
        text = f"approvald refused {tool}: {reason or 'forbidden by policy'}"
    elif status == "denied":
        text = f"approvald: {tool} was denied by {by}" + (f": {reason}" if reason else "")
    elif status == "redirected":
        text = f"approvald: {tool} did not run; {by} redirected it: {reason or ''}"
    elif status == "expired":
        text = (f"approvald: {tool} did not run; its approval request expired unanswered "
                f"at {when(doc.get('expires_at'))}")
    elif status == "cancelled":
        text = f"approvald: {tool} did not run; its approval request was cancelled"
        if reason:
            text += f": {reason}"
    else:  # an outcome this face has no sentence for: named as every view names it
        named = WORDS[OutcomeName(doc["outcome"])] if doc.get("outcome") in set(OutcomeName) \
            else WORDS[OutcomeName.UNKNOWN]
        text = f"approvald: {tool} did not run (request {named.words})"
    return Refused(status, f"{text} (request {rid}). Nothing was executed.", rid)


class CallerGate:
    """Requests for one caller face's calls: the credential, the request a call joins or
    makes, waiting for its decision. Subclasses say what a request's packet is
    (:meth:`_new_request`) and what is done with an approved call."""

    # who cancels an approval nobody collected, and who failed to collect it (audit)
    actor = "system:caller"
    client = "client"
    # what the face is called in messages ("the MCP gateway files")
    what = "caller"
    # whether a call whose intent is recorded is over: the MCP gateway runs the call and
    # reports it, so a started call is still its request's; a hook only allows it (the
    # assistant runs it), and the same call made later is asked about again
    started_is_over = False

    def __init__(self, engine: Engine, source: Source, *, requested_by: str,
                 heartbeat: float = HEARTBEAT) -> None:
        self.e = engine
        self.source = source
        self.name = source.name
        self.token_name = check_name(source.credential)
        self.key_prefix = f"{source.kind}:"
        self.requested_by = requested_by
        self.heartbeat = heartbeat
        self.owner = engine.process
        self._cursor: dict[str, int] = {}  # digest -> the first generation maybe open

    # -- the credential -------------------------------------------------------------------
    async def token(self, *, kept: bool = False) -> TokenRecord:
        """The face's credential, made on first use (audited). Revoking it (``approvald
        tokens revoke mcp.NAME``) switches the face off: it raises :class:`CallerOff`.
        No bearer token exists for it (the HTTP API refuses every such name), and an
        operator's token is never taken for it."""
        found = await self.credential(kept=kept)
        why = await self.switched_off(found, kept=kept)
        if why is not None:
            raise CallerOff(why, token=found)
        return found

    async def credential(self, *, kept: bool = False) -> TokenRecord:
        """The face's credential, switched off or not (what came of a call it let through
        before it was switched off is still recorded). ``kept``: for a request, whose
        statements check it again (the one read before, from memory)."""
        return await self.e.caller_credential(self.source, kept=kept)

    async def switched_off(self, found: TokenRecord, *, kept: bool = False) -> str | None:
        """Why the face lets nothing through now (None: it is on)."""
        if found.revoked_at is None:
            return None
        return (f"the {self.what} is switched off: its token {self.token_name} was revoked "
                f"by {found.revoked_by}")

    def running_here(self, rid: str) -> bool:
        """Whether this process is running request ``rid``'s call now."""
        return False

    def _new_request(self, tool: str, args: dict[str, Any], key: str,
                     digest: str | None = None) -> NewRequest:
        """The request for one call under idempotency key ``key``; ``digest``: the
        call's :func:`~runtime.kernel.canonical.call_digest`, when the caller worked it out
        already (its request then carries it: not worked out again)."""
        raise NotImplementedError

    # -- the request a call joins or makes ----------------------------------------------
    async def _request(self, token: TokenRecord, tool: str, args: dict[str, Any], *,
                       key: str | None = None,
                       call: str | None = None) -> tuple[dict[str, Any], bool]:
        """The request this call joins or makes: (its document, whether the call's start
        was recorded with it: :func:`~runtime.runs.external.started_at_once`). ``key``:
        the call's :meth:`call_key` and ``call`` its digest, when the caller worked them
        out already (issue 50: the gateway did, and its arguments were canonicalised and
        digested three times a call)."""
        digest = key if key is not None else self.call_key(tool, args)
        n = self._cursor.get(digest)
        fresh = False  # whether generation n was just seen not to exist
        # a call this process has not seen: most likely never made, so its first
        # generation is tried without a look-up first (a request under that key is found
        # by the insert's conflict all the same); made before (by another process), the
        # first generation that may still be open is searched for then
        probe = n is None
        if n is None:
            n, fresh = 0, True
        while True:
            req = self._new_request(tool, args, idempotency_key(self.key_prefix, digest, n),
                                    call)
            try:
                doc, new = await self.e.open_request(token, req, fresh=fresh)
            except ExternalError as exc:
                # same key, other contents (the tool's description changed meanwhile):
                # still the same call, so join its request
                if exc.code != "idempotency_conflict" or exc.run_id is None:
                    raise
                doc, new = await self.e.request_document(token, exc.run_id), False
            if new or not await self._over(token, doc):
                self._cursor[digest] = n
                while len(self._cursor) > CURSORS:
                    self._cursor.pop(next(iter(self._cursor)))
                return doc, started_at_once(req, doc, new)
            if probe:
                probe = False
                last, fresh = await self._first_open(token, digest)
                if last > n:
                    n = last
                    continue
            n, fresh = n + 1, False

    def call_key(self, tool: str, args: dict[str, Any], call: str | None = None) -> str:
        """What makes two calls the same call (their requests one): here the tool and its
        arguments, whichever client of the gateway makes it. Keyed (a binding: it is
        part of an idempotency key, which traces and questions show). ``call``: their
        :func:`~runtime.kernel.canonical.call_digest`, when worked out already."""
        return binding.shown(call if call is not None else call_digest(tool, args))

    async def _first_open(self, token: TokenRecord, digest: str) -> tuple[int, bool]:
        """The first generation of this call that may still be open: requests are made in
        order, each once the one before is over, so only the last can be open. Galloping
        search for the first free key (a few lookups, however often the call was made).
        With it, whether that generation was seen not to exist yet (the call never made)."""
        async def made(n: int) -> bool:
            key = idempotency_key(self.key_prefix, digest, n)
            return await self.e.documents.request_made(token.id, key)

        if not await made(0):
            return 0, True
        lo, hi = 0, 1
        while await made(hi):
            lo, hi = hi, hi * 2
        while hi - lo > 1:  # made(lo), not made(hi)
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if await made(mid) else (lo, mid)
        return lo, False

    async def _over(self, token: TokenRecord, doc: dict[str, Any]) -> bool:
        """Whether a request no longer stands for a call waiting for its answer (see the
        module docstring)."""
        status = doc["status"]
        if status in OPEN:
            return False
        rid = str(doc["id"])
        if status != "approved":  # it answers the call that waited for it, once
            return doc["approval_id"] is None \
                or await self.e.request_answered(token, rid) is not None
        if doc["result"] is not None or await self._run_status(rid) in FINAL_STATUSES:
            return True
        if self.running_here(rid):
            return False
        if await self.e.documents.request_started(rid):  # running elsewhere, or unknown
            return self.started_is_over
        # an approval nobody collected within its window was closed when its document was
        # read (runtime.kernel.collect: the one window rule), and is over as a cancelled request
        return False

    async def _run_status(self, rid: str) -> str:
        return await self.e.documents.run_status(rid) or "cancelled"

    async def answer(self, token: TokenRecord, doc: dict[str, Any]) -> Refused:
        """What the client is told about request ``doc``, which ended without running its
        call; from now on the request has answered its call, and the same call made again
        is asked about again. (A policy's refusal answers only the call that made it.)"""
        if doc["approval_id"] is not None:
            await self.e.mark_request_answered(token, str(doc["id"]))
        return refusal(doc)

    async def refused(self, token: TokenRecord, tool: str, out: Refused,
                      **details: Any) -> Refused:
        """Audit ``out``, a refusal of the face's own (no decision behind it: the call is
        still waiting at its budget, its start was refused...), and return it."""
        await self.e.refuse_request(token, tool=tool, reason=out.status,
                                    message=out.message, actor=self.actor,
                                    request_id=out.request_id, details=details)
        return out

    # -- waiting for the decision -------------------------------------------------------
    async def _wait(self, token: TokenRecord, doc: dict[str, Any],
                    waiting: Waiting | None, seconds: float | None = None) -> dict[str, Any]:
        """One heartbeat of waiting: the document once decided, or as it stands. A request
        past its expiry is settled here too (expired, or escalated to the next rung) by
        the sweep's own compare-and-set, should no ``serve`` be sweeping."""
        if waiting is not None:
            await waiting(doc)
        expires = doc.get("expires_at")
        if expires is not None and doc["approval_id"] is not None \
                and datetime.fromisoformat(expires) <= self.e.now():
            await self.e.sweep(only=[str(doc["approval_id"])])
        return await self.e.wait_request(token, str(doc["id"]), seconds=min(
            self.heartbeat, self.heartbeat if seconds is None else seconds))

    async def progress(self, doc: dict[str, Any]) -> str:
        """One line about a request waiting for a decision, saying where it can be decided
        now, as the database knows it (this process's settings are not the deployment's:
        a hook runs wherever its assistant does)."""
        approval_id = doc.get("approval_id")
        at = await self.e.where(str(approval_id)) if approval_id else None
        return describe(doc, at)


def describe(doc: dict[str, Any], at: Where | None) -> str:
    """One line about a request waiting for a decision (for progress messages), saying
    where it can be decided (``at``): its card in Slack once posted, the web review queue
    once mailed, and from a terminal always."""
    places = []
    if at is not None and at.card == "posted":
        places.append(f"on its card in Slack (channel {at.channel})")
    if at is not None and at.mailed:
        places.append("in the web review queue (it was mailed to its approvers)")
    aid = at.approval_id if at is not None else "ID"
    places.append(f"from a terminal with `approvald approvals approve {aid} --as U…` (or "
                  f"`approvald approvals deny {aid} --as U… --reason …`)")
    card = "" if at is None else CARD_NOT_POSTED.get(at.card, "")
    return (f"waiting for approval: request {doc['id']}"
            + (f", expires {doc['expires_at']}" if doc.get("expires_at") else "")
            + ". It can be decided " + "; ".join(places) + card)


# what a progress line adds when the request's card is not in Slack
CARD_NOT_POSTED = {
    "queued": ". Its card waits to be posted to Slack by `approvald serve`",
    "given_up": ". Its card could not be posted to Slack (see `approvald outbox list`)",
    "logged": ". It has no card in Slack: the `approvald serve` that took it has no Slack",
}
