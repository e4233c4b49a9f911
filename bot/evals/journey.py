"""Drive one run of one eval task to its end, simulating the humans, under an interruption.

The driver is stateless: everything it decides it reads from the database (the run's
pending requests, and which of a tool's requests each one is), so a journey a crashed
process left half done is finished by the same code. What it returns is read back from
the database too, never taken from what the model said it did.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from approvald.bot.evals.dataset import Decision, Task
from approvald.runtime import (
    Actor,
    Agent,
    AssistantMessage,
    DecisionRefused,
    DemoLedger,
    Engine,
    ManualClock,
    PolicyFile,
    Registry,
    ToolCall,
    ToolOverride,
    Trace,
    Verdict,
    Waiting,
    assemble,
)
from approvald.store.db import Database
from approvald.store.records import ApprovalRecord, ExecutionRecord

# crash interruptions: a variant ``kill_before_call_N`` / ``kill_after_call_N`` runs the
# advances of its run in a child process (:mod:`bot.evals.child`) armed to SIGKILL
# itself at the N-th tool invocation, before it starts or after it returned (its result
# not yet recorded), until it has; the journey is then finished here, from the database
KILL_POINTS = {"kill_before_call_": "before_call", "kill_after_call_": "before_result"}
# restart_before_decision: every advance runs in a child process armed to SIGKILL itself
# once it has committed a request (before its card is even sent); the decision is made and
# the run resumed here, in another process, as after a redeploy
RESTART_POINT = ("after_commit_before_post", 1)
CHILD_TIMEOUT = 60.0  # s one advance in a child may take


def _start_child(argv: list[str]) -> tuple[BaseProcess, Connection]:
    """A process advancing a run (:func:`bot.evals.child.in_child`), forked from
    multiprocessing's forkserver, which imported the child's module (and so approvald) once
    for the whole evaluation: a cold ``python -m bot.evals.child`` spent most of its second
    of CPU importing. The answer comes back on the connection returned."""
    from approvald.bot.evals import child

    context = multiprocessing.get_context("forkserver")
    # (the main module too: a child would import it again, as its __mp_main__)
    context.set_forkserver_preload(["__main__", "approvald.bot.evals.child"])
    answer, send = context.Pipe(duplex=False)
    proc = context.Process(target=child.in_child, args=(argv, dict(os.environ), send),
                           daemon=True)
    proc.start()
    send.close()
    return proc, answer
REQUESTED_BY = "U0EVALRUN1"  # who starts eval runs (never one of the script's deciders)
OPERATOR = "U0EVALOPS1"  # answers "did this call happen?" from the outside world's records
MAX_ROUNDS = 200  # advance -> decide rounds before a journey is cut off (a looping agent)


@dataclass
class Journey:
    """What one run of a task under one interruption left in the database."""

    task: str
    variant: str
    run_id: str
    status: str = ""
    result: str | None = None
    error: str | None = None
    steps: int = 0
    proposed: list[ToolCall] = field(default_factory=list)  # in transcript order
    executions: list[ExecutionRecord] = field(default_factory=list)  # in call order
    approvals: list[ApprovalRecord] = field(default_factory=list)  # in request order
    side_effects: dict[str, list[str]] = field(default_factory=dict)  # key -> tool per line
    idempotent: set[str] = field(default_factory=set)  # tools a second run of is harmless
    killed: bool = False  # a crash interruption's child process died at its failpoint
    changed: bool = False  # data_changed_while_paused: the outside world did change
    asked: list[str] = field(default_factory=list)  # outcome questions the operator answered
    cost_usd: float | None = None
    latency_ms: float = 0.0
    problems: list[str] = field(default_factory=list)  # what the driver saw go wrong
    trace: Trace | None = None  # the run's timeline, read before its database goes

    def call_order(self, call_id: str) -> int:
        for i, c in enumerate(self.proposed):
            if c.id == call_id:
                return i
        return len(self.proposed)


def decision_for(task: Task, approvals: Sequence[ApprovalRecord],
                 a: ApprovalRecord) -> Decision | None:
    """The scripted decision for request ``a``: the one at the index of its call among the
    run's calls of that tool that asked for approval; past the end, the tool's last one."""
    script = task.decisions_for(a.tool)
    if not script:
        return None
    calls: list[str] = []
    for other in approvals:
        if other.kind == "tool_call" and other.tool == a.tool and other.call_id not in calls:
            calls.append(other.call_id)
    index = calls.index(a.call_id) if a.call_id in calls else len(calls)
    return script[min(index, len(script) - 1)]


class Driver:
    """Runs eval journeys over one database with a clock only the driver moves."""

    def __init__(self, db: Database, agents: Sequence[Agent], *, policy: PolicyFile,
                 clock: ManualClock, ledger_path: str | None, agent_modules: str = "") -> None:
        self.agent_modules = agent_modules  # what a child process imports to have them too
        self.db = db
        self.agents = list(agents)
        self.policy = policy
        self.clock = clock
        self.ledger_path = ledger_path

    def engine(self) -> Engine:
        """A new engine (a new owner, as a restarted process would be) on the database."""
        return assemble(self.db, Registry(self.agents, policy=self.policy), clock=self.clock)

    async def start(self, engine: Engine, agent: str, task: Task) -> str:
        return await engine.start_run(agent, task.task, requested_by=REQUESTED_BY)

    async def run(self, agent: str, task: Task, variant: str) -> Journey:
        """Start ``task`` as a fresh run and drive it to its end under ``variant``."""
        engine = self.engine()
        run_id = await self.start(engine, agent, task)
        journey = Journey(task=task.name, variant=variant, run_id=run_id)
        started = time.perf_counter()
        await self.finish(engine, task, journey)
        journey.latency_ms = (time.perf_counter() - started) * 1000.0
        await self.read_back(engine, journey)
        return journey

    async def finish(self, engine: Engine, task: Task, journey: Journey) -> None:
        """Advance the run and answer its requests as scripted until it ends or is stuck."""
        run_id, variant = journey.run_id, journey.variant
        kill = crash_point(variant)
        restart = variant == "restart_before_decision"
        for _ in range(MAX_ROUNDS):
            if restart and kill is None:
                kill = RESTART_POINT
            if kill is not None:  # the next advance happens in a child, until it is killed
                left = await self.advance_in_child(run_id, *kill, journey)
                if left is None:
                    return
                kill = None if left == 0 else (kill[0], left)
                if left == 0:  # its lease dies with it: time moves on until it has lapsed
                    journey.killed = True
                    self.clock.set(self.clock.now() + engine.lease_ttl
                                   + timedelta(seconds=1))
            outcome = await engine.advance(run_id)
            if outcome.status == "needs_attention":
                if not await self.answer_questions(engine, journey):
                    return
                continue
            if isinstance(outcome, Waiting) and outcome.until is not None:
                if outcome.until > self.clock.now():
                    self.clock.set(outcome.until)
                continue
            if outcome.status != "awaiting_approval":
                return
            approvals = await engine.run_approvals(run_id)
            pending = [a for a in approvals if a.status == "pending" and a.kind == "tool_call"]
            if not pending:
                journey.problems.append(f"the run waits for approval ({outcome.status}) but "
                                        "has no pending tool-call request to answer")
                return
            if variant == "data_changed_while_paused" and not journey.changed:
                if not self.change_data(task, journey):
                    return
            restore: PolicyFile | None = None
            for a in pending:
                decision = decision_for(task, approvals, a)
                if decision is None:
                    journey.problems.append(
                        f"{a.tool} asked for approval ({a.call_id}) but the task scripts no "
                        f"decision for {a.tool}")
                    return
                if restart:
                    engine = self.engine()  # a new owner in this process, which is not the
                    # one that asked: that one died (the driver never lets one live on)
                elif variant.startswith("policy_") and decision.action != "expire":
                    kind = "auto" if variant == "policy_auto_while_paused" else "forbidden"
                    restore = restore or engine.policy_file()
                    engine.use_policy(_override(engine.policy_file(), a.tool, kind),
                                      check=False)
                if not await self.apply(engine, a, decision, journey,
                                        twice=variant == "duplicate_callback"):
                    return
            if restore is not None:
                # the run resumes under the changed policy (the stored request decides),
                # and the change is undone once the decided call has been dealt with
                await engine.advance(run_id)
                engine.use_policy(restore, check=False)
        journey.problems.append(f"the run did not end within {MAX_ROUNDS} rounds of "
                                "advancing and deciding")

    def change_data(self, task: Task, journey: Journey) -> bool:
        """While the run waits, the outside world changes as ``task.changed_data`` says
        (someone else acts on the same data); False if there is no ledger to change."""
        if not self.ledger_path:
            journey.problems.append("data_changed_while_paused needs the demo ledger (the "
                                    "outside world's records) and there is none")
            return False
        world = DemoLedger(self.ledger_path)
        for i, record in enumerate(task.changed_data):
            world.append(record.tool, dict(record.args), at=self.clock.now(),
                         key=f"outside:{journey.run_id}:{i}", scope=journey.run_id)
        journey.changed = True
        return True

    async def answer_questions(self, engine: Engine, journey: Journey) -> bool:
        """A crash left a call's outcome unknown and the run asks a person: answer as an
        operator who checks the outside world would (the demo ledger: the call's
        idempotency key is there if it ran): "it happened" (mark done) or "retry". False
        if there is nothing to answer, or the answer is refused."""
        questions = [a for a in await engine.run_approvals(journey.run_id)
                     if a.status == "pending" and a.kind == "outcome_unknown"]
        if not questions:
            return False
        ran = side_effects(self.ledger_path, journey.run_id)
        for q in questions:
            happened = f"{journey.run_id}:{q.call_id}" in ran
            verdict: Verdict = "mark_done" if happened else "retry"
            try:
                await engine.decide(q.id, actor=Actor(id=OPERATOR, via="eval"),
                                    verdict=verdict,
                                    reason="the provider's records show it" if happened
                                    else None)
            except DecisionRefused as exc:
                journey.problems.append(f"the operator's answer about {q.tool} "
                                        f"({q.call_id}) was refused: {exc}")
                return False
            journey.asked.append(f"{q.tool} ({q.call_id}): {verdict}")
        return True

    async def advance_in_child(self, run_id: str, point: str, nth: int,
                               journey: Journey) -> int | None:
        """Advance the run once in a child process armed to die at the ``nth`` pass of
        ``point``: 0 if it died there, else how many passes are still to go; None (and a
        problem noted) if the child could not do its advance."""
        argv = ["--db", self.db.url.render_as_string(hide_password=False), "--run", run_id,
                "--now", self.clock.now().isoformat(), "--failpoint", f"{point}@{nth}",
                "--policy", self.policy.model_dump_json(), "--agents", self.agent_modules,
                *(("--ledger", self.ledger_path) if self.ledger_path else ())]
        proc, answer = _start_child(argv)
        try:
            await asyncio.to_thread(proc.join, CHILD_TIMEOUT)
            if proc.exitcode is None:
                proc.kill()
                await asyncio.to_thread(proc.join)
                journey.problems.append(f"an advance in a child process took over "
                                        f"{CHILD_TIMEOUT:g} s")
                return None
            if proc.exitcode == -signal.SIGKILL:
                return 0
            said = answer.recv() if answer.poll() else {"error": "no answer"}
        finally:
            answer.close()
            proc.close()
        try:
            hits = int(said["hits"])
        except (ValueError, KeyError, TypeError):
            why = str(said.get("error", said))
            journey.problems.append(f"an advance in a child process failed (exit "
                                    f"{proc.exitcode}): {why[:300]}")
            return None
        return nth - hits  # it passed the point fewer than nth times, or it would be dead

    async def apply(self, engine: Engine, a: ApprovalRecord, d: Decision, journey: Journey,
                    *, twice: bool = False) -> bool:
        """Carry out ``d`` on ``a`` (``twice``: deliver it a second time, which must change
        nothing); False if the journey cannot go on."""
        if d.action == "expire":
            self.clock.set(max(self.clock.now(), a.expires_at + timedelta(seconds=1)))
            await engine.sweep()
            if twice:
                repeat = await engine.sweep()
                if repeat.expired:
                    journey.problems.append(
                        f"a second expiry sweep expired {', '.join(repeat.expired)} again")
            return True
        actor = Actor(id=d.by, via="eval")
        args = {**a.effective_args(), **(d.args or {})} if d.action == "edit" else None
        reason = d.reason if d.action == "deny" else d.guidance if d.action == "redirect" \
            else None
        try:
            decided = await engine.decide(a.id, actor=actor, verdict=d.action, reason=reason,
                                          args=args)
        except DecisionRefused as exc:
            journey.problems.append(f"the scripted {d.action} of {a.tool} ({a.call_id}) was "
                                    f"refused: {exc}")
            return False
        if not decided.final:
            journey.problems.append(
                f"the scripted {d.action} of {a.tool} ({a.call_id}) did not decide the request "
                f"(outcome {decided.outcome}: {decided.approvals} of {decided.quorum} "
                "approvals); the script has one decider")
            return False
        if twice:
            try:
                again = await engine.decide(a.id, actor=actor, verdict=d.action,
                                            reason=reason, args=args)
            except DecisionRefused:
                pass  # one decision per request: the duplicate is refused…
            else:
                if again.repeated:  # …or is its decider's repeat, which changes nothing
                    return True
                journey.problems.append(
                    f"a duplicated {d.action} callback for {a.tool} ({a.call_id}) was "
                    f"accepted (outcome {again.outcome}); only the first may count")
        return True

    async def read_back(self, engine: Engine, journey: Journey) -> None:
        """Fill ``journey`` from the database and the outside world's ledger."""
        state = await engine.state(journey.run_id)
        file = await engine.documents.run_file(journey.run_id)
        run, approvals = file.run, file.approvals
        assert run is not None
        journey.status, journey.result, journey.error = run.status, run.result, run.error
        journey.steps = run.step
        costs: list[float] = []
        for m in state.messages:
            if isinstance(m, AssistantMessage):
                journey.proposed.extend(m.tool_calls)
                if m.meta is not None and m.meta.cost_usd is not None:
                    costs.append(m.meta.cost_usd)
        journey.cost_usd = sum(costs) if costs else None
        journey.executions = sorted(file.executions,
                                    key=lambda e: (journey.call_order(e.call_id), e.call_id))
        journey.approvals = sorted(approvals, key=lambda a: (a.requested_at, a.id))
        journey.side_effects = side_effects(self.ledger_path, journey.run_id)
        journey.idempotent = {t.name for a in self.agents if a.name == run.agent
                              for t in a.tools if t.idempotent}
        journey.trace = await engine.trace(journey.run_id)


def crash_point(variant: str) -> tuple[str, int] | None:
    """``kill_before_call_N`` -> ("before_call", N); None for other variants."""
    for prefix, point in KILL_POINTS.items():
        if variant.startswith(prefix) and variant[len(prefix):].isdigit():
            return point, int(variant[len(prefix):])
    return None


def crash_variants(interruption: str, invocations: int) -> list[str]:
    """``kill_before_calls`` -> one variant per tool invocation of the baseline."""
    prefix = {"kill_before_calls": "kill_before_call_",
              "kill_after_calls": "kill_after_call_"}[interruption]
    return [f"{prefix}{n}" for n in range(1, invocations + 1)]


def _override(policy: PolicyFile, tool: str, kind: str) -> PolicyFile:
    tools = dict(policy.tools)
    base = tools.get(tool, ToolOverride())
    tools[tool] = base.model_copy(update={"policy": kind})
    return policy.model_copy(update={"tools": tools})


def side_effects(ledger_path: str | None, run_id: str) -> dict[str, list[str]]:
    """The demo ledger's lines for ``run_id``: idempotency key -> the tool of each line
    (one line per real invocation, so a key with two lines ran twice)."""
    found: dict[str, list[str]] = {}
    if not ledger_path:
        return found
    try:
        with open(ledger_path, encoding="utf-8") as fh:
            lines = fh.readlines()
    except FileNotFoundError:
        return found
    for line in lines:
        if not line.strip():
            continue
        entry: dict[str, Any] = json.loads(line)
        key = str(entry.get("idempotency_key", ""))
        if key.startswith(run_id + ":"):
            found.setdefault(key, []).append(str(entry.get("tool")))
    return found


