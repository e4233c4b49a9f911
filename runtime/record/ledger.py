"""The execution ledger: an approved (or automatic) call runs at most once.

Before a tool runs, an intent row under the call's idempotency key ``(run_id, call_id)``
is committed; after it returns, its result. Re-entering the same call (a resumed run, a
second replica, a double click) finds the row:

* a recorded result is reused, never re-run;
* an intent with no result is *outcome unknown*: an idempotent tool is re-run under the
  same key, a tool's ``reconcile`` hook may decide, and otherwise the caller is told so it
  can ask a human. A non-idempotent tool is never blindly re-run.

"It did not happen" is only believed once the earlier attempt has provably ended: its
process is gone (a dead process on this host, or an attempt this process no longer
runs) or the tool's ``timeout`` has passed since it started (the attempt cancels itself
then). Until then the attempt may still be on its way to the provider, and running the
call again could do it twice: the run waits out the timeout, or a person is asked. A
person's "retry" sanctions exactly the one attempt it was asked about.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from approvald.runtime.kernel import binding
from approvald.runtime.kernel.canonical import compact_json
from approvald.runtime.kernel.clock import Clock
from approvald.runtime.kernel.errors import DigestMismatch, LeaseLost
from approvald.runtime.kernel.failpoints import failpoint
from approvald.runtime.kernel.ids import owner_is_dead, parse_worker_id
from approvald.runtime.kernel.vocabulary import ANSWERED_AT_ONCE, policy_outcome
from approvald.runtime.policies.sensitive import paths_text
from approvald.runtime.policies.tools import Reconciled, Tool, ToolContext
from approvald.runtime.record.audit import AuditTrail, result_excerpt
from approvald.store.db import Database
from approvald.store.jsontext import loads
from approvald.store.records import ExecutionRecord
from approvald.store.repos import Tx
from approvald.store.repos.runs import Settled


@dataclass(frozen=True)
class Recorded:
    """A result as it is being committed (handed to writes that must share its transaction)."""

    run_id: str
    idempotency_key: str
    status: str
    result: str | None
    error: str | None
    latency_ms: float | None
    # the result as the model reads it (``result`` decoded), for an entry that quotes it
    value: Any = None


# extra writes that must land in the same transaction as the result (outbox notices, audit)
AfterResult = Callable[[Tx, Recorded], Awaitable[None]]
# a result's write, run inside a transaction the caller commits
Settle = Callable[[Tx], Awaitable[None]]


# the results whose stored JSON text reads back as the very value (exactly these types)
_SAME_AS_STORED = frozenset({str, int, float, bool, type(None)})
_FOLDED = "ledger.folded"  # tx.scratch: a deferred result its checkpoint's statement wrote


@dataclass(frozen=True)
class Deferred:
    """A deferred result's write (a :data:`Settle`), and ``row``: the intent row's outcome
    it records, which the step's checkpoint may write in its own statement instead
    (:meth:`~store.repos.runs.RunsRepo.checkpoint_with_events`; None: the call had no
    intent, its one row is inserted). After that, :meth:`folded` marks it written, and
    the write then runs only what follows the result in its transaction (its audit
    entry, a notice)."""

    write: Settle
    row: Settled | None

    async def __call__(self, tx: Tx) -> None:
        await self.write(tx)

    def folded(self, tx: Tx) -> None:
        assert self.row is not None
        tx.scratch[f"{_FOLDED}:{self.row.call_id}"] = True


@dataclass(frozen=True)
class Executed:
    """The call has an outcome; ``observation`` is what the model will read.

    ``settle`` is set when the caller deferred the result (``execute(defer=True)``): the
    write that records it, which the caller runs in its next transaction (the step's
    checkpoint). Until that commits the call is as recorded as a call that is still
    running: an intent with no result, or (an idempotent call) nothing at all.
    """

    observation: Any
    reused: bool
    settle: Settle | None = None


@dataclass(frozen=True)
class OutcomeUnknown:
    """The call started in an earlier attempt and nobody knows whether it took effect.

    ``reconcile``: what the tool's reconcile hook said, in words, for the person asked.
    """

    record: ExecutionRecord
    reconcile: str = "the tool has no reconcile hook"


@dataclass(frozen=True)
class WaitForAttempt:
    """An earlier attempt may still be running; it has certainly ended by ``until``."""

    until: datetime
    reason: str


@dataclass(frozen=True)
class _Bare:
    """What the single row of a call that had no intent row records."""

    step: int
    tool: str
    digest: str
    started_at: datetime
    owner: str
    sensitive: str | None


TIMEOUT_MARGIN = timedelta(seconds=5)  # past a tool's timeout, an attempt has surely ended


# attempts this process is running now, by idempotency key: process-wide, since an
# attempt is "this process's" whichever engine in it started the attempt
_RUNNING: set[str] = set()


def needs_intent(tool: Tool, existing: ExecutionRecord | None, *, defer: bool) -> bool:
    """Does :meth:`Ledger.execute` commit an intent (with the step's journal) before it
    runs this call? Not for a fresh call of an idempotent tool whose result is deferred."""
    return not (defer and existing is None and tool.idempotent)


def observation_of(rec: ExecutionRecord) -> Any:
    """What the model reads for a recorded execution."""
    if rec.status == "succeeded":
        return rec.result_value()
    return {"status": "error", "error_class": rec.error_class, "error": rec.error}


class Ledger:
    def __init__(self, db: Database, clock: Clock, *, max_result_bytes: int,
                 lease_ttl: timedelta, audit: AuditTrail | None = None) -> None:
        self.db = db
        self.clock = clock
        self.max_result_bytes = max_result_bytes
        self.lease_ttl = lease_ttl
        self.audit = audit  # a retried attempt is audited (``retried``) with its intent

    def attempt_ended(self, rec: ExecutionRecord, tool: Tool) -> str | None:
        """How we know the attempt recorded in ``rec`` is over, or None if we do not."""
        if rec.owner is not None:
            parsed = parse_worker_id(rec.owner)
            if parsed is not None and parsed == (socket.gethostname(), os.getpid()):
                if rec.idempotency_key not in _RUNNING:
                    return "it was this process's, and it is no longer running here"
                return None
            if owner_is_dead(rec.owner):
                return f"its process ({rec.owner}) is gone"
        if tool.timeout is not None:
            deadline = rec.started_at + timedelta(seconds=tool.timeout) + TIMEOUT_MARGIN
            if self.clock.now() >= deadline:
                return f"its {tool.timeout:g} s timeout has passed"
        return None

    async def execute(
        self,
        *,
        tool: Tool,
        ctx: ToolContext,
        step: int,
        args: dict[str, Any],
        digest: str,
        existing: ExecutionRecord | None,
        owner: str,
        journal: str | None = None,
        after_result: AfterResult | None = None,
        retry_sanctioned: bool = False,
        defer: bool = False,
        sensitive: Sequence[str] = (),
    ) -> Executed | OutcomeUnknown | WaitForAttempt:
        """Run ``tool`` once under ``ctx.idempotency_key`` (or reuse what is recorded).

        ``defer``: do not commit the result; hand its write back in ``Executed.settle`` for
        the caller's next transaction, which must follow at once (the step's checkpoint,
        so a step is one commit fewer). A fresh call of an idempotent tool then needs no
        intent either: if the process dies before the checkpoint, running it again is
        harmless, so the step's only commit is its checkpoint.
        ``sensitive``: the argument paths the call's policy declared, recorded with it.
        """
        attempt = 1
        bare = not needs_intent(tool, existing, defer=defer)  # no intent row at all
        if existing is not None:
            if existing.args_digest != digest:
                raise DigestMismatch(
                    f"call {ctx.call_id} was recorded with different arguments "
                    f"({binding.short(existing.args_digest)} != {binding.short(digest)}); "
                    "refusing to run it",
                    run_id=ctx.run_id,
                )
            if existing.status in ("succeeded", "failed"):
                return Executed(observation_of(existing), reused=True)
            # started or unknown: the earlier attempt may or may not have taken effect
            if retry_sanctioned:
                why = "a person checked that it did not take effect and chose Retry"
            elif tool.idempotent:
                why = "the tool is idempotent, so running it again under its key is harmless"
            else:
                decided = await self._settle_unknown(tool, ctx, args, existing, owner,
                                                     after_result)
                if not isinstance(decided, str):
                    return decided
                why = decided  # it provably did not happen: run it again under the same key
            attempt = existing.attempts + 1
            async with self.db.write() as tx:
                await self._check_lease(tx, ctx.run_id, owner, journal)
                if not await tx.executions.retry_intent(
                        run_id=ctx.run_id, call_id=ctx.call_id, now=self.clock.now(),
                        owner=owner, attempts=existing.attempts):
                    raise LeaseLost(f"call {ctx.call_id} was retried by someone else",
                                    run_id=ctx.run_id)
                if self.audit is not None:
                    self.audit.record(
                        tx, at=self.clock.now(), action="retried", actor="system:runtime",
                        via="runtime", run_id=ctx.run_id, digest=digest,
                        details={"tool": tool.name, "call_id": ctx.call_id,
                                 "idempotency_key": ctx.idempotency_key,
                                 "attempt": attempt, "why": why,
                                 "once": not tool.idempotent or retry_sanctioned},
                        sensitive=sensitive)
        elif not bare:
            now = self.clock.now()
            # one statement where the database can (issue 50): the lease renewed if it is
            # still ours, the intent written only then, committed before the call starts.
            # The step's model reply is journaled with its first side effect, so a
            # retried step replays these exact calls instead of asking the model again
            async with self.db.write_one() as tx:
                fresh = await tx.executions.intent_under_lease(
                    run_id=ctx.run_id, call_id=ctx.call_id, step=step, tool=tool.name,
                    digest=digest, now=now, owner=owner, until=now + self.lease_ttl,
                    journal=journal, sensitive=paths_text(sensitive))
            if fresh is None:
                raise LeaseLost(f"lost the lease on run {ctx.run_id}", run_id=ctx.run_id)
            if not fresh:  # somebody else recorded it between our read and our write
                async with self.db.read() as tx:
                    again = await tx.executions.get(ctx.run_id, ctx.call_id)
                return await self.execute(tool=tool, ctx=ctx, step=step, args=args,
                                          digest=digest, existing=again, owner=owner,
                                          after_result=after_result, defer=defer,
                                          sensitive=sensitive)
        if not bare:
            failpoint("after_intent")

        run_ctx = ToolContext(**{**ctx.__dict__, "attempt": attempt})
        started_at = self.clock.now()
        failpoint("before_call")
        t0 = time.perf_counter()
        error: BaseException | None = None
        result: Any = None
        _RUNNING.add(ctx.idempotency_key)
        try:
            if tool.timeout is None:  # (no Timeout to make and enter for it)
                result = await tool.invoke(run_ctx, args)
            else:
                async with asyncio.timeout(tool.timeout):
                    result = await tool.invoke(run_ctx, args)
        except TimeoutError as exc:
            error = exc
        except Exception as exc:  # a tool failure is an observation, not a crash
            error = exc
        finally:
            _RUNNING.discard(ctx.idempotency_key)
        # (to the microsecond, as a model step's: the digits beyond are noise, and a
        # number with as many as a card's would have the detectors look at every entry's
        # details again, string by string, for nothing)
        latency = round((time.perf_counter() - t0) * 1000.0, 3)
        failpoint("before_result")
        if isinstance(error, TimeoutError) and tool.timeout is not None:
            return await self._timed_out(tool, ctx, args, owner, after_result, latency)
        if not defer:
            return await self._record(ctx, tool, result, error, latency, after_result)
        insert = None
        if bare:
            insert = _Bare(step=step, tool=tool.name, digest=digest, started_at=started_at,
                           owner=owner, sensitive=paths_text(sensitive))
        write, executed = self._result(ctx, tool, result, error, latency, after_result, insert)
        return Executed(executed.observation, executed.reused, write)

    async def _reconcile(self, tool: Tool, ctx: ToolContext,
                         args: dict[str, Any]) -> tuple[Reconciled | None, str]:
        """Ask the tool's reconcile hook; a hook that raises knows nothing (unknown)."""
        if tool.reconcile is None:
            return None, "the tool has no reconcile hook"
        try:
            verdict = await tool.reconcile(ctx, args)
        except Exception as exc:
            return None, f"its reconcile hook raised {type(exc).__name__}: {str(exc)[:300]}"
        if verdict is None:
            return None, "its reconcile hook could not tell"
        return verdict, ("its reconcile hook says it happened" if verdict.happened
                         else "its reconcile hook says it did not happen")

    async def _settle_unknown(self, tool: Tool, ctx: ToolContext, args: dict[str, Any],
                              existing: ExecutionRecord, owner: str,
                              after_result: AfterResult | None,
                              ) -> Executed | OutcomeUnknown | WaitForAttempt | str:
        """An attempt with no result: record it, ask for a person, wait, or run it again
        because it provably did not take effect (then: why it did not, in words)."""
        verdict, said = await self._reconcile(tool, ctx, args)
        if verdict is not None and verdict.happened:
            return await self._record(ctx, tool, verdict.result, None, 0.0, after_result)
        if verdict is None:
            return OutcomeUnknown(existing, said)
        ended = self.attempt_ended(existing, tool)
        if ended is not None:
            return f"{said} and attempt {existing.attempts} has ended ({ended})"
        # "not happened" while the attempt may still be running is not an answer yet
        heard = (existing.heard_at or existing.started_at).isoformat()
        if tool.timeout is not None:
            until = existing.started_at + timedelta(seconds=tool.timeout) + TIMEOUT_MARGIN
            return WaitForAttempt(until, f"attempt {existing.attempts} of {tool.name} "
                                         f"(last heard from {heard}) may still be running; "
                                         f"its timeout ends by {until.isoformat()}")
        return OutcomeUnknown(existing, f"{said}, but attempt {existing.attempts} (by "
                                        f"{existing.owner or 'an unknown worker'}, last heard "
                                        f"from {heard}) may still be running")

    async def _timed_out(self, tool: Tool, ctx: ToolContext, args: dict[str, Any], owner: str,
                         after_result: AfterResult | None,
                         latency: float) -> Executed | OutcomeUnknown:
        """The call was cancelled at its timeout: did it take effect before that?"""
        verdict, said = await self._reconcile(tool, ctx, args)
        if verdict is not None and verdict.happened:
            return await self._record(ctx, tool, verdict.result, None, latency, after_result)
        if verdict is not None or tool.idempotent:  # it did not (or running it is harmless)
            err = TimeoutError(f"{tool.name} was cancelled after {tool.timeout:g} s ({said})")
            return await self._record(ctx, tool, None, err, latency, after_result)
        async with self.db.read() as tx:
            rec = await tx.executions.get(ctx.run_id, ctx.call_id)
        assert rec is not None
        return OutcomeUnknown(rec, f"it was cancelled after its {tool.timeout:g} s timeout "
                                   f"and {said}")

    async def _record(self, ctx: ToolContext, tool: Tool, result: Any,
                      error: BaseException | None, latency_ms: float,
                      after_result: AfterResult | None) -> Executed:
        write, executed = self._result(ctx, tool, result, error, latency_ms, after_result)
        # the call has run: a connection lost before COMMIT must not turn its outcome
        # into an unknown one, so the write is retried (it is a compare-and-set)
        await self.db.transact(write, what=f"result of {ctx.idempotency_key}")
        failpoint("after_result")
        return executed

    def _result(self, ctx: ToolContext, tool: Tool, result: Any, error: BaseException | None,
                latency_ms: float, after_result: AfterResult | None,
                bare: _Bare | None = None) -> tuple[Settle, Executed]:
        """The write recording a call's outcome (a compare-and-set on its intent, or the
        insert of a ``bare`` call's only row), and what the model will read."""
        status, text, err_class, err_text = "succeeded", None, None, None
        if isinstance(error, TimeoutError):
            err_class, err_text = "ToolTimeout", str(error)[:4000]
        elif error is None:
            try:
                text = compact_json(result)
                # UTF-8 is what the database stores: a lone surrogate (json.dumps takes
                # "\ud800") cannot be encoded, so the result is not storable text
                size = len(text.encode())
            except (TypeError, ValueError) as exc:  # UnicodeEncodeError is a ValueError
                error, text = exc, None
                err_class, err_text = "UnserializableResult", f"tool result is not JSON: {exc}"
            else:
                if size > self.max_result_bytes:
                    err_class = "PayloadTooLarge"
                    err_text = (f"tool result of {size} bytes exceeds the "
                                f"{self.max_result_bytes}-byte cap")
                    text = None
        elif err_class is None:
            err_class, err_text = type(error).__name__, str(error)[:4000]
        if err_class is not None:
            status = "failed"

        # what the model reads is the result as stored; a string, a number or null reads
        # back as itself (not decoded again: issue 50), and is what its audit entry quotes
        seen = None
        if status == "succeeded":
            seen = result if type(result) in _SAME_AS_STORED else (
                None if text is None else loads(text))

        async def write(tx: Tx) -> None:
            now = self.clock.now()
            if bare is None and tx.scratch.pop(f"{_FOLDED}:{ctx.call_id}", None) is not None:
                recorded = True  # written by the checkpoint's statement (Deferred.row)
            elif bare is not None:
                recorded = await tx.executions.record_done(
                    run_id=ctx.run_id, call_id=ctx.call_id, step=bare.step, tool=bare.tool,
                    digest=bare.digest, started_at=bare.started_at, now=now,
                    owner=bare.owner, status=status, result=text, error_class=err_class,
                    error=err_text, latency_ms=latency_ms, sensitive=bare.sensitive)
            else:
                recorded = await tx.executions.record_result(
                    run_id=ctx.run_id, call_id=ctx.call_id, status=status, result=text,
                    error_class=err_class, error=err_text, now=now, latency_ms=latency_ms)
            if not recorded:
                raise LeaseLost(
                    f"call {ctx.call_id} was settled by someone else while it ran",
                    run_id=ctx.run_id,
                )
            if after_result is not None:
                await after_result(tx, Recorded(
                    run_id=ctx.run_id, idempotency_key=ctx.idempotency_key, status=status,
                    result=text, error=err_text, latency_ms=latency_ms, value=seen))

        settle = Deferred(write, None if bare is not None else Settled(
            call_id=ctx.call_id, status=status, result=text, error_class=err_class,
            error=err_text, latency_ms=latency_ms))
        if status == "succeeded":
            return settle, Executed(seen, reused=False)
        return settle, Executed({"status": "error", "error_class": err_class,
                                 "error": err_text}, reused=False)

    async def _check_lease(self, tx: Tx, run_id: str, owner: str,
                           journal: str | None = None) -> None:
        """Renew our lease as part of the intent write; a lost lease stops the write."""
        now = self.clock.now()
        if not await tx.runs.renew_lease(run_id, owner=owner, now=now,
                                         until=now + self.lease_ttl, journal=journal):
            raise LeaseLost(f"lost the lease on run {run_id}", run_id=run_id)


# the outcome word of each policy that answers at once (the vocabulary's, looked up once)
_OUTCOME_WORD = {kind: policy_outcome(kind).value for kind in ANSWERED_AT_ONCE}


def audit_execution(trail: AuditTrail, tx: Tx, *, at: Any, approval_id: str | None,
                    rec: Recorded, tool: str, digest: str, args: dict[str, Any],
                    policy: str, sensitive: Sequence[str],
                    noted: Mapping[str, Any] | None = None) -> None:
    """Audit entry for a call's execution, asked about or not (``approval_id`` None: the
    policy ran it without asking; ``policy`` says how): the exact arguments that ran
    (beside the proposed and edited ones in earlier entries) and what came of them,
    recorded masked under the call's declared paths, ``sensitive``; ``noted``: more of
    the call's record (what shadow rules would have decided)."""
    trail.record(
        tx, at=at, action="executed", actor="system:runtime", via="runtime",
        run_id=rec.run_id, approval_id=approval_id, digest=digest,
        details={"tool": tool, "args": args, "status": rec.status, "answer": policy,
                 "idempotency_key": rec.idempotency_key,
                 "result": result_excerpt(rec.result, rec.value),
                 "error": rec.error, "latency_ms": rec.latency_ms,
                 # a call nobody was asked about: its outcome is the policy's answer (a
                 # request's outcome is on the entry that decided it)
                 **({"outcome": _OUTCOME_WORD[policy]}
                    if approval_id is None and policy in _OUTCOME_WORD else {}),
                 **(noted or {})},
        sensitive=sensitive,
    )
