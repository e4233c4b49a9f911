"""Nothing twice: a lapsed lease, a second crash after a "retry", and the question a
person is asked when nobody knows whether a call took effect."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import Any

import pytest
from approvald.runtime.approvals.decide import Actor
from approvald.runtime.kernel import failpoints
from approvald.runtime.kernel.outcomes import Completed, NeedsAttention, Waiting
from approvald.runtime.models.scripted import ScriptedModel, reply
from approvald.runtime.policies.tools import Reconciled, ToolContext, tool
from approvald.runtime.runs.agent import Agent
from approvald.store.repos.runs import RunsRepo
from sqlalchemy.exc import OperationalError

from tests.helpers import Crash, Rows
from tests.helpers import crash as _crash

OPS = Actor("U_OPS", "slack")






class Provider:
    """A payment provider that only records a charge when the call completes."""

    def __init__(self) -> None:
        self.charges: list[str] = []
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.block = False

    async def charge(self, key: str) -> None:
        first = not self.started.is_set()
        self.started.set()
        if self.block and first:  # the first attempt stalls; any other goes straight through
            await self.release.wait()
        self.charges.append(key)

    async def reconcile(self, ctx: ToolContext, args: dict[str, Any]) -> Reconciled:
        # honest, but only about charges that completed: an attempt still on its way to
        # the provider looks exactly like one that never happened
        return Reconciled(happened=ctx.idempotency_key in self.charges,
                          result={"charged": args["cents"]})


def pay_agent(provider: Provider, *, timeout: float | None = None,
              reconcile: bool = True) -> Agent:
    @tool(permission="execute", policy="auto",
          reconcile=provider.reconcile if reconcile else None,
          **({"timeout": timeout} if timeout else {}))
    async def pay(ctx: ToolContext, cents: int) -> dict[str, Any]:
        """Pays out money."""
        await provider.charge(ctx.idempotency_key)
        return {"charged": cents}

    return Agent(name="payer", instructions="", tools=[pay], model=ScriptedModel.sequence(
        [reply(None, ("pay", {"cents": 700})), reply("paid", turn=1)]))


# -- 1. a lapsed lease does not let a second worker repeat a call still running ----------

async def test_a_second_worker_does_not_repeat_a_call_whose_attempt_may_still_run(
        make_engine, db, clock):
    provider = Provider()
    provider.block = True
    first = make_engine(agents=[pay_agent(provider)], owner="host-a:1:aa")
    second = make_engine(agents=[pay_agent(provider)])
    run_id = await first.start_run("payer", "pay", requested_by="U_DANA")
    stuck = asyncio.create_task(first.advance(run_id))
    await provider.started.wait()  # the first attempt is on its way to the provider...
    clock.advance(timedelta(minutes=5))  # ...and its lease lapses (a stalled worker)
    taken = await second.advance(run_id)
    # reconcile says "not happened", but the attempt may still be running: not trusted
    assert isinstance(taken, NeedsAttention), taken
    assert provider.charges == []
    provider.release.set()
    await stuck
    assert provider.charges == [f"{run_id}:call_0_0"]  # once, not twice
    [question] = [a for a in await Rows(db).approvals(run_id)
                  if a.kind == "outcome_unknown"]
    packet = json.loads(question.packet)
    assert "may still be running" in packet["reconcile"]


async def test_with_a_timeout_the_run_waits_for_the_attempt_to_end_then_trusts_reconcile(
        make_engine, db, clock):
    provider = Provider()
    provider.block = True
    first = make_engine(agents=[pay_agent(provider, timeout=60)], owner="host-a:1:aa")
    second = make_engine(agents=[pay_agent(provider, timeout=60)])
    run_id = await first.start_run("payer", "pay", requested_by="U_DANA")
    stuck = asyncio.create_task(first.advance(run_id))
    await provider.started.wait()
    clock.advance(timedelta(seconds=40))  # the lease lapsed, the tool's timeout has not
    taken = await second.advance(run_id)
    assert isinstance(taken, Waiting) and taken.until is not None
    assert "may still be running" in taken.reason
    stuck.cancel()  # the stalled attempt ends (its worker dies) without charging
    with pytest.raises(BaseException):  # noqa: B017 - whatever the cancel surfaces as
        await stuck
    still = await second.advance(run_id)  # not yet due: nobody touches it
    assert isinstance(still, Waiting) and still.until == taken.until
    clock.set(taken.until + timedelta(seconds=1))
    provider.block = False  # the provider answers again
    done = await second.advance(run_id)
    assert isinstance(done, Completed), done
    assert provider.charges == [f"{run_id}:call_0_0"]


async def test_a_failing_lease_renewal_never_replaces_the_outcome(make_engine, db,
                                                                  monkeypatch):
    provider = Provider()
    provider.block = True
    engine = make_engine(agents=[pay_agent(provider)], lease_ttl=timedelta(seconds=0.3))
    run_id = await engine.start_run("payer", "pay", requested_by="U_DANA")
    renew = RunsRepo.renew_lease
    failing = {"on": False}

    async def flaky(self, run_id: str, **kw: Any) -> bool:  # type: ignore[no-untyped-def]
        if failing["on"]:
            raise OperationalError("UPDATE runs", {}, Exception("database is locked"))
        return await renew(self, run_id, **kw)
    monkeypatch.setattr(RunsRepo, "renew_lease", flaky)
    advancing = asyncio.create_task(engine.advance(run_id))
    await provider.started.wait()
    failing["on"] = True
    await asyncio.sleep(0.6)  # the heartbeat's own timer: renewals fail past the lease
    failing["on"] = False
    provider.release.set()
    outcome = await advancing  # an outcome, not the heartbeat's OperationalError
    assert outcome.status == "running"  # it stopped before any further side effect
    assert provider.charges == [f"{run_id}:call_0_0"]
    rec = await Rows(db).execution(run_id, "call_0_0")
    assert rec.status == "succeeded"  # the result of the call that ran is kept
    assert isinstance(await engine.advance(run_id), Completed)
    assert len(provider.charges) == 1


async def test_a_step_shorter_than_a_renewal_starts_no_heartbeat(make_engine,
                                                                 monkeypatch) -> None:
    """The lease is renewed from a task started once the first renewal is due, not from
    a task per step that sleeps and is cancelled (issue 50: most steps end well before
    ``lease_ttl / 3``); a long step still renews (the test above)."""
    provider = Provider()
    engine = make_engine(agents=[pay_agent(provider)], lease_ttl=timedelta(seconds=60))
    run_id = await engine.start_run("payer", "pay", requested_by="U_DANA")
    loop = asyncio.get_running_loop()
    real = loop.create_task
    made: list[str] = []

    def spy(coro, **kw):  # type: ignore[no-untyped-def]
        made.append(getattr(coro, "__qualname__", ""))
        return real(coro, **kw)

    monkeypatch.setattr(loop, "create_task", spy)
    assert isinstance(await engine.advance(run_id), Completed)
    assert provider.charges == [f"{run_id}:call_0_0"]
    assert not [m for m in made if "_heartbeat" in m], made


# -- 2. one "retry" answer sanctions exactly one attempt ----------------------------------

async def test_a_retry_answer_sanctions_one_attempt_not_every_later_one(make_engine, db):
    provider = Provider()
    engine = make_engine(agents=[pay_agent(provider, reconcile=False)])
    run_id = await engine.start_run("payer", "pay", requested_by="U_DANA")
    failpoints.arm("before_result", _crash)  # the provider charged; the result is lost
    with pytest.raises(Crash):
        await engine.advance(run_id)
    failpoints.arm("")
    assert isinstance(await engine.advance(run_id), NeedsAttention)
    first = await _open_question(db, run_id)
    assert json.loads(first.packet)["attempt"] == 1
    # the person looks, sees nothing at the provider (say a lagging dashboard), retries
    await engine.decide(first.id, actor=OPS, verdict="retry")
    failpoints.arm("before_result", _crash)  # and the retried attempt crashes too
    with pytest.raises(Crash):
        await engine.advance(run_id)
    failpoints.arm("")
    again = await engine.advance(run_id)
    assert isinstance(again, NeedsAttention), again  # asked again, not re-run blindly
    assert len(provider.charges) == 2  # the one sanctioned retry, no third
    second = await _open_question(db, run_id)
    assert second.id != first.id and json.loads(second.packet)["attempt"] == 2
    await engine.decide(second.id, actor=OPS, verdict="mark_done", reason="both charged")
    assert isinstance(await engine.advance(run_id), Completed)
    assert len(provider.charges) == 2


# -- 3. the question gives the person what they need to decide ------------------------------

async def test_the_outcome_question_says_which_attempt_when_and_what_reconcile_said(
        make_engine, db, clock):
    provider = Provider()

    async def raising(ctx: ToolContext, args: dict[str, Any]) -> Reconciled:
        raise ConnectionError("provider API down")

    agent = pay_agent(provider, reconcile=False)
    agent.tools[0].reconcile = raising
    engine = make_engine(agents=[agent])
    run_id = await engine.start_run("payer", "pay", requested_by="U_DANA")
    started = clock.now()
    failpoints.arm("before_result", _crash)
    with pytest.raises(Crash):
        await engine.advance(run_id)
    failpoints.arm("")
    clock.advance(90)
    outcome = await engine.advance(run_id)
    assert isinstance(outcome, NeedsAttention)  # a raising reconcile means "unknown"
    q = await _open_question(db, run_id)
    packet = json.loads(q.packet)
    assert packet["attempt"] == 1
    assert packet["started_at"] == started.isoformat()
    assert packet["heard_at"] == started.isoformat()
    assert packet["idempotency_key"] == f"{run_id}:call_0_0"
    assert "raised ConnectionError: provider API down" in packet["reconcile"]
    assert q.args_value() == {"cents": 700}
    [entry] = [e for e in await Rows(db).audit(run_id=run_id)
               if e.action == "outcome_unknown"]
    details = json.loads(entry.details)
    assert details["args"] == {"cents": 700} and details["attempts"] == 1


async def test_read_tools_are_idempotent_by_default_and_rerun_without_asking(make_engine):
    runs: list[int] = []

    @tool(permission="read")
    async def look(ctx: ToolContext, n: int) -> int:
        """Reads."""
        runs.append(ctx.attempt)
        return n

    assert look.idempotent
    agent = Agent(name="reader", instructions="", tools=[look], model=ScriptedModel.sequence(
        [reply(None, ("look", {"n": 1})), reply("seen", turn=1)]))
    engine = make_engine(agents=[agent])
    run_id = await engine.start_run("reader", "read", requested_by="U1")
    failpoints.arm("before_result", _crash)
    with pytest.raises(Crash):
        await engine.advance(run_id)
    failpoints.arm("")
    assert isinstance(await engine.advance(run_id), Completed)
    # an idempotent call has no intent row (its result rides in the step's checkpoint):
    # the crashed attempt left nothing behind, so the call simply runs again, unasked
    assert runs == [1, 1]
    assert await Rows.of(engine).approvals(run_id) == []
    [rec] = (await Rows.of(engine).executions(run_id)).values()
    assert rec.status == "succeeded" and rec.attempts == 1


async def _open_question(db, run_id: str):  # type: ignore[no-untyped-def]
    [q] = [a for a in await Rows(db).approvals(run_id)
           if a.kind == "outcome_unknown" and a.status == "pending"]
    return q
