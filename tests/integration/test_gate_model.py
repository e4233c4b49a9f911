"""A model-based test of the gate: random interleavings, invariants after every step.

Hypothesis drives one database (SQLite or PostgreSQL) through random sequences of: runs
opened under random policies (quorum, approver lists and groups, ttl, escalate or
cancel, ``edits``), approve / deny / edit / redirect / answer by random actors (approvers,
group members, the requester, strangers) with fresh, stale, forged and no tokens, policy-file
changes (relaxed to ``auto`` or tightened to ``forbidden``), standing approvals granted,
granted again, revoked and outlived, clock moves and sweeps,
resumes and recoveries, cancels, crashes at the durability failpoints (the
"process" dies; a new engine, a new owner, carries on), and decisions and advances
cancelled part-way (a dropped click, a shutdown past its grace). After every step it checks,
against the database and the demo ledger (the outside world's own record):

* every executed refund was approved on its exact digest, before its expiry, by a quorum
  of distinct authorised approvers, none of them the requester (or, re-planned after a
  redirect, was asked for while the policy file let refunds run without asking);
* no denied, redirected, expired, superseded or cancelled call ever executes (the approval
  of every executed call is ``approved``, and it is the call's last request); a redirected
  call has no execution record at all, and its redirect was made in time by an authorised
  approver other than the requester, with guidance;
* a call a standing approval let run without a card was covered by it when it ran: enough
  distinct grants by authorised approvers (never the requester), inside its window, not
  yet revoked, the same policy band, a scope that covers the exact arguments;
* each call executes at most once;
* every decision attempt, accepted or refused, left an audit entry naming its actor;
* deploys come and go too: release 2 of the agent wants a currency with a refund (no
  request made under release 1 has one), and is
  deployed alone or with release 1 retired beside it; an approved call the deployed
  release cannot run is never run (no tool ever sees arguments its schema refuses) and,
  asked about, never runs afterwards, whatever the answer;
* the audit chain verifies;
* under a data key (the ``sealed`` runs, a quarter as many schedules), every value of a
  sealed column is stored sealed under it, and the audit log, written in clear, holds
  each request's arguments masked by its sensitive paths.

Beside the agent's runs, callers of the other faces ask about the same tool name through
the one intake: an HTTP API token, an MCP gateway and a framework adapter (each its own
source, each under its own entry of the operator's policy file, or its default), with the
requester written in any of its forms and with stricter or (refused) looser ``tighten``
fields; their approved calls are run and reported as their callers would. After every
step, also:

* **no call ever runs under a policy looser than the operator's entry for its source and
  tool**: every request's stored policy is at most as permissive as the one the operator's
  file in force when it was made resolves for its source and tool (its approvers drawn
  from the entry's, a quorum at least the entry's, a wait no longer, no self-approval the
  entry does not allow, the same ladder), and its requester is in the one normal form;
* a standing approval lets run only calls of the subject (source and tool) it was granted
  on;
* **every change of authority is in the audit chain**: each standing approval's grants and
  revocation, each token made, and the policy file in force.

``pytest --hypothesis-profile=long tests/integration/test_gate_model.py`` runs 10,000
schedules per dialect (docs/performance.md records how many ran with zero violations).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import re
import shutil
import sqlite3
import sys
from collections import Counter
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import mcp_types
import pytest
from approvald.bot.claude_code import SOURCE as HOOK
from approvald.bot.claude_code import ClaudeCodeHook, HookEvent
from approvald.bot.mcp.gateway import Gateway, Ran
from approvald.bot.mcp.tasks import TaskIds, Tasks
from approvald.runtime.approvals.decide import Actor
from approvald.runtime.engine import Engine, EngineConfig, assemble
from approvald.runtime.kernel import failpoints
from approvald.runtime.kernel.canonical import call_digest
from approvald.runtime.kernel.clock import ManualClock
from approvald.runtime.kernel.errors import ApprovaldError
from approvald.runtime.policies.directory import StaticDirectory
from approvald.runtime.policies.intake import Intake, Source, Tighten
from approvald.runtime.policies.policy import ApprovalPolicy, PolicyFile
from approvald.runtime.policies.scope import Scope, scope_for
from approvald.runtime.policies.sensitive import MASKED, mask_args, sensitive_of_snapshot
from approvald.runtime.policies.tools import Tool, ToolContext, ToolIdentity
from approvald.runtime.record import audit
from approvald.runtime.record.sealing import (
    PREFIX,
    SUFFIX,
    DataKey,
    Sealer,
    is_sealed,
    key_id,
)
from approvald.runtime.record.standing_chain import StandingState
from approvald.runtime.requests import api_tokens
from approvald.runtime.requests.packet import shown_args
from approvald.runtime.runs.agent import Agent, Registry
from approvald.runtime.runs.demo import DemoLedger, refund_agent
from approvald.runtime.runs.external import CALL_ID, NewRequest, Report
from approvald.store import fastsql, types
from approvald.store.db import Database
from approvald.store.models import ApiToken, Approval, AuditEntry, AuditHead, PolicyInForce
from approvald.store.records import AuditRecord
from approvald.store.sealed import sealed_columns
from approvald.store.types import SealedText
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from sqlalchemy import (
    Text,
    and_,
    bindparam,
    func,
    literal,
    not_,
    select,
    type_coerce,
    union_all,
)
from sqlalchemy import event as sa_event

from tests.conftest import SIGNER, Kept, keep_pg, reset_pg
from tests.helpers import Crash, Rows, approvals_of, executions_of, parts, runs_of
from tests.helpers import crash as _crash

# processes, browsers or hundreds of schedules: out of the inner loop (-m 'not slow')
# hundreds of schedules: about two minutes on a quiet 2-core machine, so more than the suite's
# 5-minute deadline for a hang on a busy one (the limit still fails a real hang)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

REQUESTER = "U_REQ"
ACTORS = ["U_A", "U_B", "U_C", "W_D", REQUESTER, "U_X"]
GROUPS = {"S_FIN": ["U_B", "U_C"]}
DECISIONS = {"voted", "approved", "denied", "redirected", "edited", "refused", "repeated",
             "outcome_resolved", "cannot_run_resolved"}
# guidance naming an amount makes the demo agent ask again for it; other guidance ends the
# run; blank guidance is refused
GUIDANCE = ["Refund only $20 of it", "Offer store credit instead", "  "]
CRASH_POINTS = ["after_intent", "before_result", "after_result", "before_checkpoint",
                "after_checkpoint", "after_commit_before_post"]
LEASE = timedelta(seconds=30)
# what a process loads: release 1 of the demo refund agent, release 2 alone (a stricter
# refund schema), or release 2 with release 1 retired beside it (its runs finish on it)
RELEASES = ["1", "2", "2+1", "1b"]  # 1b: release 1's schema, another tool's code


def release_2(v1: Agent, ran_on: dict[str, str] | None = None) -> Agent:
    """The next release: ``issue_refund`` keeps its name, its schema is stricter (a
    currency is required: every refund asked for under release 1 fails it)."""
    orig = v1.tool("issue_refund")
    assert orig is not None
    seen = ran_on if ran_on is not None else {}

    async def issue_refund(ctx: ToolContext, order_id: str, amount_cents: int, reason: str,
                           currency: str) -> Any:
        seen[ctx.idempotency_key] = "2"
        return await orig.fn(ctx, order_id=order_id, amount_cents=amount_cents, reason=reason)

    strict = Tool(issue_refund, description=orig.description, permission=orig.permission,
                  policy=orig.policy, approval=orig.approval, idempotent=orig.idempotent,
                  reconcile=orig.reconcile, impact=orig.impact, timeout=orig.timeout)
    return replace(v1, version="2",
                   tools=[strict if t.name == "issue_refund" else t for t in v1.tools])


def release_1b(v1: Agent, ran_on: dict[str, str]) -> Agent:
    """A release whose ``issue_refund`` keeps its name and its schema but whose code changed
    (issue 46 item 7): a call approved for release 1's tool must not run on it."""
    orig = v1.tool("issue_refund")
    assert orig is not None

    async def issue_refund(ctx: ToolContext, order_id: str, amount_cents: int,
                           reason: str) -> Any:
        ran_on[ctx.idempotency_key] = "1b"  # (the same refund: the change is its code)
        return await orig.fn(ctx, order_id=order_id, amount_cents=amount_cents, reason=reason)

    changed = Tool(issue_refund, description=orig.description, permission=orig.permission,
                   policy=orig.policy, approval=orig.approval, idempotent=orig.idempotent,
                   reconcile=orig.reconcile, impact=orig.impact, timeout=orig.timeout)
    return replace(v1, version="1b",
                   tools=[changed if t.name == "issue_refund" else t for t in v1.tools])


class Releases:
    """The agent's releases a test's schedules load (see RELEASES), each built once a test
    over one ledger and one ``ran_on`` record, which each schedule starts anew (its own
    ledger file, an empty record). A release is its code and its argument schemas, the
    same in every "process" that loads it: built at each start of a "process" (about three
    a schedule), each of its tools read its source again for its version and made its
    argument model again, about 5% of the test's CPU. What a start makes anew (the engine,
    its owner, its registry, the policy it loads) is made anew still (``_engine``)."""

    def __init__(self) -> None:
        self.ledger = DemoLedger(None)
        self.ran_on: dict[str, str] = {}  # idempotency key -> the release whose tool ran it
        self.built: dict[str, list[Agent]] = {}

    @classmethod
    def of(cls, machine: type, ledger_path: str) -> Releases:
        """The releases of ``machine``'s test, for a new schedule writing ``ledger_path``."""
        releases = machine.__dict__.get("_releases")
        if releases is None:
            releases = cls()
            machine._releases = releases  # type: ignore[attr-defined]
        releases.ledger.path = ledger_path
        releases.ran_on.clear()
        return releases

    def load(self, release: str) -> list[Agent]:
        """The agents a process loading ``release`` serves."""
        if release not in self.built:
            v1 = self.built["1"][0] if "1" in self.built else \
                replace(refund_agent(self.ledger), version="1")
            self.built["1"] = [v1]
            self.built[release] = {
                "1": lambda: [v1], "2": lambda: [release_2(v1, self.ran_on)],
                "2+1": lambda: [release_2(v1, self.ran_on), replace(v1, retired=True)],
                "1b": lambda: [release_1b(v1, self.ran_on)]}[release]()
        return self.built[release]


class Start:
    """What each of a test's schedules starts from: a migrated database holding the
    credentials its faces' requests are made under (``GateMachine._credentials``: an
    operator's API token and approvald's own for the MCP gateway, the adapter and the hook,
    each made and audited as a real deployment makes it), made by the first schedule and
    kept: each later one starts from a copy (SQLite's file; PostgreSQL's rows put back
    after the reset), with the same credentials. Made again by each schedule, in a clock
    that starts at the same instant in every schedule, they were four audited write
    transactions a schedule (about 4% of the test's CPU), and the same rows but for their
    random ids and secrets."""

    def __init__(self, sqlite_template: Path, workdir: Path) -> None:
        self.credentials: dict[str, Any] | None = None
        self.sqlite = sqlite_template  # what a schedule's SQLite file is a copy of
        self.workdir = workdir
        self.pg: Kept | None = None  # PostgreSQL: the rows a reset puts back

    async def keep(self, url: str) -> None:
        """Keep the database at ``url`` as each later schedule's start."""
        if url.startswith("sqlite"):
            kept = self.workdir / "start.db"
            with contextlib.closing(sqlite3.connect(url.split("///", 1)[1])) as src, \
                    contextlib.closing(sqlite3.connect(kept)) as dst:
                src.backup(dst)  # (a snapshot of what is committed, the WAL's included)
            self.sqlite = kept
        else:
            self.pg = await keep_pg(url)


STATS: Counter[str] = Counter()  # what the schedules reached (a blind model proves nothing)


def event(what: str) -> None:
    STATS[what] += 1


APPROVERS = st.sampled_from([[], ["U_A"], ["U_A", "U_B"], ["U_A", "S_FIN"], ["S_FIN"],
                             ["U_A", "U_B", "U_C"], ["W_D", "S_FIN"]])


@st.composite
def policies(draw: st.DrawFn) -> dict[str, Any]:
    approvers = draw(APPROVERS)
    users = [a for a in approvers if not a.startswith("S")]
    groups = approvers != users
    most = 2 if not approvers or groups else len(users)
    policy: dict[str, Any] = {
        "approvers": approvers, "quorum": draw(st.integers(1, min(most, 3))),
        "ttl": draw(st.sampled_from(["30s", "5m", "1h"])),
        "reminders": draw(st.sampled_from([[], ["50%"]])),
        "edits": draw(st.sampled_from(["approve", "propose"])),
        "on_expire": "cancel", "escalate": [],
    }
    # sensitive arguments (issue 34): every face shows them masked, an edit gives the masked
    # view back, and what runs must still be the exact approved call. Told by the wait, not
    # drawn: a new draw would move the fixed CI schedule set off what it covers today
    policy["sensitive"] = {"30s": [], "5m": ["args.order_id"],
                           "1h": ["args.order_id", "args.reason"]}[policy["ttl"]]
    if draw(st.booleans()):
        policy["on_expire"] = "escalate"
        policy["escalate"] = draw(st.sampled_from([
            [{"approvers": ["W_D"], "ttl": "5m"}],
            [{"approvers": ["W_D", "U_A"], "ttl": "5m", "quorum": 2},
             {"approvers": ["S_FIN"], "ttl": "1h"}]]))
    return policy


@dataclass(frozen=True)
class Seen:
    """What the record held after a step, read once for every invariant: the demo ledger's
    lines, the audit chain's entries (verified), the requests of the runs and callers, the
    votes on the approved ones, the runs, their calls' execution records (the agent's by
    call, the callers' calls that ran), standing approvals, tokens and the policy in force."""

    lines: list[dict[str, Any]]
    entries: list[Any]
    asked: list[Any]
    votes: dict[str, list[Any]]
    runs: dict[str, Any]
    records: dict[tuple[str, str], Any]
    request_calls: set[tuple[str, str]]
    standing: list[Any]
    tokens: list[str]  # the API tokens' names
    in_force: str | None
    # under a data key (see _sealed_in): each value of a sealed column not sealed under it
    # (column, value), and the audit entries past the last checked (seq, approval id,
    # details, its request's policy)
    not_sealed: list[Any]
    audited: list[Any]


class GateMachine(RuleBasedStateMachine):
    """One database, one clock, one demo ledger; engines come and go like processes."""

    make_url: Any = None  # set by the test: returns a fresh database URL per example
    workdir: Path = Path(".")
    data_key: DataKey | None = None  # set by the test: the key values are sealed under
    start: Start  # set by the test: what each schedule's database starts from

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.clock = ManualClock()
        GateMachine.serial = getattr(GateMachine, "serial", 0) + 1
        self.ledger_path = self.workdir / f"ledger-{GateMachine.serial}.jsonl"
        # the clock moves leases; a small pool reuses each connection soon (a connection
        # left in a bad state by a cut-off task is met again within a few steps)
        url = self.make_url()
        self.db = Database(url, server_time=False, pool_size=2)
        # the invariants read what is committed, through connections of their own: what
        # the engine's connections see may include a transaction they never committed
        self.committed = Database(url, server_time=False)
        if url.startswith("sqlite"):
            _commits_without_fsync(self.db)
        self.policy = PolicyFile()
        self.release = "1"  # what the next process loads (see RELEASES)
        self.relaxed = False  # the policy file lets refunds run without asking
        self.ever_relaxed = False  # ... or did at some point of this schedule
        # which release's refund tool ran each refund (idempotency key -> release; release
        # 1's own tool records nothing), and each release's tool version
        self.releases = Releases.of(type(self), str(self.ledger_path))
        self.ran_on: dict[str, str] = self.releases.ran_on
        self.crossed = False  # a request approved across a changed tool was steered to
        self.versions: dict[str, str] = {}
        # calls a caller face collected: (request id, when), an MCP task's or a hook's
        self.collected: list[tuple[str, Any]] = []
        self.engine = self._engine()
        self.runs: list[str] = []
        self.tokens: dict[str, list[str]] = {}  # approval id -> tokens of cards drawn
        self.attempts: dict[tuple[str, str], int] = {}  # (actor, approval) -> attempts
        self.current: dict[str, Any] = {}  # the tool policy the last run started under
        self.standing: list[tuple[str, dict[str, Any]]] = []  # (id, policy granted under)
        self.steers = ["edit", "standing", "redirect", "cut off"]  # see _steer
        # callers of the other faces, and the requests they made (run ids)
        self.api_policy: dict[str, Any] = {"approvers": ["U_A", "S_FIN"], "quorum": 2}
        self.requests: list[str] = []
        self.policy_at: dict[str, PolicyFile] = {}  # approval id -> the file in force
        self.agents: dict[str, str] = {}  # run id -> its agent (its source)
        if self.start.credentials is None:  # the test's first schedule: made, then kept
            self.credentials = self.run(self._credentials())
            self.run(self.start.keep(url))
            self.start.credentials = self.credentials
        else:  # the database began as the first schedule's, these made in it
            self.credentials = self.start.credentials
        self._step = 0  # steps checked so far (see check_invariants)
        self._read_at: tuple[int, Seen] | None = None  # what the invariants read, at a step
        # the chain verified after each step from where the step before verified it (see
        # _read), every entry walked kept, and the authority they granted replayed
        self.entries: list[Any] = []
        self.verifier = audit.ChainVerifier(visit=self.entries.append)
        self.authority = Authority()
        # the audit entries _check_sealed checked: up to this seq, but those waiting
        self._sealed_seq = 0
        self._sealed_waiting: list[Any] = []

    # -- plumbing ----------------------------------------------------------------------
    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def _engine(self) -> Engine:
        """A new "process": its own owner id, the same database, clock and outside world."""
        agents = self.releases.load(self.release)
        for a in agents:  # the identity of each release's refund tool
            found = a.tool("issue_refund")
            assert found is not None
            self.versions[a.version] = found.identity().version
        registry = Registry(agents, policy=self.policy)
        engine = assemble(self.db, registry, clock=self.clock,
                        config=EngineConfig(lease_ttl=LEASE), signer=SIGNER,
                        directory=StaticDirectory(GROUPS))
        return engine

    def _restart(self) -> None:
        failpoints.arm("")
        self.engine = self._engine()

    def teardown(self) -> None:
        event("schedules")
        failpoints.arm("")
        # whatever a crash or a cut-off left on the loop ends here, and both databases
        # close even if one fails to: a connection left open outlives this loop, and its
        # driver thread fails later, in another test ("Event loop is closed")
        pending = [t for t in asyncio.all_tasks(self.loop) if not t.done()]
        for task in pending:
            task.cancel()
        try:
            if pending:
                self.run(_settle(pending))
            if sys.exc_info()[1] is None:  # (a schedule that failed already says why)
                self.run(self._verify_whole_chain())
            self.run(self.db.close())
        finally:
            try:
                self.run(self.committed.close())
            finally:
                self.run(self.loop.shutdown_asyncgens())
                self.loop.close()

    def _all_approve(self, a: Any) -> None:
        """Every approver on ``a``'s card clicks Approve in turn (until it is decided),
        then its run goes on."""
        for person in self._people(a):
            approvals = self.run(self._approvals())
            current = next(x for x in approvals if x.id == a.id)
            if current.status != "pending":
                break
            self._decide(approvals.index(current), person, "approve", "fresh", 0, False,
                         approvals)
        try:
            event(f"resumed: {self.run(self.engine.advance(a.run_id)).status}")
        except ApprovaldError:
            pass

    async def _approvals(self) -> list[Any]:
        return await Rows(self.db).approvals(*self.runs, *self.requests)

    async def _credentials(self) -> dict[str, Any]:
        """What each face's requests are made under: an operator's API token, and
        approvald's own credentials for an MCP gateway and an adapter."""
        made = await api_tokens.create(
            self.db, self.clock, api_tokens.WebhookKeys("model-test-secret-0123456789"),
            parts(self.engine).audit, "bot", created_by="cli:ops", via="cli", tools="issue_refund")
        own = {kind: await api_tokens.own_credential(self.db, self.clock, parts(self.engine).audit,
                                                     Source(kind, name))
               for kind, name in (("mcp", "gw"), ("adapter", "ad"), ("hook", HOOK.name))}
        return {"api": made.record, **own}

    def _set_policy(self, override: dict[str, Any]) -> None:
        """The operator edits the file (and the next process to start loads it): the
        agent's issue_refund as given; API token bot's under its own entry; every
        adapter's under a glob; the MCP gateway's named nowhere (the default). The
        requests made until now were made under the file being replaced."""
        for a in self.run(self._approvals()):
            self.policy_at.setdefault(a.id, self.policy)
        self.policy = PolicyFile.model_validate({"tools": {
            "issue_refund": override, "api:bot/issue_refund": self.api_policy,
            "adapter:*/issue_refund": {"approvers": ["U_A", "U_B"], "ttl": "5m"}},
            "groups": GROUPS})
        self.engine.use_policy(self.policy, check=False)
        self.run(self.engine.note_policy())

    # -- rules -------------------------------------------------------------------------
    @initialize()
    def empty(self) -> None:
        assert self.runs == []

    @precondition(lambda self: len(self.runs) < 4 and not self.relaxed)
    @rule(policy=policies())
    def start_run(self, policy: dict[str, Any]) -> None:
        self._set_policy(policy)
        self.current = policy  # (not a policy-file change's: runs start under this one)
        self._start()

    def _start(self) -> None:
        outcome = self.run(self.engine.run("demo-refund", f"Refund order A-{len(self.runs)}",
                                           requested_by=REQUESTER))
        # a live standing approval of the same band lets the refund run without a card
        assert outcome.status in ("awaiting_approval", "completed"), outcome
        if outcome.status == "completed":
            event("run covered by a standing approval")
        self.runs.append(outcome.run_id)
        self.draw_cards()
        if outcome.status == "awaiting_approval":
            # the requester and an outsider try the new card at once, in every schedule
            # that opens one: the coverage checks below must not rest on a draw (the
            # fixed schedule set moves with hypothesis's version and with the constants
            # it collects from this project's source)
            self.outsiders_approve(0)
            if len(self.runs) == 2 and not self.crossed:  # once per schedule, steered
                self.crossed = True
                self.approved_across_a_changed_tool(len(self._pending_list()[0]) - 1)
            self._steer(outcome.run_id)

    def _steer(self, run_id: str) -> None:
        """Steer a schedule's cards, one each, through what the coverage checks below
        need and a draw reaches too seldom (left to it, 2 redirects were accepted in 167
        schedules, and one random seed in five missed a live standing approval, a dropped
        click or a click past the expiry): an edit, a vote on the card it replaced and a
        click just past the expiry; a standing approval's life; a redirect without
        guidance, with it, and a late click after it; an approval dropped at its first
        await, one lost in a crash, and the run's advance cut off."""
        if not self.steers or self.relaxed:
            return
        mine = self._pending_of(run_id)
        if not mine:  # (where the policy names no approver, the outsider was one)
            return
        step = self.steers.pop(0)
        if step == "standing":
            before = len(self.standing)
            self.standing_lifecycle(mine[0], 0)
            if len(self.standing) == before:  # refused (a window past the policy's)
                self.steers.insert(0, step)
        elif step == "redirect":  # blank guidance first, then a click on the decided card
            self.redirect_without_guidance(mine[0], 0)
            self.redirect_as_an_approver(mine[0], 0, GUIDANCE[0], "fresh", False, False)
            approvals = self.run(self._approvals())
            late = next(a for a in approvals if a.run_id == run_id)
            people = self._people(late)
            self._decide(approvals.index(late), people[-1], "approve", "fresh", 0, False,
                         approvals)
        elif step == "edit":  # and, on the edited card, a click just past its expiry
            self.edit_then_vote_on_the_old_card(mine[0], 0, 100, 1)
            for k in self._pending_of(run_id)[:1]:
                self.approve_just_past_expiry(k, 0, 0)
        else:  # then one lost in a crash, then the approved run's advance cut off
            self.cut_off(mine[0], 0, 1, "decide")
            approvals = self.run(self._approvals())
            for a in [a for a in approvals if a.run_id == run_id and a.status == "pending"]:
                self._decide(approvals.index(a), self._people(a)[0], "approve", "fresh", 0,
                             True, approvals)
            self.cut_off(self.runs.index(run_id), 0, 2, "advance")

    def _pending_of(self, run_id: str) -> list[int]:
        """Where run ``run_id``'s pending request is in ``_pending``'s list ([] if none)."""
        pending, _ = self._pending_list()
        return [k for k, a in enumerate(pending) if a.run_id == run_id]

    # -- standing approvals: granted on a request, granted again for a quorum, revoked,
    # outlived by the clock; runs started under the band they were granted in
    @precondition(lambda self: bool(self.runs))
    @rule(i=st.integers(0, 50), j=st.integers(0, 5),
          minutes=st.sampled_from([15, 30, 30, 120]),
          scope=st.sampled_from(["condition", "condition", "fields", "exact"]))
    def grant_standing(self, i: int, j: int, minutes: int, scope: str) -> None:
        a, _ = self._pending(i)
        if a is None:
            return
        people = self._people(a)
        try:
            sc = scope_for(a, scope, fields=["reason"], when="args.amount_cents <= 5000")
            s, _ = self.run(self.engine.grant_standing(
                a.id, actor=Actor(people[j % len(people)], "slack"),
                window=timedelta(minutes=minutes), scope=sc, token=self.engine.button_token(a)))
        except ValueError:
            event("standing refused: scope")
        except ApprovaldError as exc:
            event(f"standing refused: {getattr(exc, 'reason', type(exc).__name__)}")
        else:
            event("standing granted")
            self.standing.append((s.id, self.current))

    @precondition(lambda self: bool(self.standing))
    @rule(k=st.integers(0, 10), who=st.sampled_from([*ACTORS, "U_B", "U_C"]))
    def grant_standing_again(self, k: int, who: str) -> None:
        sid, _ = self.standing[k % len(self.standing)]
        try:
            self.run(self.engine.add_standing_grant(sid, actor=Actor(who, "slack")))
        except ApprovaldError as exc:
            event(f"standing grant refused: {getattr(exc, 'reason', type(exc).__name__)}")
        else:
            event("standing granted again")

    @precondition(lambda self: bool(self.standing))
    @rule(k=st.integers(0, 10), stranger=st.booleans())
    def revoke_standing(self, k: int, stranger: bool) -> None:
        """A granter revokes (or a stranger tries to)."""
        sid, _ = self.standing[k % len(self.standing)]
        s = self.run(self.engine.standing_grant(sid))
        who = "U_X" if stranger and "U_X" not in s.approvers_value() \
            and s.approvers_value() else s.grants_value()[0]
        try:
            self.run(self.engine.revoke_standing(sid, actor=Actor(who, "slack")))
        except ApprovaldError as exc:
            event(f"standing revoke refused: {getattr(exc, 'reason', type(exc).__name__)}")
        else:
            event("standing revoked")

    @precondition(lambda self: bool(self.runs) and len(self.runs) < 5 and not self.relaxed)
    @rule(i=st.integers(0, 50), j=st.integers(0, 5))
    def standing_lifecycle(self, i: int, j: int) -> None:
        """Steered, so every schedule set reaches it: a grant on a pending request, a run
        in its band, a revocation by the granter, another run in its band."""
        before = len(self.standing)
        self.grant_standing(i, j, 30, "condition")
        if len(self.standing) == before:
            return
        sid, _ = self.standing[-1]
        s = self.run(self.engine.standing_grant(sid))
        for person in self._people(s):  # a quorum's other approvers join the grant
            if s.status != "proposed":
                break
            if person not in s.grants_value():
                self.grant_standing_again(len(self.standing) - 1, person)
                s = self.run(self.engine.standing_grant(sid))
        self.start_run_under_a_standing_band(len(self.standing) - 1)
        self.run(self.engine.revoke_standing(sid, actor=Actor(s.grants_value()[0], "slack")))
        event("standing revoked")
        if len(self.runs) < 6:
            self.start_run_under_a_standing_band(len(self.standing) - 1)

    @precondition(lambda self: bool(self.standing) and len(self.runs) < 6
                  and not self.relaxed)
    @rule(k=st.integers(0, 10))
    def start_run_under_a_standing_band(self, k: int) -> None:
        _, policy = self.standing[k % len(self.standing)]
        self._set_policy(policy)
        self._start()

    @rule()
    def draw_cards(self) -> None:
        """Cards are (re)drawn: approvers now hold a token for the current arguments."""
        for a in self.run(self._approvals()):
            token = self.engine.button_token(a)
            if a.status == "pending" and token is not None:
                self.tokens.setdefault(a.id, []).append(token)

    @precondition(lambda self: bool(self.runs))
    @rule(i=st.integers(0, 50), actor=st.sampled_from([*ACTORS, "U_A", "U_B", "U_C"]),
          verdict=st.sampled_from(["approve", "approve", "approve", "deny", "edit", "edit",
                                   "redirect", "retry", "mark_done", "abort", "replan"]),
          token=st.sampled_from(["fresh", "fresh", "fresh", "stale", "stale", "forged",
                                 "none"]),
          amount=st.sampled_from([100, 4200, 9900]), crash=st.booleans())
    def decide(self, i: int, actor: str, verdict: str, token: str, amount: int,
               crash: bool) -> None:
        approvals = self.run(self._approvals())
        if approvals:  # (none while every run so far ran under a relaxed policy file)
            self._decide(i, actor, verdict, token, amount, crash, approvals)

    def _decide(self, i: int, actor: str, verdict: str, token: str, amount: int,
                crash: bool, approvals: list[Any], held_token: str | None = None,
                reason: str | None = None) -> None:
        a = approvals[i % len(approvals)]
        if a.kind == "outcome_unknown" and verdict in ("retry", "mark_done"):
            # the person asked looks at the outside world before answering (a person who
            # says "retry" about a call that did happen is not something a gate can stop)
            verdict = "mark_done" if self._happened(a) else "retry"
        held = [held_token] if held_token else self.tokens.get(a.id) or [None]
        chosen = {"fresh": self.engine.button_token(a), "stale": held[i % len(held)],
                  "forged": "x" * 12 + ".forged", "none": None}[token]
        args = None
        if verdict == "edit":  # edited from the view every face shows: masked values
            shown = shown_args(a)
            args = {"order_id": shown.get("order_id", "A-0"), "amount_cents": amount,
                    "reason": "edited"}
            if shown != a.effective_args():
                event("edit of a masked view")
        before = self.run(self._head())
        if crash:
            failpoints.arm("after_decision", _crash)
        try:
            if reason is None and verdict != "approve":
                reason = "because"
            self.run(self.engine.decide(a.id, actor=Actor(actor, "slack"), verdict=verdict,
                                        reason=reason, args=args, token=chosen))
        except ApprovaldError as exc:
            event(f"decision refused: {getattr(exc, 'reason', type(exc).__name__)}")
        except Crash:
            event("crashed after a decision")
            self._restart()
        else:
            event(f"decision accepted: {verdict}")
        finally:
            failpoints.arm("")
        self.attempts[(actor, a.id)] = self.attempts.get((actor, a.id), 0) + 1
        entries = self.run(self._entries_after(before))
        mine = [e for e in entries if e.actor == actor and e.approval_id == a.id
                and e.action in DECISIONS]
        assert mine, f"no audit entry for {actor}'s {verdict} on {a.id}: {entries}"

    @precondition(lambda self: bool(self.runs))
    @rule(i=st.integers(0, 50), j=st.integers(0, 5), crash=st.booleans())
    def approve_as_an_approver(self, i: int, j: int, crash: bool) -> None:
        """The common case: an approver clicks Approve on the card in front of them."""
        approvals = [a for a in self.run(self._approvals()) if a.status == "pending"]
        if not approvals:
            return
        a = approvals[i % len(approvals)]
        named = a.approvers_value() or [x for x in ACTORS if x != REQUESTER]
        people = sorted({m for n in named for m in GROUPS.get(n, [n])})
        verdict = {"tool_call": "approve", "cannot_run": "replan"}.get(a.kind, "retry")
        self._decide(approvals.index(a), people[j % len(people)], verdict, "fresh", 0, crash,
                     approvals)

    # The rules below steer towards the attacks the gate exists to refuse, so that every
    # schedule set (including CI's derandomized one) reaches them, not just lucky seeds.
    def _pending_list(self, kind: str = "tool_call") -> tuple[list[Any], list[Any]]:
        """The pending requests of ``kind``, and every request (as ``_decide`` takes them)."""
        approvals = self.run(self._approvals())
        return [a for a in approvals if a.status == "pending" and a.kind == kind], approvals

    def _pending(self, i: int, kind: str = "tool_call") -> Any:
        pending, approvals = self._pending_list(kind)
        return (pending[i % len(pending)], approvals) if pending else (None, approvals)

    def _people(self, a: Any) -> list[str]:
        named = a.approvers_value() or [x for x in ACTORS if x != REQUESTER]
        return sorted({m for n in named for m in GROUPS.get(n, [n])} - {REQUESTER})

    @precondition(lambda self: bool(self.runs))
    @rule(i=st.integers(0, 50), j=st.integers(0, 5), amount=st.sampled_from([100, 9900]),
          k=st.integers(0, 5))
    def edit_then_vote_on_the_old_card(self, i: int, j: int, amount: int, k: int) -> None:
        """An approver edits; another, still looking at the old card, clicks Approve."""
        a, approvals = self._pending(i)
        if a is None:
            return
        old = self.engine.button_token(a)
        people = self._people(a)
        self._decide(approvals.index(a), people[j % len(people)], "edit", "fresh", amount,
                     False, approvals)
        after = self.run(self._approvals())
        if old is not None:
            self.tokens.setdefault(a.id, []).append(old)
            mine = next(x for x in after if x.id == a.id)
            self._decide(after.index(mine), people[k % len(people)], "approve", "stale", 0,
                         False, after, held_token=old)

    @precondition(lambda self: bool(self.runs))
    @rule(i=st.integers(0, 50), j=st.integers(0, 5))
    def redirect_without_guidance(self, i: int, j: int) -> None:
        """Steered: an approver redirects with blank guidance, which is refused."""
        a, approvals = self._pending(i)
        if a is None:
            return
        people = self._people(a)
        self._decide(approvals.index(a), people[j % len(people)], "redirect", "fresh", 0,
                     False, approvals, reason=GUIDANCE[-1])

    @precondition(lambda self: bool(self.runs))
    @rule(i=st.integers(0, 50), j=st.integers(0, 5),
          guidance=st.sampled_from([*GUIDANCE[:2], *GUIDANCE]),
          token=st.sampled_from(["fresh", "fresh", "fresh", "stale"]), crash=st.booleans(),
          resume=st.booleans())
    def redirect_as_an_approver(self, i: int, j: int, guidance: str, token: str, crash: bool,
                                resume: bool) -> None:
        """An approver redirects the agent with guidance; the run re-plans on it (a new
        request for the amount the guidance names, or an answer with no refund)."""
        a, approvals = self._pending(i)
        if a is None:
            return
        people = self._people(a)
        self._decide(approvals.index(a), people[j % len(people)], "redirect", token, 0, crash,
                     approvals, reason=guidance)
        if resume:
            try:
                event(f"resumed: {self.run(self.engine.advance(a.run_id)).status}")
            except ApprovaldError:
                pass

    @precondition(lambda self: bool(self.runs))
    @rule(i=st.integers(0, 50), j=st.integers(0, 5), roll=st.integers(0, 2))
    def approve_just_past_expiry(self, i: int, j: int, roll: int) -> None:
        """No sweep has run: the clock passes ``expires_at`` and an approver clicks."""
        a, approvals = self._pending(i)
        if a is None or roll:  # rarer than the rest, or every request would lapse
            return
        self.clock.set(max(self.clock.now(), a.expires_at + timedelta(seconds=1)))
        people = self._people(a)
        self._decide(approvals.index(a), people[j % len(people)], "approve", "fresh", 0,
                     False, approvals)

    @precondition(lambda self: bool(self.runs))
    @rule(i=st.integers(0, 50))
    def whole_quorum_approves(self, i: int) -> None:
        """Every approver on the card clicks Approve in turn, then the run goes on."""
        a, _ = self._pending(i)
        if a is None:
            return
        self._all_approve(a)

    @precondition(lambda self: bool(self.runs))
    @rule(i=st.integers(0, 50))
    def outsiders_approve(self, i: int) -> None:
        """The requester approving their own call, and someone with no say at all, on the
        same card. Both, not one drawn at random: a draw of who tried correlated by chance
        with whether anything was pending left the requester's attempts untried in one
        whole set of schedules."""
        a, approvals = self._pending(i)
        if a is None:
            return
        for who in (REQUESTER, "U_X"):
            self._decide(approvals.index(a), who, "approve", "fresh", 0, False, approvals)

    @rule(seconds=st.sampled_from([1, 1, 5, 20, 45, 300, 3600]))
    def advance_clock(self, seconds: int) -> None:
        self.clock.advance(seconds)

    @rule()
    def sweep(self) -> None:
        self.run(self.engine.sweep())

    @precondition(lambda self: bool(self.runs))
    @rule(i=st.integers(0, 50), crash=st.sampled_from([None, None, *CRASH_POINTS]))
    def resume(self, i: int, crash: str | None) -> None:
        run_id = self.runs[i % len(self.runs)]
        if crash:
            failpoints.arm(crash, _crash)
        try:
            event(f"resumed: {self.run(self.engine.advance(run_id)).status}")
        except Crash:
            event(f"crashed at {crash}")
            self._restart()
        except ApprovaldError:
            pass
        finally:
            failpoints.arm("")

    @precondition(lambda self: bool(self.runs))
    @rule(i=st.integers(0, 50), j=st.integers(0, 5),
          turns=st.one_of(st.integers(0, 2), st.integers(0, 40)),
          what=st.sampled_from(["decide", "advance"]))
    def cut_off(self, i: int, j: int, turns: int, what: str) -> None:
        """A task cancelled part-way, at its ``turns``-th await: a click whose request
        was dropped (the process carries on), or a run's advance cut off by a shutdown past
        its grace (a new process carries on). What it committed stands; what it did not is
        gone; the connections it used serve what comes next as if nothing happened. (A
        decision on SQLite awaits once, its COMMIT; on PostgreSQL some 30 times: hence
        the small counts drawn half the time.)"""
        if what == "decide":
            approvals = [a for a in self.run(self._approvals()) if a.status == "pending"
                         and a.kind == "tool_call"]
            if not approvals:
                return
            a = approvals[i % len(approvals)]
            people = self._people(a)
            if not people:
                return
            work: Any = self.engine.decide(a.id, actor=Actor(people[j % len(people)], "slack"),
                                           verdict="approve", token=self.engine.button_token(a))
        else:
            work = self.engine.advance(self.runs[i % len(self.runs)])
        finished = self.run(_cancel_at(turns, work))
        event(f"cut off: {what}" if not finished else f"not cut off: {what}")
        if what == "advance" and not finished:
            self._restart()

    @rule(release=st.sampled_from(RELEASES))
    def redeploy(self, release: str) -> None:
        """A deploy: the process restarts on another release of the agent."""
        self.release = release
        self._restart()
        event(f"deployed release {release}")

    @precondition(lambda self: bool(self.runs))
    @rule(i=st.integers(0, 50))
    def approved_across_a_changed_tool(self, i: int) -> None:
        """Steered (a draw seldom deploys between a request and its approval): a pending
        refund's tool changes its code under the same schema (release 1b deployed where
        release 1 made the request, or 1 where 1b did), then the request is approved and
        the run resumed: the call must not run on the changed tool (issue 46 item 7)."""
        pending, _ = self._pending_list()
        agents = [a for a in pending if a.tool_version is not None]  # (a caller runs its own)
        if not agents:
            event("changed tool: nothing pending")
            return
        a = agents[i % len(agents)]
        self.redeploy("1b" if a.tool_version == self.versions.get("1") else "1")
        self._all_approve(a)

    @rule()
    def recover(self) -> None:
        self.run(self.engine.recover())

    @precondition(lambda self: bool(self.runs))
    @rule(i=st.integers(0, 50), roll=st.integers(0, 3))
    def cancel(self, i: int, roll: int) -> None:
        if roll:  # cancels are rarer than decisions, or few calls would ever run
            return
        try:
            self.run(self.engine.cancel(self.runs[i % len(self.runs)],
                                        actor=Actor("U_OPS", "cli:ops"), reason="model"))
        except ApprovaldError:
            pass

    @rule(kind=st.sampled_from(["auto", "forbidden", "notify_after"]))
    def change_policy(self, kind: str) -> None:
        """Someone edits the policy file: requests already made keep their own rules."""
        self._set_policy({"policy": kind})
        self.relaxed = kind != "forbidden"
        self.ever_relaxed = self.ever_relaxed or self.relaxed

    @precondition(lambda self: self.relaxed)
    @rule()
    def restore_policy(self) -> None:
        self._set_policy({})
        self.relaxed = False

    # -- the other faces: an API token, an MCP gateway, an adapter ---------------------
    @precondition(lambda self: len(self.requests) < 4)
    @rule(source=st.sampled_from(["api", "mcp", "adapter"]),
          written=st.sampled_from([REQUESTER, "u_req", "<@U_REQ>", " <@u_req|req> "]),
          tighten=st.sampled_from([None, None, {"ttl": "1m"}, {"quorum": 2},
                                   {"approvers": ["U_A"]}, {"edits": "propose"},
                                   {"ttl": "9h"}, {"approvers": ["U_X"]}, {"quorum": 1}]),
          amount=st.sampled_from([100, 4200]), policy=policies())
    def caller_asks(self, source: str, written: str, tighten: dict[str, Any] | None,
                    amount: int, policy: dict[str, Any]) -> None:
        """A caller of another face asks about issue_refund (the same name as the agent's
        tool, another source's tool), maybe stricter, maybe trying to be looser."""
        if source == "api" and not self.relaxed:
            self.api_policy = policy  # the operator's entry for api:bot/issue_refund
            self._set_policy(self.current)
        token = self.credentials[source]
        args = {"order_id": f"X-{len(self.requests)}", "amount_cents": amount,
                "reason": "caller"}
        try:
            doc, _ = self.run(self.engine.open_request(token, NewRequest(
                tool="issue_refund", args=args, requested_by=written,
                tighten=None if tighten is None else Tighten.model_validate(tighten))))
        except ApprovaldError as exc:
            event(f"caller refused: {getattr(exc, 'code', type(exc).__name__)}")
            return
        event(f"caller asked: {source} ({doc['status']})")
        self.requests.append(str(doc["id"]))

    @precondition(lambda self: bool(self.requests))
    @rule(i=st.integers(0, 20), fail=st.booleans())
    def caller_runs_what_was_approved(self, i: int, fail: bool) -> None:
        """The caller runs an approved call, as approved (effective arguments), and reports
        it; a request not approved, or closed, is refused."""
        rid = self.requests[i % len(self.requests)]
        run = self.run(self._run(rid))
        token = self.credentials[Source.of_run(run.agent).kind]
        doc = self.run(self.engine.request_document(token, rid))
        try:
            self.run(self.engine.start_request(token, rid, args_digest=doc["effective_digest"],
                                                owner="caller"))
            self.collected.append((rid, self.clock.now()))
            self.run(self.engine.report_request(token, rid, Report(
                "failed" if fail else "succeeded", doc["effective_digest"])))
        except ApprovaldError as exc:
            event(f"caller's run refused: {getattr(exc, 'code', type(exc).__name__)}")
            if "window closed" in str(exc):
                event("collection refused: window closed")
        else:
            event("caller ran an approved call")

    @precondition(lambda self: bool(self.requests))
    @rule(i=st.integers(0, 20))
    def mcp_task_poll(self, i: int) -> None:
        """An MCP client polls its task (``tasks/get``): an approved call is run by the
        poll, once, and only while its request's window is open (issue 46 item 5)."""
        rid = self.requests[i % len(self.requests)]
        if not self.run(self._run(rid)).agent.endswith(":mcp.gw"):
            return
        g = Gateway(self.engine, name="gw", requested_by=REQUESTER, server="model")
        server = _Upstream(self, rid)
        tasks = Tasks(TaskIds("model-tasks-secret", "gw"), server)  # type: ignore[arg-type]
        try:
            task = self.run(tasks.state(g, self.credentials["mcp"], rid))
        except ApprovaldError as exc:
            event(f"task poll refused: {type(exc).__name__}")
            return
        event(f"task polled: {task['status']}")
        if "window closed" in str(task.get("statusMessage")):
            event("collection refused: window closed")

    @precondition(lambda self: len(self.requests) < 6)
    @rule(n=st.integers(0, 1), use=st.integers(0, 1))
    def hook_joins(self, n: int, use: int) -> None:
        """Claude Code's hook asks about a command, or joins the request the same command
        made before (a call that gave up waiting, made again): allowed only on an
        approval still in its window, and what ran is reported."""
        def ev(name: str, **extra: Any) -> HookEvent:
            return HookEvent.parse(json.dumps({
                "hook_event_name": name, "session_id": "model-session", "cwd": "/srv",
                "tool_name": "Bash", "tool_input": {"command": f"make deploy-{n}"},
                "tool_use_id": f"use-{use}", "transcript_path": "/tmp/t.jsonl", **extra}))

        hook = ClaudeCodeHook(self.engine, ev("PreToolUse"), requested_by=REQUESTER)
        out = self.run(hook.pre_tool_use(wait=0))["hookSpecificOutput"]
        said = out["permissionDecisionReason"]
        found = re.search(r"request (x[0-9a-z]+)", said)
        if found is not None and found.group(1) not in self.requests:
            self.requests.append(found.group(1))
        if "window closed" in said:
            event("collection refused: window closed")
        if out["permissionDecision"] != "allow":
            event("hook denied")
            return
        assert found is not None, said
        event("hook allowed")
        self.collected.append((found.group(1), self.clock.now()))
        after = ClaudeCodeHook(self.engine, ev("PostToolUse", tool_response={"ok": True}),
                               requested_by=REQUESTER)
        self.run(after.post_tool_use())

    @precondition(lambda self: len(self.requests) < 6 and not self.relaxed)
    @rule(face=st.sampled_from(["hook", "mcp"]), late=st.booleans(), n=st.integers(2, 3))
    def approved_then_collected(self, face: str, late: bool, n: int) -> None:
        """Steered (a draw seldom approves a face's request and then comes back for it): a
        hook's call or an MCP task is approved, then its caller comes back for it, in time
        or after the request's window closed (the clock moved past it)."""
        before = len(self.requests)
        if face == "hook":
            self.hook_joins(n, 0)
        else:
            g = Gateway(self.engine, name="gw", requested_by=REQUESTER, server="model")
            out = self.run(g.call(f"deploy-{n}", {"n": n}, _Upstream(self, "").forward(""),
                                  budget=0))
            if getattr(out, "request_id", None) and out.request_id not in self.requests:
                self.requests.append(out.request_id)
        if len(self.requests) == before:
            return
        rid = self.requests[-1]
        approvals = self.run(self._approvals())
        mine = [a for a in approvals if a.run_id == rid and a.status == "pending"]
        if not mine:
            return
        self._decide(approvals.index(mine[0]), self._people(mine[0])[0], "approve", "fresh",
                     0, False, approvals)
        if late:
            self.clock.set(max(self.clock.now(), mine[0].expires_at + timedelta(seconds=1)))
        if face == "hook":
            self.hook_joins(n, 0)
        else:
            self.mcp_task_poll(len(self.requests) - 1)

    async def _run(self, run_id: str) -> Any:
        return await Rows(self.db).run(run_id)

    # -- invariants --------------------------------------------------------------------
    # Each reads what one read of the record gave after this step (:meth:`_seen`): the audit
    # chain verified once (its new entries walked, see _read_in), each table read once
    # (after every step of every schedule, each of these invariants read its own copy of the
    # same rows: on PostgreSQL a statement is a round trip, and the walks and reads were
    # most of the test's CPU).
    @invariant()
    def nothing_runs_that_was_not_approved_exactly_in_time(self) -> None:
        self._check(self._seen())

    @invariant()
    def no_call_runs_outside_its_window_or_on_another_tool(self) -> None:
        self._check_window_and_identity(self._seen())

    @invariant()
    def no_request_is_looser_than_the_operators_policy(self) -> None:
        self._check_policies(self._seen())

    @invariant()
    def every_change_of_authority_is_audited(self) -> None:
        self._check_authority(self._seen())

    @invariant()
    def no_sensitive_value_is_stored_in_clear(self) -> None:
        if self.data_key is not None:
            self._check_sealed(self._seen(), self.data_key)

    def check_invariants(self, *args: Any, **kwargs: Any) -> None:
        # after each step (hypothesis checks the invariants once a step): read again
        self._step += 1
        super().check_invariants(*args, **kwargs)  # type: ignore[misc]

    def _seen(self) -> Seen:
        """What the record holds after this step, read once for the invariants."""
        # (a hypothesis that no longer checked invariants through check_invariants would
        # leave every step reading the first step's record: refused, not a weaker check)
        assert self._step > 0, "hypothesis checked an invariant outside check_invariants"
        if self._read_at is None or self._read_at[0] != self._step:
            self._read_at = (self._step, self.run(self._read()))
        return self._read_at[1]

    async def _read(self) -> Seen:
        lines = [json.loads(x) for x in (self.ledger_path.read_text().splitlines()
                                         if self.ledger_path.exists() else []) if x.strip()]
        return await Rows(self.committed).in_one_read(
            lambda tx: self._read_in(tx, lines), snapshot=True)

    async def _read_in(self, tx: Any, lines: list[dict[str, Any]]) -> Seen:
        """The record after this step, in one snapshot: the chain and the tables it is
        checked against, then the rows the invariants read (each one statement over every
        run, not one a run or a request; the votes and the standing approvals are the ones
        the chain's check compared with it, ``ChainVerifier.compared``; under a data key,
        the sealed columns and the new audit entries too, :meth:`_sealed_in`): at most 11
        statements a step (13 under a data key), BEGIN and COMMIT included, where reading
        them again, the sealed columns in a transaction of their own, was 14 (18).

        The chain verifies, and its entries (each checked against its MAC) serve the
        checks. Each step's check walks only the entries appended since the step before
        verified it (``audit.ChainVerifier``), and is no weaker for it: the model's
        engines only ever append to the chain; the head verified last is held here, so an
        entry cut off the end, or a history rewritten and re-chained up to it, is caught
        at once (that entry is read again and its MAC recomputed); the approvals, votes and
        standing approvals tables are compared with the whole chain after every step, as
        ``audit verify`` does; and an entry edited before the last head, the chain left
        broken after it, is caught at the schedule's end, where teardown verifies the
        whole chain from its first entry (``_verify_whole_chain``)."""
        report = await self.verifier.check(tx)
        assert report.ok, report.problems
        asked = await approvals_of(tx, [*self.runs, *self.requests])
        approved = [a.id for a in asked if a.kind == "tool_call" and a.status == "approved"]
        votes: dict[str, list[Any]] = {aid: [] for aid in approved}
        # the votes and standing approvals the chain's check compared with it (every one
        # in this snapshot), not read again: two statements fewer a step
        for v in self.verifier.compared.votes:
            if v.approval_id in votes:
                votes[v.approval_id].append(v)
        calls = await executions_of(tx, [*self.runs, *self.requests])  # (one statement)
        mine = set(self.runs)
        not_sealed, audited = await self._sealed_in(tx.approvals.conn, self.data_key) \
            if self.data_key is not None else ([], [])
        authority = list(await tx.approvals.conn.execute(_AUTHORITY))  # (one statement)
        return Seen(
            lines=lines, entries=self.entries, asked=asked, votes=votes,
            runs=await runs_of(tx, {*self.runs, *self.requests, *(a.run_id for a in asked)}),
            records={k: rec for k, rec in calls.items() if k[0] in mine},
            request_calls={k for k in calls if k[0] not in mine},
            standing=list(self.verifier.compared.standing),
            tokens=[v for k, v in authority if k == "token"],
            in_force=next((v for k, v in authority if k == "policy"), None),
            not_sealed=not_sealed, audited=audited)

    async def _verify_whole_chain(self) -> None:
        """The whole chain verifies from its first entry, as after every step it verified
        from the step before's head, and it holds what the steps' checks walked."""
        whole: list[Any] = []
        report = await audit.verify(self.committed, visit=whole.append)
        assert report.ok, report.problems
        assert report.head[0] >= self.verifier.head[0], (report.head, self.verifier.head)
        assert [e.hash for e in whole[:len(self.entries)]] == [e.hash for e in self.entries]

    async def _sealed_in(self, conn: Any, key: DataKey) -> tuple[list[Any], list[Any]]:
        """What :meth:`_check_sealed` checks, read in the snapshot the chain and the tables
        are read in (one transaction a step, not two)."""
        # one statement for every sealed column of every table (after every step: on
        # PostgreSQL each statement is a round trip; one a table was nine a step), and
        # a column written in clear has nothing to check here. Every row is still read,
        # by the database: which rows a step changed is not known cheaply (no column
        # records it), so none is left out. What comes back is only the values not
        # sealed under the key (the statement's test is exactly the one in _check_sealed,
        # see _sealed_under), not every sealed value of every row (the ciphertexts were
        # most of the bytes read and of the loop).
        not_sealed = list(await conn.execute(_not_sealed_under(key)))
        # The audit log: the entries past the last one checked in this schedule, each
        # with its request's policy (one statement). Not weaker than reading the whole
        # log again every step: entries are only appended (never rewritten) by the
        # model's engines, and an entry checked once and edited after it would break the
        # chain, which is verified after every step (_read_in, every new entry and the
        # head held) and from its first entry at teardown (_verify_whole_chain).
        # An entry naming an approval this read does not find is checked again each
        # step until it does (an id that is no request's, a standing approval's, stays
        # there: its entry had nothing to mask before either).
        entries = [*self._sealed_waiting,
                   *await conn.execute(_AUDIT_AFTER, {"seq": self._sealed_seq})]
        missing = sorted({e[1] for e in entries if e[1] is not None and e[3] is None})
        found = {r[0]: r[1] for r in await conn.execute(
            select(_APPROVALS.c.id, _APPROVALS.c.policy)
            .where(_APPROVALS.c.id.in_(missing)))} if missing else {}
        return not_sealed, [(seq, approval_id, details,
                             found.get(approval_id) if policy is None else policy)
                            for seq, approval_id, details, policy in entries]

    def _check_sealed(self, seen: Seen, key: DataKey) -> None:
        """Under a data key, every value of a sealed column is stored sealed under it, and
        the audit log (written in clear) holds each request's arguments masked by its
        sensitive paths: masking them again changes nothing."""
        for column, value in seen.not_sealed:
            assert is_sealed(value) and key_id(value) == key.id, \
                f"{column} holds a value in clear: {value[:80]}"
        self._sealed_waiting = []
        for seq, approval_id, details, policy in seen.audited:
            self._sealed_seq = max(self._sealed_seq, seq)
            assert not is_sealed(details), f"audit entry {seq} is sealed"
            if approval_id is not None and policy is None:
                self._sealed_waiting.append((seq, approval_id, details, None))
                continue
            hidden = sensitive_of_snapshot(policy) if policy is not None else ()
            if not hidden:
                continue
            recorded = json.loads(details)
            for k in ("args", "edited_args", "previous_args", "original_args"):
                if k in recorded:
                    assert mask_args(recorded[k], hidden) == recorded[k], \
                        f"audit entry {seq} holds {k} unmasked: {recorded[k]}"
                    event("audit entry with masked arguments")

    def _check_window_and_identity(self, seen: Seen) -> None:
        """Issue 46 items 5 and 7: every collected call (an agent's first attempt at it, a
        caller's start, an MCP task's forward, a hook's allow) was collected on an approval
        before its request's window closed; every refund ran on the tool identity its
        request was made for."""
        lines = seen.lines
        last = {}
        for a in seen.asked:
            if a.kind == "tool_call":
                last[(a.run_id, a.call_id)] = a
        # an agent's calls: its first attempt's intent in the window
        for rec in seen.records.values():
            a = last.get((rec.run_id, rec.call_id))
            if a is None or rec.attempts != 1 or a.decided_via == "standing":
                continue
            assert a.status == "approved", f"{rec.idempotency_key} ran on a {a.status} request"
            assert rec.started_at < a.expires_at, \
                f"{rec.idempotency_key} collected at {rec.started_at}, window {a.expires_at}"
            event("agent call collected in its window")
        for rid, at in self.collected:  # a caller face's
            a = last.get((rid, CALL_ID))
            if a is None:
                continue  # answered by the policy at once: nobody's window
            assert a.status == "approved", f"{rid} collected on a {a.status} request"
            assert at < a.expires_at, f"{rid} collected at {at}, window {a.expires_at}"
            event("caller call collected in its window")
        for line in (e for e in lines if e["tool"] == "issue_refund"):
            key = line["idempotency_key"]
            a = last.get(tuple(key.split(":", 1)))  # type: ignore[arg-type]
            if a is None or a.tool_version is None:
                continue
            ran = self.versions[self.ran_on.get(key, "1")]
            assert a.tool_version == ran, \
                f"{key} approved for tool version {a.tool_version}, ran on {ran}"
            event("refund ran on the tool it was approved for")

    def _check_policies(self, seen: Seen) -> None:
        agent_tool = self.engine.agent("demo-refund").tool("issue_refund")
        rows = [(a, seen.runs.get(a.run_id)) for a in seen.asked]
        ran = {run_id for run_id, call_id in seen.request_calls if call_id == CALL_ID}
        by_id = {a.id: a for a, _ in rows}
        for a, run in rows:
            if a.kind != "tool_call":
                continue
            # the file in force when it was asked (an escalation: its first request's)
            first = a
            while first.supersedes is not None and first.supersedes in by_id:
                first = by_id[first.supersedes]
            pf = self.policy_at.setdefault(first.id, self.policy)
            source = Source.of_run(run.agent)
            operator = Intake(lambda pf=pf: pf, StaticDirectory(GROUPS)).resolve(
                source, a.tool, json.loads(first.args),
                declared=(agent_tool.policy, agent_tool.approval))
            assert a.requested_by == REQUESTER, f"{a.id}: requester {a.requested_by!r}"
            if a.decided_via == "standing" or operator.kind != "approve_before":
                continue  # (the standing check covers the first; the second: asked earlier)
            _no_looser(ApprovalPolicy.from_snapshot(a.policy), operator.approval, a.id)
            if source.kind != "agent":
                event(f"checked a {source.kind} request against the operator's policy")
        for run_id in ran:  # a caller's call ran: its request was approved, or the policy's
            last = [a for a, _ in rows if a.run_id == run_id]
            assert not last or last[-1].status == "approved", \
                f"{run_id} ran on a {last[-1].status} request"

    def _check_authority(self, seen: Seen) -> None:
        rows, tokens, in_force = seen.standing, seen.tokens, seen.in_force
        told = self.authority.replay(seen.entries)
        for s in rows:
            assert told.state.disagrees(s) is None, f"{s.id}: {told.state.disagrees(s)}"
        made = told.tokens
        assert set(tokens) <= made, f"tokens made unaudited: {tokens}"
        loaded = told.policies
        assert in_force is None or (loaded and loaded[-1] == in_force), (loaded, in_force)
        if in_force is not None:
            assert in_force == self.policy.digest

    def _happened(self, a: Any) -> bool:
        key = f"{a.run_id}:{a.call_id}"
        return self.ledger_path.exists() and key in self.ledger_path.read_text()

    async def _head(self) -> int:
        async def head(tx: Any) -> int:
            row = (await tx.audit.conn.execute(_HEAD_SEQ)).first()
            return 0 if row is None else int(row[0])
        return int(await Rows(self.committed).in_one_read(head))

    async def _entries_after(self, seq: int) -> list[Any]:
        async def after(tx: Any) -> list[Any]:  # (the new entries alone, not the whole log)
            return [AuditRecord(**r._mapping)
                    for r in await tx.audit.conn.execute(_ENTRIES_AFTER, {"seq": seq})]
        return list(await Rows(self.committed).in_one_read(after))

    def _check(self, seen: Seen) -> None:
        lines, entries, asked = seen.lines, seen.entries, seen.asked
        for name in ("issue_refund", "send_customer_email"):
            keys = [e["idempotency_key"] for e in lines if e["tool"] == name]
            assert len(keys) == len(set(keys)), f"{name} ran twice: {keys}"
        by_call: dict[tuple[str, str], list[Any]] = {}
        for a in asked:
            if a.kind == "tool_call":
                by_call.setdefault((a.run_id, a.call_id), []).append(a)
        votes = seen.votes
        standing = {f"standing:{x.id}": x for x in seen.standing}
        # who had granted a standing approval when it approved a request (grants only
        # grow, so today's list may name someone who granted after that use)
        by_standing = {a.id for rows in by_call.values() for a in rows
                       if a.decided_via == "standing"}
        granted_by = {e.approval_id: json.loads(e.details)["granted_by"]
                      for e in entries
                      if e.approval_id in by_standing and e.action == "approved"}
        records = seen.records
        executions = set(records)
        mine = set(self.runs)
        cannot = [a for a in asked if a.run_id in mine and a.kind == "cannot_run"]
        not_executed = {e.approval_id for e in entries
                        if e.run_id in mine and e.action == "not_executed"}
        for run_id, run in seen.runs.items():
            self.agents[run_id] = run.agent
        for rows in by_call.values():
            for a in rows:
                if a.status == "approved" and a.decided_via == "standing":
                    self._check_standing(a, standing.get(a.decided_by or ""),
                                         granted_by.get(a.id))
                elif a.status == "approved":
                    self._check_approved(a, votes[a.id])
                elif a.status == "redirected":
                    self._check_redirected(a, executions)
        for line in (e for e in lines if e["tool"] == "issue_refund"):
            run_id, call_id = line["idempotency_key"].split(":", 1)
            rows = by_call.get((run_id, call_id), [])
            if not rows:
                # a call asked for anew after a redirect is under today's policy file
                # (invariant 12): while it let refunds run without asking, this one did
                replanned = any(a.status == "redirected" for (r, _), asked in by_call.items()
                                if r == run_id for a in asked)
                assert replanned and self.ever_relaxed, \
                    f"refund {line['idempotency_key']} ran without any request"
                event("re-planned refund ran under a relaxed policy")
                continue
            last = rows[-1]  # later rungs replace earlier ones; only the last may run
            assert last.status == "approved", f"refund ran on a {last.status} request"
            assert line["args"] == last.effective_args()
            shown = json.dumps(line["args"], ensure_ascii=False)
            assert MASKED not in shown and "••••" not in shown, \
                f"refund {line['idempotency_key']} ran on a masked value: {shown}"
            assert call_digest("issue_refund", line["args"]) == last.effective_digest
        # no tool ever saw arguments its schema refuses (a deploy in between)
        for key, rec in records.items():
            assert rec.error_class != "ValidationError", f"{key} ran on refused arguments"
        ran = {tuple(e["idempotency_key"].split(":", 1)) for e in lines
               if e["tool"] == "issue_refund"}
        for q in cannot:  # an approved call the release could not run: never run after
            event(f"cannot_run {q.status}")
            if "changed since it was asked about" in json.loads(q.packet).get("reason", ""):
                event("cannot_run: the tool changed")
            asked = by_call.get((q.run_id, q.call_id), [])
            assert asked and asked[-1].status == "approved", f"{q.id} about a call not approved"
            assert asked[-1].id in not_executed, f"{q.id}: no not_executed audit entry"
            if (q.run_id, q.call_id) not in executions:
                assert (q.run_id, q.call_id) not in ran, f"{q.id}'s call ran"
        if any(e["tool"] == "issue_refund" for e in lines):
            event("refund executed")

    def _check_redirected(self, a: Any, executions: set[tuple[str, str]]) -> None:
        event("redirected")
        assert (a.run_id, a.call_id) not in executions, f"redirected {a.id} has an execution"
        assert a.verdict == "redirect" and (a.reason or "").strip(), a
        assert a.decided_at is not None and a.decided_at < a.expires_at, \
            f"{a.id} redirected at {a.decided_at}, expiry {a.expires_at}"
        assert a.decided_by != a.requested_by
        approvers = a.approvers_value()
        if approvers:
            allowed = set(approvers) | {m for g in approvers for m in GROUPS.get(g, [])}
            assert a.decided_by in allowed, f"{a.id}: {a.decided_by} is not an approver"

    def _check_standing(self, a: Any, s: Any, grants: list[str] | None) -> None:
        """A request a standing approval approved: it was live when used (enough distinct
        grants by authorised approvers, none the requester; within its window; not yet
        revoked), of the same band, and its scope covers the exact arguments. ``grants``:
        the granters when it was used, as its audit entry tells."""
        event("approved by a standing approval")
        assert s is not None, f"{a.id} names {a.decided_by}, which does not exist"
        assert a.decided_at is not None and a.decided_at < s.expires_at, \
            f"{a.id} used {s.id} at {a.decided_at}, after its window ({s.expires_at})"
        assert s.revoked_at is None or a.decided_at <= s.revoked_at, \
            f"{a.id} used {s.id} at {a.decided_at}, after its revocation ({s.revoked_at})"
        assert grants is not None, f"{a.id}: no audit entry of its approval"
        assert grants == s.grants_value()[:len(grants)], \
            f"{a.id}: granters at use {grants}, now {s.grants_value()}: grants only grow"
        if len(grants) < len(s.grants_value()):
            event("standing granted again after a use")
        assert len(set(grants)) == len(grants) and a.approve_count == len(grants)
        assert len(grants) >= s.quorum == a.quorum
        assert REQUESTER not in grants
        approvers = s.approvers_value()
        if approvers:
            allowed = set(approvers) | {m for g in approvers for m in GROUPS.get(g, [])}
            assert set(grants) <= allowed, f"{s.id}: {set(grants) - allowed} not approvers"
        assert sorted(approvers) == sorted(a.approvers_value())
        assert ApprovalPolicy.from_snapshot(a.policy).rule == s.rule
        assert Scope.model_validate_json(s.scope).covers(a.tool, a.effective_args())
        run_agent = self.agents[a.run_id]
        assert s.subject == Source.of_run(run_agent).subject(a.tool), \
            f"{a.id} of {run_agent} ran on {s.id}, granted for {s.subject}"
        if not s.subject.startswith("agent:"):
            event("a caller's call approved by a standing approval")

    def _check_approved(self, a: Any, votes: list[Any]) -> None:
        assert a.decided_at is not None and a.decided_at < a.expires_at, \
            f"{a.id} approved at {a.decided_at}, expiry {a.expires_at}"
        voters = {v.actor for v in votes
                  if v.verdict == "approve" and v.digest == a.effective_digest}
        assert len(voters) >= a.quorum, f"{a.id}: {voters} on {a.effective_digest[:8]}"
        assert a.requested_by not in voters
        policy = ApprovalPolicy.from_snapshot(a.policy)
        if policy.edits == "propose" and a.edited_by:  # the proposer never counts
            assert len(voters - {a.edited_by}) >= a.quorum, \
                f"{a.id}: {voters} approved {a.edited_by}'s proposal"
        approvers = a.approvers_value()
        if approvers:
            allowed = set(approvers) | {m for g in approvers for m in GROUPS.get(g, [])}
            assert voters <= allowed, f"{a.id}: {voters - allowed} are not approvers"


def _commits_without_fsync(db: Database) -> None:
    """``db``'s SQLite commits wait for no fsync (``synchronous=NORMAL``, in WAL mode: a
    commit survives the process dying, as every crash this test makes is, and only a
    power loss could undo it), as the session's PostgreSQL database commits without
    waiting for its WAL flush (tests/conftest.py). Under load a commit waited about
    2.7 ms for the disk, not 0.03, and a schedule commits about 40 times."""

    @sa_event.listens_for(db.engine.sync_engine, "connect")
    def _no_fsync(dbapi_conn: Any, _record: Any) -> None:  # after the runtime's own pragmas
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.close()


class Authority:
    """What the audit chain says of authority, replayed entry by entry: standing approvals
    granted and revoked, tokens made, policy files loaded (in order). The chain only
    grows, so each step replays only the entries after those replayed before."""

    def __init__(self) -> None:
        self.state = StandingState()
        self.tokens: set[str] = set()
        self.policies: list[str] = []
        self.replayed = 0

    def replay(self, entries: list[Any]) -> Authority:
        for e in entries[self.replayed:]:
            self.state.apply(e.action, json.loads(e.details), e.at)
            if e.action == "token_created":
                self.tokens.add(json.loads(e.details)["token"])
            elif e.action == "policy_loaded":
                self.policies.append(json.loads(e.details)["digest"])
        self.replayed = len(entries)
        return self


class _Upstream:
    """The MCP server behind the model's gateway: a forwarded call is a collection, noted
    with the time it happened."""

    def __init__(self, machine: GateMachine, rid: str) -> None:
        self.machine, self.rid = machine, rid

    def forward(self, tool: str) -> Any:
        async def call(args: dict[str, Any]) -> Ran[Any]:
            assert self.rid, "a gateway's call ran without a task poll collecting it"
            self.machine.collected.append((self.rid, self.machine.clock.now()))
            event("task ran its approved call")
            result = mcp_types.CallToolResult(
                content=[mcp_types.TextContent(type="text", text="ok")])
            return Ran(result, "succeeded", result.model_dump(mode="json", exclude_none=True))
        return call

    def identify(self, tool: str) -> Any:
        async def identify() -> ToolIdentity:  # the model's upstream never changes a tool
            return ToolIdentity("mcp:model", "model")
        return identify


def _no_looser(stored: ApprovalPolicy, operator: ApprovalPolicy, where: str) -> None:
    """``stored`` is at most as permissive as ``operator`` (see the module docstring)."""
    if operator.approvers:
        allowed = set(operator.approvers) | {m for g in operator.approvers
                                             for m in GROUPS.get(g, [])}
        assert set(stored.approvers) <= allowed, \
            f"{where}: approvers {stored.approvers} beyond the operator's {operator.approvers}"
    assert stored.quorum >= operator.quorum, f"{where}: quorum {stored.quorum} < operator's"
    assert stored.ttl <= operator.ttl, f"{where}: waits {stored.ttl}, longer than allowed"
    assert operator.allow_self_approval or not stored.allow_self_approval, where
    assert (stored.on_expire, stored.escalate) == (operator.on_expire, operator.escalate), \
        f"{where}: a ladder the operator did not set"
    assert stored.max_standing <= operator.max_standing, where
    assert operator.edits == "approve" or stored.edits == "propose", where
    assert set(operator.sensitive) <= set(stored.sensitive), \
        f"{where}: shows {operator.sensitive} the operator made sensitive"


async def _cancel_at(steps: int, work: Any) -> bool:
    """Run coroutine ``work`` and cancel it at its ``steps``-th suspension unless it ended
    first; whether it ended by itself (a refusal counts: the gate said no).

    The coroutine is stepped here rather than by a task, and each suspension is waited
    out before the next step: the ``CancelledError`` lands at that await as soon as what
    it awaited is done. So where it lands depends only on the code path, never on how
    soon a driver thread or the server answered, and a schedule replayed by hypothesis
    cuts at the same point (cancelling a task after N event-loop turns did not: one
    random-seed run in ~50 stopped with ``FlakyStrategyDefinition``). What it gives up:
    a cancel while a statement is in flight, which ``test_db_cancel.py`` covers."""
    for step in range(10**6):
        try:
            if step == steps:
                awaited = work.throw(asyncio.CancelledError())
            else:
                awaited = work.send(None)
        except StopIteration:
            return True
        except asyncio.CancelledError:
            return False
        except ApprovaldError:
            return True
        if awaited is None:  # a bare yield: asyncio.sleep(0)
            await asyncio.sleep(0)
        else:  # a future: wait for it as the task would, without taking its outcome
            awaited._asyncio_future_blocking = False
            await asyncio.wait([awaited])
    raise AssertionError("the work never ended")


def _profile(name: str) -> settings:
    # the ci profile runs one fixed set of schedules (derandomized): the coverage checks
    # below then ask the same question of every CI run instead of a lucky or unlucky seed
    return settings(settings.get_profile(name), stateful_step_count=30, deadline=None,
                    derandomize=name == "ci",
                    suppress_health_check=[HealthCheck.too_slow,
                                           HealthCheck.filter_too_much,
                                           HealthCheck.data_too_large])


_APPROVALS = Approval.__table__
_AUDIT = AuditEntry.__table__
# the columns stored sealed, grouped by table (sealed_columns() lists them in schema order)
_SEALED_BY_TABLE: list[list[Any]] = []
for _table, _col in sealed_columns():
    assert isinstance(_col.type, SealedText)
    if _col.type.sealed:
        if _SEALED_BY_TABLE and _SEALED_BY_TABLE[-1][0].table is _table:
            _SEALED_BY_TABLE[-1].append(_col)
        else:
            _SEALED_BY_TABLE.append([_col])

def _sealed_under(value: Any, key: DataKey) -> Any:
    """SQL: ``value`` is sealed under ``key``, exactly as ``is_sealed(value) and
    key_id(value) == key.id`` says in Python: it starts with the prefix and the key's id
    and a colon (a key id is hex: no colon in it, and the prefix's remainder up to the
    first colon is the id) and ends with the suffix (no overlap: the prefix and id end
    in a colon, the suffix starts with a quote). The start is compared by ``=`` (exact
    in both dialects; SQLite's LIKE ignores case), the end by LIKE (no letter in it, no
    wildcard in the pattern)."""
    start = f"{PREFIX}{key.id}:"
    assert "%" not in start + SUFFIX and "_" not in start + SUFFIX
    return and_(func.substr(value, 1, len(start)) == start,
                value.like(f"{start}%{SUFFIX}"))


@functools.cache
def _not_sealed_under(key: DataKey) -> Any:
    """One statement: each value of a sealed column not sealed under ``key``, with its
    column's name (built once: built after every step, it was most of the check's time;
    run by its plan, ``store/fastsql.py``)."""
    parts = []
    for cols in _SEALED_BY_TABLE:
        for c in cols:
            raw = type_coerce(c, Text)
            parts.append(select(literal(c.type.column, Text).label("col"), raw.label("value"))
                         .where(raw.is_not(None), not_(_sealed_under(raw, key))))
    return fastsql.fast(union_all(*parts))


# the audit entries past a seq, each with its request's policy (see _sealed_in), run by
# its plan
_AUDIT_AFTER = fastsql.fast(
    select(_AUDIT.c.seq, _AUDIT.c.approval_id, type_coerce(_AUDIT.c.details, Text),
           _APPROVALS.c.policy)
    .select_from(_AUDIT.outerjoin(_APPROVALS, _APPROVALS.c.id == _AUDIT.c.approval_id))
    .where(_AUDIT.c.seq > bindparam("seq")))


# the API tokens' names and the digest of the policy in force, in one statement; the
# chain's head; the entries past a seq (a decision's): each run by its plan
_TOKENS, _IN_FORCE = ApiToken.__table__, PolicyInForce.__table__
_AUTHORITY = fastsql.fast(union_all(
    select(literal("token", Text).label("kind"), _TOKENS.c.name.label("value")),
    select(literal("policy", Text), _IN_FORCE.c.digest).where(_IN_FORCE.c.id == 1)))
_HEAD_SEQ = fastsql.fast(select(AuditHead.__table__.c.seq))
_ENTRIES_AFTER = fastsql.fast(select(_AUDIT).where(_AUDIT.c.seq > bindparam("seq"))
                              .order_by(_AUDIT.c.seq))


SEALED_SHARE = 4  # the sealed run takes one schedule in this many: its own question only


def _machine(db_url: str, tmp_path: Path, sqlite_template: Path) -> type[GateMachine]:
    """The machine a test runs: each schedule on a database of its own, begun as the
    first schedule's (``Start``). Its class body's source, as it is written here, seeds
    the fixed schedules: a change to it (its indentation included) moves them."""
    counter = iter(range(10**9))
    start = Start(sqlite_template, tmp_path)

    def fresh_url() -> str:
        if db_url.startswith("sqlite"):
            path = tmp_path / f"model-{next(counter)}.db"
            shutil.copy(start.sqlite, path)
            return f"sqlite+aiosqlite:///{path}"
        asyncio.run(_truncate(db_url, start.pg))
        return db_url

    class Machine(GateMachine):
        make_url = staticmethod(fresh_url)
        workdir = tmp_path

    Machine.start = start
    return Machine


# the sealed case runs a quarter of the schedules: a shorter limit than the module's, which
# also orders it after both clear cases (tests/conftest.py runs the longest limits first), so
# the two xdist workers start the two longest cases, SQLite's and PostgreSQL's, at once
@pytest.mark.parametrize("sealed", [False, pytest.param(True, marks=pytest.mark.timeout(600))],
                         ids=["clear", "sealed"])
def test_the_gate_holds_under_random_interleavings(db_url: str, tmp_path: Path,
                                                   sqlite_template: Path, sealed: bool,
                                                   request: pytest.FixtureRequest) -> None:
    """``sealed``: under a data key (fewer schedules: what it adds is the invariant that
    nothing sensitive is stored in clear; the rest is the clear run's to cover)."""
    key = DataKey("model-data-key-0123456789") if sealed else None
    types.set_codec(Sealer([key]) if key is not None else None)
    Machine = _machine(db_url, tmp_path, sqlite_template)
    Machine.data_key = key  # (not in the class body: its source seeds the fixed schedules)

    profile = request.config.getoption("hypothesis_profile", None) or "ci"
    STATS.clear()
    chosen = _profile(profile)
    if sealed:
        chosen = settings(chosen, max_examples=max(1, chosen.max_examples // SEALED_SHARE))
    run_state_machine_as_test(Machine, settings=chosen)
    print(f"\n{db_url.split(':')[0]}: {STATS['schedules']} schedules, zero violations; "
          + ", ".join(f"{k}: {v}" for k, v in sorted(STATS.items())))
    if sealed:
        assert STATS["audit entry with masked arguments"] > 0
        assert STATS["refund executed"] > 0 and STATS["edit of a masked view"] > 0
        assert STATS["approved by a standing approval"] > 0
        return
    # the schedules must reach the states the invariants are about
    assert STATS["refund executed"] > 0 and STATS["decision accepted: edit"] > 0
    assert STATS["edit of a masked view"] > 0
    assert STATS["decision accepted: redirect"] > 0 and STATS["redirected"] > 0
    assert STATS["decision refused: guidance_required"] > 0
    assert STATS["standing granted"] > 0 and STATS["standing revoked"] > 0
    assert STATS["approved by a standing approval"] > 0
    for reason in ("expired", "stale_card", "not_authorized", "self_approval", "not_pending"):
        assert STATS[f"decision refused: {reason}"] > 0, reason
    assert sum(v for k, v in STATS.items() if k.startswith("crashed")) > 0
    assert STATS["cut off: decide"] > 0 and STATS["cut off: advance"] > 0
    for source in ("api", "mcp", "adapter"):
        assert STATS[f"checked a {source} request against the operator's policy"] > 0, source
    assert STATS["caller refused: looser_than_policy"] > 0
    assert STATS["caller ran an approved call"] > 0
    assert STATS["cannot_run pending"] > 0
    # issue 46 items 5 and 7: every face's collection, in its window and after it
    assert STATS["hook allowed"] > 0 and STATS["task ran its approved call"] > 0
    assert STATS["collection refused: window closed"] > 0
    assert STATS["caller call collected in its window"] > 0
    assert STATS["cannot_run: the tool changed"] > 0


def test_a_schedule_builds_no_release_and_makes_no_credential_the_first_made(
        db_url: str, tmp_path: Path, sqlite_template: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """What every schedule would make alike is made once a test (``Releases``, ``Start``):
    over five schedules, each deploying releases and restarting "processes", the refund
    agent is built once and the faces' credentials made once, and each later schedule's
    requests are made under them (its database began as the first one's)."""
    built: list[Any] = []
    made: list[Any] = []

    def counted_agent(ledger: DemoLedger) -> Agent:
        built.append(ledger)
        return build(ledger)

    async def counted_credentials(self: GateMachine) -> dict[str, Any]:
        made.append(self)
        return await credentials(self)

    def counted_tool(*args: Any, **kwargs: Any) -> Tool:
        tools.append(args[0])
        return make_tool(*args, **kwargs)

    def counted_engine(self: GateMachine) -> Engine:
        engines.append(self.release)
        return engine(self)

    engines: list[str] = []
    tools: list[Any] = []  # the tools a release other than 1 wraps
    build, make_tool = refund_agent, Tool
    credentials, engine = GateMachine._credentials, GateMachine._engine
    monkeypatch.setattr(sys.modules[__name__], "Tool", counted_tool)
    monkeypatch.setattr(sys.modules[__name__], "refund_agent", counted_agent)
    monkeypatch.setattr(GateMachine, "_credentials", counted_credentials)
    monkeypatch.setattr(GateMachine, "_engine", counted_engine)
    Pinned = _machine(db_url, tmp_path, sqlite_template)
    STATS.clear()
    run_state_machine_as_test(Pinned, settings=settings(_profile("ci"), max_examples=5))
    assert STATS["schedules"] == 5
    assert len(built) == 1 and len(made) == 1, (len(built), len(made))
    # processes came and went, releases other than 1 loaded again, and each of them
    # wrapped its refund tool once
    others = [r for r in engines if r != "1"]
    assert len(engines) > 5 and len(others) > len(set(others)), engines
    assert len(tools) == len(set(others)), (len(tools), engines)
    assert any(k.startswith("caller asked") for k in STATS), STATS  # (under the credentials)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("sealed", [False, True], ids=["clear", "sealed"])
def test_a_steps_invariants_read_the_record_in_one_snapshot_of_at_most_11_statements(
        db_url: str, tmp_path: Path, sqlite_template: Path, sealed: bool,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """After every step the invariants read the record once (``_read_in``): one
    transaction of at most 11 statements, BEGIN and COMMIT included (the votes and the
    standing approvals are the ones the chain's check compared; the tokens and the policy
    in force one statement); under a data key 13, the sealed columns and the new audit
    entries read in the same transaction. Every statement SQLite runs is counted (its
    trace), whichever path sent it; a connection's opening PRAGMAs are not the read's."""
    key = DataKey("model-data-key-0123456789") if sealed else None
    types.set_codec(Sealer([key]) if key is not None else None)
    reads: list[list[str]] = []
    checking = [False]
    connect = sqlite3.connect

    def traced(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        conn = connect(*args, **kwargs)
        conn.set_trace_callback(
            lambda sql: reads[-1].append(sql) if checking[0] and not sql.startswith("PRAGMA")
            else None)
        return conn

    def counted(self: GateMachine, *args: Any, **kwargs: Any) -> None:
        reads.append([])
        checking[0] = True
        try:
            check(self, *args, **kwargs)
        finally:
            checking[0] = False

    check = GateMachine.check_invariants
    monkeypatch.setattr(sqlite3, "connect", traced)
    monkeypatch.setattr(GateMachine, "check_invariants", counted)
    Pinned = _machine(db_url, tmp_path, sqlite_template)
    Pinned.data_key = key
    STATS.clear()
    run_state_machine_as_test(Pinned, settings=settings(_profile("ci"), max_examples=3))
    assert STATS["schedules"] == 3
    read = [r for r in reads if r]
    assert len(read) > 20, len(read)
    for statements in read:
        assert statements[0].startswith("BEGIN") and statements[-1] == "COMMIT", statements
        assert sum(s.startswith(("BEGIN", "COMMIT")) for s in statements) == 2, statements
    assert max(len(r) for r in read) == (13 if sealed else 11), Counter(len(r) for r in read)


async def _settle(tasks: list[asyncio.Task[Any]]) -> None:
    await asyncio.gather(*tasks, return_exceptions=True)


async def _truncate(url: str, kept: Kept | None) -> None:
    await reset_pg(url, kept)
