"""The runtime's front door: start, advance, decide, cancel, recover.

An :class:`Engine` is cheap and holds no run state of its own: any number of engines in
any number of processes can serve the same database. What one process learns (a decision
it recorded, a request it opened) it announces to local listeners so it can act at once;
other processes find the same facts by polling the database.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from approvald.runtime.adapters.gate import ApprovalGate
from approvald.runtime.approvals.batch import BatchVerdict, Target, decide_each
from approvald.runtime.approvals.batch import Outcome as BatchOutcome
from approvald.runtime.approvals.decide import Actor, Decider, Decision, Verdict
from approvald.runtime.approvals.decisions import Decisions
from approvald.runtime.approvals.standing import StandingApprovals
from approvald.runtime.documents import Documents
from approvald.runtime.insights import MIN_REQUESTS, Insights, insights
from approvald.runtime.insights_board import InsightsBoard, OperatorInsights
from approvald.runtime.kernel import prefix
from approvald.runtime.kernel.clock import Clock, SystemClock
from approvald.runtime.kernel.errors import ApprovaldError, ConfigError, NotFound
from approvald.runtime.kernel.handoff import LeasedRuns
from approvald.runtime.kernel.ids import TokenSigner, lease_id, new_id
from approvald.runtime.kernel.limits import DEFAULT_MAX_PAYLOAD, PayloadCap
from approvald.runtime.kernel.metrics import DecidedRuns, Meter
from approvald.runtime.kernel.outcomes import Outcome
from approvald.runtime.kernel.owners import Owners
from approvald.runtime.kernel.periodic import Pace
from approvald.runtime.kernel.signals import Signals
from approvald.runtime.kernel.urgency import Urgency
from approvald.runtime.kernel.vocabulary import OutcomeName, match_of
from approvald.runtime.policies.directory import Directory, StaticDirectory
from approvald.runtime.policies.intake import Intake, Source, Tighten
from approvald.runtime.policies.policy import Channel, PolicyFile
from approvald.runtime.policies.scope import Scope
from approvald.runtime.policies.tools import Tool, ToolIdentity
from approvald.runtime.record import retention, sealing
from approvald.runtime.record.audit import AuditKey, AuditTrail, queue_head
from approvald.runtime.record.audit_check import disagreements_of
from approvald.runtime.record.history import History, read_history
from approvald.runtime.record.ledger import Ledger
from approvald.runtime.record.outbox import WINDOW as OUTBOX_WINDOW
from approvald.runtime.record.outbox import Deliverer, DrainConfig, OutboxDrain
from approvald.runtime.record.outbox import deadline as outbox_deadline
from approvald.runtime.record.review_state import ReviewState
from approvald.runtime.record.sealing import Sealer
from approvald.runtime.record.shown import RunMasking, read_run
from approvald.runtime.record.state import FINAL_STATUSES, RunState, UserMessage
from approvald.runtime.record.switches import Switches
from approvald.runtime.record.tracing import Span, Tracer
from approvald.runtime.record.transcript import build_state, encode
from approvald.runtime.replay import Replay, declared_for, replay
from approvald.runtime.requests import api_tokens
from approvald.runtime.requests.expiry import Expiry, SweepResult
from approvald.runtime.requests.gate import Gate, Where, where
from approvald.runtime.runs.agent import Agent, Registry
from approvald.runtime.runs.deploy_check import DeployReport, deploy_check
from approvald.runtime.runs.external import ExternalError, ExternalRequests, NewRequest, Report
from approvald.runtime.runs.runner import Runner
from approvald.runtime.runs.scheduler import ExpiryScheduler
from approvald.runtime.runs.tool_lookup import ToolLookup
from approvald.runtime.runs.worker import ResumeWorker
from approvald.runtime.threads import RunThreads
from approvald.runtime.trace import Trace, load_trace
from approvald.runtime.views import Views
from approvald.store import sealed
from approvald.store.db import Database
from approvald.store.records import (
    ApprovalRecord,
    OutboxRecord,
    RunRecord,
    VoteRecord,
)
from approvald.store.repos import Tx
from approvald.store.repos.external import SwitchRecord, TokenRecord
from approvald.store.repos.standing import StandingRecord

log = logging.getLogger("approvald.engine")


@dataclass(frozen=True)
class CallResult:
    """A call's recorded outcome, as a person may see it (:meth:`Engine.call_result`)."""

    tool: str
    value: Any  # its result (masked), or ``{"error_class", "error"}``
    status: str  # succeeded or failed
    attempts: int


@dataclass(frozen=True)
class EngineConfig:
    lease_ttl: timedelta = timedelta(seconds=30)
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD
    # who sees the insights in the App Home and on the web queue (APPROVALD_OPERATORS)
    operators: frozenset[str] = frozenset()
    # how the record the insights read is verified (as `audit verify` is)
    audit_old_keys: tuple[AuditKey, ...] = ()
    audit_unkeyed_until: int = 0


@dataclass(frozen=True)
class Parts:
    """What :func:`assemble` built, each part from exactly the collaborators it uses."""

    db: Database
    registry: Registry
    clock: Clock
    config: EngineConfig
    directory: Directory
    signer: TokenSigner | None
    require_tokens: bool
    owners: Owners
    audit: AuditTrail
    cap: PayloadCap
    signals: Signals
    urgency: Urgency
    meter: Meter
    tracer: Tracer
    decided_runs: DecidedRuns
    intake: Intake
    ledger: Ledger
    gate: Gate
    expiry: Expiry
    tool_for: ToolLookup
    decider: Decider
    decisions: Decisions
    standing: StandingApprovals
    external: ExternalRequests
    runner: Runner
    switches: Switches  # the faces' kill switches (approvald hook disable|enable)
    board: InsightsBoard  # the operators' insights (issue 51)


def assemble(db: Database, registry: Registry, *, clock: Clock | None = None,
             config: EngineConfig | None = None, directory: Directory | None = None,
             signer: TokenSigner | None = None, owner: str | None = None,
             require_tokens: bool = False, audit_key: AuditKey | None = None,
             meter: Meter | None = None, tracer: Tracer | None = None,
             urgency: Urgency | None = None) -> Engine:
    """Build the runtime's parts from their collaborators, and the front door over them.

    ``serve``, the sandbox, the evaluator and the tests all build through here, with other
    arguments (a file clock, a Slack directory, a Prometheus meter, an OpenTelemetry
    tracer); nothing is swapped on a built part afterwards.
    """
    clock = clock or SystemClock()
    config = config or EngineConfig()
    directory = directory or StaticDirectory(registry.policy.groups)
    meter = meter or Meter()  # what the process reports about itself (serve exports it)
    tracer = tracer or Tracer()  # spans of steps, calls and decisions (serve may export)
    owners = Owners(db, owner)
    audit = AuditTrail(audit_key)  # chained with a key kept outside the database
    cap = PayloadCap(config.max_payload_bytes)
    signals = Signals()
    urgency = urgency or Urgency()  # decided runs go before background deliveries
    decided_runs = DecidedRuns()  # click -> tool start, measured in-process

    def policy() -> PolicyFile:  # the policy file in force (the registry holds it)
        return registry.policy

    intake = Intake(policy, directory)  # every face's one way in
    ledger = Ledger(db, clock, max_result_bytes=config.max_payload_bytes,
                    lease_ttl=config.lease_ttl, audit=audit)
    gate = Gate(clock, audit, policy)
    expiry = Expiry(db, clock, audit, gate, meter, signals)
    tool_for = ToolLookup(db, registry, intake)
    leased = LeasedRuns()  # a decision's leased run row, handed to the runner
    decider = Decider(db, clock, audit, directory, tool_for, policy, cap, gate, expiry,
                      signals, owner=owners.owner, lease_ttl=config.lease_ttl, signer=signer,
                      require_tokens=require_tokens, traceparent=tracer.traceparent,
                      leased=leased)
    decisions = Decisions(decider, clock, signals, urgency, tracer, meter, decided_runs)
    standing = StandingApprovals(db, clock, audit, directory, gate, decisions, urgency,
                                 signals)
    external = ExternalRequests(db, clock, audit, intake, gate, standing, signals, cap, policy)
    # the request document's webhook and its waiters follow every transition, whichever
    # path made it: an outbox row queued with what it audited (its follow-up runs in the
    # drain, never in the deciding transaction), and a wake-up after commit
    audit.follow(external.follow)
    signals.on_outbox(external.announce)
    runner = Runner(db, clock, audit, registry, intake, gate, standing, ledger, cap, signals,
                    urgency, tracer, meter, decided_runs, owner=owners.owner,
                    lease_ttl=config.lease_ttl, leased=leased)
    keys = [*([audit_key] if audit_key is not None else []), *config.audit_old_keys]

    async def record(window: timedelta) -> History:
        history = await read_history(db, since=clock.now() - window, keys=keys,
                                     unkeyed_until=config.audit_unkeyed_until)
        for problem in history.problems:  # (the CLI prints them; the board logs them)
            log.warning("audit log: %s", problem)
        return history

    def figure(history: History, window: str) -> Insights:
        return insights(history, registry.policy, directory, declared_for(registry),
                        window=window)

    board = InsightsBoard(clock, config.operators, record, figure)
    return Engine(Parts(
        db=db, registry=registry, clock=clock, config=config, directory=directory,
        signer=signer, require_tokens=require_tokens, owners=owners, audit=audit, cap=cap,
        signals=signals, urgency=urgency, meter=meter, tracer=tracer,
        decided_runs=decided_runs, intake=intake, ledger=ledger, gate=gate, expiry=expiry,
        tool_for=tool_for, decider=decider, decisions=decisions, standing=standing,
        external=external, runner=runner, switches=Switches(db, clock, audit), board=board))


class Engine:
    """The front door the faces call: runs started, advanced, cancelled and recovered,
    decisions, requests, standing approvals, and the read models a face draws from
    (:attr:`views`, :attr:`documents`, :attr:`threads`). Built by :func:`assemble`; it
    holds no run state of its own. Its parts are private (issue 47): a face calls a verb
    or reads a view, never ``engine.db`` or ``engine.decider``; the tests' one door to
    them is ``tests.helpers.parts``."""

    def __init__(self, parts: Parts) -> None:
        self._parts = parts
        self._db = parts.db
        self._registry = parts.registry
        self._clock = parts.clock
        self._config = parts.config
        self._directory = parts.directory
        self._signer = parts.signer
        self._owners = parts.owners
        self._owner = parts.owners.owner
        self._audit = parts.audit
        self._signals = parts.signals
        self._live_tokens = api_tokens.LiveTokens(parts.db)
        # kept for requests, whose statements check them again (Checks)
        self._kept_credentials: dict[str, TokenRecord] = {}
        self._kept_on: set[tuple[str, str]] = set()
        # each caller face's calls: the first generation of each that may still be open
        self._call_cursors: dict[str, dict[str, int]] = {}
        self._urgency = parts.urgency
        self._meter = parts.meter
        self._tracer = parts.tracer
        self._gate = parts.gate
        self._expiry = parts.expiry
        self._decider = parts.decider
        self._decisions = parts.decisions
        self._standing = parts.standing
        self._external = parts.external
        self._runner = parts.runner
        self._documents = Documents(parts.db)
        self._views = Views(parts.db, parts.clock, parts.registry, parts.decider,
                            parts.standing, parts.signer)
        self._threads = RunThreads(parts.db, parts.clock, parts.owners)

    # -- the services around the runs, built from the same parts ------------------------
    def worker(self, *, concurrency: int = 8, poll_interval: float = 2.0) -> ResumeWorker:
        """A worker that advances this database's runs that can go on."""
        p = self._parts
        # the runner's drive, not this front door's: the worker does not call back up
        return ResumeWorker(p.db, p.clock, p.owners, p.signals, p.urgency, p.meter,
                            p.runner.advance, lease_ttl=p.config.lease_ttl,
                            concurrency=concurrency, poll_interval=poll_interval)

    def drain(self, deliverer: Deliverer, config: DrainConfig | None = None) -> OutboxDrain:
        """An outbox drain that hands each committed row to ``deliverer``."""
        p = self._parts
        return OutboxDrain(p.db, p.clock, p.owners, p.urgency, deliverer, config,
                           audit=p.audit, own=p.external)  # the runtime's own rows

    @property
    def pace(self) -> Pace:
        """How often this process polls: slower while another replica leads (a face's
        own periodic work, such as a thread follower's, goes at it too)."""
        return self._owners.pace

    def expiry_scheduler(self, *, sweep_interval: timedelta = timedelta(seconds=15)
                         ) -> ExpiryScheduler:
        """The APScheduler jobs that settle each request at its reminder and expiry."""
        p = self._parts
        return ExpiryScheduler(p.db, p.clock, p.expiry, p.signals,
                               sweep_interval=sweep_interval)

    def approval_gate(self, *, name: str,
                      tighten: Tighten | Mapping[str, Any] | None = None) -> ApprovalGate:
        """The gate a framework adapter named ``name`` asks through (see
        :mod:`runtime.adapters`)."""
        p = self._parts
        return ApprovalGate(p.db, p.clock, p.audit, p.external, p.cap, owner=self._owner,
                            name=name, tighten=tighten)

    # -- local notifications (see runtime.kernel.signals) -------------------------------------
    def take_decided(self, fn: Callable[[str, str], None] | None) -> None:
        self._signals.take_decided(fn)

    @property
    def takes_decided(self) -> bool:
        return self._signals.takes_decided

    def on_ready(self, fn: Callable[[str], None]) -> None:
        self._signals.on_ready(fn)

    def on_opened(self, fn: Callable[[str], None]) -> None:
        self._signals.on_opened(fn)

    def on_outbox(self, fn: Callable[[], None]) -> None:
        self._signals.on_outbox(fn)

    def notify_outbox(self) -> None:
        self._signals.notify_outbox()

    def notify_ready(self, run_id: str) -> None:
        self._signals.notify_ready(run_id)

    def notify_opened(self, approval_id: str) -> None:
        self._signals.notify_opened(approval_id)

    async def note_policy(self, *, per_process: bool = False,
                          command: bool = False) -> bool:
        """Record the policy file this process loaded as the one in force, and audit the
        change when it differs from the last one recorded (invariant 18: an auditor can say
        which policy governed each decision). ``per_process``: audit this process's load
        even when the policy is in force already (a long-lived process, ``serve``: each
        one's loads are on record, so two policies are never in force unnoticed).
        ``command``: a short-lived process (a CLI command, a hook call) that opens or
        decides requests: its load is audited whenever its policy is not the one on record
        as in force, every time, and it changes that record only where none was made yet
        (the long-lived processes hold the policy in force; a command run with another file
        acts under it for its own life, on record, without passing it off as theirs). The
        entry holds the policy's text, whose SHA-256 is its digest. True when audited."""
        policy = self._registry.policy
        if not per_process:
            async with self._db.read() as tx:
                if await tx.policy.current() == policy.digest:
                    return False  # the common case: no write at all

        async def write(tx: Tx) -> bool:
            now = self._clock.now()
            if command:
                before = await tx.policy.current()
                if before == policy.digest:
                    return False
                if before is None:
                    await tx.policy.replace(digest=policy.digest,
                                            source=policy.source or "(none)", now=now)
            else:
                before = await tx.policy.replace(digest=policy.digest,
                                                 source=policy.source or "(none)", now=now)
                if before == policy.digest and not per_process:
                    return False
            lifetime = {"lifetime": "command", "in_force": before or policy.digest} \
                if command else {}
            self._audit.record(tx, at=now, action="policy_loaded", actor=f"process:{self._owner}",
                              via="runtime",
                              details={"digest": policy.digest, "previous": before,
                                       "source": policy.source or None,
                                       "tools": sorted(policy.tools), "process": self._owner,
                                       **lifetime, "text": policy.text,
                                       "digest_of": "sha256 of text (UTF-8)"})
            return True

        return await self._db.transact(write, what="the policy in force")

    # -- helpers ----------------------------------------------------------------------
    def check_payload(self, text: str, *, what: str) -> None:
        self._parts.cap.check(text, what=what)

    def button_token(self, a: ApprovalRecord) -> str | None:
        """The token a card showing ``a``'s current arguments carries (None: no signer)."""
        if self._signer is None:
            return None
        return self._signer.token(a.id, a.token_nonce, a.effective_digest)

    async def tool_for(self, a: ApprovalRecord) -> Tool:
        """The tool an approval is about (see :class:`runtime.runs.tool_lookup.ToolLookup`)."""
        return await self._parts.tool_for(a)

    async def resolve_run(self, run_id: str) -> RunRecord:
        """A run by id or unambiguous id prefix (see :func:`runtime.kernel.prefix.resolve`)."""
        async with self._db.read() as tx:
            return await prefix.resolve("run", run_id, tx.runs.get, tx.runs.find,
                                        field="run_id")

    # -- runs ---------------------------------------------------------------------------
    async def start_run(self, agent: str, task: str, *, requested_by: str,
                        claim: str | None = None) -> str:
        """Create a run (status ``running``) with the task as its first message. With
        ``claim`` (a :func:`runtime.kernel.ids.lease_id` of this process) the new run is leased to
        the caller in the same transaction, so no worker's poll claims it before the caller
        advances it with ``advance(run_id, claim=claim)``."""
        a = self._registry.get(agent)
        self.check_payload(task, what="the task")
        run_id = new_id()
        now = self._clock.now()
        async with self._db.write() as tx:
            await tx.runs.create(run_id=run_id, agent=a.name, task=task,
                                 requested_by=requested_by,
                                 instructions_version=a.instructions_version, now=now,
                                 agent_version=a.version)
            nxt = await tx.events.append(run_id, 0, 0, [encode(UserMessage(content=task))])
            await tx.runs.update(run_id, next_seq=nxt)
            if claim is not None:
                await tx.runs.acquire_lease(run_id, owner=claim, now=now,
                                            until=now + self._config.lease_ttl)
        return run_id

    async def advance(self, run_id: str, *, stop: asyncio.Event | None = None,
                      stale_owners: tuple[str, ...] = (), claim: str | None = None) -> Outcome:
        """Drive the run until it completes, fails, pauses, or ``stop`` is set (``claim``:
        the lease id the caller already holds the run under: a worker's poll claimed it,
        see ``RunsRepo.claim_runnable``, or :meth:`start_run` leased it)."""
        return await self._runner.advance(run_id, stop=stop, stale_owners=stale_owners,
                                         claim=claim)

    async def run(self, agent: str, task: str, *, requested_by: str) -> Outcome:
        claim = lease_id(self._owner)  # the run is ours from the start: no poll takes it
        run_id = await self.start_run(agent, task, requested_by=requested_by, claim=claim)
        return await self.advance(run_id, claim=claim)

    async def state(self, run_id: str) -> RunState:
        async with self._db.read() as tx:
            run = await tx.runs.get(run_id)
            if run is None:
                raise NotFound(f"no run {run_id}", run_id=run_id)
            events = await tx.events.load(run_id)
            executions = await tx.executions.for_run(run_id)
        return build_state(run, events, executions)

    async def note(self, action: str, actor: str, via: str, details: dict[str, Any]) -> None:
        """Audit what an operator does to no request in particular: ``revealed`` (about to
        see sensitive values in clear, recorded before they are shown: a reveal that is
        not on record never happens), ``resealed`` (values sealed again under a new data
        key)."""
        async with self._db.write() as tx:
            self._audit.record(tx, at=self._clock.now(), action=action, actor=actor, via=via,
                              details=details)

    async def reseal(self, sealer: Sealer, *, actor: str, via: str,
                     batch: int = sealed.BATCH) -> dict[str, int]:
        """Seal every sensitive value again under ``sealer``'s current key, in batches
        (:func:`runtime.record.sealing.reseal`), and audit who did it (``resealed``: the key, the
        retired keys, how many values each table had rewritten); the counts."""
        counts = await sealing.reseal(self._db, sealer, batch=batch)
        current = sealer.current
        assert current is not None  # reseal refuses without one
        await self.note("resealed", actor, via, {
            "key": current.id, "retired": [k.id for k in sealer.keys[1:]], "tables": counts})
        return counts

    async def cancel(self, run_id: str, *, actor: Actor, reason: str | None = None) -> str:
        """Cancel a run: at once if no worker is mid-step, else at its next step boundary
        (where the worker ends it instead of opening any request). Either way who asked,
        when and why is audited.

        Returns ``cancelled`` or ``cancel_requested``.
        """
        reason = (reason or "").strip() or None
        stale = tuple(await self.stale_owners())

        async def work(tx: Tx) -> str:
            now = self._clock.now()
            run = await tx.runs.get_locked(run_id)  # the one lock order: run first
            if run is None:
                raise NotFound(f"no run {run_id}", run_id=run_id)
            if run.status in FINAL_STATUSES:
                raise ApprovaldError(f"run {run_id} is already {run.status}", run_id=run_id)
            error = f"cancelled by {actor.id}" + (f": {reason}" if reason else "")
            details = {"was": run.status, "step": run.step, "reason": reason}
            if await tx.runs.cancel_if_idle(run_id, now=now, error=error, by=actor.id,
                                            reason=reason, stale_owners=stale):
                await self._gate.cancel_pending(tx, run_id, actor=actor.id, via=actor.via,
                                               reason=reason)
                self._audit.record(tx, at=now, action="cancelled", actor=actor.id,
                                  via=actor.via, run_id=run_id, details=details)
                return "cancelled"
            await tx.runs.request_cancel(run_id, by=actor.id, reason=reason, now=now)
            self._audit.record(tx, at=now, action="cancel_requested", actor=actor.id,
                              via=actor.via, run_id=run_id,
                              details={**details, "worker": run.lease_owner})
            return "cancel_requested"

        result = await self._db.transact(work, what=f"cancel of run {run_id}")
        if result == "cancelled":
            self.notify_outbox()
        return result

    async def stale_owners(self) -> list[str]:
        """Lease and claim holders that ran on this host and whose process is gone."""
        return list(await self._owners.stale())

    async def recover(self, *, limit: int = 1000) -> list[Outcome]:
        """Advance every run left ``running`` without a live worker (expired or dead lease)."""
        stale = tuple(await self.stale_owners())
        async with self._db.read() as tx:
            runs = await tx.runs.runnable(now=self._clock.now(), limit=limit, stale_owners=stale)
        outcomes = []
        for run in runs:
            outcomes.append(await self.advance(run.id, stale_owners=stale))
        return outcomes

    # -- what the faces read and repair (no face opens the database itself) -------------
    async def run_and_approvals(self, run_id: str
                                ) -> tuple[RunRecord | None, list[ApprovalRecord]]:
        """Run ``run_id`` (an exact id; None when there is none) and its requests, read
        together."""
        async with self._db.read() as tx:
            run = await tx.runs.get(run_id)
            approvals = await tx.approvals.for_run(run_id) if run else []
        return run, approvals

    async def recent_runs(self, *, status: str | None = None, limit: int = 50
                          ) -> list[RunRecord]:
        """The newest ``limit`` runs (of ``status``), newest first."""
        async with self._db.read() as tx:
            return await tx.runs.recent(status=status, limit=limit)

    async def run_approvals(self, run_id: str) -> list[ApprovalRecord]:
        """Every request run ``run_id`` made, oldest first."""
        async with self._db.read() as tx:
            return await tx.approvals.for_run(run_id)

    async def run_masking(self, run_id: str) -> RunMasking:
        """What may be shown of run ``run_id``'s calls: each call's declared paths and
        values as the store recorded them, with the detectors (:mod:`runtime.record.shown`)."""
        async with self._db.read() as tx:
            return (await read_run(tx, run_id)).masking()

    async def call_result(self, run_id: str, call_id: str) -> CallResult | None:
        """What call ``call_id`` of run ``run_id`` returned (or its error), masked as
        everywhere a person sees it; None when the store holds no result for it."""
        async with self._db.read() as tx:
            records = await read_run(tx, run_id)
        rec = records.executions.get(call_id)
        if rec is None or rec.status not in ("succeeded", "failed"):
            return None
        value: Any = (rec.result_value() if rec.status == "succeeded"
                      else {"error_class": rec.error_class, "error": rec.error})
        return CallResult(rec.tool, records.masking().call(call_id).data(value), rec.status,
                          rec.attempts)

    async def runs_by_status(self) -> dict[str, int]:
        """How many runs there are of each status."""
        async with self._db.read() as tx:
            return await tx.runs.count_by_status()

    async def trace(self, run_id: str) -> Trace:
        """The timeline of run ``run_id`` (an exact id) as of now."""
        return await load_trace(self._db, run_id, now=self._clock.now())

    async def deploy_check(self) -> DeployReport:
        """What the agents this process loaded could not run of the calls waiting in the
        database (see :mod:`runtime.runs.deploy_check`)."""
        return await deploy_check(self._db, self._registry)

    # -- the record of requests: a policy replayed against it, and insights (issue 51) ----
    async def history(self, *, since: timedelta | None, keys: Sequence[AuditKey] = (),
                      unkeyed_until: int = 0, full: bool = False) -> History:
        """The requests recorded in the last ``since`` (None: the whole record), read
        from the audit chain once it verifies (:class:`runtime.record.history.ChainBroken` if
        not): from its verified-through checkpoint, or (``full``) all of it."""
        start = self._clock.now() - since if since is not None else None
        return await read_history(self._db, since=start, keys=keys,
                                  unkeyed_until=unkeyed_until, full=full)

    async def operator_insights(self, viewer: str) -> OperatorInsights | None:
        """The insights an operator's App Home and web queue show (None: ``viewer`` is not
        one of ``APPROVALD_OPERATORS``; see :mod:`runtime.insights_board`)."""
        return await self._parts.board.for_viewer(viewer)

    def replay_policy(self, history: History, policy: PolicyFile) -> Replay:
        """What ``policy`` would have done to ``history``'s requests (the intake decides
        each again; see :mod:`runtime.replay`). Nothing changes."""
        return replay(history.requests, policy, self._directory, declared_for(self._registry))

    def insights(self, history: History, *, window: str,
                 min_requests: int = MIN_REQUESTS) -> Insights:
        """Figures, shadow records and suggestions for ``history`` under the policy in
        force (see :mod:`runtime.insights`)."""
        return insights(history, self._registry.policy, self._directory,
                        declared_for(self._registry), window=window,
                        min_requests=min_requests)

    async def prune(self, older_than: timedelta, *, dry_run: bool = False
                    ) -> retention.PruneReport:
        """Delete what finished before ``older_than`` ago (see
        :func:`runtime.record.retention.prune`; ``ValueError`` for a horizon too short)."""
        return await retention.prune(self._db, self._clock, older_than, dry_run=dry_run)

    async def prune_expired(self) -> dict[str, int]:
        """Delete the web review queue's rows that expired a day ago (see
        :func:`runtime.record.retention.prune_expired`); how many, by table."""
        return await retention.prune_expired(self._db, self._clock)

    @property
    def audit_key_id(self) -> str | None:
        """The fingerprint of the key new audit entries are chained with (None: unkeyed)."""
        return self._audit.key.id if self._audit.key is not None else None

    def use_audit_key(self, key: AuditKey | None) -> None:
        """Chain new audit entries with ``key`` from now on (a rotation: entries name the
        key they were chained with, so ``audit verify`` needs the old one retired)."""
        self._audit.key = key

    async def oldest_approvals(self, *, outcome: OutcomeName | None = None,
                               run_id: str | None = None,
                               limit: int = 100) -> tuple[list[ApprovalRecord], int]:
        """The ``limit`` oldest requests (whose outcome is ``outcome``, as every view names
        it: :mod:`runtime.kernel.vocabulary`; of ``run_id``), oldest first, and how many there are
        in all."""
        match = None if outcome is None else match_of(outcome)
        async with self._db.read() as tx:
            rows = await tx.approvals.oldest(run_id=run_id, limit=limit, match=match)
            total = (await tx.approvals.count(run_id=run_id, match=match)
                     if len(rows) == limit else len(rows))
        return rows, total

    async def where(self, approval_id: str) -> Where | None:
        """Where request ``approval_id`` can be decided now, as the database knows it
        (None: no such request)."""
        async with self._db.read() as tx:
            a = await tx.approvals.get(approval_id)
            return None if a is None else await where(tx, a)

    # -- the faces' kill switches (runtime.record.switches) --------------------------------------
    async def switch_off(self, face: str, forms: Sequence[str], *, by: str, via: str,
                         reason: str | None = None) -> list[SwitchRecord]:
        """Switch ``forms`` of ``face`` off (audited); the forms now off."""
        return await self._parts.switches.disable(face, forms, by=by, via=via, reason=reason)

    async def switch_on(self, face: str, forms: Sequence[str], *, by: str,
                        via: str) -> list[SwitchRecord]:
        """Switch ``forms`` of ``face`` on again (audited); the switches they were off by."""
        return await self._parts.switches.enable(face, forms, by=by, via=via)

    async def face_switches(self, face: str) -> dict[str, SwitchRecord | None]:
        """Each form of ``face``: the switch it is off by, or None when it is on."""
        return await self._parts.switches.state(face)

    async def switched_off(self, face: str, form: str, *, credential: TokenRecord,
                           kept: bool = False) -> SwitchRecord | None:
        """Why ``form`` of ``face`` lets nothing through now (None: it is on). ``kept``:
        for a request whose statements check the switch again (``Checks.on``), a form
        found on before is taken to be on still, without a read."""
        if kept and (face, form) in self._kept_on:
            return None
        off = await self._parts.switches.off(face, form, credential=credential)
        if off is None:
            self._kept_on.add((face, form))
        else:
            self._kept_on.discard((face, form))
        return off

    def forget_kept(self) -> None:
        """Forget the credentials and switches kept in memory (a request's statement found
        one revoked or off): the next call reads them again."""
        self._kept_on.clear()
        self._kept_credentials.clear()

    async def approval_check(self, approval_id: str) -> list[str]:
        """How request ``approval_id``'s row and votes say otherwise than its audit
        entries (empty: they agree). A view shows it beside the row: a row changed behind
        the chain's back is never shown as if it were the record."""
        async with self._db.read() as tx:
            return await disagreements_of(tx, approval_id)

    async def votes(self, approval_id: str) -> list[VoteRecord]:
        """The votes cast on request ``approval_id`` (an exact id), in order."""
        async with self._db.read() as tx:
            return await tx.approvals.votes(approval_id)

    async def outbox_rows(self, *, statuses: Sequence[str] = (), limit: int = 50
                          ) -> list[tuple[OutboxRecord, datetime | None]]:
        """The newest ``limit`` outbox rows (of ``statuses``), oldest first, each with the
        time a row not yet delivered gives up (worked out as the drain will)."""
        async with self._db.read() as tx:
            rows = await tx.outbox.newest(statuses=statuses, limit=limit)
            return [(r, await outbox_deadline(tx, r) if r.status != "delivered" else None)
                    for r in rows]

    async def outbox_row(self, row_id: int) -> OutboxRecord | None:
        async with self._db.read() as tx:
            return await tx.outbox.get(row_id)

    async def redrive_outbox(self, row_ids: Sequence[int] | None
                             ) -> list[tuple[OutboxRecord, datetime]]:
        """Put outbox rows back to work now (``row_ids``; None: every dead one): a dead row
        with a fresh give-up window, a waiting one tried at once. Each row put back, with
        the time it gives up."""
        now = self._clock.now()
        async with self._db.write() as tx:
            rows = await tx.outbox.redrive(row_ids, now=now, give_up_at=now + OUTBOX_WINDOW)
            return [(r, await outbox_deadline(tx, r)) for r in rows]

    # -- callers' requests (the HTTP API, the MCP gateways, Claude Code's hooks) --------
    def now(self) -> datetime:
        """The time, by the engine's one clock."""
        return self._clock.now()

    @property
    def max_payload_bytes(self) -> int:
        """The largest arguments or result a request may carry (``APPROVALD_MAX_PAYLOAD``)."""
        return self._config.max_payload_bytes

    def policy_file(self) -> PolicyFile:
        """The operator's policy file in force."""
        return self._registry.policy

    async def caller(self, authorization: str, *, to_open: bool = False
                     ) -> TokenRecord | None:
        """The live token an ``Authorization: Bearer …`` header carries, or None.
        ``to_open``: for :meth:`open_request` alone, whose statements check the token is
        still live (:class:`~runtime.requests.api_tokens.LiveTokens`): from memory once found."""
        if to_open:
            return await self._live_tokens.from_header(authorization)
        return await api_tokens.from_header(self._db, authorization)

    def forget_caller(self, token: TokenRecord) -> None:
        """Forget a bearer token kept in memory (a request's statement found it revoked)."""
        self._live_tokens.forget(token)

    async def open_request(self, token: TokenRecord, req: NewRequest, *, fresh: bool = False
                           ) -> tuple[dict[str, Any], bool]:
        """Open a caller's request (or find the one its idempotency key made): (its
        document, whether it is new); see :meth:`runtime.runs.external.ExternalRequests.create`
        (``fresh``: the key was just seen unused)."""
        try:
            return await self._external.create(token, req, fresh=fresh)
        except ExternalError as exc:
            if exc.code == "unauthorized":  # revoked since it was kept in memory
                self._live_tokens.forget(token)
            raise

    async def request_document(self, token: TokenRecord, request_id: str) -> dict[str, Any]:
        """A caller's request as it stands; NotFound unless ``token`` made it."""
        return await self._external.get(token, request_id)

    async def wait_request(self, token: TokenRecord, request_id: str, *, seconds: float,
                           stop: asyncio.Event | None = None) -> dict[str, Any]:
        """The request's document once it is decided, or after ``seconds`` (a long poll)."""
        return await self._external.wait(token, request_id, seconds=seconds, stop=stop)

    async def start_request(self, token: TokenRecord, request_id: str, *, args_digest: str,
                            owner: str, identity: ToolIdentity | None = None) -> None:
        """Record that the caller is about to run its approved call (before the call), on a
        tool of ``identity`` if it says (refused, ``tool_changed``, if the approval bound
        another: :meth:`runtime.runs.external.ExternalRequests.start`)."""
        await self._external.start(token, request_id, args_digest=args_digest, owner=owner,
                                  identity=identity)

    async def report_request(self, token: TokenRecord, request_id: str, rep: Report
                             ) -> tuple[dict[str, Any], bool]:
        """Record what came of the approved call: (the document, whether it is new)."""
        return await self._external.report(token, request_id, rep)

    # -- what the chat faces read and do (issue 47: the Slack face through the front door) --
    @property
    def views(self) -> Views:
        """The read models a face draws from (:mod:`runtime.views`)."""
        return self._views

    @property
    def threads(self) -> RunThreads:
        """The run threads a face tells in chat: its claims and progress
        (:mod:`runtime.threads`)."""
        return self._threads

    @property
    def signs_buttons(self) -> bool:
        """Do cards' buttons carry tokens (a signer from ``APPROVALD_SECRET``)?"""
        return self._signer is not None

    def span(self, name: str, **attributes: Any) -> contextlib.AbstractContextManager[Span]:
        """A tracing span around a face's act (a click: its decision is a child)."""
        return self._tracer.span(name, **attributes)

    async def settle(self, patience: float) -> bool:
        """Defer to decided runs: wait until none is pressing, at most ``patience``
        seconds (background work, such as telling threads, calls this first)."""
        return await self._urgency.settle(patience)

    def note_face_error(self, face: str, method: str, error: str) -> None:
        """Count a face's failed call to its platform (``method``, ``error``) where the
        process reports about itself (a meter's ``<face>_error``, if it counts them)."""
        note = getattr(self._meter, f"{face}_error", None)
        if note is not None:
            note(method, error)

    async def card_posted(self, approval_id: str, *, channel: str, ts: str) -> None:
        """Record where request ``approval_id``'s card was posted (updates go there)."""
        async with self._db.write() as tx:
            await tx.approvals.set_message(approval_id, channel=channel, ts=ts)

    async def preflight(self, approval_id: str, token: str | None,
                        actor: Actor) -> ApprovalRecord:
        """Would a decision by ``actor`` on request ``approval_id`` with the card's
        ``token`` be accepted now? The request if so; raises as :meth:`decide` would
        otherwise (a modal is opened only for a click a decision would accept)."""
        a = await self._decider.get(approval_id)
        self._decider.check_open(a, token)
        await self._decider.authorize(a, actor)
        return a

    async def read_edit(self, approval_id: str, args: Any) -> dict[str, Any]:
        """An approver's edit of request ``approval_id`` as it will run: sensitive values
        given back as shown keep their real value; validated by the tool
        (``InvalidArguments``)."""
        return await self._decider.read_edit(await self._decider.get(approval_id), args)

    # -- approvals ----------------------------------------------------------------------
    async def decide(self, approval_id: str, *, actor: Actor, verdict: Verdict,
                     reason: str | None = None, args: Any = None, token: str | None = None,
                     expect_digest: str | None = None) -> Decision:
        """Record a decision (see :class:`runtime.approvals.decisions.Decisions`)."""
        return await self._decisions.decide(approval_id, actor=actor, verdict=verdict,
                                           reason=reason, args=args, token=token,
                                           expect_digest=expect_digest)

    # -- the verbs and read models of the faces other than Slack's (issue 47) ------------
    @property
    def documents(self) -> Documents:
        """The read models of the HTTP API, the web review queue, the mails and the
        callers' faces (:mod:`runtime.documents`): each one read transaction, frozen."""
        return self._documents

    @property
    def process(self) -> str:
        """This process's name in leases, claims and wake-ups (host and pid)."""
        return self._owner

    def new_claim(self) -> str:
        """A new lease id of this process: a run started under it is ours from the start
        (no poll takes it), until :meth:`advance` is called with it."""
        return lease_id(self._owner)

    @property
    def lease_ttl(self) -> timedelta:
        """How long a lease lives unrenewed (a dead process's runs wait that long)."""
        return self._config.lease_ttl

    def review_state(self) -> ReviewState:
        """The web review queue's own state (links, sessions, refusal counts): the narrow
        part that face is handed instead of the database."""
        p = self._parts
        return ReviewState(p.db, p.clock, p.audit, self.notify_outbox)

    # the agents and the policy in force
    def agent(self, name: str) -> Agent:
        """The current release of agent ``name`` (:class:`ConfigError`-like refusal for an
        unknown one: see :meth:`runtime.runs.agent.Registry.get`)."""
        return self._registry.get(name)

    def agent_releases(self) -> list[Agent]:
        """Every registered release of every agent, current and retired."""
        return self._registry.releases()

    def naming_channel(self, channel: Channel) -> str | None:
        """Where a policy in force names ``channel`` (None: none does)."""
        return self._registry.naming_channel(channel)

    def use_policy(self, policy: PolicyFile, *, check: bool = True) -> None:
        """Put ``policy`` in force in this process for requests not yet made. ``check``:
        refuse (:class:`ConfigError`) a file that names a tool no agent defines, keeping
        the one in force."""
        old = self._registry.policy
        self._registry.use_policy(policy)
        if not check:
            return
        try:
            self._registry.check_policy()
        except ConfigError:
            self._registry.use_policy(old)
            raise

    async def queue_audit_head(self) -> bool:
        """Queue the audit chain's head for the audit channel, unless the last one queued
        is this head already; True when one was queued."""
        return await queue_head(self._db, now=self._clock.now()) is not None

    async def aclose(self) -> None:
        """Close the agents' model clients that hold connections."""
        await self._registry.aclose()

    # requests, decided one by one or in a batch; expiry
    async def approval(self, approval_id: str) -> ApprovalRecord:
        """A request by id or unambiguous id prefix (NotFound otherwise)."""
        return await self._decider.get(approval_id)

    async def may_decide(self, a: ApprovalRecord, actor: Actor) -> None:
        """Raise :class:`DecisionRefused` unless ``actor`` may decide ``a`` (the same check
        as a click: never its requester; its approvers as the request was made)."""
        await self._decider.authorize(a, actor)

    async def decide_each(self, targets: Sequence[Target], *, actor: Actor,
                          verdict: BatchVerdict, reason: str | None = None
                          ) -> list[BatchOutcome]:
        """Decide each target on its own (see :func:`runtime.approvals.batch.decide_each`)."""
        return await decide_each(self._decisions, targets, actor=actor, verdict=verdict,
                                 reason=reason)

    async def sweep(self, *, only: Sequence[str] | None = None) -> SweepResult:
        """Settle every request overdue as of now (or just those in ``only``): expired,
        escalated, reminded (:meth:`runtime.requests.expiry.Expiry.sweep`)."""
        return await self._expiry.sweep(only=only)

    # standing approvals (runtime.approvals.standing)
    async def grant_standing(self, approval_id: str, *, actor: Actor, window: timedelta,
                             scope: Scope, token: str | None = None
                             ) -> tuple[StandingRecord, Decision]:
        """Approve ``approval_id`` and propose a standing approval drawn from it (``token``:
        the card's, checked as a click's)."""
        return await self._standing.grant(approval_id, actor=actor, window=window, scope=scope,
                                         token=token)

    async def standing_grants(self, *, live_only: bool = True) -> list[StandingRecord]:
        return await self._standing.listing(live_only=live_only)

    async def standing_grant(self, standing_id: str) -> StandingRecord:
        """A standing approval by id or unambiguous id prefix."""
        return await self._standing.get(standing_id)

    async def add_standing_grant(self, standing_id: str, *, actor: Actor) -> StandingRecord:
        """A further approver's grant of a proposed standing approval."""
        return await self._standing.add_grant(standing_id, actor=actor)

    async def revoke_standing(self, standing_id: str, *, actor: Actor,
                              reason: str | None = None) -> StandingRecord:
        return await self._standing.revoke(standing_id, actor=actor, reason=reason)

    # callers' requests (runtime.callers, the HTTP API's long polls)
    async def caller_credential(self, source: Source, *, kept: bool = False) -> TokenRecord:
        """The credential a caller face's requests are made under, made on first use.
        ``kept``: for a request, whose statements check that its token is live: the one
        read before, without a read."""
        found = self._kept_credentials.get(source.credential) if kept else None
        if found is None:
            p = self._parts
            found = await api_tokens.own_credential(p.db, p.clock, p.audit, source)
            if found.revoked_at is None:  # a revoked one is read again each time
                self._kept_credentials[source.credential] = found
            else:
                self._kept_credentials.pop(source.credential, None)
        return found

    async def request_answered(self, token: TokenRecord, request_id: str) -> datetime | None:
        return await self._external.answered(token, request_id)

    async def mark_request_answered(self, token: TokenRecord, request_id: str) -> None:
        await self._external.mark_answered(token, request_id)

    async def refuse_request(self, token: TokenRecord, *, tool: str, reason: str,
                             message: str, actor: str, request_id: str | None = None,
                             details: Mapping[str, Any] | None = None) -> None:
        """Audit a call a face refused with no decision behind it."""
        await self._external.refused(token, tool=tool, reason=reason, message=message,
                                    actor=actor, request_id=request_id, details=details)

    async def record_request_report(self, token: TokenRecord, request_id: str,
                                    rep: Report) -> bool:
        """:meth:`report_request` without reading the document back: whether it is new."""
        return await self._external.record_report(token, request_id, rep)

    def call_cursor(self, credential: str) -> dict[str, int]:
        """The calls this process made for caller face ``credential``: the first generation
        of each that may still be open (the face's own memory, kept here so every one of
        its hooks in this process shares it)."""
        return self._call_cursors.setdefault(credential, {})

    def forget_calls(self) -> None:
        """Forget every caller face's calls (as another process would know none of them)."""
        self._call_cursors.clear()

    def on_request_decided(self, fn: Callable[[str], None]) -> None:
        """Call ``fn(request_id)`` after this process committed a request's decision."""
        self._external.on_decided(fn)

    def wake_request(self, request_id: str) -> None:
        """Another process committed something about ``request_id``: its waiters look."""
        self._external.wake(request_id)
