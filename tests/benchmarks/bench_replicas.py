"""Replicas on PostgreSQL: does a second and third ``serve`` add capacity?

    python tests/benchmarks/bench_replicas.py [--db postgresql+asyncpg://…] [--runs 200]
                                              [--rounds 3] [--breakdown] [--warm N]

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

Each round also prints where three replicas' statements differ from one's: the statements
per decision each sent, the extra ones first (exact counts, whatever the machine's load).
``--breakdown`` says where they come from and what else the replicas do: each statement
is counted by the store function that sent it and the part of ``runtime`` or ``bot`` that
asked (:func:`sql_count.origin`), and each ``serve`` runs under cProfile
(``profile_serve.py``), its Python calls counted by area (a package of ``runtime``,
``store`` or ``bot``, or a library), one replica's beside three's, per decision. The
walk per statement and the profiler slow ``serve`` down: its CPU figures are then not
comparable with a run without ``--breakdown``; the counts are.

``--warm N`` makes N approvals first in each measurement, spread over the replicas and
left out of every figure: each ``serve`` process pays some costs once (its statements'
compiled forms, the first collections' freezes, its connections' prepared statements), and
in a 200-click run three processes pay them three times, which a deployment up for a while
does not.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import pstats
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sqlalchemy import make_url

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

import bench_clicks
import sql_count
from bench_clicks import bench

DEFAULT_DB = "postgresql+asyncpg://postgres@127.0.0.1:5432/test"


NEIGHBOUR = """
import time
while True:
    t = time.process_time() + {busy}
    while time.process_time() < t:
        pass
    time.sleep({idle})
"""


async def on_fresh_database(server: str, runs: int, replicas: int,
                            statements: int = 0,
                            detail: dict[str, Any] | None = None,
                            warm: int = 0, neighbours: int = 0) -> dict[str, float]:
    """``bench`` on a database created for it on ``server``, dropped afterwards.
    ``neighbours``: that many processes beside it each busy a third of the time (1 ms of
    CPU, 2 ms asleep), as a replica is on this machine: the same work's CPU when the
    cores are shared by more processes (the machine's part, not the code's)."""
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
    others = [await asyncio.create_subprocess_exec(
        sys.executable, "-c", NEIGHBOUR.format(busy=0.001, idle=0.002))
        for _ in range(neighbours)]
    try:
        return await bench(runs, 20, "effect",
                           url.set(database=name).render_as_string(hide_password=False),
                           replicas=replicas, targets=False, statements=statements,
                           detail=detail, warm=warm)
    finally:
        for x in others:
            x.kill()
            await x.wait()
        await say(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def idle(server: str, replicas: int, seconds: float) -> dict[str, Any]:
    """``replicas`` serve processes on a fresh database of ``server``, with nothing to do:
    what each spends over ``seconds`` (after a few to settle) on its periodic work alone
    (polls, sweeps, lease and claim look-ups): CPU seconds and statements, per replica."""
    import asyncpg

    url = make_url(server)
    name = f"approvald_bench_{secrets.token_hex(4)}"
    admin = url.set(drivername="postgresql").render_as_string(hide_password=False)
    db_url = url.set(database=name).render_as_string(hide_password=False)
    conn = await asyncpg.connect(admin)
    await conn.execute(f'CREATE DATABASE "{name}"')
    tmp = Path(tempfile.mkdtemp())
    emulator = bench_clicks.SlackEmulator(bot_token="xoxb-bench",
                                          signing_secret=bench_clicks.SECRET)
    for ch in (bench_clicks.CHANNEL, bench_clicks.OPS):
        emulator.add_channel(ch)
    serves: list[Any] = []
    try:
        db = bench_clicks.Database(db_url)
        await bench_clicks.migrate.upgrade(db)
        await db.close()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("APPROVALD_", "SLACK_"))}
        env.update(SLACK_BOT_TOKEN="xoxb-bench", SLACK_SIGNING_SECRET=bench_clicks.SECRET,
                   SLACK_API_URL=await emulator.start(), APPROVALD_DATABASE_URL=db_url,
                   APPROVALD_CHANNEL=bench_clicks.CHANNEL, APPROVALD_OPS_CHANNEL=bench_clicks.OPS,
                   APPROVALD_HOST="127.0.0.1", APPROVALD_SECRET=bench_clicks.TOKEN_SECRET,
                   APPROVALD_AGENTS="bench_agent", APPROVALD_LOG_LEVEL="WARNING",
                   BENCH_SQL_COUNT=str(tmp),
                   PYTHONPATH=os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")]))
        ports = [bench_clicks.free_port() for _ in range(replicas)]
        serves = [await asyncio.create_subprocess_exec(
            *bench_clicks.serve_command(), env={**env, "APPROVALD_PORT": str(p)},
            stderr=bench_clicks.serve_log()) for p in ports]
        for p in ports:
            await bench_clicks.wait_healthy(p)
        await asyncio.sleep(3)  # start-up's own work done
        before = [await bench_clicks.count_statements([x], tmp) for x in serves]
        cpu0 = [bench_clicks.cpu_seconds(x.pid) for x in serves]
        bench_clicks.profile_toggle(serves)  # (with PROFILE_TO: the idle seconds' calls)
        await asyncio.sleep(seconds)
        cpu = [bench_clicks.cpu_seconds(x.pid) - c for x, c in zip(serves, cpu0, strict=True)]
        bench_clicks.profile_toggle(serves)
        after = [await bench_clicks.count_statements([x], tmp) for x in serves]
        sent: collections.Counter[str] = collections.Counter()
        for b, a in zip(before, after, strict=True):
            for n, sql in sql_count.by_statement(b, a):
                sent[sql] += n
        return {"cpu": cpu, "statements": [sql_count.per_kind(b, a).get("all", 0)
                                           for b, a in zip(before, after, strict=True)],
                "sent": dict(sent)}
    finally:
        for x in serves:
            x.terminate()
        for x in serves:
            await x.wait()
        await emulator.stop()
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await conn.close()


async def idle_main(db: str, seconds: float, rows: int) -> int:
    """``--idle``: one replica, then three, with no traffic (see :func:`idle`)."""
    for replicas in (1, 3):
        got = await idle(db, replicas, seconds)
        cpu = ", ".join(f"{c / seconds * 1000:.1f}" for c in got["cpu"])
        n = ", ".join(f"{s / seconds:.1f}" for s in got["statements"])
        print(f"\n{replicas} replica(s), idle for {seconds:.0f} s: CPU per replica {cpu} "
              f"ms a second; statements per replica {n} a second")
        for sql, count in sorted(got["sent"].items(), key=lambda kv: -kv[1])[:rows]:
            text = sql if len(sql) <= 110 else sql[:107] + "..."
            print(f"    {count / seconds:6.2f}/s  {text}")
    return 0


async def apart(server: str, runs: int, warm: int,
                detail: dict[str, Any]) -> dict[str, float]:
    """Three deployments side by side, each one ``serve`` on a database of its own, each
    a third of the clicks (and of the concurrency), measured at once: three processes on
    this machine's cores with a third of the load each and nothing shared. Beside one
    replica alone it shows what the machine and a third of the load per process cost;
    beside three replicas on one database, what sharing it costs (the audit chain's
    head, the outbox's claims, the leases). CPU per decision of all three together."""
    sizes = [runs // 3 + (i < runs % 3) for i in range(3)]
    conc = [20 // 3 + (i < 20 % 3) for i in range(3)]
    barrier = asyncio.Barrier(3)
    details: list[dict[str, Any]] = [{}, {}, {}]

    import asyncpg

    url = make_url(server)
    admin = url.set(drivername="postgresql").render_as_string(hide_password=False)
    names = [f"approvald_bench_{secrets.token_hex(4)}" for _ in range(3)]
    urls = [url.set(database=n).render_as_string(hide_password=False) for n in names]
    conn = await asyncpg.connect(admin)
    try:
        for name, db_url in zip(names, urls, strict=True):
            await conn.execute(f'CREATE DATABASE "{name}"')
            db = bench_clicks.Database(db_url)  # one after the other (alembic's state is
            await bench_clicks.migrate.upgrade(db)  # the process's): bench finds them done
            await db.close()
        got = await asyncio.gather(*(
            bench(sizes[i], conc[i], "effect", urls[i], targets=False, detail=details[i],
                  warm=warm // 3, together=barrier) for i in range(3)))
    finally:
        for name in names:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await conn.close()
    detail["replicas"] = [d["replicas"][0] for d in details if d.get("replicas")]
    sent: collections.Counter[str] = collections.Counter()
    for d in details:
        sent.update(d.get("sent", {}))
    detail["sent"] = dict(sent)
    detail["wall"] = {"whole": max(d.get("wall", {}).get("whole", 0.0) for d in details)}
    out = {k: sum(g[k] * n for g, n in zip(got, sizes, strict=True)) / runs
           for k in ("cpu_ms", "whole_cpu_ms", "statements")}
    # each measured every PostgreSQL process over about the same seconds: all of them
    out["server_ms"] = statistics.mean(g["server_ms"] * n for g, n in zip(got, sizes,
                                                                         strict=True)) / runs
    wall = max(n / g["per_second"] for g, n in zip(got, sizes, strict=True))
    out.update(per_second=runs / wall, start_p99=max(g["start_p99"] for g in got),
               busy=statistics.mean(g["busy"] for g in got))
    return out


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


def area(path: str, func: str) -> str:
    """The part of the code a profiled function belongs to: a package of approvald
    (``runtime/record``, ``store/repos``, ``bot/slack``...), a library (``sqlalchemy``,
    ``asyncpg``...), or the standard library's module (``asyncio``, ``json``...)."""
    root = str(HERE.parents[1]) + os.sep
    if "site-packages" + os.sep in path:  # (a virtualenv may sit in the checkout)
        return path.split("site-packages" + os.sep, 1)[1].split(os.sep, 1)[0]
    if path.startswith(root):
        parts = path[len(root):].split(os.sep)
        return "/".join(parts[:2]) if len(parts) > 2 else parts[0]
    if path == "~":  # a built-in: its name says where (``<method 'get' of 'dict'...>``)
        return "builtins"
    stem = Path(path).parent.name if Path(path).name == "__init__.py" else Path(path).stem
    parent = Path(path).parent.name
    return parent if parent in ("asyncio", "json", "logging", "email", "http") else stem


def profiled(directory: Path, pattern: str) -> list[Path]:
    """The profiles the replicas wrote (``profile_serve.py``, one per process)."""
    return sorted(directory.glob(pattern))


def calls_by_area(files: list[Path]) -> list[collections.Counter[str]]:
    """Each profile's function calls (all of them, recursive ones included) by area."""
    out = []
    for f in files:
        counts: collections.Counter[str] = collections.Counter()
        for (path, _line, func), (_cc, nc, *_rest) in pstats.Stats(str(f)).stats.items():  # type: ignore[attr-defined]
            counts[area(path, func)] += nc
        out.append(counts)
    return out


def diff_table(one: dict[str, float], three: dict[str, float], runs: int, rows: int,
               label: str) -> None:
    """Per decision, what three replicas did beside one: the largest excess first."""
    keys = sorted(set(one) | set(three),
                  key=lambda k: (-(three.get(k, 0) - one.get(k, 0)), k))
    total1, total3 = sum(one.values()) / runs, sum(three.values()) / runs
    print(f"    {'1 replica':>9} {'3 replicas':>10} {'extra':>7}  {label} "
          f"(all: {total1:.2f} -> {total3:.2f}, {total3 - total1:+.2f})")
    fewer = [k for k in reversed(keys) if three.get(k, 0) < one.get(k, 0)][:max(3, rows // 5)]
    for k in [*keys[:rows], *(k for k in reversed(fewer) if k not in keys[:rows])]:
        a, b = one.get(k, 0) / runs, three.get(k, 0) / runs
        if abs(b - a) < 0.005:
            continue
        text = k if len(k) <= 120 else k[:117] + "..."
        print(f"    {a:9.2f} {b:10.2f} {b - a:+7.2f}  {text}")


def processes(one: dict[str, Any], three: dict[str, Any], runs: int,
              label: str = "3 replicas") -> None:
    """Each replica's CPU from the first click until every run completed, per decision of
    the whole stream: user and system time, the collector's share, context switches and
    the wake-ups it heard from the others and sent them (exact counts)."""
    if not (one.get("replicas") or three.get("replicas")):
        return
    hz = os.sysconf("SC_CLK_TCK")
    print("  each process, first click until every run completed, per decision of the "
          "whole stream (CPU ms; switches, wake-ups: counts):")
    kinds = sorted({k for d in (one, three) for r in d.get("replicas", [])
                    for k in r if k.startswith("notified")})
    head = "user   sys    gc  vol.sw invol.sw  gen0/1/2    " + "  ".join(
        k.removeprefix("notified ") for k in kinds)
    print(f"    {'':14} {head}")
    for name, d in (("1 replica", one), (label, three)):
        wall = d.get("wall", {}).get("whole", 0.0)
        for n, r in enumerate(d.get("replicas", [])):
            gens = "/".join(f"{r.get(f'gc gen{g}', 0)}" for g in range(3))
            cells = "  ".join(f"{r.get(k, 0) / runs:{len(k) - 9}.2f}" for k in kinds)
            user, system = (r.get(k, 0) / hz / runs * 1e3 for k in ("utime", "stime"))
            print(f"    {name if n == 0 else '':11} #{n + 1} {user:5.2f} {system:5.2f} "
                  f"{r.get('gc cpu us', 0) / runs / 1e3:5.2f} "
                  f"{r.get('voluntary_ctxt_switches', 0) / runs:7.1f} "
                  f"{r.get('nonvoluntary_ctxt_switches', 0) / runs:8.1f}  {gens:10}  {cells}")
        if wall:
            print(f"    {'':14} (the runs took {wall:.2f} s)")


def by_shape(sent: dict[str, int]) -> dict[str, float]:
    """Statement counts by :func:`sql_count.shape` (the autocommit mark left out)."""
    out: collections.Counter[str] = collections.Counter()
    for sql, n in sent.items():
        if sql != sql_count.AUTOCOMMIT:
            out[sql_count.shape(sql)] += n
    return dict(out)


def breakdown(one: dict[str, Any], three: dict[str, Any], runs: int, rows: int) -> None:
    """Print where three replicas' statements (and, with ``--breakdown``, their origins
    and Python calls) differ from one's, per decision."""
    processes(one, three, runs)
    print("  statements per decision, by statement (the extra ones first):")
    diff_table(by_shape(one.get("sent", {})), by_shape(three.get("sent", {})), runs, rows,
               "statement")
    if "where" in one and "where" in three:
        def by_origin(where: dict[str, int], kind: bool) -> dict[str, float]:
            out: collections.Counter[str] = collections.Counter()
            for key, n in where.items():
                place, _, sql = key.partition("\t")
                if sql == sql_count.AUTOCOMMIT:  # a mark beside a write, not a statement
                    continue
                first = sql.split()[0].rstrip(";").upper() if sql.split() else "?"
                out[f"{place} [{first}]" if kind else place] += n
            return dict(out)

        print("  statements per decision, by where they were sent from (store < the part "
              "that asked):")
        diff_table(by_origin(one["where"], False), by_origin(three["where"], False), runs,
                   rows, "origin")
        print("  ... and by statement kind:")
        diff_table(by_origin(one["where"], True), by_origin(three["where"], True), runs,
                   rows, "origin [kind]")
    if one.get("profiles") and three.get("profiles"):
        ones, threes = calls_by_area(one["profiles"]), calls_by_area(three["profiles"])
        total3: collections.Counter[str] = collections.Counter()
        for c in threes:
            total3.update(c)
        print("  Python calls per decision by area (cProfile; three replicas summed; each "
              "replica's share after it):")
        keys = sorted(set(ones[0]) | set(total3),
                      key=lambda k: (-(total3[k] - ones[0][k]), k))
        print(f"    {'1 replica':>9} {'3 replicas':>10} {'extra':>7}  area  (per replica) "
              f"(all: {sum(ones[0].values()) / runs:.0f} -> {sum(total3.values()) / runs:.0f})")
        for k in keys[:rows]:
            a, b = ones[0][k] / runs, total3[k] / runs
            if abs(b - a) < 0.5:
                continue
            each = " ".join(f"{c[k] / runs:.0f}" for c in threes)
            print(f"    {a:9.0f} {b:10.0f} {b - a:+7.0f}  {k}  ({each})")


def spread(rounds: list[dict[str, float]], key: str, fmt: str = ".0f") -> str:
    """``median (min-max)`` of one figure over the rounds."""
    values = [r[key] for r in rounds]
    mid = statistics.median(values)
    if len(values) == 1:
        return f"{mid:{fmt}}"
    return f"{mid:{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


async def main_async(db: str, runs: int, rounds: int, statements: int = 0,
                     rows: int = 25, deep: bool = False, warm: int = 0,
                     neighbours: int = 0, separate: bool = False) -> int:
    ones: list[dict[str, float]] = []
    threes: list[dict[str, float]] = []
    besides: list[dict[str, float]] = []  # one replica beside ``neighbours`` busy processes
    aparts: list[dict[str, float]] = []  # three deployments, a third of the clicks each
    profiles = Path(tempfile.mkdtemp(prefix="replicas-prof-")) if deep else Path()
    if deep:
        os.environ["BENCH_SQL_WHERE"] = "1"  # serve counts statements by origin
    for n in range(rounds):
        details: dict[int, dict[str, Any]] = {}
        speed = machine_speed()
        # one, three; then three, one: a machine that drifts during the rounds favours neither
        order: tuple[int, ...] = (1, 3) if n % 2 == 0 else (3, 1)
        if neighbours:  # (-1: one replica beside the busy processes, between the two)
            order = (order[0], -1, order[1])
        if separate:  # (-3: three deployments side by side, between the two)
            order = (order[0], -3, *order[1:])
        for replicas in order:
            what = ("one serve process (baseline)" if replicas == 1
                    else "three deployments side by side, a database and a third of the "
                         "clicks each (nothing shared)" if replicas == -3
                    else f"one serve process beside {neighbours} busy processes (the "
                         "machine's part)" if replicas == -1
                    else "three serve replicas, clicks spread over them")
            print(f"\n== round {n + 1} of {rounds}: {what} (a fixed loop took {speed:.0f} ms)")
            details[replicas] = detail = {}
            if deep:
                bench_clicks.PROFILE_TO = str(profiles / f"r{n}-{replicas}-{{pid}}.prof")
            if replicas == -3:
                got = await apart(db, runs, warm, detail)
            else:
                got = await on_fresh_database(db, runs, abs(replicas), statements, detail,
                                              warm, neighbours if replicas == -1 else 0)
            if deep:
                bench_clicks.PROFILE_TO = ""
                detail["profiles"] = profiled(profiles, f"r{n}-{replicas}-*.prof")
            got["speed"] = speed
            {1: ones, -1: besides, -3: aparts, 3: threes}[replicas].append(got)
        one, three = ones[-1], threes[-1]
        print(f"\n-- round {n + 1}: 1 replica {one['per_second']:.0f}/s, p99 "
              f"{one['start_p99']:.0f} ms; 3 replicas {three['per_second']:.0f}/s, p99 "
              f"{three['start_p99']:.0f} ms ({three['per_second'] / one['per_second']:.2f}x)")
        breakdown(details[1], details[3], runs, rows)
        if neighbours:
            print(f"  one replica beside {neighbours} busy processes: CPU per decision "
                  f"{besides[-1]['cpu_ms']:.1f} ms against {one['cpu_ms']:.1f} alone "
                  f"({besides[-1]['cpu_ms'] / one['cpu_ms']:.2f}x: the same work, the same "
                  "statements, on busier cores)")
            processes(details[1], details[-1], runs, "beside")
        if separate:
            print(f"  three deployments side by side: CPU per decision {aparts[-1]['cpu_ms']:.1f} "
                  f"ms against {one['cpu_ms']:.1f} for one alone "
                  f"({aparts[-1]['cpu_ms'] / one['cpu_ms']:.2f}x) and {three['cpu_ms']:.1f} for "
                  f"three replicas on one database ({three['cpu_ms'] / aparts[-1]['cpu_ms']:.2f}x "
                  f"of the deployments side by side); statements per decision "
                  f"{aparts[-1]['statements']:.2f} against {one['statements']:.2f} and "
                  f"{three['statements']:.2f}")
            processes(details[1], details[-3], runs, "apart")
            print("  statements per decision, three deployments side by side against three "
                  "replicas on one database:")
            diff_table(by_shape(details[-3].get("sent", {})),
                       by_shape(details[3].get("sent", {})),
                       runs, rows, "statement")
    for one, three in zip(ones, threes, strict=True):
        one["ratio"] = three["ratio"] = three["per_second"] / one["per_second"]
        three["per_replica_ms"] = three["cpu_ms"] / 3
        three["cpu_ratio"] = three["cpu_ms"] / one["cpu_ms"]
        three["whole_ratio"] = three["whole_cpu_ms"] / one["whole_cpu_ms"]
    for one, three, other in zip(ones, threes, aparts, strict=False):  # (none: no --apart)
        other["cpu_ratio"] = other["cpu_ms"] / one["cpu_ms"]
        other["whole_ratio"] = other["whole_cpu_ms"] / one["whole_cpu_ms"]
        three["shared_ratio"] = three["cpu_ms"] / other["cpu_ms"]
    for one, beside in zip(ones, besides, strict=False):  # (none without --neighbours)
        beside["cpu_ratio"] = beside["cpu_ms"] / one["cpu_ms"]
        beside["whole_ratio"] = beside["whole_cpu_ms"] / one["whole_cpu_ms"]
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
    print(f"  3 replicas' CPU per decision over one's, each round's pair (issue 50: <= 1.2x): "
          f"{spread(threes, 'cpu_ratio', '.2f')}x while clicking, "
          f"{spread(threes, 'whole_ratio', '.2f')}x until every run completed")
    if besides:
        print(f"  one replica beside {neighbours} busy processes over one alone (the machine's "
              f"part): {spread(besides, 'cpu_ratio', '.2f')}x while clicking, "
              f"{spread(besides, 'whole_ratio', '.2f')}x until every run completed")
    if aparts:
        print(f"  three deployments side by side over one alone (this machine's cores and a "
              f"third of the load per process): {spread(aparts, 'cpu_ratio', '.2f')}x while "
              f"clicking, {spread(aparts, 'whole_ratio', '.2f')}x until every run completed; "
              f"three replicas on one database over them (sharing it): "
              f"{spread(threes, 'shared_ratio', '.2f')}x")
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
    p.add_argument("--rows", type=int, default=25,
                   help="lines of each breakdown table (largest excess first)")
    p.add_argument("--breakdown", action="store_true",
                   help="also count statements by where they came from and each replica's "
                        "Python calls by area (cProfile): slower, CPU figures not comparable")
    p.add_argument("--idle", type=float, default=0, metavar="SECONDS",
                   help="instead: one replica, then three, with no traffic for SECONDS: "
                        "each one's CPU and statements a second on periodic work alone")
    p.add_argument("--warm", type=int, default=0, metavar="N",
                   help="N approvals first, spread over the replicas and not measured: each "
                        "process's once-only costs (compiled statements, the first "
                        "collections' freezes) paid before, as in a deployment up for a while")
    p.add_argument("--neighbours", type=int, default=0, metavar="N",
                   help="also measure, each round, one replica beside N processes each busy "
                        "a third of the time: how much of three replicas' extra CPU the "
                        "shared cores alone cause")
    p.add_argument("--apart", action="store_true",
                   help="also measure, each round, three deployments side by side (a "
                        "database each, a third of the clicks each): the machine's part and "
                        "sharing one database's part of three replicas' extra CPU")
    a = p.parse_args()
    if a.idle:
        return asyncio.run(idle_main(a.db, a.idle, a.rows))
    if a.rounds < 1:
        p.error("--rounds must be at least 1")
    return asyncio.run(main_async(a.db, a.runs, a.rounds, a.statements, a.rows,
                                  a.breakdown, a.warm, a.neighbours,
                                  a.apart))


if __name__ == "__main__":
    sys.exit(main())
