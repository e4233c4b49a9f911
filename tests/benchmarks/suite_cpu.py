"""Where the test suite's CPU goes, test by test (a pytest plugin and its summary).

On a shared machine wall times say more about the neighbours than about the suite; CPU
does not. Loaded into a run, this writes one JSON line per test to
``$SUITE_CPU_DIR/<xdist worker>.jsonl``: its wall time, the CPU of the test process
(user+sys) and of the processes it started and waited for (their descendants included;
the tests' warm servers (:class:`tests.zygote.Warm`, the docs pages' ``approvald`` among
them) and multiprocessing's forkserver count as they go), and
the commands it started (the first words of each). Run as a script, it sums a directory
of them: by file, by kind of process started, and the tests that start none.

    SUITE_CPU_DIR=/tmp/cpu PYTHONPATH=tests/benchmarks pytest -p suite_cpu --durations=80
    python tests/benchmarks/suite_cpu.py /tmp/cpu

What it cannot see: PostgreSQL's own CPU (its server processes are not the suite's
children), and a process the suite started but never waited for.
"""

from __future__ import annotations

import collections
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

_started: list[str] = []
_spawn = subprocess.Popen.__init__


def _popen_init(self: subprocess.Popen[Any], *args: Any, **kwargs: Any) -> None:
    command = args[0] if args else kwargs.get("args")
    words = command[:4] if isinstance(command, list | tuple) else str(command).split()[:4]
    _started.append(" ".join(Path(str(w)).name if i == 0 else str(w)
                             for i, w in enumerate(words)))
    _spawn(self, *args, **kwargs)


def _cpu() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime + _warm_cpu()


def _warm_cpu() -> float:
    """The CPU of this process's servers that fork processes for the tests, and of the
    processes they forked and reaped: the warm ``approvald`` and MCP fixture server
    (tests/zygote.py) and multiprocessing's forkserver (the evaluator's crash children).
    Those processes are the servers' children, not this process's, so ``RUSAGE_CHILDREN``
    sees none of it until the servers end (after the last test)."""
    pids = []
    zygote = sys.modules.get("tests.zygote")
    helpers = sys.modules.get("tests.helpers")
    for warm in vars(helpers).values() if helpers is not None and zygote is not None else ():
        server = getattr(warm, "_server", None) if isinstance(warm, zygote.Warm) else None
        if server is not None:
            pids.append(server.pid)
    forkserver = sys.modules.get("multiprocessing.forkserver")
    pid = getattr(getattr(forkserver, "_forkserver", None), "_forkserver_pid", None)
    if pid is not None:
        pids.append(pid)
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # utime, stime, cutime, cstime: fields 14-17 of proc(5), 12-15 after the name
        total += sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    return total


class _Recorder:
    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        self.out = (directory / f"{worker}.jsonl").open("a", encoding="utf-8")

    def write(self, **line: Any) -> None:
        self.out.write(json.dumps(line) + "\n")
        self.out.flush()

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Iterator[None]:
        _started.clear()
        own, children = _cpu()
        began = time.monotonic()
        try:
            return (yield)
        finally:
            own_after, children_after = _cpu()
            self.write(id=item.nodeid, wall=time.monotonic() - began, own=own_after - own,
                       children=children_after - children, started=list(_started))

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self) -> None:
        own, children = _cpu()
        self.write(id="<collected>", own=own, children=children)

    def pytest_sessionfinish(self) -> None:
        own, children = _cpu()
        self.write(id="<finished>", own=own, children=children)


def pytest_configure(config: pytest.Config) -> None:
    global _spawn
    directory = os.environ.get("SUITE_CPU_DIR")
    if directory:
        # what starts a process now, not when this module was imported: tests/conftest.py's
        # refusal of a process to a test not marked slow (loaded after ``-p suite_cpu``,
        # before this hook) stays in force, and its own test passes
        _spawn = subprocess.Popen.__init__
        subprocess.Popen.__init__ = _popen_init  # type: ignore[method-assign]
        config.pluginmanager.register(_Recorder(Path(directory)), "suite-cpu")


def summary(directory: Path) -> str:
    lines = [json.loads(x) for f in sorted(directory.glob("*.jsonl"))
             for x in f.read_text().splitlines() if x.strip()]
    tests = [x for x in lines if not x["id"].startswith("<")]
    out = [f"{len(tests)} tests: {sum(t['own'] for t in tests):.0f} s of CPU in the test "
           f"processes, {sum(t['children'] for t in tests):.0f} s in what they started"]
    for x in lines:
        if x["id"] == "<collected>":
            out.append(f"a worker's start and collection: {x['own']:.1f} s")
    by_file: collections.Counter[str] = collections.Counter()
    count: collections.Counter[str] = collections.Counter()
    for t in tests:
        name = t["id"].split("::")[0]
        by_file[name] += t["own"] + t["children"]
        count[name] += 1
    out.append("by file (CPU s, tests, processes started):")
    started: collections.Counter[str] = collections.Counter()
    per_file_started: collections.Counter[str] = collections.Counter()
    for t in tests:
        per_file_started[t["id"].split("::")[0]] += len(t["started"])
        for s in t["started"]:
            started[" ".join(s.split()[:2])] += 1
    for name, cpu in by_file.most_common(30):
        out.append(f"  {cpu:7.1f} {count[name]:5} {per_file_started[name]:5}  {name}")
    out.append(f"processes started: {sum(started.values())} in "
               f"{sum(1 for t in tests if t['started'])} tests")
    for what, n in started.most_common(20):
        out.append(f"  {n:5}  {what}")
    quiet = [t for t in tests if not t["started"]]
    out.append(f"tests that start no process: {len(quiet)}, "
               f"{sum(t['own'] for t in quiet):.0f} s of CPU, "
               f"{sum(t['wall'] for t in quiet):.0f} s of their wall time")
    return "\n".join(out)


if __name__ == "__main__":
    print(summary(Path(sys.argv[1])))
