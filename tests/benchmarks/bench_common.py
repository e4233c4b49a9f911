"""What several benchmarks share: the ``approvald`` command beside this interpreter, the
Claude Code hook's policy, percentiles, a free port, a process's CPU time, a count of the
Python calls made (:class:`Calls`), and a database of the run's own (a temporary SQLite
file, or one made on a PostgreSQL server and dropped afterwards). Not a benchmark itself
(``bench_*.py`` are; this module has no ``main``)."""

from __future__ import annotations

import dis
import os
import re
import sys
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo, for tests.helpers

from tests.helpers import free_port as free_port  # a port below the ephemeral range, re-exported

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



def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds process ``pid`` has taken so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Calls:
    """Counts the Python calls made on this thread (``sys.setprofile``), each function
    once per call: a coroutine or generator resumed is not called again (cProfile counts
    every resumption as a call). Calls into C (builtins, methods of C types) count too,
    by name. ``areas``: (label, pattern of the file name), first match wins; ``shape``:
    (label, pattern of ``file:function``), the counts that tell the shape of the work;
    ``only``: a call is counted only while it says so (e.g. in one task's context);
    ``top``: the report lists the functions called most (their files from ``root`` on)."""

    def __init__(self, areas: Sequence[tuple[str, str]],
                 shape: Sequence[tuple[str, str]] = (), *,
                 only: Callable[[], bool] | None = None, top: int = 0,
                 root: Path | None = None) -> None:
        self.areas, self.shape = areas, shape
        self.only, self.top, self.root = only, top, root
        self.by_code: dict[Any, int] = defaultdict(int)
        self.by_c: dict[str, int] = defaultdict(int)
        self._first: dict[Any, int] = {}

    @property
    def c_calls(self) -> int:
        return sum(self.by_c.values())

    def _start(self, code: Any) -> int:
        """The offset of ``code``'s first RESUME: where a fresh frame stands when called."""
        at = self._first.get(code)
        if at is None:
            at = next((i.offset for i in dis.get_instructions(code) if i.opname == "RESUME"), 0)
            self._first[code] = at
        return at

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        if self.only is not None and not self.only():
            return
        if event == "call":
            code = frame.f_code
            if frame.f_lasti <= self._start(code):
                self.by_code[code] += 1
        elif event == "c_call":
            self.by_c[getattr(arg, "__qualname__", None) or repr(arg)] += 1

    def by_area(self) -> dict[str, int]:
        calls: dict[str, int] = defaultdict(int)
        for code, n in self.by_code.items():
            area = next((a for a, pat in self.areas if re.search(pat, code.co_filename)),
                        "other Python")
            calls[area] += n
        calls["calls into C"] = self.c_calls
        return calls

    def by_function(self) -> dict[str, int]:
        """Each function's calls, named ``file:line(qualified name)`` (a C one by its
        qualified name), the file from its package's folder on."""
        out: dict[str, int] = defaultdict(int)
        for code, n in self.by_code.items():
            name = re.sub(r".*/(site-packages|lib/python3\.\d+)/", "", code.co_filename)
            name = re.sub(r".*/(bot|runtime|store|tests)/", r"\1/", name)
            out[f"{name}:{code.co_firstlineno}({code.co_qualname})"] += n
        for name, n in self.by_c.items():
            out[f"C: {name}"] += n
        return out

    def report(self, runs: int, unit: str) -> None:
        calls = self.by_area()
        total = sum(calls.values())
        print(f"  Python calls per {unit}: {total / runs:.0f}")
        for area in sorted(calls, key=lambda a: -calls[a]):
            print(f"    {area:18} {calls[area] / runs:7.1f}")
        if self.shape:
            print(f"  per {unit}:")
        for label, pat in self.shape:
            n = sum(c for code, c in self.by_code.items()
                    if re.search(pat, f"{code.co_filename}:{code.co_name}"))
            print(f"    {label:44} {n / runs:6.2f}")
        if self.top:
            print(f"  the {self.top} functions called most, per {unit}:")
            for code, n in sorted(self.by_code.items(), key=lambda kv: -kv[1])[:self.top]:
                where = re.sub(r".*(site-packages|python3\.\d+)/", "", code.co_filename)
                if self.root is not None:
                    where = where.removeprefix(f"{self.root}/")
                print(f"    {n / runs:8.2f}  {where}:{code.co_firstlineno}:{code.co_qualname}")


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
