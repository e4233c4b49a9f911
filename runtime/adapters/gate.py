"""approvald's half of every framework adapter: ask, read the decision, run once, report.

A framework (LangGraph, Pydantic AI, the OpenAI Agents SDK) runs its own loop and its own
tools; approvald decides and remembers. Each gated call becomes an *external request*
(:mod:`runtime.runs.external`), made in-process under approvald's own credential for the
adapter, so its card, reminders, expiry, escalation, clicks, CLI and audit chain are
those of any request.
The request is made with an idempotency key derived from the framework's own ids, so a
re-run of the step that paused finds the request it made instead of making a second one.

Running an approved call goes through :meth:`ApprovalGate.execute`: the execution
ledger's intent row is committed before the call (``ExternalRequests.start``) and the
result after it (``ExternalRequests.report``), so the audit log holds what ran, a second
resume reuses the recorded result instead of running the call again, and a call cut short
(a crash mid-call) is never re-run blindly: it is *outcome unknown* until a person looks.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from approvald.runtime.kernel import binding
from approvald.runtime.kernel.canonical import call_digest, compact_json, sha256_hex
from approvald.runtime.kernel.clock import Clock
from approvald.runtime.kernel.errors import ApprovaldError, NotFound
from approvald.runtime.kernel.ids import new_id
from approvald.runtime.kernel.limits import PayloadCap
from approvald.runtime.policies.intake import Source, Tighten
from approvald.runtime.record.audit import AuditTrail
from approvald.runtime.requests.api_tokens import check_name, own_credential
from approvald.runtime.runs.external import ExternalError, ExternalRequests, NewRequest, Report
from approvald.store.db import Database
from approvald.store.repos.adapters import AdapterPauseRecord
from approvald.store.repos.external import TokenRecord
from pydantic_core import to_jsonable_python

DECIDED_WAIT = 60.0  # s one long poll holds (the external API's cap)


class CallNotApproved(ApprovaldError):
    """A call was about to run without an approval covering it (a resume that came too
    early, or a forged resume value): nothing ran."""


class CallOutcomeUnknown(ApprovaldError):
    """An earlier attempt at this approved call started and never reported: it may or may
    not have happened, so approvald does not run it again. A person must look."""


class CallFailedBefore(ApprovaldError):
    """The approved call ran once already and failed; its failure is recorded and the call
    is not run again."""


@dataclass(frozen=True)
class Call:
    """One gated tool call as the framework proposed it."""

    call_id: str  # the framework's id of the call (a tool call id)
    tool: str
    args: dict[str, Any]


@dataclass(frozen=True)
class Decision:
    """What approvald decided about one call."""

    call: Call
    request_id: str
    status: str  # approved | denied | redirected | expired | cancelled | forbidden
    effective_args: dict[str, Any]  # what an approval covers (an approver's edit, if any)
    edited: bool
    decided_by: str | None
    reason: str | None

    @property
    def approved(self) -> bool:
        return self.status == "approved"

    def refusal(self) -> dict[str, Any]:
        """The tool result the model reads when the call did not run (as approvald's own
        runs give it: denial and expiry are tool results, not errors)."""
        if self.status == "denied":
            return {"status": "denied", "reason": self.reason or "", "by": self.decided_by}
        if self.status == "redirected":
            return {"status": "redirected", "guidance": self.reason or "",
                    "by": self.decided_by}
        if self.status == "forbidden":
            return {"status": "forbidden", "reason": self.reason or ""}
        return {"status": self.status}

    def refusal_text(self) -> str:
        return json.dumps(self.refusal(), ensure_ascii=False)

    @classmethod
    def of(cls, call: Call, doc: Mapping[str, Any]) -> Decision:
        decision = doc.get("decision") or {}
        return cls(call=call, request_id=str(doc["id"]), status=str(doc["status"]),
                   effective_args=dict(doc["effective_args"]), edited=bool(doc["edited"]),
                   decided_by=decision.get("decided_by"), reason=decision.get("reason"))


@dataclass(frozen=True)
class Executed:
    """An approved call's result: ``reused`` when it had run before (the recorded result,
    as JSON, rather than the tool's own return value)."""

    result: Any
    reused: bool


def jsonable(value: Any) -> Any:
    """``value`` as JSON data (what the store and the audit log keep of a result)."""
    return to_jsonable_python(value, fallback=str)


def call_key(framework: str, pause_key: str, call_id: str) -> str:
    """The idempotency key of one call's request: stable for a re-run of the same step."""
    return f"{framework}:{sha256_hex(pause_key + chr(0) + call_id)[:48]}"


class ApprovalGate:
    """The approvald side a framework adapter talks to (in-process, same database).

    ``name`` names the adapter. Its requests are made under approvald's own credential
    ``adapter.<name>`` (``approvald tokens list`` shows it; revoking it stops the adapter
    from asking), never under an operator's token, and their source is ``adapter:<name>``:
    the operator's policy for a call is the policy file's ``[tools."adapter:NAME/TOOL"]``
    entry (or a glob), else its ``[default]``. ``tighten`` may make every request stricter
    (:class:`runtime.policies.intake.Tighten`), never looser.
    """

    def __init__(self, db: Database, clock: Clock, audit: AuditTrail,
                 external: ExternalRequests, cap: PayloadCap, *, owner: str, name: str,
                 tighten: Tighten | Mapping[str, Any] | None = None) -> None:
        self.db = db
        self.clock = clock
        self.audit = audit
        self.external = external
        self.cap = cap
        self.owner = owner  # this process (the owner of the calls it starts)
        self.name = check_name(name)
        self.source = Source("adapter", self.name)
        self.tighten = tighten if isinstance(tighten, Tighten) or tighten is None \
            else Tighten.model_validate(dict(tighten))
        self._token: TokenRecord | None = None

    # -- the adapter's credential --------------------------------------------------------
    async def token(self) -> TokenRecord:
        """The adapter's credential, made on first use (and audited). Nobody holds a bearer
        value for it: only the hash of one never shown is stored, and the HTTP API refuses
        every ``adapter.`` name. It exists so the adapter's requests are named, listed and
        revocable."""
        if self._token is None:
                self._token = await own_credential(self.db, self.clock, self.audit,
                                               self.source)
        if self._token.revoked_at is not None:
            raise ApprovaldError(f"{self._token.name} was revoked: the adapter asks nothing "
                                 "more")
        return self._token

    async def _live_token(self) -> TokenRecord:
        token = await self.token()
        async with self.db.read() as tx:
            now = await tx.external.token(token.id)
        if now is None or now.revoked_at is not None:
            self._token = now
            raise ApprovaldError(f"{token.name} was revoked: the adapter asks nothing more")
        return token

    # -- requests ------------------------------------------------------------------------
    def _request(self, call: Call, *, key: str, requested_by: str, task: str | None,
                 framework: str) -> NewRequest:
        # the packet is part of a retry's fingerprint: nothing in it may vary between runs
        packet = {"doing": f"{self.name} ({framework}) wants to run {call.tool} "
                           "(it runs the call itself once approved).",
                  "description": f"{call.tool}, a {framework} tool run by {self.name}"}
        if task:
            packet["task"] = task
        return NewRequest(tool=call.tool, args=call.args, requested_by=requested_by,
                          packet=packet, tighten=self.tighten, idempotency_key=key)

    async def ask(self, call: Call, *, key: str, requested_by: str, framework: str,
                  task: str | None = None) -> dict[str, Any]:
        """Open the request for ``call`` (or find the one ``key`` already made): its
        document (see :func:`runtime.runs.external.document`)."""
        token = await self._live_token()
        doc, _ = await self.external.create(
            token, self._request(call, key=key, requested_by=requested_by, task=task,
                                 framework=framework))
        return doc

    async def document(self, request_id: str) -> dict[str, Any]:
        return await self.external.get(await self.token(), request_id)

    async def wait(self, request_ids: Sequence[str], *, seconds: float) -> bool:
        """Wait until every request is decided (True) or ``seconds`` pass (False)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        token = await self.token()
        for request_id in request_ids:
            while True:
                left = deadline - loop.time()
                doc = await self.external.wait(token, request_id,
                                                 seconds=max(0.0, min(left, DECIDED_WAIT)))
                if doc["status"] != "pending":
                    break
                if left <= 0:
                    return False
        return True

    # -- running an approved call once ---------------------------------------------------
    async def execute(self, call: Call, request_id: str,
                      run: Callable[[dict[str, Any]], Awaitable[Any]]) -> Executed:
        """Run the approved call of ``request_id`` with its effective (possibly edited)
        arguments, at most once: intent committed before, result reported after. A call
        that ran before returns its recorded result (or raises :class:`CallFailedBefore`);
        one that started and never reported raises :class:`CallOutcomeUnknown`.

        ``call`` is the call the framework is about to run: the request must be for it
        (its tool, and its arguments as proposed or as approved), so a request id taken
        from anywhere else (a forged or mixed-up resume value) runs nothing."""
        token = await self.token()
        ext = self.external
        doc = await ext.get(token, request_id)
        # (a document shows the arguments by their bindings: runtime/kernel/binding.py)
        if doc["tool"] != call.tool or binding.shown(call_digest(call.tool, call.args)) not in (
                doc["args_digest"], doc["effective_digest"]):
            raise CallNotApproved(
                f"request {request_id} is for {doc['tool']} with other arguments, not for "
                f"this call of {call.tool} ({call.call_id}): nothing ran", run_id=request_id)
        if doc["result"] is not None:
            return _recorded(request_id, doc)
        if doc["status"] != "approved":
            raise CallNotApproved(f"request {request_id} is {doc['status']}: its call does not "
                                  "run", run_id=request_id)
        digest = str(doc["effective_digest"])
        try:
            await ext.start(token, request_id, args_digest=digest, owner=self.owner)
        except ExternalError as exc:
            if exc.code == "already_reported":
                return _recorded(request_id, await ext.get(token, request_id))
            if exc.code == "already_started":
                raise CallOutcomeUnknown(
                    f"request {request_id}: an earlier attempt at {doc['tool']} started and "
                    "never reported, so it may have happened; approvald does not run it again "
                    f"(look it up by idempotency key {request_id}:call)",
                    run_id=request_id) from None
            raise
        try:
            result = await run(dict(doc["effective_args"]))
        except Exception as exc:
            await ext.record_report(token, request_id, Report(
                status="failed", args_digest=digest, error=f"{type(exc).__name__}: {exc}"))
            raise
        await ext.record_report(token, request_id, Report(status="succeeded", args_digest=digest,
                                                   result=jsonable(result)))
        return Executed(result, reused=False)

    # -- pauses --------------------------------------------------------------------------
    async def pause(self, framework: str, key: str, *, requested_by: str, state: Any,
                    calls: Sequence[Call], task: str | None = None) -> AdapterPauseRecord:
        """Record a paused run's state and the calls it waits for (before any request is
        made: state first, request second); the row ``key`` already names, if any."""
        state_text = compact_json(state)
        self.cap.check(state_text, what=f"the {framework} state")
        calls_text = compact_json({"task": task, "calls": [
            {"call_id": c.call_id, "tool": c.tool, "args": c.args} for c in calls]})
        pause_id = new_id()
        async with self.db.write() as tx:
            await tx.adapters.add(id=pause_id, framework=framework, key=key,
                                  requested_by=requested_by, state=state_text,
                                  requests=calls_text, status="paused", outcome=None,
                                  created_at=self.clock.now(), resumed_at=None)
            rec = await tx.adapters.by_key(framework, key)
        assert rec is not None
        return rec

    async def pause_record(self, pause_id: str) -> AdapterPauseRecord:
        async with self.db.read() as tx:
            rec = await tx.adapters.get(pause_id)
        if rec is None:
            raise NotFound(f"no paused run {pause_id}")
        return rec

    async def paused(self, framework: str) -> list[AdapterPauseRecord]:
        async with self.db.read() as tx:
            return await tx.adapters.paused(framework)

    async def finish(self, pause_id: str, outcome: Any) -> AdapterPauseRecord:
        """Record what the resume came to (once); the row as it then stands."""
        async with self.db.write() as tx:
            await tx.adapters.finish(pause_id, outcome=compact_json(outcome),
                                     now=self.clock.now())
            rec = await tx.adapters.get(pause_id)
        assert rec is not None
        return rec


def calls_of(rec: AdapterPauseRecord) -> list[Call]:
    return [Call(call_id=c["call_id"], tool=c["tool"], args=c["args"])
            for c in json.loads(rec.requests)["calls"]]


def task_of(rec: AdapterPauseRecord) -> str | None:
    task: str | None = json.loads(rec.requests)["task"]
    return task


def _recorded(request_id: str, doc: Mapping[str, Any]) -> Executed:
    result = doc["result"]
    if result["status"] == "failed":
        raise CallFailedBefore(f"request {request_id}'s call ran once and failed: "
                               f"{result['error']}", run_id=request_id)
    return Executed(result["result"], reused=True)
