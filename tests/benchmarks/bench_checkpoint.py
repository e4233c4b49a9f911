"""Checkpoint cost per step as a run grows: approvald vs LangGraph vs the raw SQLite floor.

Workload: one agent step per iteration, each appending a ~1 KB tool result, checkpointed
durably on SQLite (WAL, synchronous=FULL), 1,000 steps. Prints the median per-step time
early and late in the run, their ratio, and the bytes the database holds per step.

    python tests/benchmarks/bench_checkpoint.py [--steps 1000] [--payload 1000]
    python tests/benchmarks/bench_checkpoint.py --data-key [--rounds 3]
    python tests/benchmarks/bench_checkpoint.py --calls [--steps 200]

The LangGraph comparison runs when the ``bench`` extra is installed
(``pip install -e '.[bench]'``); the raw-sqlite floor always runs, as the in-run baseline.
Targets (issue 2): late/early ratio <= 1.3, bytes/step <= payload + 1 KB, median <= 2 ms;
(issue 14) whole step p50 <= 2 ms at both ends and below LangGraph's at both ends. Two
approvald workloads: each step's call an idempotent read (its result rides in the
checkpoint: one commit per step) and a side effect that must run once (an intent commit
before the call, then the checkpoint with its result: two commits).

``--data-key`` measures what sealing at rest adds to a step (issue 34, target: at most
1.10): the side-effect workload without a data key, then with one (every transcript,
result and ledger value sealed), one after the other, ``--rounds`` times; prints each
pair and the ratio of the medians.

``--calls`` prints what a step costs exactly, whatever the machine's load: the Python calls
of steps 51-150 of each workload per step (counted as ``bench_click_cpu.py`` counts them: a
coroutine resumed is not called again; calls into C included), the functions that make
most of them, and the bytes per step each table's values hold.
"""

from __future__ import annotations

import argparse
import asyncio
import operator
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from itertools import pairwise
from pathlib import Path
from typing import Annotated, Any, TypedDict

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from approvald.runtime.engine import assemble
from approvald.runtime.record.sealing import DataKey, Sealer
from approvald.runtime.runs.agent import Registry
from approvald.runtime.runs.demo import DemoLedger, steps_agent
from approvald.runtime.runs.runner import Runner
from approvald.store import migrate
from approvald.store.db import Database
from approvald.store.types import set_codec

WINDOW = 50


class GraphState(TypedDict):
    """LangGraph state for the comparison: the transcript grows by one message per step."""

    messages: Annotated[list[dict[str, Any]], operator.add]
    n: int


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000 if samples else float("nan")


def db_bytes(path: str) -> tuple[int, int]:
    """(main file, main + WAL) sizes."""
    main = os.path.getsize(path)
    wal = path + "-wal"
    return main, main + (os.path.getsize(wal) if os.path.exists(wal) else 0)


async def bench_approvald(steps: int, payload: int, *, idempotent: bool,
                          calls: Any = None) -> dict[str, Any]:
    """``idempotent``: each step's call is a read that may run twice (one commit per
    step: the checkpoint); else a side effect that runs once (an intent commit first).
    ``calls``: a profile function (``bench_click_cpu.Calls``) set for steps 51-150."""
    path = os.path.join(tempfile.mkdtemp(), "approvald.db")
    db = Database(f"sqlite+aiosqlite:///{path}")
    await migrate.upgrade(db)
    # the schema out of the WAL first: else the bytes "per step" hold the schema's pages
    # (the tables' count grows with the product, not with a step)
    async with db.connection() as conn:
        await conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    base_main, _ = db_bytes(path)
    engine = assemble(db, Registry([steps_agent(DemoLedger(None), payload_bytes=payload,
                                              idempotent=idempotent)]))

    checkpoint_times: list[float] = []
    step_stamps: list[float] = []
    original = Runner._checkpoint

    async def timed(self: Runner, *args: Any, **kwargs: Any) -> bool:
        t0 = time.perf_counter()
        result = await original(self, *args, **kwargs)
        t1 = time.perf_counter()
        checkpoint_times.append(t1 - t0)
        step_stamps.append(t1)
        if calls is not None and len(step_stamps) in (WINDOW, WINDOW + CALL_STEPS):
            sys.setprofile(calls if len(step_stamps) == WINDOW else None)
        return result

    Runner._checkpoint = timed  # type: ignore[method-assign]
    try:
        t0 = time.perf_counter()
        outcome = await engine.run("demo-steps", str(steps), requested_by="bench")
        total = time.perf_counter() - t0
    finally:
        Runner._checkpoint = original  # type: ignore[method-assign]
    assert outcome.status == "completed", outcome
    _, with_wal = db_bytes(path)
    async with db.connection() as conn:
        await conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    await db.close()
    main, _ = db_bytes(path)
    held = values_held(path)
    step_times = [b - a for a, b in pairwise(step_stamps)]
    return {
        "total_s": total,
        "ckpt_early": median_ms(checkpoint_times[:WINDOW]),
        "ckpt_late": median_ms(checkpoint_times[steps - WINDOW:steps]),
        "step_early": median_ms(step_times[:WINDOW]),
        "step_late": median_ms(step_times[steps - WINDOW - 1:steps - 1]),
        "db_bytes": main - base_main,
        "db_wal_bytes": with_wal,
        "held": held,
    }


def values_held(path: str) -> dict[str, int]:
    """The bytes each table's values hold (the sum of their lengths), tables with rows."""
    conn = sqlite3.connect(path)
    held: dict[str, int] = {}
    tables = [t for (t,) in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")
              if not t.startswith(("sqlite_", "alembic"))]
    for t in tables:
        cols = [c[1] for c in conn.execute(f'PRAGMA table_info("{t}")')]
        summed = " + ".join(f'coalesce(sum(length("{c}")), 0)' for c in cols)
        total = conn.execute(f'SELECT {summed} FROM "{t}"').fetchone()[0]
        if total:
            held[t] = total
    conn.close()
    return held


CALL_STEPS = 100  # steps counted by --calls (after the first WINDOW)


async def count_calls(steps: int, payload: int) -> int:
    """``--calls``: each workload's Python calls per step, and the bytes its values hold."""
    from bench_click_cpu import Calls

    print(f"workload: {steps} steps, {payload}-byte tool result per step; calls of steps "
          f"{WINDOW + 1}-{WINDOW + CALL_STEPS} (exact, whatever the load)")
    for label, idempotent in (("read step", True), ("side-effect step", False)):
        calls = Calls()
        r = await bench_approvald(steps, payload, idempotent=idempotent, calls=calls)
        python = sum(calls.by_code.values())
        print(f"{label}: {(python + calls.c_calls) / CALL_STEPS:.1f} calls per step "
              f"({python / CALL_STEPS:.1f} Python, {calls.c_calls / CALL_STEPS:.1f} into C); "
              f"{r['db_bytes'] / steps:,.0f} bytes/step in the file, values "
              f"{sum(r['held'].values()) / steps:,.0f} bytes/step: " + ", ".join(
                  f"{t} {n / steps:,.0f}" for t, n in sorted(r["held"].items(),
                                                             key=lambda kv: -kv[1])))
        top = sorted(calls.by_code.items(), key=lambda kv: -kv[1])[:12]
        print("  most called: " + ", ".join(
            f"{code.co_qualname} {n / CALL_STEPS:g}" for code, n in top))
    return 0


def bench_floor(steps: int, payload: int) -> dict[str, Any]:
    """The physical floor: one payload-sized INSERT + COMMIT per step, raw sqlite3."""
    path = os.path.join(tempfile.mkdtemp(), "floor.db")
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE e (run TEXT, seq INT, body BLOB, PRIMARY KEY (run, seq))")
    times = []
    body = b"x" * payload
    for i in range(steps):
        t0 = time.perf_counter()
        conn.execute("BEGIN")
        conn.execute("INSERT INTO e VALUES ('r', ?, ?)", (i, body))
        conn.execute("COMMIT")
        times.append(time.perf_counter() - t0)
    conn.close()
    return {"early": median_ms(times[:WINDOW]), "late": median_ms(times[-WINDOW:]),
            "db_bytes": db_bytes(path)[1]}


async def bench_langgraph(steps: int, payload: int) -> dict[str, Any] | None:
    """The same workload through LangGraph's AsyncSqliteSaver (durability="sync")."""
    try:
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
        from langgraph.graph import END, StateGraph
    except ImportError:
        return None

    stamps: list[float] = []
    pad = "x" * payload

    def step(state: GraphState) -> dict[str, Any]:
        stamps.append(time.perf_counter())
        return {"messages": [{"role": "tool", "content": pad, "i": state["n"]}],
                "n": state["n"] + 1}

    def route(state: GraphState) -> str:
        return END if state["n"] >= steps else "step"

    path = os.path.join(tempfile.mkdtemp(), "langgraph.db")
    graph = StateGraph(GraphState)
    graph.add_node("step", step)
    graph.set_entry_point("step")
    graph.add_conditional_edges("step", route)
    async with AsyncSqliteSaver.from_conn_string(path) as saver:
        app = graph.compile(checkpointer=saver)
        t0 = time.perf_counter()
        await app.ainvoke({"messages": [], "n": 0},
                          {"configurable": {"thread_id": "bench"},
                           "recursion_limit": steps * 3},
                          durability="sync")
        total = time.perf_counter() - t0
    gaps = [b - a for a, b in pairwise(stamps)]
    return {"total_s": total, "step_early": median_ms(gaps[:WINDOW]),
            "step_late": median_ms(gaps[-WINDOW:]), "db_bytes": db_bytes(path)[1]}


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


async def compare_sealing(steps: int, payload: int, rounds: int) -> int:
    """The side-effect workload without, then with, a data key, ``rounds`` times."""
    print(f"workload: {steps} side-effect steps, {payload}-byte tool result per step, "
          f"SQLite WAL synchronous=FULL, {os.cpu_count()} CPUs; {rounds} rounds of "
          "(no key, data key)")
    pairs: list[tuple[dict[str, Any], dict[str, Any]]] = []
    for n in range(rounds):
        set_codec(None)
        plain = await bench_approvald(steps, payload, idempotent=False)
        set_codec(Sealer([DataKey(os.urandom(32))]))
        try:
            sealed = await bench_approvald(steps, payload, idempotent=False)
        finally:
            set_codec(None)
        pairs.append((plain, sealed))
        print(f"round {n + 1}: whole step median ms, early: {plain['step_early']:.3f} -> "
              f"{sealed['step_early']:.3f}, late: {plain['step_late']:.3f} -> "
              f"{sealed['step_late']:.3f}; checkpoint txn: {plain['ckpt_late']:.3f} -> "
              f"{sealed['ckpt_late']:.3f}; bytes/step {plain['db_bytes'] / steps:,.0f} -> "
              f"{sealed['db_bytes'] / steps:,.0f}", flush=True)
    print("sealed / plain, medians of the rounds (issue 34 target: <= 1.10)")
    for key, label in (("step_early", f"whole step, steps 1-{WINDOW}"),
                       ("step_late", f"whole step, steps {steps - WINDOW + 1}-{steps}"),
                       ("ckpt_late", f"checkpoint txn, steps {steps - WINDOW + 1}-{steps}")):
        before = statistics.median(p[key] for p, _ in pairs)
        after = statistics.median(s[key] for _, s in pairs)
        print(f"  {label}: {before:.3f} -> {after:.3f} ms  ratio {after / before:.2f}  "
              f"{verdict(after / before <= 1.10)}")
    return 0


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--payload", type=int, default=1000)
    parser.add_argument("--skip-langgraph", action="store_true")
    parser.add_argument("--data-key", action="store_true",
                        help="compare steps without and with a data key (sealing at rest)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", action="store_true",
                        help="count each workload's Python calls and stored bytes per step")
    a = parser.parse_args()
    steps, payload = a.steps, a.payload
    if a.calls:
        return await count_calls(steps, payload)
    if a.data_key:
        return await compare_sealing(steps, payload, a.rounds)

    read = await bench_approvald(steps, payload, idempotent=True)
    ours = await bench_approvald(steps, payload, idempotent=False)
    floor = bench_floor(steps, payload)
    lg = None if a.skip_langgraph else await bench_langgraph(steps, payload)

    ratio = ours["ckpt_late"] / ours["ckpt_early"]
    per_step = ours["db_bytes"] / steps
    print(f"workload: {steps} steps, {payload}-byte tool result per step, SQLite WAL "
          f"synchronous=FULL, {os.cpu_count()} CPUs")
    for title, r in (("approvald, an idempotent read per step (1 commit: the checkpoint "
                      "holds the result)", read),
                     ("approvald, a side effect that runs once per step (2 commits: the "
                      "ledger intent, then the checkpoint with the result)", ours)):
        print(title)
        print(f"  checkpoint txn  median ms: steps 1-{WINDOW}: {r['ckpt_early']:.3f}   "
              f"steps {steps - WINDOW + 1}-{steps}: {r['ckpt_late']:.3f}   "
              f"ratio {r['ckpt_late'] / r['ckpt_early']:.2f}")
        print(f"  whole step      median ms: steps 1-{WINDOW}: {r['step_early']:.3f}   "
              f"steps {steps - WINDOW + 1}-{steps}: {r['step_late']:.3f}   "
              f"ratio {r['step_late'] / r['step_early']:.2f}")
        print(f"  database: {r['db_bytes']:,} bytes after checkpointing the WAL "
              f"({r['db_wal_bytes']:,} with the WAL) = {r['db_bytes'] / steps:,.0f} bytes/step;"
              f" total {r['total_s']:.2f} s")
    print("raw sqlite3 floor (1 INSERT+COMMIT per step)")
    print(f"  median ms: early {floor['early']:.3f}   late {floor['late']:.3f}")
    if lg is None:
        print("langgraph: skipped (pip install -e '.[bench]' to compare)")
    else:
        lg_ratio = lg["step_late"] / lg["step_early"]
        print("langgraph AsyncSqliteSaver durability=sync (a node per step, no ledger)")
        print(f"  whole step median ms: early {lg['step_early']:.3f}   late {lg['step_late']:.3f}"
              f"   ratio {lg_ratio:.2f}")
        print(f"  database: {lg['db_bytes']:,} bytes = {lg['db_bytes'] / steps:,.0f} bytes/step"
              f"   total {lg['total_s']:.2f} s")
    print(f"approvald vs floor: checkpoint txn {ours['ckpt_late'] / floor['late']:.1f}x, "
          f"whole step {ours['step_late'] / floor['late']:.1f}x the raw commit")
    print("targets")
    print(f"  checkpoint ratio late/early <= 1.3: {ratio:.2f}  {verdict(ratio <= 1.3)}")
    print(f"  bytes/step <= payload + 1 KB ({payload + 1024}): {per_step:,.0f}  "
          f"{verdict(per_step <= payload + 1024)}")
    print(f"  median checkpoint <= 2 ms: {ours['ckpt_late']:.3f}  "
          f"{verdict(ours['ckpt_late'] <= 2.0)}")
    for label, r in (("read step", read), ("side-effect step", ours)):
        for end in ("early", "late"):
            when = f"steps 1-{WINDOW}" if end == "early" else \
                f"steps {steps - WINDOW + 1}-{steps}"
            mine = r[f"step_{end}"]
            line = f"  {label}, {when}: {mine:.3f} ms; <= 2 ms {verdict(mine <= 2.0)}"
            if lg is not None:
                theirs = lg[f"step_{end}"]
                line += f"; below langgraph's {theirs:.3f} ms {verdict(mine < theirs)}"
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
