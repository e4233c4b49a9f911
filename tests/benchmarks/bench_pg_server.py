"""Where PostgreSQL's own CPU goes per hot statement (issue 50).

    python tests/benchmarks/bench_pg_server.py --db postgresql+asyncpg://postgres@127.0.0.1:5432/test
        [--calls 1000] [--rounds 3] [--faces hook,api] [--mode auto|force_generic_plan|...]
        [--explain 20]

``bench_decision_cpu.py``'s ``serve`` (in this process, one call at a time over a kept-alive
loopback connection) makes its auto decisions against a database of the run's own on the
server ``--db`` names (made, then dropped). Per call, the CPU the *database server's
backends* took (the same host: ``/proc/<pid>/schedstat``'s time on CPU, in nanoseconds, and
``/proc/<pid>/stat``'s utime + stime, in clock ticks, summed over the backends connected to
the run's database, the benchmark's own monitoring connection excepted), beside a bare
``SELECT 1`` write transaction's (``Database.transact``: BEGIN, SELECT 1, COMMIT), and the
statements asyncpg was given per call (BEGIN and COMMIT included when said as statements).

Then each distinct statement a call sent is explained, ``--explain`` times, in a rolled-back
transaction on the monitoring connection, with the arguments it was sent with:
``EXPLAIN (ANALYZE, BUFFERS, SUMMARY)``'s planning and execution times (the median, in
ms; a backend alone on its statement, so close to its CPU). A statement given parameters
is planned anew on each EXPLAIN (a custom plan): its planning time is what each execution
pays while ``plan_cache_mode`` chooses custom plans. Beside it, the generic plan's (the
statement ``PREPARE``d with ``plan_cache_mode = force_generic_plan``, ``EXPLAIN ANALYZE
EXECUTE``d with its arguments as literals): what a cached generic plan costs per
execution. A replay writes what the arguments still write: an auto decision's insert is
guarded by the audit head it guessed, which has moved on since, so its replay inserts
nothing and its execution time is a floor (the rows, index entries and WAL it would write
are in the first figure, the CPU per call, not here). ``--texts`` prints each statement
text a round sent, and the generic plans in full. ``--perf`` samples the backends with
``perf record`` during each shape's last round and prints what share of their samples
falls under each phase of a statement (reading the client, parse, the plan cache and
planning, the executor's start, run, finish and end, index maintenance, commit and its
WAL flush, the answer sent): planning against execution against commit, exactly where
the CPU went.

    python tests/benchmarks/bench_pg_server.py --db URL --watch DATABASE [--seconds 10] [--perf]

samples instead the backends of another run's database while it runs (``bench_click_cpu.py``
makes ``bench_click_cpu_<its pid>``): their CPU per committed transaction, and by phase.

``--mode`` sets ``plan_cache_mode`` on the run's database (``ALTER DATABASE``, before serve
connects; a setting the connection's startup packet names overrides it): the default,
``keep``, leaves whatever the code under test sets. Timings on a shared machine are noisy:
run before and after alternately, several times, and say "under load".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE))

from bench_common import setup_database
from bench_decision_cpu import Client, Counter, calls, select_one, serve_environment, shut_down
from bench_history import Captured
from sqlalchemy import text

TICK = os.sysconf("SC_CLK_TCK")


def backend_cpu(pids: list[int]) -> tuple[int, int, int]:
    """(nanoseconds on CPU by schedstat, clock ticks of utime, of stime) summed over pids."""
    ns = user = system = 0
    for pid in pids:
        ns += int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        user += int(fields[11])
        system += int(fields[12])
    return ns, user, system


class Monitor:
    """A connection of its own to the run's database: the backends serving the others."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.own = 0

    async def pids(self) -> list[int]:
        if not self.own:
            self.own = await self.conn.fetchval("SELECT pg_backend_pid()")
        rows = await self.conn.fetch(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> $1 AND backend_type = 'client backend'", self.own)
        return sorted(r["pid"] for r in rows)


async def server_cpu(fns: list[Callable[[int], Awaitable[None]]], n: int, rounds: int,
                     counter: Counter, monitor: Monitor, captured: Captured,
                     perf: str | None = None
                     ) -> tuple[list[float], list[float], list[float], float]:
    """Server CPU in ms per call (schedstat; stat's user + system; its system part) for
    each round of ``n`` calls, and the statements asyncpg was given per call (counted
    over the last round). A backend that appears during a round is counted from its
    start; with ``perf``, the last round's backends are sampled by ``perf record`` into
    that file. ``fns``: one per caller, the callers at once, each one call at a time."""
    async def run(count: int) -> None:
        async def one(fn: Callable[[int], Awaitable[None]], k: int) -> None:
            for _ in range(k):
                await fn(counter.next())
        await asyncio.gather(*(one(fn, count // len(fns)) for fn in fns))

    n = n // len(fns) * len(fns)
    await run(min(n, 200 * len(fns)))  # connections opened, statements prepared
    sched, stat, system = [], [], []
    sent = 0.0
    for r in range(rounds):
        pids = await monitor.pids()
        ns0, u0, s0 = backend_cpu(pids)
        last = r == rounds - 1
        recorder = None
        if perf and last:
            recorder = await asyncio.create_subprocess_exec(
                "perf", "record", "-q", "-g", "-o", perf, "-p", ",".join(map(str, pids)),
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            await asyncio.sleep(0.5)  # attached
        captured.sent.clear()
        captured.on = last
        await run(n)
        captured.on = False
        if recorder is not None:
            recorder.send_signal(signal.SIGINT)
            await recorder.wait()
        after = await monitor.pids()
        ns1, u1, s1 = backend_cpu(after)
        if after != pids:
            print(f"    (backends during the round: {pids} -> {after}; a new one counted "
                  "from its start)")
            gone = backend_cpu([p for p in pids if p not in after])  # none: pooled
            ns1, u1, s1 = ns1 + gone[0], u1 + gone[1], s1 + gone[2]
        sched.append((ns1 - ns0) / n / 1e6)
        stat.append((u1 - u0 + s1 - s0) / TICK / n * 1000)
        system.append((s1 - s0) / TICK / n * 1000)
        if captured.sent:
            sent = len(captured.sent) / n
    return sched, stat, system, sent


# what a backend does for a statement, by the function perf finds it under (inclusive)
PHASES = (
    ("reading the client's messages", "pq_getbyte"),
    ("parse (a statement prepared)", "exec_parse_message"),
    ("plan cache: revalidate, lock", "GetCachedPlan"),
    ("  of which planning", "pg_plan_queries"),
    ("executor start (plan initialized)", "standard_ExecutorStart"),
    ("executor run", "standard_ExecutorRun"),
    ("executor finish (CTE writes)", "standard_ExecutorFinish"),
    ("  of which triggers (foreign keys)", "AfterTriggerEndQuery"),
    ("executor end", "standard_ExecutorEnd"),
    ("index maintenance", "ExecInsertIndexTuples"),
    ("commit", "CommitTransactionCommand"),
    ("  of which WAL flush", "XLogFlush"),
    ("    of which fdatasync", "__x64_sys_fdatasync"),
    ("sending the answer", "secure_write"),
)


def phases(data: str, per_call: float, unit: str = "call") -> None:
    """Each phase's share of the backends' samples (perf report, callers included), and
    that share of the server CPU per call (``per_call`` ms)."""
    out = subprocess.run(["perf", "report", "-i", data, "--children", "--sort", "symbol",
                          "--stdio", "-g", "none"], capture_output=True, text=True).stdout
    share: dict[str, float] = {}
    for line in out.splitlines():
        f = line.split()
        if len(f) >= 4 and f[0].endswith("%") and f[2] in ("[.]", "[k]"):
            share.setdefault(f[3], float(f[0].rstrip("%")))
    for name, symbol in PHASES:
        got = share.get(symbol, 0.0)
        print(f"      {name:38} {got:5.1f} %  {got / 100 * per_call:6.3f} ms per {unit}")


async def explain(conn: Any, sent: list[tuple[str, tuple[Any, ...]]], times: int,
                  verbose: bool = False) -> None:
    """Each distinct statement's planning and execution times (EXPLAIN ANALYZE, median)."""
    seen: dict[str, tuple[Any, ...]] = {}
    for sql, args in sent:
        head = sql.lstrip().split(None, 1)[0].upper() if sql.strip() else ""
        if head in ("SELECT", "UPDATE", "INSERT", "DELETE", "WITH"):
            seen.setdefault(sql, args)
    for n, (sql, args) in enumerate(seen.items()):
        if args:  # its generic plan, as a cached prepared statement runs it
            await conn.execute("SET plan_cache_mode = force_generic_plan")
            await conn.execute(f"PREPARE bench_{n} AS {sql}")
            marks = ", ".join(literal(v) for v in args)
            g_plan, g_exec = [], []
            for _ in range(times):
                tr = conn.transaction()
                await tr.start()
                try:
                    got = await conn.fetchval(f"EXPLAIN (ANALYZE, BUFFERS, SUMMARY, FORMAT JSON)"
                                              f" EXECUTE bench_{n}({marks})")
                finally:
                    await tr.rollback()
                out = json.loads(got)[0]
                g_plan.append(out["Planning Time"])
                g_exec.append(out["Execution Time"])
            await conn.execute(f"DEALLOCATE bench_{n}")
            await conn.execute("RESET plan_cache_mode")
            triggers = [(t["Trigger Name"], t["Calls"], round(t["Time"], 3))
                        for t in out.get("Triggers", [])]
            print(f"    generic plan: planning {statistics.median(g_plan):6.3f} ms  execution "
                  f"{statistics.median(g_exec):6.3f} ms; triggers {triggers}")
            if verbose:
                print(json.dumps(out, indent=1)[:6000])
        plan_ms, exec_ms = [], []
        hits = reads = dirtied = 0
        for _ in range(times):
            tr = conn.transaction()
            await tr.start()
            try:
                got = await conn.fetchval(
                    f"EXPLAIN (ANALYZE, BUFFERS, SUMMARY, FORMAT JSON) {sql}", *args)
            finally:
                await tr.rollback()
            out = json.loads(got)[0]
            plan_ms.append(out["Planning Time"])
            exec_ms.append(out["Execution Time"])
            p = out["Plan"]
            hits, reads, dirtied = (p.get("Shared Hit Blocks", 0), p.get("Shared Read Blocks", 0),
                                    p.get("Shared Dirtied Blocks", 0))
        print(f"    planning {statistics.median(plan_ms):6.3f} ms  execution "
              f"{statistics.median(exec_ms):6.3f} ms  ({len(args)} parameters; buffers: hit "
              f"{hits}, read {reads}, dirtied {dirtied})  {' '.join(sql.split())[:110]}")


def literal(v: Any) -> str:
    """A value as an SQL literal of unknown type (the prepared statement casts it)."""
    if v is None:
        return "NULL"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, bytes):
        return f"'\\x{v.hex()}'"
    text_ = v.isoformat() if hasattr(v, "isoformat") else str(v)
    return "'" + text_.replace("'", "''") + "'"


async def watch(a: argparse.Namespace) -> int:
    """``--watch``: another run's database (say ``bench_click_cpu.py``'s), sampled for
    ``--seconds``: its backends' CPU per committed transaction, and by phase."""
    import asyncpg
    from sqlalchemy.engine import make_url

    plain = make_url(a.db).set(drivername="postgresql", database=a.watch).render_as_string(
        hide_password=False)
    conn = await asyncpg.connect(plain)
    try:
        monitor = Monitor(conn)
        count = ("SELECT xact_commit + xact_rollback FROM pg_stat_database "
                 "WHERE datname = current_database()")
        pids = await monitor.pids()
        x0 = await conn.fetchval(count)
        ns0, u0, s0 = backend_cpu(pids)
        data = str(Path(tempfile.mkdtemp()) / "perf.data") if a.perf else None
        recorder = None
        if data:
            recorder = await asyncio.create_subprocess_exec(
                "perf", "record", "-q", "-g", "-o", data, "-p", ",".join(map(str, pids)),
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        await asyncio.sleep(a.seconds)
        if recorder is not None:
            recorder.send_signal(signal.SIGINT)
            await recorder.wait()
        after = await monitor.pids()
        ns1, u1, s1 = backend_cpu([p for p in after if p in pids])
        x1 = await conn.fetchval(count)
        xacts = max(x1 - x0 - 3, 1)  # this connection's own statements left out
        print(f"database {a.watch}: {len(pids)} backends, {xacts} transactions in "
              f"{a.seconds:.0f} s; server CPU {(ns1 - ns0) / 1e6 / xacts:.3f} ms per "
              f"transaction (schedstat), {(u1 - u0 + s1 - s0) / TICK * 1000 / xacts:.3f} ms "
              f"(stat; system {(s1 - s0) / TICK * 1000 / xacts:.3f})")
        if set(after) != set(pids):
            print(f"    (backends changed: {pids} -> {after}; only those throughout counted)")
        if data:
            print("    the backends' samples (perf), by phase:")
            phases(data, (ns1 - ns0) / 1e6 / xacts, "transaction")
        return 0
    finally:
        await conn.close()


def figure(ms: list[float]) -> str:
    return f"{statistics.median(ms):6.3f} ms ({min(ms):.3f}-{max(ms):.3f})"


async def bench(a: argparse.Namespace) -> int:
    import asyncpg  # type: ignore[import-untyped]
    from sqlalchemy.engine import make_url

    tmp = Path(tempfile.mkdtemp())
    db_url, drop = await setup_database(a.db, tmp, "bench_pg_server")
    plain = make_url(db_url).set(drivername="postgresql").render_as_string(hide_password=False)
    mon_conn = await asyncpg.connect(plain)
    if a.mode != "keep":
        await mon_conn.execute(
            f"ALTER DATABASE \"{make_url(db_url).database}\" SET plan_cache_mode = '{a.mode}'")
    monitor = Monitor(mon_conn)
    port, tokens = await serve_environment(tmp, db_url)

    import logging

    from approvald.bot.config import Settings
    from approvald.bot.serve import Service
    from approvald.bot.wiring import open_database

    logging.basicConfig(level=logging.ERROR)
    captured = Captured()
    captured.install()
    settings = Settings()
    db = await open_database(settings, quiet=True)
    service = Service(settings, db)
    clients = [Client(port) for _ in range(a.callers)]
    try:
        await service.start()
        for c in clients:
            await c.open()
        per_client = [calls(c, tokens) for c in clients]
        fns = {k: [f[k] for f in per_client] for k in per_client[0]}
        fns["select1"] = [await select_one(db)] * a.callers
        counter = Counter()
        got = await db.transact(lambda tx: tx.conn.execute(text("SHOW plan_cache_mode")),
                                what="bench")
        mode = got.scalar_one()
        print(f"database: {db.display_url}; {os.cpu_count()} cores, load average "
              f"{os.getloadavg()[0]:.1f}; --mode {a.mode} (serve's connections' plan_cache_mode: "
              f"{mode}); server CPU per call, {a.rounds} rounds of {a.calls} calls, "
              f"{a.callers} caller(s) at once, each one call at a time (median, range)")
        shapes = ["select1", *[f for f in a.faces.split(",") if f]]
        results: dict[str, tuple[list[float], list[float], list[float], float]] = {}
        last: dict[str, list[tuple[str, tuple[Any, ...]]]] = {}
        for shape in shapes:
            data = str(tmp / f"perf-{shape}.data") if a.perf else None
            results[shape] = await server_cpu(fns[shape], a.calls, a.rounds, counter,
                                              monitor, captured, data)
            last[shape] = list(captured.sent)
            if a.texts:
                from collections import Counter as Tally
                for sql, k in Tally(sql for sql, _ in captured.sent).most_common():
                    print(f"      {k:5} x {' '.join(sql.split())[:150]}")
            sched, stat, system, sent = results[shape]
            print(f"  {shape:8} server CPU {figure(sched)} (schedstat), {figure(stat)} "
                  f"(stat; system {statistics.median(system):.3f}); {sent:.1f} statements "
                  "per call, "
                  f"{len({sql for sql, _ in captured.sent})} distinct texts in the round")
            if data:
                print("    the last round's backend samples (perf), by phase:")
                phases(data, statistics.median(results[shape][0]))
        base = statistics.median(results["select1"][0])
        for shape in shapes[1:]:
            print(f"  {shape:8} over the bare SELECT 1 transaction: "
                  f"{statistics.median(results[shape][0]) - base:+.3f} ms")
        if a.explain:
            print(f"planning and execution (EXPLAIN ANALYZE, {a.explain} times each, median)")
            for shape in shapes:
                print(f"  {shape}:")
                await explain(mon_conn, last[shape][-20:], a.explain, a.texts)
        return 0
    finally:
        await shut_down(clients, service, db, drop, mon_conn)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--db", required=True, help="a PostgreSQL server's URL (a database is "
                                               "made on it and dropped)")
    p.add_argument("--calls", type=int, default=1000, help="calls per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--faces", default="hook,api")
    p.add_argument("--callers", type=int, default=1, help="callers at once, each one call "
                   "at a time (concurrent commits may share a WAL flush)")
    p.add_argument("--mode", default="keep", help="plan_cache_mode set on the run's "
                   "database (keep: leave it to the code)")
    p.add_argument("--explain", type=int, default=20)
    p.add_argument("--perf", action="store_true", help="sample the backends with perf "
                   "record during each shape's last round and print the share of each phase "
                   "(needs perf, and root or perf_event_paranoid <= 1)")
    p.add_argument("--texts", action="store_true", help="print each statement text a "
                   "round sent, with how many times")
    p.add_argument("--watch", default=None, help="instead: sample the backends of this "
                   "database on the server --db names (another benchmark's, running)")
    p.add_argument("--seconds", type=float, default=10.0, help="--watch: for how long")
    a = p.parse_args()
    return asyncio.run(watch(a) if a.watch else bench(a))


if __name__ == "__main__":
    sys.exit(main())
