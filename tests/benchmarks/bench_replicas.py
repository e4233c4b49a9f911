"""Replicas on PostgreSQL: does a second and third ``serve`` add capacity?

    python tests/benchmarks/bench_replicas.py [--db postgresql+asyncpg://…] [--runs 200]

Runs ``bench_clicks`` (200 signed Approve clicks, 20 at a time, each in flight until its
tool starts) twice: against one ``serve`` process (the in-run baseline), then against
three replicas with the clicks spread over them in turn, as a load balancer would. Each
runs on a fresh database of its own, created on the server ``--db`` names and dropped
afterwards: a database that earlier rounds left full of dead rows (where autovacuum is
off or behind) would make whichever ran second, and every later round, slower. Prints
decisions per second, p99 click -> tool start and the serve CPU per decision for both.
Targets (issue 14): three replicas at least 2x the decisions per second of one, and p99
click -> tool start <= 300 ms with three. On a machine with fewer cores than replicas
the machine is the limit: the CPU per decision then says whether the replicas share the
work or fight over it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import sys
from pathlib import Path

from sqlalchemy import make_url

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from bench_clicks import bench

DEFAULT_DB = "postgresql+asyncpg://postgres@127.0.0.1:5432/test"


async def on_fresh_database(server: str, runs: int, replicas: int) -> dict[str, float]:
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
                           replicas=replicas)
    finally:
        await say(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def main_async(db: str, runs: int) -> int:
    print("== one serve process (baseline)")
    one = await on_fresh_database(db, runs, 1)
    print("\n== three serve replicas, clicks spread over them")
    three = await on_fresh_database(db, runs, 3)
    ratio = three["per_second"] / one["per_second"]
    print(f"\n{os.cpu_count()} CPUs")
    print(f"  decisions/s:        1 replica {one['per_second']:.0f}   3 replicas "
          f"{three['per_second']:.0f}   ({ratio:.2f}x)")
    print(f"  CPU per decision:   1 replica {one['cpu_ms']:.1f} ms   3 replicas "
          f"{three['cpu_ms']:.1f} ms (all replicas together, while clicking)")
    print(f"  ... until every run completed and its card was updated: 1 replica "
          f"{one['whole_cpu_ms']:.1f} ms   3 replicas {three['whole_cpu_ms']:.1f} ms")
    print(f"  PostgreSQL server CPU per decision: 1 replica {one['server_ms']:.1f} ms   "
          f"3 replicas {three['server_ms']:.1f} ms")
    print(f"  the machine's cores busy during the clicks: 1 replica {one['busy']:.0%}   "
          f"3 replicas {three['busy']:.0%}")
    print(f"  p99 click -> tool start: 1 replica {one['start_p99']:.0f} ms   3 replicas "
          f"{three['start_p99']:.0f} ms")
    print("targets")
    ok_scale, ok_p99 = ratio >= 2.0, three["start_p99"] <= 300
    # fewer free cores than replicas: more replicas cannot add capacity, and the
    # figure that says whether they share the work is each replica's CPU per decision
    saturated = (f" (the machine is the limit: its cores {three['busy']:.0%} busy with 3; "
                 f"each replica spent {three['cpu_ms'] / 3:.1f} ms per decision of the "
                 f"whole stream against {one['cpu_ms']:.1f} ms for one alone)"
                 if not ok_scale and three["busy"] >= 0.9 else "")
    print(f"  3 replicas >= 2x the decisions/s of 1: {ratio:.2f}x  "
          f"{'PASS' if ok_scale else 'FAIL'}{saturated}")
    print(f"  p99 click -> tool start <= 300 ms with 3: {three['start_p99']:.0f}  "
          f"{'PASS' if ok_p99 else 'FAIL'}")
    return 0 if ok_scale and ok_p99 else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--db", default=DEFAULT_DB,
                   help="a PostgreSQL server (its URL; each measurement gets a fresh database "
                        "there, so the role must be allowed to create databases)")
    p.add_argument("--runs", type=int, default=200)
    a = p.parse_args()
    return asyncio.run(main_async(a.db, a.runs))


if __name__ == "__main__":
    sys.exit(main())
