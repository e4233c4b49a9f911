"""The runtime's parts take what they use (issue 37): each is built from the collaborators
its constructor names, no part holds the engine, and no module of the runtime imports the
engine module (only the faces do, and the assembly that builds it lives there)."""

from __future__ import annotations

import ast
from datetime import timedelta
from pathlib import Path

from approvald.runtime.approvals.decide import Actor, Decider
from approvald.runtime.kernel.clock import ManualClock
from approvald.runtime.kernel.limits import PayloadCap
from approvald.runtime.kernel.metrics import Meter
from approvald.runtime.kernel.signals import Signals
from approvald.runtime.policies.directory import StaticDirectory
from approvald.runtime.policies.policy import PolicyFile
from approvald.runtime.policies.tools import Tool
from approvald.runtime.record.audit import AuditTrail
from approvald.runtime.requests.expiry import Expiry
from approvald.runtime.requests.gate import Gate
from approvald.runtime.runs.demo import REFUND_POLICY, DemoLedger, refund_agent
from approvald.store.db import Database
from approvald.store.records import ApprovalRecord

from tests.helpers import Rows

RUNTIME = Path(__file__).resolve().parents[2] / "runtime"
# above the front door: the callers' client (the MCP gateway's, the hooks' and the HTTP
# API's shared code, moved out of bot/ by issue 47) uses the engine's verbs like a face;
# it is no part of the engine, and nothing below the engine imports it
ABOVE = frozenset({"callers.py"})
# and runtime/__init__.py, the names agent modules, docs and faces import (issue 47 item 3),
# stands above them all: it names the engine and the callers' client among them (lazily: it
# imports nothing until a name is asked for)
FACADE = RUNTIME / "__init__.py"


def _imports(path: Path) -> list[str]:
    out: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        out += [node.module or ""] if isinstance(node, ast.ImportFrom) else \
            [a.name for a in node.names] if isinstance(node, ast.Import) else []
    return out


def test_no_module_of_the_runtime_imports_the_engine_module() -> None:
    found = [str(path.relative_to(RUNTIME)) for path in RUNTIME.rglob("*.py")
             if path.name != "engine.py" and path.name not in ABOVE and path != FACADE
             and any(n.endswith("runtime.engine") for n in _imports(path))]
    assert found == []


def test_nothing_below_the_front_door_imports_what_stands_above_it() -> None:
    above = {f"runtime.{name.removesuffix('.py')}" for name in ABOVE}
    found = [str(path.relative_to(RUNTIME)) for path in RUNTIME.rglob("*.py")
             if path.name not in ABOVE and path != FACADE
             and any(n.endswith(tuple(above)) for n in _imports(path))]
    assert found == []


def test_no_part_holds_the_engine() -> None:
    held = [str(p.relative_to(RUNTIME)) for p in RUNTIME.rglob("*.py")
            if p.name not in ABOVE
            and ("self.e = " in p.read_text() or "self.engine = " in p.read_text())]
    assert held == []


async def test_a_decider_is_built_from_the_collaborators_it_names(db: Database,
                                                                 ledger_path: Path) -> None:
    clock, audit, signals = ManualClock(), AuditTrail(), Signals()
    policy = PolicyFile()
    tool = refund_agent(DemoLedger(str(ledger_path))).tool("issue_refund")
    assert tool is not None

    async def tool_for(a: ApprovalRecord) -> Tool:
        return tool

    gate = Gate(clock, audit, lambda: policy)
    expiry = Expiry(db, clock, audit, gate, Meter(), signals)
    decider = Decider(db, clock, audit, StaticDirectory(), tool_for, lambda: policy,
                      PayloadCap(), gate, expiry, signals, owner="test",
                      lease_ttl=timedelta(seconds=30))
    args = {"order_id": "A-1", "amount_cents": 500, "reason": "test"}

    async def waiting(tx):  # type: ignore[no-untyped-def]
        await tx.runs.create(run_id="r1", agent="demo-refund", task="t", requested_by="U_DANA",
                             instructions_version="v", now=clock.now(),
                             status="awaiting_approval")
        run = await tx.runs.get("r1")
        return await gate.insert_approval(
            tx, run=run, call_id="c1", kind="tool_call", tool="issue_refund", args=args,
            policy=REFUND_POLICY, rung=0, packet={"agent": "demo-refund"})

    approval_id = await Rows(db).in_one_write(waiting)
    decision = await decider.decide(approval_id, actor=Actor("U_ALICE", "cli:test"),
                                    verdict="approve")
    assert decision.outcome == "approved" and decision.run_ready
    edited = await decider.get(approval_id)
    assert edited.status == "approved" and edited.decided_by == "U_ALICE"


async def test_the_worker_drives_runs_through_the_runner_not_the_front_door(
        make_engine, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The worker is given the runner's drive at construction (issue 47): it never calls
    back up through ``Engine.advance``, and a run it drives still ends pressing and
    announces the requests it opened, as the front door's advance does."""
    import asyncio

    from approvald.runtime.engine import Engine

    engine = make_engine()

    async def not_here(*args: object, **kwargs: object) -> None:
        raise AssertionError("the worker called back up through Engine.advance")

    monkeypatch.setattr(Engine, "advance", not_here)
    opened: list[str] = []
    announced = asyncio.Event()
    engine.on_opened(lambda approval_id: (opened.append(approval_id), announced.set()))
    run_id = await engine.start_run("demo-refund", "Refund order A-1001",
                                    requested_by="U_DANA")
    worker = engine.worker(concurrency=1, poll_interval=3600)
    stop = asyncio.Event()
    serving = asyncio.create_task(worker.run(stop))
    try:
        worker.wake(run_id)
        await asyncio.wait_for(announced.wait(), 10)
    finally:
        stop.set()
        await asyncio.wait_for(serving, 10)
    assert len(opened) == 1  # the refund's request, announced by the runner's drive
    assert (await engine.state(run_id)).status == "awaiting_approval"


# -- the front door is closed (issue 47): the engine's parts are its own ------------------
TESTS = Path(__file__).resolve().parents[1]
_PRIMITIVE = (str, bytes, int, float, bool, timedelta, type(None))


def test_the_engine_shows_no_part_of_its_own(make_engine) -> None:  # type: ignore[no-untyped-def]
    """An assembled engine has no public attribute at all (its parts, the database, the
    clock, the deciders, are underscore names), and none of its properties hands a part
    out: a face calls a verb or reads a view."""
    import dataclasses

    from tests.helpers import parts

    engine = make_engine()
    held = parts(engine)
    objects = {id(held)} | {id(v) for v in (getattr(held, f.name)
                                            for f in dataclasses.fields(held))
                            if not isinstance(v, _PRIMITIVE)}
    assert sorted(k for k in vars(engine) if not k.startswith("_")) == []
    shown = sorted(name for name in dir(type(engine))
                   if not name.startswith("_")
                   and isinstance(getattr(type(engine), name), property)
                   and id(getattr(engine, name)) in objects)
    assert shown == []


def _private_reads(source: str, where: str = "<test>") -> list[str]:
    """Where ``source`` reads the engine's parts past the one door (``tests.helpers.parts``):
    ``x._parts``, or a private attribute of anything but ``self``/``cls`` named after one
    of the engine's parts (``engine._db``, ``h.engine._decider``), or ``getattr`` of one."""
    import dataclasses

    from approvald.runtime.engine import Parts

    private = {"_parts", "_owner"} | {f"_{f.name}" for f in dataclasses.fields(Parts)}
    found = []
    for node in ast.walk(ast.parse(source, where)):
        if isinstance(node, ast.Attribute) and (
                node.attr == "_parts" or (node.attr in private
                                          and ast.unparse(node.value) not in ("self", "cls"))):
            found.append(f"{where}:{node.lineno} {ast.unparse(node)}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id == "getattr" \
                and len(node.args) > 1 and isinstance(node.args[1], ast.Constant) \
                and node.args[1].value in private:
            found.append(f"{where}:{node.lineno} {ast.unparse(node)}")
    return found


def test_tests_reach_the_engines_parts_through_the_one_door() -> None:
    """``tests.helpers.parts`` is the tests' only way to the engine's parts: no other test
    module reads ``engine._parts`` or a private part of the engine itself."""
    helpers = TESTS / "helpers.py"
    found = [hit for path in sorted(TESTS.rglob("*.py"))
             if path != helpers and "node_modules" not in path.parts
             for hit in _private_reads(path.read_text(), str(path.relative_to(TESTS)))]
    assert found == []


def test_the_one_door_check_sees_a_reach_past_it() -> None:
    """The check above cannot pass by finding nothing."""
    found = _private_reads(
        "async def peek(engine, h):\n"
        "    async with engine._db.read() as snap:\n"
        "        return h.engine._parts.decider, getattr(engine, '_clock'), snap\n"
        "class Fake:\n"
        "    def go(self):\n"
        "        return self._runner\n")
    assert sorted(hit.split(" ", 1)[1] for hit in found) == [
        "engine._db", "getattr(engine, '_clock')", "h.engine._parts"], found
