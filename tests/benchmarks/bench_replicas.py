"""Replicas on PostgreSQL: does a second and third ``serve`` add capacity?

    python tests/benchmarks/bench_replicas.py [--db postgresql+asyncpg://…] [--runs 200]
                                              [--rounds 3]

Runs ``bench_clicks`` (200 signed Approve clicks, 20 at a time, each in flight until its
tool starts) twice: against one ``serve`` process (the in-run baseline), then against
three replicas with the clicks spread over them in turn, as a load balancer would. Each
runs on a fresh database of its own, created on the server ``--db`` names and dropped
afterwards: a database that earlier rounds left full of dead rows (where autovacuum is
off or behind) would make whichever ran second, and every later round, slower. Does so
``--rounds`` times, alternating which goes first, and before each round times a fixed
loop (on a shared host the cores' speed drifts: one round is not a verdict). Prints each
round, then the median and range over the rounds of decisions per second, p99 click ->
tool start and the serve CPU per decision for both. Targets (issue 14), on the medians:
three replicas at least 2x the decisions per second of one, and p99 click -> tool start
<= 300 ms with three. On a machine with fewer cores than replicas the machine is the
limit: the CPU per decision then says whether the replicas share the work or fight over
it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import statistics
import sys
import time
from pathlib import Path

from sqlalchemy import make_url

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from bench_clicks import bench

DEFAULT_DB = "postgresql+asyncpg://postgres@127.0.0.1:5432/test"


async def on_fresh_database(server: str, runs: int, replicas: int,
                            statements: int = 0) -> dict[str, float]:
    """``bench`` on a database created for it on ``server``, dropped afterwards."""
    import asyncpg  # type: ignore[import-untyped]

    url = make_url(server)
    name = f"approvald_bench_{secrets.token_hex(4)}"
    admin = url.set(drivername="postgresql").render_as_string(hide_password=False)

    async def say(sql: str) -> None:
        conn = await asyncpg.connect(admin)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    await say(f'CREATE DATABASE "{name}"')
    try:
        return await bench(runs, 20, "effect",
                           url.set(database=name).render_as_string(hide_password=False),
                           replicas=replicas, targets=False, statements=statements)
    finally:
        await say(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def machine_speed() -> float:
    """Milliseconds a fixed pure-Python loop takes now (the median of five). The same loop
    each round: on a shared host the cores' speed drifts during a session, and rounds are
    compared only with that in view."""
    times = []
    for _ in range(5):
        t, total = time.perf_counter(), 0
        for i in range(2_000_000):
            total += i
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def spread(rounds: list[dict[str, float]], key: str, fmt: str = ".0f") -> str:
    """``median (min-max)`` of one figure over the rounds."""
    values = [r[key] for r in rounds]
    mid = statistics.median(values)
    if len(values) == 1:
        return f"{mid:{fmt}}"
    return f"{mid:{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


async def main_async(db: str, runs: int, rounds: int, statements: int = 0) -> int:
    ones: list[dict[str, float]] = []
    threes: list[dict[str, float]] = []
    for n in range(rounds):
        speed = machine_speed()
        # one, three; then three, one: a machine that drifts during the rounds favours neither
        order = (1, 3) if n % 2 == 0 else (3, 1)
        for replicas in order:
            what = ("one serve process (baseline)" if replicas == 1
                    else "three serve replicas, clicks spread over them")
            print(f"\n== round {n + 1} of {rounds}: {what} (a fixed loop took {speed:.0f} ms)")
            got = await on_fresh_database(db, runs, replicas, statements)
            got["speed"] = speed
            (ones if replicas == 1 else threes).append(got)
        one, three = ones[-1], threes[-1]
        print(f"\n-- round {n + 1}: 1 replica {one['per_second']:.0f}/s, p99 "
              f"{one['start_p99']:.0f} ms; 3 replicas {three['per_second']:.0f}/s, p99 "
              f"{three['start_p99']:.0f} ms ({three['per_second'] / one['per_second']:.2f}x)")
    for one, three in zip(ones, threes, strict=True):
        one["ratio"] = three["ratio"] = three["per_second"] / one["per_second"]
        three["per_replica_ms"] = three["cpu_ms"] / 3
    ratio = statistics.median(t["ratio"] for t in threes)
    p99 = statistics.median(t["start_p99"] for t in threes)
    busy = statistics.median(t["busy"] for t in threes)
    print(f"\n{os.cpu_count()} CPUs; {rounds} round(s): median (lowest-highest); the fixed "
          f"loop took {spread(ones, 'speed')} ms")
    print(f"  decisions/s:        1 replica {spread(ones, 'per_second')}   3 replicas "
          f"{spread(threes, 'per_second')}   ({spread(threes, 'ratio', '.2f')}x)")
    print(f"  CPU per decision:   1 replica {spread(ones, 'cpu_ms', '.1f')} ms   3 replicas "
          f"{spread(threes, 'cpu_ms', '.1f')} ms (all replicas together, while clicking)")
    print(f"  ... until every run completed and its card was updated: 1 replica "
          f"{spread(ones, 'whole_cpu_ms', '.1f')} ms   3 replicas "
          f"{spread(threes, 'whole_cpu_ms', '.1f')} ms")
    print(f"  PostgreSQL server CPU per decision: 1 replica {spread(ones, 'server_ms', '.1f')} "
          f"ms   3 replicas {spread(threes, 'server_ms', '.1f')} ms")
    print(f"  statements sent per decision: 1 replica {spread(ones, 'statements', '.1f')}   "
          f"3 replicas {spread(threes, 'statements', '.1f')} (all replicas together; the "
          "same work, or replicas repeating each other's)")
    print(f"  the machine's cores busy during the clicks: 1 replica "
          f"{spread(ones, 'busy', '.0%')}   3 replicas {spread(threes, 'busy', '.0%')}")
    print(f"  p99 click -> tool start: 1 replica {spread(ones, 'start_p99')} ms   3 replicas "
          f"{spread(threes, 'start_p99')} ms")
    print("targets (on the medians)")
    ok_scale, ok_p99 = ratio >= 2.0, p99 <= 300
    # fewer free cores than replicas: more replicas cannot add capacity, and the
    # figure that says whether they share the work is each replica's CPU per decision
    saturated = (f" (the machine is the limit: its cores {busy:.0%} busy with 3; each "
                 f"replica spent {spread(threes, 'per_replica_ms', '.1f')} ms per decision "
                 f"of the whole stream against {spread(ones, 'cpu_ms', '.1f')} ms for one "
                 "alone)" if not ok_scale and busy >= 0.9 else "")
    print(f"  3 replicas >= 2x the decisions/s of 1: {ratio:.2f}x  "
          f"{'PASS' if ok_scale else 'FAIL'}{saturated}")
    met = sum(t["start_p99"] <= 300 for t in threes)
    print(f"  p99 click -> tool start <= 300 ms with 3: {p99:.0f}  "
          f"{'PASS' if ok_p99 else 'FAIL'} (met in {met} of {rounds} round(s))")
    return 0 if ok_scale and ok_p99 else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--db", default=DEFAULT_DB,
                   help="a PostgreSQL server (its URL; each measurement gets a fresh database "
                        "there, so the role must be allowed to create databases)")
    p.add_argument("--runs", type=int, default=200)
    p.add_argument("--rounds", type=int, default=3,
                   help="rounds of one then three replicas (the order alternates); the "
                        "targets are judged on the medians")
    p.add_argument("--statements", type=int, default=0, metavar="N",
                   help="also print, each round, the N statements the replicas sent most, "
                        "per decision")
    a = p.parse_args()
    if a.rounds < 1:
        p.error("--rounds must be at least 1")
    return asyncio.run(main_async(a.db, a.runs, a.rounds, a.statements))


if __name__ == "__main__":
    sys.exit(main())
