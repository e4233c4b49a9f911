"""What several benchmarks share: the ``approvald`` command beside this interpreter, the
Claude Code hook's policy, percentiles, a free port, a process's CPU time, and a database
of the run's own (a temporary SQLite file, or one made on a PostgreSQL server and dropped
afterwards). Not a benchmark itself (``bench_*.py`` are; this module has no ``main``)."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

APPROVALD = str(Path(sys.executable).parent / "approvald")

# the Claude Code hook's Bash calls: ``ls ...`` auto, ``git push ...`` forbidden, the rest asked
HOOK_POLICY = """
[tools."hook:claude-code/Bash"]
approvers = ["U_ALICE"]

[[tools."hook:claude-code/Bash".rules]]
when = 'args.command.startsWith("ls")'
policy = "auto"

[[tools."hook:claude-code/Bash".rules]]
when = 'args.command.startsWith("git push")'
policy = "forbidden"
reason = "pushes go through CI"
"""


def pct(samples: list[float], q: float) -> float:
    """The ``q`` quantile of ``samples`` (seconds), in milliseconds."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] * 1000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds process ``pid`` has taken so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _nothing() -> None:
    return None


async def setup_database(url: str | None, tmp: Path, name: str
                         ) -> tuple[str, Callable[[], Awaitable[None]]]:
    """A database for this run, and how to drop it afterwards: ``tmp/<name>.db`` (SQLite)
    when ``url`` is None, else a database ``<name>_<pid>`` made on the PostgreSQL server
    ``url`` names."""
    if url is None:
        return f"sqlite+aiosqlite:///{tmp / f'{name}.db'}", _nothing
    import asyncpg  # type: ignore[import-untyped]
    from sqlalchemy.engine import make_url

    u = make_url(url)
    db_name = f"{name}_{os.getpid()}"
    plain = u.set(drivername="postgresql", database="postgres").render_as_string(
        hide_password=False)
    conn = await asyncpg.connect(plain)
    await conn.execute(f'CREATE DATABASE "{db_name}"')
    await conn.close()

    async def drop() -> None:
        c = await asyncpg.connect(plain)
        await c.execute(f'DROP DATABASE IF EXISTS "{db_name}" WITH (FORCE)')
        await c.close()

    return u.set(database=db_name).render_as_string(hide_password=False), drop
