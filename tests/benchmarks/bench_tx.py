"""What a transaction itself costs through :class:`~store.db.Database`, per shape (issue 50).

    python tests/benchmarks/bench_tx.py [--db URL] [--n 2000] [--rounds 3]

Each shape runs ``--n`` times one after the other in this process: a write transaction of
one planned statement (the lease heartbeat's UPDATE, matching no row), a write of one
statement in autocommit (``write_one``), a plain read of one planned ``SELECT``, a snapshot
read, and the bare ``SELECT 1`` write transaction through SQLAlchemy that
``bench_decision_cpu.py`` takes as its baseline. Printed per shape: the Python function
calls per transaction, counted by cProfile (exact, whatever the machine's load: what a
change to the path shows first), and the CPU per transaction (``time.process_time``; the
median of ``--rounds``; meaningful only on a quiet machine), with the machine's load.

On PostgreSQL ``--db`` names a server (``postgresql+asyncpg://postgres@127.0.0.1:5432/test``):
a database of the run's own is made there and dropped afterwards. Default: a temporary
SQLite file. ``APPROVALD_DB_FAST_PATH=0`` measures SQLAlchemy's own path.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE))

from bench_common import setup_database
from sqlalchemy import text

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def shapes(db: object) -> dict[str, Callable[[], Awaitable[None]]]:
    from approvald.store.db import Database

    assert isinstance(db, Database)

    async def write() -> None:
        async with db.write() as tx:
            await tx.runs.renew_lease("no-such-run", owner="w", now=NOW, until=NOW)

    async def write_one() -> None:
        async with db.write_one() as tx:
            await tx.runs.renew_lease("no-such-run", owner="w", now=NOW, until=NOW)

    async def read() -> None:
        async with db.read() as tx:
            await tx.runs.get("no-such-run")

    async def snapshot() -> None:
        async with db.read(snapshot=True) as tx:
            await tx.runs.get("no-such-run")

    async def select1() -> None:
        await db.transact(lambda tx: tx.conn.execute(text("SELECT 1")), what="baseline")

    return {"write (1 planned statement)": write, "write_one (autocommit)": write_one,
            "read (1 planned SELECT)": read, "read(snapshot=True)": snapshot,
            "transact(SELECT 1 via SQLAlchemy)": select1}


async def bench(a: argparse.Namespace) -> int:
    from approvald.store import migrate
    from approvald.store.db import Database

    tmp = Path(tempfile.mkdtemp())
    url, drop = await setup_database(a.db, tmp, "bench_tx")
    db = Database(url, server_time=False)
    try:
        await migrate.upgrade(db)
        print(f"database: {db.display_url}; fast path {'on' if db.fast_path else 'off'}; "
              f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
        for name, fn in shapes(db).items():
            for _ in range(min(a.n, 200)):  # connections, plans, prepared statements
                await fn()
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(a.n):
                await fn()
            prof.disable()
            calls = pstats.Stats(prof).total_calls / a.n  # type: ignore[attr-defined]
            cpu = []
            for _ in range(a.rounds):
                t = time.process_time()
                for _ in range(a.n):
                    await fn()
                cpu.append((time.process_time() - t) / a.n * 1000)
            print(f"  {name:36} {calls:7.1f} Python calls   {statistics.median(cpu):.3f} ms "
                  f"CPU (rounds {min(cpu):.3f}-{max(cpu):.3f})")
        return 0
    finally:
        await db.close()
        await drop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--db", default=None, help="a PostgreSQL server's URL (a database is made "
                                              "on it); default: a temp SQLite file")
    p.add_argument("--n", type=int, default=2000, help="transactions per shape and round")
    p.add_argument("--rounds", type=int, default=3)
    return asyncio.run(bench(p.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
