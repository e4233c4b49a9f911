"""Why each statement taken off an approval's path (issue 50) was not needed: a test per
statement, each of which fails if what the statement did is left undone.

:mod:`tests.unit.test_click_statements` counts what the path sends; these show that what
it no longer sends was redundant, for a click decided in another process than the one
that made the request (the case a shared per-process memory could get wrong).
"""

from __future__ import annotations

import collections
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from approvald.runtime.approvals.decide import Actor
from approvald.runtime.engine import Engine, assemble
from approvald.runtime.kernel.clock import ManualClock
from approvald.runtime.kernel.outcomes import Busy, Completed, Paused
from approvald.runtime.models.scripted import ScriptedModel, reply
from approvald.runtime.policies.tools import ToolContext, tool
from approvald.runtime.runs.agent import Agent, Registry
from approvald.store.db import Database
from approvald.store.models import Run
from approvald.store.repos import Tx
from sqlalchemy.exc import IntegrityError

from tests.conftest import SIGNER
from tests.helpers import Rows, parts
from tests.unit.test_decisions import card_token
from tests.unit.test_intake_statements import statements  # noqa: F401  (a fixture)

# declared sensitive, and shaped like nothing a detector knows: only the declaration masks it
VAULT = "hunter2-Zq81xLw-vault"


@tool(permission="execute", sensitive=["secret"])
async def pay(ctx: ToolContext, service: str, secret: str) -> str:
    """Pay for a service with a vault secret (declared sensitive)."""
    return f"paid for {service}"


def _agent() -> Agent:
    return Agent(name="payer", instructions="", tools=[pay],
                 model=ScriptedModel.sequence([
                     reply("paying", ("pay", {"service": "web", "secret": VAULT})),
                     reply("done", turn=1)]))


def _engine(db: Database) -> Engine:
    """An engine of its own: a process with nothing in memory about any request."""
    return assemble(db, Registry([_agent()]), signer=SIGNER)


async def test_a_request_decided_in_another_process_is_audited_masked_unread(
        db: Database, statements) -> None:  # noqa: F811
    """The decision's audit entries mask the call's declared paths with no read of the
    request's policy (``SELECT approvals.id, approvals.policy``): the decision holds the
    request's row, locked, and tells the trail its paths; the run's later entries (the
    call executed) are masked from the same."""
    maker = _engine(db)
    paused = await maker.run("payer", "pay for web", requested_by="U_DANA")
    assert isinstance(paused, Paused)
    clicker = _engine(db)  # another serve: its trail has never seen this request
    a = await parts(clicker).decider.get(paused.approval_ids[0])
    window = statements.during()
    await clicker.decide(a.id, actor=Actor("U_ALICE", "slack"), verdict="approve",
                         token=card_token(a))
    assert isinstance(await clicker.advance(a.run_id), Completed)
    assert not [s for s in window.sent if s.startswith("SELECT approvals.id, approvals.policy ")
                ], window.sent
    entries = await Rows(db).audit(run_id=a.run_id)
    shown = [e for e in entries if e.action in ("approved", "executed")]
    assert {e.action for e in shown} == {"approved", "executed"}, [e.action for e in entries]
    for e in shown:
        details: dict[str, Any] = json.loads(e.details)
        assert VAULT[:8] not in e.details, e.details
        assert details["args"]["service"] == "web", details


async def _leased_run(db: Database, owner: str) -> str:
    """A run (paused on its request) leased to ``owner`` for a minute."""
    paused = await _engine(db).run("payer", "pay for web", requested_by="U_DANA")
    runs = Run.__table__
    await Rows(db).forge(runs, runs.c.id == paused.run_id, lease_owner=owner,
                         lease_expires_at=datetime.now(UTC) + timedelta(minutes=1))
    return paused.run_id


async def _intent(db: Database, run_id: str, owner: str, call_id: str = "call_9") -> bool | None:
    now = datetime.now(UTC)
    async with db.write_one() as tx:
        return await tx.executions.intent_under_lease(
            run_id=run_id, call_id=call_id, step=1, tool="pay", digest="d" * 64, now=now,
            owner=owner, until=now + timedelta(minutes=10), journal='{"reply": 1}',
            sensitive=None)


async def test_the_intent_and_the_lease_renewal_are_one_write_that_holds_both_or_neither(
        db: Database, statements) -> None:  # noqa: F811
    """The approved call's intent used to be a transaction of four statements (BEGIN, the
    lease renewed, the intent, COMMIT); on PostgreSQL it is one statement in autocommit.
    What the renewal was for still holds: a worker whose lease was taken over writes no
    intent (so never starts the call), and one that holds it renews it, journals the
    step's reply and writes the intent, all or nothing; an intent already there is not
    written twice, and says so."""
    run_id = await _leased_run(db, "worker-a/1")
    assert await _intent(db, run_id, "worker-b/1") is None  # not b's lease: nothing written
    run = await Rows(db).run(run_id)
    assert await Rows(db).execution(run_id, "call_9") is None
    assert run is not None and run.lease_owner == "worker-a/1" and run.inflight is None
    before = run.lease_expires_at
    window = statements.during()
    assert await _intent(db, run_id, "worker-a/1") is True
    if db.dialect == "postgresql":
        assert window.kinds() == collections.Counter({"WITH": 1}), window.sent
    run, started = await Rows(db).run(run_id), await Rows(db).execution(run_id, "call_9")
    assert started is not None and started.status == "started" \
        and started.owner == "worker-a/1" and started.args_digest == "d" * 64
    assert run is not None and run.inflight == '{"reply": 1}'
    assert run.lease_expires_at is not None and before is not None \
        and run.lease_expires_at > before
    assert await _intent(db, run_id, "worker-a/1") is False  # already there: not again


async def _last_step(db: Database, run_id: str, owner: str, first_seq: int) -> Any:
    now = datetime.now(UTC)
    async with db.write_one() as tx:
        return await tx.runs.checkpoint_with_events(
            run_id, owner=owner, first_seq=first_seq, step=2,
            events=[(1, '{"role": "assistant", "content": "done"}')], status="completed",
            now=now, lease_until=None, release=True, result="done")


async def test_the_last_step_is_one_write_of_its_events_and_the_run_under_the_lease(
        db: Database, statements) -> None:  # noqa: F811
    """A run's last step (the model's final reply) used to be a transaction of four
    statements (BEGIN, its events, the run row completed, COMMIT); on PostgreSQL it is
    one statement in autocommit, the events inserted from the row the fenced UPDATE
    returned. What the transaction was for still holds: a worker whose lease was taken
    over writes neither the events nor the run (the run is not completed by it), and
    an event that cannot be written (its place in the transcript taken) leaves the run
    as it was: both or neither."""
    run_id = await _leased_run(db, "worker-a/1")
    run = await Rows(db).run(run_id)
    assert run is not None
    seq = run.next_seq

    async def transcript() -> int:
        return len(await Rows(db).events(run_id))

    events_before = await transcript()
    assert await _last_step(db, run_id, "worker-b/1", seq) is None  # not b's lease
    after = await Rows(db).run(run_id)
    assert after.status == run.status and after.lease_owner == "worker-a/1" \
        and after.next_seq == seq and after.result is None
    assert await transcript() == events_before

    from approvald.store.models import RunEvent

    await Rows(db).insert(RunEvent.__table__, [  # the transcript's next place taken
        {"run_id": run_id, "seq": seq, "step": 2, "v": 1,
         "body": '{"role": "user", "content": "x"}'}])
    with pytest.raises(IntegrityError):
        await _last_step(db, run_id, "worker-a/1", seq)
    after = await Rows(db).run(run_id)
    assert after.status == run.status and after.lease_owner == "worker-a/1" \
        and after.next_seq == seq, after

    window = statements.during()
    req = await _last_step(db, run_id, "worker-a/1", seq + 1)
    assert req is not None and not req.requested
    if db.dialect == "postgresql":
        assert window.kinds() == collections.Counter({"WITH": 1}), window.sent
    done = await Rows(db).run(run_id)
    assert done.status == "completed" and done.result == "done" \
        and done.lease_owner is None and done.next_seq == seq + 2 and done.step == 2
    assert await transcript() == events_before + 2


def _run_reads(sent: list[str]) -> list[str]:
    """Reads of a whole run row (``RunsRepo.get``), not the decision's lock of its id."""
    return [s for s in sent if s.startswith("SELECT runs.id, runs.agent")]


async def test_a_decided_run_starts_from_the_row_its_decision_leased_while_it_is_fresh(
        db: Database, statements) -> None:  # noqa: F811
    """The worker that takes a run decided in its process used to read the run before
    resuming it; the decision's lease statement returns the row, and the runner starts
    from it (runtime.kernel.handoff). Only while it can be the run as it stands: once half a
    lease has passed, the lease may have lapsed and another worker taken and finished the
    run, and the row is read again, so the late worker finds the run is not its own (it
    does not try to drive a finished run from a stale row)."""
    clock = ManualClock()
    calls: list[str] = []

    @tool(permission="execute")
    async def deploy(ctx: ToolContext, service: str) -> str:
        """Deploy a service."""
        calls.append(ctx.run_id)
        return f"deployed {service}"

    def engine() -> Engine:
        return assemble(db, Registry([Agent(
            name="deployer", instructions="", tools=[deploy],
            model=ScriptedModel.sequence([reply("deploying", ("deploy", {"service": "web"})),
                                          reply("done", turn=1)]))]),
            signer=SIGNER, clock=clock)

    here, elsewhere = engine(), engine()
    taken: list[tuple[str, str]] = []
    parts(here).signals.take_decided(lambda run_id, claim: taken.append((run_id, claim)))

    async def decided() -> tuple[str, str]:
        paused = await here.run("deployer", "deploy web", requested_by="U_DANA")
        a = await parts(here).decider.get(paused.approval_ids[0])
        await here.decide(a.id, actor=Actor("U_ALICE", "slack"), verdict="approve",
                          token=card_token(a))
        return taken.pop()

    await decided()  # connections opened, plans made
    run_id, claim = await decided()
    window = statements.during()
    assert isinstance(await parts(here).runner.advance(run_id, claim=claim), Completed)
    assert _run_reads(window.sent) == [] and calls[-1] == run_id, window.sent

    run_id, claim = await decided()
    clock.advance(parts(here).runner.lease_ttl * 2)  # the lease lapsed before the worker got to it
    assert isinstance(await elsewhere.advance(run_id), Completed)
    window = statements.during()
    late = await parts(here).runner.advance(run_id, claim=claim)
    assert _run_reads(window.sent), window.sent  # stale: read again
    assert late.status == "completed" and not isinstance(late, Busy), late
    assert calls.count(run_id) == 1


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)  # SQLite locks the file
async def test_the_decisions_one_locking_read_holds_the_run_and_then_the_request(
        db: Database) -> None:
    """The decision used to lock the run's row, then read and lock the request's: on
    PostgreSQL one statement now (``ApprovalsRepo.lock_in_run``). Both rows are still
    held until the decision ends: a writer of either (an expiry sweep, a cancel, another
    decision) waits for it, so what the decision read is what it decides on. The rows
    are tried from another connection with NOWAIT while the decision's transaction is
    open."""
    paused = await _engine(db).run("payer", "pay for web", requested_by="U_DANA")
    import asyncpg  # type: ignore[import-untyped]

    other = await asyncpg.connect(db.url.set(drivername="postgresql")
                                  .render_as_string(hide_password=False))
    aid = paused.approval_ids[0]

    async def decision(tx: Tx) -> None:  # while it is open, the two rows are tried
        a = await tx.approvals.lock_in_run(aid, paused.run_id)
        assert a is not None and a.id == aid and a.status == "pending"
        for table, key in (("runs", paused.run_id), ("approvals", aid)):
            with pytest.raises(asyncpg.exceptions.LockNotAvailableError):
                await other.execute(f"SELECT 1 FROM {table} WHERE id = $1 "
                                    "FOR UPDATE NOWAIT", key)

    try:
        await db.transact(decision, attempts=1)
        for table, key in (("runs", paused.run_id), ("approvals", aid)):  # let go at the end
            async with other.transaction():
                await other.execute(f"SELECT 1 FROM {table} WHERE id = $1 "
                                    "FOR UPDATE NOWAIT", key)
    finally:
        await other.close()


async def test_a_cards_redraw_reads_its_request_thread_and_standing_grants_in_one_statement(
        make_engine, db: Database, ledger_path, statements) -> None:  # noqa: F811
    """A card's redraw (the outbox drain's, after a decision) used to read the request,
    then its run's thread, then the standing approvals proposed on it: one statement now
    (``ApprovalsRepo.card``), the standing approvals read only when one was proposed.
    What the reads were for still shows: the thread where the run's replies go, as it
    stands at each redraw (none before its parent is posted; moved when re-posted), and a
    standing approval granted on the request, told on its card."""
    from approvald.runtime.policies.scope import scope_for
    from approvald.store.models import RunThread

    from tests.unit.test_decisions import ALICE, engine_with
    from tests.unit.test_standing import UP_TO_50, start

    engine = engine_with(make_engine, ledger_path)
    paused = await start(engine, "$30")
    assert isinstance(paused, Paused)
    aid = paused.approval_ids[0]
    window = statements.during()
    view = await engine.views.card(aid)
    assert view is not None and view.approval.id == aid and view.thread is None
    assert view.standing == ()
    assert len(window.sent) == 1 and window.sent[0].startswith("SELECT approvals.id, ") \
        and "JOIN run_threads" in window.sent[0], window.sent

    threads = RunThread.__table__
    await Rows(db).insert(threads, [{"run_id": paused.run_id, "channel": "C_OPS", "ts": None,
                                     "posted_status": "running"}])
    view = await engine.views.card(aid)
    assert view is not None and view.thread is None  # its parent not posted yet
    await Rows(db).forge(threads, threads.c.run_id == paused.run_id, ts="111.1")
    view = await engine.views.card(aid)
    assert view is not None and view.thread == ("C_OPS", "111.1")
    await Rows(db).forge(threads, threads.c.run_id == paused.run_id, ts="222.2")  # re-posted
    view = await engine.views.card(aid)
    assert view is not None and view.thread == ("C_OPS", "222.2")

    a = await engine.views.approval(aid)
    assert a is not None
    standing, _ = await engine.grant_standing(
        aid, actor=ALICE, window=timedelta(minutes=30),
        scope=scope_for(a, "condition", when=UP_TO_50))
    view = await engine.views.card(aid)
    assert view is not None and [s.id for s in view.standing] == [standing.id]
    assert view.approval.status == "approved" and view.thread == ("C_OPS", "222.2")


async def test_the_vote_and_the_decision_it_makes_are_one_write_that_holds_both_or_neither(
        db: Database, statements) -> None:  # noqa: F811
    """A one-approver decision used to insert the vote, then compare-and-set the request:
    on PostgreSQL one statement now (``ApprovalsRepo.vote_and_transition``), the request
    changed only if the vote was new. What the two did still holds: a person whose vote
    on these arguments is already recorded changes nothing (refused, the request still
    pending, no second vote); a new vote decides, and is recorded with the decision."""
    from approvald.runtime.kernel.errors import DecisionRefused

    maker = _engine(db)
    paused = await maker.run("payer", "pay for web", requested_by="U_DANA")
    assert isinstance(paused, Paused)
    a = await parts(maker).decider.get(paused.approval_ids[0])
    from approvald.store.models import ApprovalVote

    await Rows(db).insert(ApprovalVote.__table__, [  # left behind the runtime's back
        {"approval_id": a.id, "actor": "U_ALICE", "verdict": "approve",
         "digest": a.effective_digest, "via": "slack", "at": datetime.now(UTC)}])
    clicker = _engine(db)
    with pytest.raises(DecisionRefused) as refused:
        await clicker.decide(a.id, actor=Actor("U_ALICE", "slack"), verdict="approve",
                             token=card_token(a))
    assert refused.value.reason == "already_voted"
    still = await parts(clicker).decider.get(a.id)
    assert still.status == "pending" and still.decided_by is None
    assert [v.actor for v in await Rows(db).votes(a.id)] == ["U_ALICE"]

    window = statements.during()
    decision = await clicker.decide(a.id, actor=Actor("U_BOB", "slack"), verdict="approve",
                                    token=card_token(a))
    assert decision.outcome == "approved" and decision.approval.decided_by == "U_BOB"
    assert decision.approval.approve_count == 1
    if db.dialect == "postgresql":
        assert not [s for s in window.sent if s.startswith(("INSERT INTO approval_votes",
                                                            "UPDATE approvals"))], window.sent
    assert sorted(v.actor for v in await Rows(db).votes(a.id)) == ["U_ALICE", "U_BOB"]


async def test_a_click_by_a_named_approver_locks_its_request_unread_and_a_group_is_looked_up_first(
        make_engine, db: Database, ledger_path, statements) -> None:  # noqa: F811
    """A decision used to read its request before its transaction (to look its approver
    up, which may be slow, before any lock): it is read as it is locked now, when the
    actor is one of its named approvers (nothing to look up). What the read was for still
    holds: an actor who could be an approver only through a group is looked up with no
    transaction open (the request read first, as before), and decides if a member; one
    who is not is refused, and the refusal audited; a named approver's click sends no
    statement before its transaction's."""
    from approvald.runtime.kernel.errors import DecisionRefused
    from approvald.runtime.policies.directory import StaticDirectory

    from tests.unit.test_decisions import ALICE, BOB, STRANGER, engine_with, pause

    open_when_asked: list[int] = []

    class Watched(StaticDirectory):
        async def members(self, group_id: str) -> frozenset[str]:
            begun = sum(s.startswith("BEGIN") for s in statements.sent)
            ended = sum(s.startswith(("COMMIT", "ROLLBACK")) for s in statements.sent)
            open_when_asked.append(begun - ended)
            return await super().members(group_id)

    engine = engine_with(make_engine, ledger_path, approvers=["U_ALICE", "S_OPS"],
                         directory=Watched({"S_OPS": ["U_BOB"]}))
    paused = await pause(engine)
    aid = paused.approval_ids[0]
    a = await engine.views.approval(aid)
    assert a is not None
    with pytest.raises(DecisionRefused) as refused:
        await engine.decide(aid, actor=STRANGER, verdict="approve", token=card_token(a))
    assert refused.value.reason == "not_authorized" and open_when_asked == [0]
    assert [e.actor for e in await Rows(db).audit(approval_id=aid)
            if e.action == "refused"] == [STRANGER.id]
    decision = await engine.decide(aid, actor=BOB, verdict="approve", token=card_token(a))
    assert decision.outcome == "approved" and open_when_asked == [0, 0]

    paused = await pause(engine)
    aid = paused.approval_ids[0]
    a = await engine.views.approval(aid)
    assert a is not None
    window = statements.during()
    decision = await engine.decide(aid, actor=ALICE, verdict="approve", token=card_token(a))
    assert decision.outcome == "approved" and open_when_asked == [0, 0]  # not asked
    assert window.sent[0].startswith("BEGIN"), window.sent


async def test_a_resume_reads_the_runs_events_ledger_and_requests_in_one_statement(
        db: Database, statements) -> None:  # noqa: F811
    """The run's state, rebuilt when a worker resumes it, was three reads (its events, its
    execution ledger's rows, its requests); it is one statement (``tx.events.state``),
    which returns what the three did, in their order, every column processed by its type
    (sealed texts opened, times as times): a resume that lost an intent would run an
    approved call again, one that lost a request would ask again, events out of order
    would replay another transcript. Shown on a run with an intent and no result (the
    outcome unknown: not run again), and on a completed run."""
    engine = _engine(db)
    paused = await engine.run("payer", "pay for web", requested_by="U_DANA")
    a = await parts(engine).decider.get(paused.approval_ids[0])
    await engine.decide(a.id, actor=Actor("U_ALICE", "slack"), verdict="approve",
                        token=card_token(a))
    rows = Rows(db)
    call_id = (await rows.approval(a.id)).call_id
    assert await rows.record_intent(  # the intent of a worker that died before the call
        run_id=a.run_id, call_id=call_id, step=0, tool="pay", digest=a.digest,
        now=datetime.now(UTC))

    async def three(tx: Tx) -> Any:
        return (await tx.events.load(a.run_id), await tx.executions.for_run(a.run_id),
                await tx.approvals.for_run(a.run_id))

    async def both(tx: Tx) -> Any:
        window = statements.during()
        state = await tx.events.state(a.run_id)
        assert len(window.sent) == 1, window.sent
        assert state == await three(tx)
        return state

    async def one() -> Any:
        return await rows.in_one_read(both)

    events, executions, approvals = await one()
    assert [e.seq for e in events] == list(range(len(events))) and len(events) > 1
    assert list(executions) == [call_id] and executions[call_id].status == "started"
    assert [x.id for x in approvals] == [a.id] and approvals[0].status == "approved"
    assert isinstance(approvals[0].requested_at, datetime)
    assert await rows.record_result(
        run_id=a.run_id, call_id=call_id, status="succeeded", result='"paid"',
        error_class=None, error=None, now=datetime.now(UTC), latency_ms=1.0)
    assert isinstance(await engine.advance(a.run_id), Completed)  # not run again
    events, executions, approvals = await one()
    assert executions[call_id].result == '"paid"' and len(events) > 3


def _pays_twice() -> Agent:
    return Agent(name="payer2", instructions="", tools=[pay],
                 model=ScriptedModel.sequence([
                     reply("paying", ("pay", {"service": "web", "secret": VAULT}),
                           ("pay", {"service": "db", "secret": VAULT})),
                     reply("done", turn=1)]))


async def test_a_close_queues_its_card_and_wakes_its_run_in_the_statement_that_decides(
        db: Database, statements) -> None:  # noqa: F811
    """A one-approver decision's statement (the vote and the transition) used to be
    followed by two more: the card's update queued with its mail thread's follow-up
    (``INSERT INTO outbox ... SELECT``) and the run woken and leased (``UPDATE runs ...
    RETURNING``); on PostgreSQL they ride in it now (``ApprovalsRepo.vote_and_close``),
    done only if the request was closed by it. What they did still holds: every closed
    request's card is queued, the follow-up only in a mailed request's thread; the run is
    woken only once no other request of its step is pending (the statement's own snapshot
    still sees the request it closes pending: it is left out by id), and leased to this
    process's worker only when nobody else holds its lease."""
    from approvald.runtime.record.outbox_kinds import (
        OUTCOME_MAIL,
        REQUEST_MAIL,
        CardUpdate,
        mail_group,
    )
    from approvald.store.models import Outbox

    engine = assemble(db, Registry([_pays_twice()]), signer=SIGNER)
    taken: list[tuple[str, str]] = []
    parts(engine).signals.take_decided(lambda run_id, claim: taken.append((run_id, claim)))
    rows = Rows(db)
    alice = Actor("U_ALICE", "slack")

    async def two() -> tuple[str, str, str]:
        paused = await engine.run("payer2", "pay twice", requested_by="U_DANA")
        assert isinstance(paused, Paused) and len(paused.approval_ids) == 2
        return paused.run_id, *paused.approval_ids

    async def decide(aid: str, verdict: Any = "approve", reason: str | None = None) -> Any:
        return await engine.decide(aid, actor=alice, verdict=verdict, reason=reason,
                                   token=card_token(await rows.approval(aid)))

    run_id, first, second = await two()
    now = datetime.now(UTC)
    await rows.insert(Outbox.__table__, [  # the second was mailed to its approvers
        {"kind": REQUEST_MAIL, "group_key": mail_group(second), "payload": "{}",
         "status": "delivered", "attempts": 1, "not_before": now, "created_at": now}])
    window = statements.during()
    d1 = await decide(first)
    if db.dialect == "postgresql":
        assert not [s for s in window.sent if s.startswith(("INSERT INTO outbox",
                                                            "UPDATE runs"))], window.sent
    assert not d1.run_ready and d1.claim is None  # the second still pending: it waits
    run = await rows.run(run_id)
    assert run.status == "awaiting_approval" and run.lease_owner is None
    d2 = await decide(second)
    assert d2.run_ready and d2.claim is not None and d2.run is not None
    run = await rows.run(run_id)
    assert run.status == "running" and run.lease_owner == d2.claim == d2.run.lease_owner
    cards = [r.group_key for r in await rows.outbox(CardUpdate.kind)]
    assert cards == [first, second], cards
    assert [r.group_key for r in await rows.outbox(OUTCOME_MAIL)] == [mail_group(second)]

    run_id, first, second = await two()  # a denial closes too; another worker's lease stays
    runs = Run.__table__
    await rows.forge(runs, runs.c.id == run_id, lease_owner="worker-b/1",
                     lease_expires_at=datetime.now(UTC) + timedelta(minutes=1))
    d1 = await decide(first, "deny", "not this one")
    assert d1.outcome == "denied" and not d1.run_ready
    assert (await rows.run(run_id)).status == "awaiting_approval"
    d2 = await decide(second)
    assert d2.run_ready and d2.claim is None and d2.run is None  # woken, not leased
    run = await rows.run(run_id)
    assert run.status == "running" and run.lease_owner == "worker-b/1"
    assert [r.group_key for r in await rows.outbox(CardUpdate.kind)][2:] == [first, second]
    assert len(await rows.outbox(OUTCOME_MAIL)) == 1


async def test_a_calls_result_rides_in_its_steps_checkpoint_statement_both_or_neither(
        db: Database, statements) -> None:  # noqa: F811
    """The approved call's result, left to its step's checkpoint, used to be a statement
    of its own in the checkpoint's transaction (``UPDATE tool_executions``, after the
    run's row and events); on PostgreSQL the checkpoint's statement writes it
    (``RunsRepo.checkpoint_with_events(settled=...)``), the run's row locked first. What
    the write did still holds: the result and its ``executed`` entry are recorded with
    the step; a worker whose lease was taken writes no result; and an intent another
    process settled while the call ran is not written over, nor is the step checkpointed
    around it (the transaction rolls back, as when the result's own write found it so)."""
    settle_meanwhile = [False]

    @tool(permission="execute")
    async def ship(ctx: ToolContext, service: str) -> str:
        """Ship a service."""
        if settle_meanwhile[0]:  # another process records this call's outcome meanwhile
            assert await Rows(db).record_result(
                run_id=ctx.run_id, call_id=ctx.call_id, status="failed", result=None,
                error_class="Elsewhere", error="theirs", now=datetime.now(UTC),
                latency_ms=1.0)
        return f"shipped {service}"

    engine = assemble(db, Registry([Agent(
        name="shipper", instructions="", tools=[ship],
        model=ScriptedModel.sequence([reply("shipping", ("ship", {"service": "web"})),
                                      reply("done", turn=1)]))]), signer=SIGNER)
    rows = Rows(db)

    async def approved() -> tuple[str, str]:
        paused = await engine.run("shipper", "ship web", requested_by="U_DANA")
        assert isinstance(paused, Paused)
        a = await rows.approval(paused.approval_ids[0])
        await engine.decide(a.id, actor=Actor("U_ALICE", "slack"), verdict="approve",
                            token=card_token(a))
        return a.run_id, a.call_id

    run_id, call_id = await approved()
    window = statements.during()
    assert isinstance(await engine.advance(run_id), Completed)
    if db.dialect == "postgresql":
        assert not [s for s in window.sent if s.startswith("UPDATE tool_executions")], \
            window.sent
    done = await rows.execution(run_id, call_id)
    assert done.status == "succeeded" and done.result == '"shipped web"' \
        and done.finished_at is not None and done.latency_ms is not None
    [executed] = [e for e in await rows.audit(run_id=run_id) if e.action == "executed"]
    assert json.loads(executed.details)["status"] == "succeeded"

    run_id, call_id = await approved()  # settled by another process while it ran
    settle_meanwhile[0] = True
    before = await rows.run(run_id)
    outcome = await engine.advance(run_id)
    assert isinstance(outcome, Busy), outcome
    theirs = await rows.execution(run_id, call_id)
    assert theirs.status == "failed" and theirs.error == "theirs" and theirs.result is None
    after = await rows.run(run_id)
    assert after.next_seq == before.next_seq and after.step == before.step  # not checkpointed
    assert not [e for e in await rows.audit(run_id=run_id) if e.action == "executed"]

    run_id, call_id = await approved()  # a worker whose lease was taken writes nothing
    runs = Run.__table__
    await rows.forge(runs, runs.c.id == run_id, lease_owner="worker-a/1",
                     lease_expires_at=datetime.now(UTC) + timedelta(minutes=1))
    assert await rows.record_intent(run_id=run_id, call_id=call_id, step=1, tool="ship",
                                    digest="d" * 64, now=datetime.now(UTC))
    from approvald.store.repos.runs import Settled

    now = datetime.now(UTC)
    for owner in ("worker-b/1", "worker-a/1"):
        async with db.write_one() as tx:  # (one statement: on PostgreSQL, autocommit)
            req = await tx.runs.checkpoint_with_events(
                run_id, owner=owner, first_seq=before.next_seq + 10, step=2,
                events=[(1, '{"role": "tool", "content": "x"}')], status="running",
                now=now, lease_until=now + timedelta(minutes=1), release=False,
                settled=Settled(call_id=call_id, status="succeeded", result='"x"',
                                error_class=None, error=None, latency_ms=1.0))
            if owner == "worker-b/1":
                assert req is None
                assert (await rows.execution(run_id, call_id)).status == "started"
            else:
                assert req is not None and req.settled is (
                    True if db.dialect == "postgresql" else None)
