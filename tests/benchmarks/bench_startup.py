"""What starting ``approvald`` costs, command by command: the modules a command imports
(exact: ``-X importtime``'s lines, and the time it says they took), and the wall and CPU
time of the whole process, for ``--help``, commands that read a SQLite file
(``approvals list``, ``runs list``), the Claude Code hook (handing its event to a serve
that is not there, and deciding it itself), and ``serve`` until it answers ``/healthz``.

    python tests/benchmarks/bench_startup.py [--runs 15] [--approvald CMD]

``--approvald`` runs another build the same way (another worktree's console script): run
two one after the other for a paired comparison. Prints, per command, the modules
imported, their import time (the sum of ``-X importtime``'s self times, one run), and the
p50 of wall and CPU time over ``--runs`` processes.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import APPROVALD, HOOK_POLICY, cpu_seconds, free_port, pct


def event(i: int) -> bytes:
    return json.dumps({"hook_event_name": "PreToolUse", "session_id": f"bench-{i}",
                       "cwd": "/tmp", "tool_name": "Bash", "tool_input": {"command": f"ls {i}"},
                       "tool_use_id": f"toolu_{i}"}).encode()


def imports(cmd: list[str], env: dict[str, str], stdin: bytes | None
            ) -> tuple[int, float, set[str]]:
    """(modules imported, their summed self time in ms, their names): one process."""
    done = subprocess.run(cmd, input=stdin, env={**env, "PYTHONPROFILEIMPORTTIME": "1"},
                          capture_output=True, check=False)
    names: set[str] = set()
    own = 0
    for line in done.stderr.decode().splitlines():
        if line.startswith("import time:") and "|" in line and "self [us]" not in line:
            self_us, _cum, name = line.removeprefix("import time:").split("|")
            own += int(self_us)
            names.add(name.strip())
    return len(names), own / 1000, names


def timed(cmd: list[str], env: dict[str, str], stdin: bytes | None, runs: int
          ) -> tuple[list[float], list[float]]:
    walls, cpus = [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.perf_counter()
        done = subprocess.run(cmd, input=stdin, env=env, capture_output=True, check=False)
        walls.append(time.perf_counter() - t)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        if done.returncode not in (0, 1):
            raise RuntimeError(f"{cmd}: exit {done.returncode}: {done.stderr[-500:]!r}")
    return walls, cpus


def serve_start(cmd: list[str], env: dict[str, str], port: int) -> tuple[float, float]:
    """Wall and CPU seconds from starting ``serve`` to its first ``/healthz`` 200."""
    t = time.perf_counter()
    proc = subprocess.Popen([*cmd, "serve"], env={**env, "APPROVALD_PORT": str(port)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while True:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
                conn.request("GET", "/healthz")
                if conn.getresponse().status == 200:
                    return time.perf_counter() - t, cpu_seconds(proc.pid)
            except OSError:
                time.sleep(0.01)
            if proc.poll() is not None or time.perf_counter() - t > 60:
                raise RuntimeError("serve did not start")
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=15, help="processes per figure")
    ap.add_argument("--approvald", default=APPROVALD, help="the command that runs approvald")
    ap.add_argument("--modules", metavar="COMMAND", help="list the modules this command "
                    "(one of the figures' names) imports, and stop")
    a = ap.parse_args()
    cmd = shlex.split(a.approvald)
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        (work / "policy.toml").write_text(HOOK_POLICY)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("APPROVALD_", "SLACK_"))}
        env.update(HOME=str(work), APPROVALD_DATABASE_URL=f"sqlite+aiosqlite:///{work}/a.db",
                   APPROVALD_POLICY_FILE=str(work / "policy.toml"),
                   APPROVALD_SECRET="bench-secret-0123456789abcdef",
                   APPROVALD_LOG_LEVEL="WARNING", APPROVALD_METRICS_ADDR="127.0.0.1:0")
        subprocess.run([*cmd, "db", "upgrade"], env=env, capture_output=True, check=True)
        figures: list[tuple[str, list[str], bytes | None]] = [
            ("approvald --help", ["--help"], None),
            ("approvals list", ["approvals", "list"], None),
            ("runs list", ["runs", "list"], None),
            ("hook claude-code --serve (none there)",
             ["hook", "claude-code", "--serve", f"http://127.0.0.1:{free_port()}",
              "--wait", "0"], event(0)),
            ("hook claude-code (deciding itself)",
             ["hook", "claude-code", "--requested-by", "U_DANA", "--wait", "0"], event(1)),
        ]
        if a.modules:
            [(_, args, stdin)] = [f for f in figures if f[0] == a.modules]
            print("\n".join(sorted(imports([*cmd, *args], env, stdin)[2])))
            return 0
        print(f"{'':40} {'modules':>7} {'import ms':>9} {'wall p50':>8} {'CPU p50':>8}")
        for name, args, stdin in figures:
            n, ms, _ = imports([*cmd, *args], env, stdin)
            walls, cpus = timed([*cmd, *args], env, stdin, a.runs)
            print(f"{name:40} {n:7} {ms:9.0f} {pct(walls, .5):8.0f} {pct(cpus, .5):8.0f}")
        starts = [serve_start(cmd, env, free_port()) for _ in range(max(3, a.runs // 3))]
        print(f"{'serve, until /healthz answers':40} {'':7} {'':9} "
              f"{pct([w for w, _ in starts], .5):8.0f} {pct([c for _, c in starts], .5):8.0f}")
    load = os.getloadavg()
    print(f"(ms; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
