"""Intake decisions at a fleet's rate: auto and forbidden answers mixed with gated requests,
from many callers at once, through every caller face of one ``approvald serve`` (issue 50).

    python tests/benchmarks/bench_fleet.py [--db URL ...] [--callers 50] [--per-kind 300]
                                           [--mixed 3000] [--count 40] [--rate 1000]
                                           [--seconds 5] [--open-faces hook,api,mcp]

Every tool call of every engineer's Claude Code, every MCP call and every API request is an
intake decision, most of them answered at once by the operator's policy. ``approvald
serve`` runs as its own process (no Slack: a gated request's card is logged), with an MCP
gateway ``bank`` in front of a small MCP server it starts; this process plays ``--callers``
callers at once, over HTTP with bearer tokens made by ``approvald tokens create``:

* ``/v1/hooks/claude-code`` (``wait=0``): Claude Code's HTTP hook, a ``PreToolUse`` per call
  (``ls …`` auto, ``git push …`` forbidden, ``rm …`` asked: denied as still pending);
* ``/v1/requests``: the HTTP API (``read_metrics`` auto, ``drop_table`` forbidden,
  ``deploy`` asked: 201 pending);
* ``/mcp/bank``: ``tools/call`` over Streamable HTTP (``echo`` auto, and run by the
  gateway; ``echo`` of ``rm …`` forbidden; ``transfer_money`` asked, the gateway's wait 0).

Each call is its own (its own arguments), so none joins another's request.

First the **statements** (and transactions) ``serve`` sends its database per decision,
counted in the serve process (:mod:`sql_count`: asyncpg's calls on PostgreSQL, sqlite3's
trace callback on SQLite; ``BEGIN`` and ``COMMIT`` count), ``--count`` calls of each face
and kind one at a time: each statement a decision sends is sent a whole number of times
per call, and what serve's sweeps and polls send meanwhile (measured idle, and printed)
is a small fraction per call, so rounding per statement gives the exact path; the
statements of each face's auto decision are listed. Then, for each face and kind alone,
``--per-kind`` calls, ``--callers`` at a time: decisions per second, p50/p99 latency and
``serve``'s CPU per decision; then ``--mixed`` calls of every face and kind interleaved
(8 auto : 1 forbidden : 1 asked), as a fleet sends them. A call not answered as its
kind must be (a hook's deny because serve did not decide within its budget, on a
saturated machine) is counted and printed.

Those runs are closed loops (each of ``--callers`` callers makes its next call as soon
as the one before is answered, with aiohttp, in this process): they measure the most
``serve`` answers with these callers beside it, and their p99 is the callers' queue
(about ``--callers`` / rate), not the latency at a given rate. So each face of
``--open-faces`` is then measured twice more from :mod:`load_gen` (a raw-socket client
in a process of its own, every request's bytes built before its clock starts, its own
CPU printed): an **open loop**, ``--rate`` calls a second offered (Poisson arrivals over
``--seconds``, spread over ``--callers`` kept-alive connections; each call's latency
counts from its arrival, so a server that falls behind shows it), and a **closed loop**
of as many calls over the same connections (the most it answers). Each line gives
``serve``'s CPU per decision and in cores, the load generator's cores, and how many of
the machine's cores were busy meanwhile (``/proc/stat``: everything, PostgreSQL
included), so the reader sees what share of the machine the callers took.

The in-run baselines, ``--callers`` at a time: a bare round trip to ``serve`` (``GET
/healthz`` carrying the same bearer header, which it does not check), a bare signed round
trip (``POST /v1/requests`` with the API face's bearer token, checked as an auto
decision's is, and a body of ``{}``, refused with 422 before the runtime: what every
decision pays before it is one) and a bare ``SELECT 1`` write transaction from this
process (``BEGIN; SELECT 1; COMMIT``). Targets (issue 50, for PostgreSQL): >= 1,000 auto
decisions per second per serve with p99 <= 20 ms, judged on the open loop at the offered
rate (PASS when ``--rate`` >= 1,000, every call answered as it must be, the answers ending
within 2% of the arrivals' span, and p99 <= 20 ms), and <= 3 statements per auto
decision; PASS/FAIL printed for each face's auto decisions.

On PostgreSQL ``--db`` names a server (``postgresql+asyncpg://postgres@127.0.0.1:5432/test``):
the benchmark makes a database of its own there and drops it afterwards; ``--db sqlite``
(the default) a temporary SQLite file. Given more than once (``--db sqlite --db
postgresql+asyncpg://…``: both dialects), each is run in turn, one serve after the other,
and the runs end with one summary: each dialect's baselines and auto decisions per face
(closed loop; open loop at the offered rate; statements) with the targets' PASS/FAIL.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE))

import aiohttp
import bench_probe
import sql_count
from approvald.store.db import Database
from bench_common import APPROVALD, HOOK_POLICY, cpu_seconds, free_port, pct, setup_database
from sqlalchemy import text

MCP_SERVER = HERE.parent / "fixtures" / "mcp_server.py"
POLICY = HOOK_POLICY + """
[tools."api:fleet/read_metrics"]
policy = "auto"

[tools."api:fleet/drop_table"]
policy = "forbidden"

[tools."api:fleet/deploy"]
approvers = ["U_ALICE"]

[tools."mcp:bank/echo"]
policy = "auto"

[[tools."mcp:bank/echo".rules]]
when = 'args.text.startsWith("rm")'
policy = "forbidden"
reason = "nothing is removed through echo"

[tools."mcp:bank/transfer_money"]
approvers = ["U_ALICE"]
"""
FACES = ("hook", "api", "mcp")
KINDS = ("auto", "forbidden", "asked")
TARGET_RATE, TARGET_P99, TARGET_STATEMENTS = 1000.0, 20.0, 3.0
KEPT_UP = 0.98  # an open run kept up when its answers end within 2% of its arrivals' span
SIGNED = "signed round trip (POST /v1/requests, 422)"
LOAD_GEN = HERE / "load_gen.py"


class Callers:
    """The three faces' calls, each checked for the answer its kind must get."""

    def __init__(self, http: aiohttp.ClientSession, base: str, tokens: dict[str, str]) -> None:
        self.http = http
        self.base = base
        self.tokens = tokens
        self.n = 0

    def _auth(self, face: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[face]}",
                "Content-Type": "application/json"}

    async def call(self, face: str, kind: str, caller: int) -> None:
        self.n += 1
        i = self.n
        if face == "hook":
            command = {"auto": f"ls -la /srv/{i}", "forbidden": f"git push origin b{i}",
                       "asked": f"rm -rf /tmp/fleet-{i}"}[kind]
            event = {"hook_event_name": "PreToolUse", "session_id": f"fleet-{caller}",
                     "cwd": "/srv", "tool_name": "Bash", "tool_input": {"command": command},
                     "tool_use_id": f"toolu_{i}"}
            async with self.http.post(f"{self.base}/v1/hooks/claude-code?wait=0", json=event,
                                      headers=self._auth(face)) as r:
                body = await r.json()
            said = body["hookSpecificOutput"]["permissionDecision"]
            if r.status != 200 or said != ("allow" if kind == "auto" else "deny") \
                    or "could not" in json.dumps(body):
                raise RuntimeError(f"hook {kind}: {r.status} {body}")
        elif face == "api":
            tool = {"auto": "read_metrics", "forbidden": "drop_table", "asked": "deploy"}[kind]
            async with self.http.post(f"{self.base}/v1/requests",
                                      json={"tool": tool, "args": {"n": i}},
                                      headers=self._auth(face)) as r:
                body = await r.json()
            want = {"auto": (201, "approved"), "forbidden": (403, "forbidden"),
                    "asked": (201, "pending")}[kind]
            if (r.status, body.get("status")) != want:
                raise RuntimeError(f"api {kind}: {r.status} {body}")
        else:
            name, args = {"auto": ("echo", {"text": f"hi {i}"}),
                          "forbidden": ("echo", {"text": f"rm {i}"}),
                          "asked": ("transfer_money", {"to": f"ACME-{i}", "cents": i})}[kind]
            msg = {"jsonrpc": "2.0", "id": i, "method": "tools/call",
                   "params": {"name": name, "arguments": args}}
            async with self.http.post(f"{self.base}/mcp/bank", json=msg, headers={
                    **self._auth(face), "Accept": "application/json, text/event-stream",
                    "MCP-Protocol-Version": "2025-06-18"}) as r:
                raw = await r.text()
            body = _jsonrpc(raw)
            result = body.get("result") or {}
            if r.status != 200 or bool(result.get("isError")) != (kind != "auto"):
                raise RuntimeError(f"mcp {kind}: {r.status} {raw[:500]}")


def _jsonrpc(raw: str) -> dict[str, Any]:
    """The JSON-RPC response in a JSON body or a server-sent event stream's last data."""
    raw = raw.strip()
    if raw.startswith("{"):
        return dict(json.loads(raw))
    data = [line[5:].strip() for line in raw.splitlines() if line.startswith("data:")]
    for item in reversed(data):
        doc = json.loads(item)
        if "result" in doc or "error" in doc:
            return dict(doc)
    raise RuntimeError(f"no JSON-RPC response in {raw[:300]!r}")


FAILED: list[str] = []  # calls that did not get the answer their kind must get


async def flood(jobs: list[Callable[[int], Awaitable[None]]], callers: int
                ) -> tuple[float, list[float]]:
    """Run ``jobs``, ``callers`` at a time (each caller takes the next job as it is done);
    (wall seconds, each job's latency). A call answered wrongly (a hook's deny because no
    decision came within its budget, say) is kept in :data:`FAILED` and printed."""
    queue = list(reversed(jobs))
    latencies: list[float] = []

    async def caller(c: int) -> None:
        while queue:
            job = queue.pop()
            t = time.perf_counter()
            try:
                await job(c)
            except (RuntimeError, aiohttp.ClientError, KeyError, ValueError) as exc:
                FAILED.append(str(exc)[:300])
            latencies.append(time.perf_counter() - t)

    t0 = time.perf_counter()
    await asyncio.gather(*(caller(c) for c in range(callers)))
    return time.perf_counter() - t0, latencies


@dataclass
class Row:
    name: str
    count: int
    wall: float
    latencies: list[float]
    cpu: float
    statements: dict[str, int]
    most: list[tuple[int, str]]
    failed: int = 0

    @property
    def rate(self) -> float:
        return self.count / self.wall

    def per(self, kind: str) -> float:
        if kind == "BEGIN":
            return sql_count.begins(self.statements) / self.count
        return self.statements.get(kind, 0) / self.count

    def path(self) -> list[tuple[int, str]]:
        """The statements of one decision: each statement sent about once per decision
        or more, rounded (a decision sends each a whole number of times; what serve's
        sweeps and polls sent meanwhile, or a connection opened, is well under half a
        statement per decision one call at a time, and is left out)."""
        return [(k, sql) for k, sql in ((round(n / self.count), sql) for n, sql in self.most)
                if k >= 1]  # (half the calls' retries round to none, not to a "0" line)

    def exact(self, kind: str = "all") -> int:
        return sum(n for n, sql in self.path()
                   if kind == "all" or sql.split()[0].upper().rstrip(";") == kind)


class Serve:
    def __init__(self, proc: subprocess.Popen[bytes], counts: Path) -> None:
        self.proc = proc
        self.counts = counts

    async def statements(self) -> dict[str, int]:
        path = self.counts / f"{self.proc.pid}.json"
        path.unlink(missing_ok=True)
        os.kill(self.proc.pid, signal.SIGUSR1)
        for _ in range(200):
            if path.exists():
                return sql_count.snapshot(self.counts, [self.proc.pid])
            await asyncio.sleep(0.05)
        raise RuntimeError("serve did not write its statement counts")


async def measure(serve: Serve, name: str, jobs: list[Callable[[int], Awaitable[None]]],
                  callers: int, most: int = 1000) -> Row:
    before = await serve.statements()
    cpu0 = cpu_seconds(serve.proc.pid)
    failed = len(FAILED)
    wall, latencies = await flood(jobs, callers)
    cpu = cpu_seconds(serve.proc.pid) - cpu0
    after = await serve.statements()
    return Row(name, len(jobs), wall, latencies, cpu, sql_count.per_kind(before, after),
               sql_count.by_statement(before, after)[:most], len(FAILED) - failed)


async def baselines(base: str, token: str, db: Database, callers: int, n: int) -> list[Row]:
    rows = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=callers)) as http:
        async def health(_: int) -> None:
            async with http.get(f"{base}/healthz",
                                headers={"Authorization": f"Bearer {token}"}) as r:
                await r.read()
                assert r.status == 200

        async def signed(_: int) -> None:
            # the bearer token checked (from memory, as an auto decision's is), the body
            # read and parsed, refused before the runtime: no statement, no decision
            async with http.post(f"{base}/v1/requests", json={}, headers={
                    "Authorization": f"Bearer {token}"}) as r:
                await r.read()
                assert r.status == 422, r.status

        await flood([health] * 100, callers)
        wall, lat = await flood([health] * n, callers)
        rows.append(Row("bare round trip (GET /healthz)", n, wall, lat, 0.0, {}, []))
        await flood([signed] * 100, callers)
        wall, lat = await flood([signed] * n, callers)
        rows.append(Row(SIGNED, n, wall, lat, 0.0, {}, []))

    async def select_one(_: int) -> None:
        await db.transact(lambda tx: tx.conn.execute(text("SELECT 1")), what="baseline")

    await flood([select_one] * 50, callers)
    wall, lat = await flood([select_one] * n, callers)
    rows.append(Row("bare SELECT 1 write transaction (this process)", n, wall, lat, 0.0,
                    {"all": 3 * n, "BEGIN": n}, []))
    return rows


def show(row: Row, *, stmts: bool = True) -> None:
    figures = (f"{row.rate:8.0f}/s  p50 {pct(row.latencies, .5):6.1f} ms  "
               f"p99 {pct(row.latencies, .99):6.1f} ms")
    if row.cpu:
        figures += f"  serve CPU {row.cpu / row.count * 1000:5.2f} ms"
    if stmts and row.statements:
        figures += (f"  {row.per('all'):5.1f} statements, "
                    f"{row.per('BEGIN'):4.1f} transactions")
    if row.failed:
        figures += f"  ({row.failed} not answered as they must be)"
    print(f"  {row.name:44} {figures}")



def make_tokens(env: dict[str, str] | None) -> dict[str, str]:
    """A bearer token for each face the benchmark calls (hook, api, mcp), made by the
    command line with environment ``env`` (None: this process's)."""
    tokens = {}
    for face, extra in (("hook", ["hook", "--face", "hook:claude-code"]),
                        ("api", ["fleet", "--tools", "*"]),
                        ("mcp", ["fleet-mcp", "--face", "mcp:bank"])):
        if face != "api":
            extra += ["--requested-by", "U_DANA"]
        made = subprocess.run([APPROVALD, "tokens", "create", *extra, "--json"], env=env,
                              capture_output=True, text=True, check=True)
        tokens[face] = json.loads(made.stdout)["token"]
    return tokens


def launch(tmp: Path, db_url: str, loop: str | None = None, probe: bool = False
           ) -> tuple[subprocess.Popen[bytes], dict[str, str], int]:
    """The policy and gateway files, a token for each face (``approvald tokens create``)
    and ``approvald serve`` started on them: (its process, the tokens, its port)."""
    (tmp / "policy.toml").write_text(POLICY)
    (tmp / "gateways.toml").write_text(
        f"[gateways.bank]\ncommand = {json.dumps([sys.executable, str(MCP_SERVER)])}\n"
        "wait = 0\n")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("APPROVALD_", "SLACK_"))}
    env.update(APPROVALD_DATABASE_URL=db_url, APPROVALD_POLICY_FILE=str(tmp / "policy.toml"),
               APPROVALD_MCP_GATEWAYS_FILE=str(tmp / "gateways.toml"),
               APPROVALD_SECRET="bench-secret-0123456789abcdef", APPROVALD_PORT=str(port),
               APPROVALD_HOST="127.0.0.1", APPROVALD_LOG_LEVEL="ERROR",
               APPROVALD_METRICS_ADDR="127.0.0.1:0", APPROVALD_AGENTS="bench_agent",
               MCP_FIXTURE_LEDGER=str(tmp / "transfers.jsonl"),
               BENCH_SQL_COUNT=str(tmp),
               BENCH_SQL_COUNT_SQLITE="1" if db_url.startswith("sqlite") else "0",
               PYTHONPATH=os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")]))
    # a setting to measure, e.g. BENCH_SERVE_ENV="APPROVALD_DB_CONNECTIONS=8"
    env.update(item.split("=", 1) for item in os.environ.get("BENCH_SERVE_ENV", "").split())
    if loop is not None:  # --loop: serve's event loop (APPROVALD_EVENT_LOOP)
        env["APPROVALD_EVENT_LOOP"] = loop
    if probe:  # --probe: what stalls serve's event loop (bench_probe)
        env["BENCH_PROBE"] = str(tmp / "probe.json")
    tokens = make_tokens(env)
    with (tmp / "serve.log").open("wb") as log:
        proc = subprocess.Popen([APPROVALD, "serve"], env=env, stdout=subprocess.DEVNULL,
                                stderr=log)
    return proc, tokens, port


def load_spec(face: str, tokens: dict[str, str]) -> dict[str, Any]:
    """What :mod:`load_gen` sends for ``face``'s auto decision (``@I@``: the call's
    number, so each call is its own) and the answer it must get; ``signed``: the signed
    baseline, a bare signed round trip refused before the runtime."""
    auth = (f"Authorization: Bearer {tokens['api' if face == 'signed' else face]}\r\n"
            "Content-Type: application/json\r\n")
    if face == "signed":  # the baseline: the API's token checked, ``{}`` refused (422)
        return {"method": "POST", "path": "/v1/requests", "headers": auth, "body": "{}",
                "status": 422, "expect": ['"code":"invalid_request"']}
    if face == "hook":
        body = json.dumps({"hook_event_name": "PreToolUse", "session_id": "fleet-open",
                           "cwd": "/srv", "tool_name": "Bash",
                           "tool_input": {"command": "ls -la /srv/@I@"},
                           "tool_use_id": "toolu_@I@"})
        return {"method": "POST", "path": "/v1/hooks/claude-code?wait=0", "headers": auth,
                "body": body, "status": 200, "expect": ['"permissionDecision":"allow"']}
    if face == "api":
        return {"method": "POST", "path": "/v1/requests", "headers": auth,
                "body": '{"tool":"read_metrics","args":{"n":@I@}}', "status": 201,
                "expect": ['"status":"approved"']}
    return {"method": "POST", "path": "/mcp/bank", "status": 200,
            "headers": auth + "Accept: application/json, text/event-stream\r\n"
                              "MCP-Protocol-Version: 2025-06-18\r\n",
            "body": '{"jsonrpc":"2.0","id":@I@,"method":"tools/call","params":{"name":"echo",'
                    '"arguments":{"text":"hi @I@"}}}',
            "expect": ['"isError":false', '"isError": false']}


def _busy() -> tuple[int, int]:
    """The machine's (busy, all) CPU jiffies so far, every core (/proc/stat)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return sum(fields) - idle, sum(fields)


@dataclass
class Load:
    """One run of :mod:`load_gen` against serve: its answers' latencies (from each
    call's arrival, open; from its send, closed) and the CPU each side took."""

    face: str
    mode: str
    offered: float | None  # a second (open), None: closed
    count: int
    wall: float
    span: float
    latencies: list[float]
    failed: int
    first_failure: str | None
    serve_cpu: float  # seconds
    gen_cpu: float  # seconds, the load generator's own
    busy: float  # cores of the machine busy meanwhile (all processes)

    @property
    def rate(self) -> float:
        return (self.count - self.failed) / max(self.wall, self.span)

    def kept_up(self) -> bool:
        """(open) every call answered as it must be, and the answers ended within
        :data:`KEPT_UP` of the arrivals' span: no backlog grew."""
        return self.failed == 0 and self.span / self.wall >= KEPT_UP

    def verdict(self) -> tuple[bool, bool]:
        """(>= TARGET_RATE answered at that rate, p99 <= TARGET_P99)."""
        rate_ok = self.offered is not None and self.offered >= TARGET_RATE and self.kept_up()
        return rate_ok, pct(self.latencies, .99) <= TARGET_P99

    def line(self) -> str:
        cores = os.cpu_count() or 1
        head = (f"offered {self.offered:6.0f}/s, answered {self.rate:6.0f}/s"
                if self.offered is not None else f"{self.rate:6.0f}/s")
        name = "baseline: signed 422" if self.face == "signed" else f"{self.face} auto"
        out = (f"  {name:20} {head}  p50 {pct(self.latencies, .5):6.1f} ms  "
               f"p99 {pct(self.latencies, .99):6.1f} ms  serve CPU "
               f"{self.serve_cpu / self.count * 1000:4.2f} ms/decision "
               f"({self.serve_cpu / self.wall:.2f} cores); load generator "
               f"{self.gen_cpu / self.count * 1000:4.2f} ms/call ({self.gen_cpu / self.wall:.2f} "
               "cores); machine "
               f"{self.busy:.2f} of {cores} cores busy")
        if self.failed:
            out += f"  ({self.failed} not answered as they must be: {self.first_failure})"
        return out


async def load(serve: Serve, port: int, spec: dict[str, Any], face: str, *, mode: str,
               count: int, first: int, connections: int, rate: float | None = None,
               seed: int = 50) -> Load:
    """``count`` calls of ``face``'s auto decision from :mod:`load_gen`, a process of its
    own (its requests' bytes built before its clock starts)."""
    spec = {**spec, "port": port, "mode": mode, "count": count, "first": first,
            "connections": connections, "rate": rate, "seed": seed}
    cpu0, busy0 = cpu_seconds(serve.proc.pid), _busy()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(LOAD_GEN), stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate(json.dumps(spec).encode())
    cpu, busy1 = cpu_seconds(serve.proc.pid) - cpu0, _busy()
    if proc.returncode != 0:
        raise RuntimeError(f"load_gen.py ended with {proc.returncode}")
    got = json.loads(out)
    share = (busy1[0] - busy0[0]) / max(1, busy1[1] - busy0[1]) * (os.cpu_count() or 1)
    # serve's CPU and the machine's are counted over the generator's whole life (its
    # start-up and connections too): slightly more than the calls' own
    return Load(face, mode, rate, count, got["wall"], got["span"], got["latencies"],
                got["failed"], got["first_failure"], cpu, got["cpu"], share)


@dataclass
class Summary:
    """One dialect's run, for the table the runs end with: its baselines and each face's
    auto decisions (alone, ``--callers`` at a time) with their statements."""

    database: str
    baselines: list[Row]
    auto: dict[str, tuple[Row, int]]
    opened: dict[str, Load]  # each face's auto decisions at the offered rate (open loop)
    most: dict[str, Load]  # and at the most serve answers (closed loop, the same client)


def mark(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def targets(face: str, per: int, opened: Load | None, most: Load | None) -> str:
    """One face's auto decisions against issue 50's targets: the rate and p99 at the
    offered rate (open loop), the statements counted; the most it answers (closed loop)."""
    text = f"<= {TARGET_STATEMENTS:g} statements: {per} {mark(per <= TARGET_STATEMENTS)}"
    if opened is not None:
        rate_ok, p99_ok = opened.verdict()
        text = (f">= {TARGET_RATE:,.0f}/s with p99 <= {TARGET_P99:g} ms (offered "
                f"{opened.offered:,.0f}/s): answered {opened.rate:.0f}/s {mark(rate_ok)}, p99 "
                f"{pct(opened.latencies, .99):.1f} ms {mark(p99_ok)};  {text}")
    if most is not None:
        text += f";  at most {most.rate:.0f}/s (closed loop)"
    return text


def summarize(runs: list[Summary]) -> None:
    """Every dialect's baselines and auto decisions, and the targets' verdicts."""
    print(f"summary: auto decisions per face, each alone; the targets (issue 50, set for "
          f"PostgreSQL): >= {TARGET_RATE:,.0f}/s with p99 <= {TARGET_P99:g} ms, judged at "
          f"the offered rate (open loop), <= {TARGET_STATEMENTS:g} statements")
    for run in runs:
        print(f"  {run.database}")
        for row in run.baselines:
            print(f"    {row.name:48} {row.rate:8.0f}/s  p50 {pct(row.latencies, .5):6.1f} ms"
                  f"  p99 {pct(row.latencies, .99):6.1f} ms")
        for label, loads in (("open loop", run.opened), ("closed loop", run.most)):
            if "signed" in loads:
                o = loads["signed"]
                print(f"    {'signed 422, ' + label + ' (load_gen.py)':48} {o.rate:8.0f}/s  "
                      f"p50 {pct(o.latencies, .5):6.1f} ms  p99 {pct(o.latencies, .99):6.1f} ms")
        for face, (row, per) in run.auto.items():
            print(f"    {face + ' auto, closed loop (aiohttp callers)':48} {row.rate:8.0f}/s  "
                  f"p50 {pct(row.latencies, .5):6.1f} ms  p99 {pct(row.latencies, .99):6.1f} "
                  "ms")
            print(f"      {targets(face, per, run.opened.get(face), run.most.get(face))}")


async def bench(a: argparse.Namespace, where: str | None) -> Summary:
    tmp = Path(tempfile.mkdtemp())
    db_url, drop = await setup_database(where, tmp, "bench_fleet")
    proc, tokens, port = launch(tmp, db_url, a.loop, a.probe)
    serve = Serve(proc, tmp)
    db = Database(db_url)
    base = f"http://127.0.0.1:{port}"
    try:
        try:
            await wait_healthy(base)
        except RuntimeError:
            print((tmp / "serve.log").read_text()[-3000:], file=sys.stderr)
            raise
        async with aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=a.callers)) as http:
            callers = Callers(http, base, tokens)

            def job(face: str, kind: str) -> Callable[[int], Awaitable[None]]:
                return lambda c: callers.call(face, kind, c)

            # warm serve's caches and connections (and the gateway's server)
            await flood([job(f, k) for f in FACES for k in KINDS for _ in range(3)], 1)
            await flood([job(f, k) for f in FACES for k in KINDS for _ in range(10)],
                        a.callers)
            FAILED.clear()
            idle0 = await serve.statements()
            t = time.perf_counter()
            await asyncio.sleep(3)
            idle = sql_count.per_kind(idle0, await serve.statements())
            idle_rate = idle.get("all", 0) / (time.perf_counter() - t)
            print(f"database: {db.display_url}; {os.cpu_count()} cores, load average "
                  f"{os.getloadavg()[0]:.1f}; one serve (pid {proc.pid}, "
                  f"{serve_loop(tmp / 'serve.log')}); {a.callers} "
                  f"callers at a time")
            print(f"serve while idle: {idle_rate:.1f} statements/s (sweeps and polls; "
                  "counted in the figures below, not subtracted)")
            print("baselines")
            bases = await baselines(base, tokens["api"], db, a.callers, a.per_kind * 2)
            for row in bases:
                show(row)
            print(f"the statements of a decision, counted in serve, {a.count} calls of each "
                  "face and kind one at a time (BEGIN and COMMIT count)")
            counted: dict[tuple[str, str], Row] = {}
            for face in FACES:
                for kind in KINDS:
                    row = await measure(serve, f"{face} {kind}",
                                        [job(face, kind)] * a.count, 1)
                    counted[face, kind] = row
                    print(f"  {row.name:16} {row.exact():3d} statements, "
                          f"{row.exact('BEGIN'):2d} transactions  (all serve sent meanwhile: "
                          f"{row.per('all'):.2f} per call)"
                          + (f"  ({row.failed} not answered as they must be)"
                             if row.failed else ""))
            print(f"each face and kind alone, {a.per_kind} calls, {a.callers} at a time")
            rows: dict[tuple[str, str], Row] = {}
            for face in FACES:
                for kind in KINDS:
                    row = await measure(serve, f"{face} {kind}",
                                        [job(face, kind)] * a.per_kind, a.callers)
                    rows[face, kind] = row
                    show(row, stmts=False)
            mix = [job(f, k) for f in FACES
                   for k, w in (("auto", 8), ("forbidden", 1), ("asked", 1))
                   for _ in range(w)]
            random.seed(50)
            jobs = [random.choice(mix) for _ in range(a.mixed)]
            print(f"all faces and kinds mixed (8 auto : 1 forbidden : 1 asked), {a.mixed} "
                  f"calls, {a.callers} at a time")
            show(await measure(serve, "mixed", jobs, a.callers), stmts=False)
            if a.statements:
                for face in FACES:
                    row = counted[face, "auto"]
                    print(f"the statements of a {face} auto decision:")
                    for n, sql in row.path():
                        print(f"  {n:3d}  {sql if len(sql) <= 120 else sql[:117] + '...'}")
            if FAILED:
                print(f"{len(FAILED)} calls were not answered as their kind must be; the "
                      f"first: {FAILED[0]}")
            opened, most = await open_and_closed(a, serve, port, tokens)
            print("targets (issue 50, set for PostgreSQL), each face's auto decisions")
            for face in FACES:
                said = targets(face, counted[face, "auto"].exact(), opened.get(face),
                               most.get(face))
                print(f"  {face}: {said}")
        return Summary(db.display_url, bases,
                       {face: (rows[face, "auto"], counted[face, "auto"].exact())
                        for face in FACES}, opened, most)
    finally:
        proc.terminate()
        proc.wait(30)
        await db.close()
        await drop()


async def open_and_closed(a: argparse.Namespace, serve: Serve, port: int,
                          tokens: dict[str, str]) -> tuple[dict[str, Load], dict[str, Load]]:
    """Each face of ``--open-faces``: its auto decisions offered at ``--rate`` (open
    loop), then as fast as serve answers them (closed loop), from :mod:`load_gen`."""
    faces = [f for f in a.open_faces.split(",") if f]
    opened: dict[str, Load] = {}
    most: dict[str, Load] = {}
    if not faces:
        return opened, most
    n = max(1, round(a.rate * a.seconds))
    first = 10_000_000  # call numbers of their own (no call joins another's request)
    print(f"open loop: {a.rate:,.0f} calls a second offered, Poisson arrivals spread over "
          f"{a.callers} kept-alive connections for {a.seconds:g} s ({n} calls), from "
          "load_gen.py (a raw-socket client, its requests built before the clock starts, "
          "in a process of its own); latency from each call's arrival")
    for face in ["signed", *faces]:
        spec = load_spec(face, tokens)
        await load(serve, port, spec, face, mode="closed", count=4 * a.callers, first=first,
                   connections=a.callers)  # serve's and the gateway's connections warm
        first += 4 * a.callers
        t0 = time.time()
        opened[face] = row = await load(serve, port, spec, face, mode="open", count=n,
                                        first=first, connections=a.callers, rate=a.rate)
        t1 = time.time()
        first += n
        rate_ok, p99_ok = row.verdict()
        print(row.line() if face == "signed" else
              f"{row.line()}  [>= {TARGET_RATE:,.0f}/s: {mark(rate_ok)}, p99 <= "
              f"{TARGET_P99:g} ms: {mark(p99_ok)}]")
        if a.probe:  # what the probe in serve saw during that window
            await asyncio.sleep(1.5)  # its next write
            for said in bench_probe.summary(serve.counts / "probe.json", t0, t1):
                print(f"    probe: {said}")
    print(f"max rate: closed loop from the same client, {a.callers} connections, each "
          f"sending its next call as soon as the one before is answered ({n} calls)")
    for face in ["signed", *faces]:
        most[face] = row = await load(serve, port, load_spec(face, tokens), face,
                                      mode="closed", count=n, first=first,
                                      connections=a.callers)
        first += n
        print(row.line())
    return opened, most


def serve_loop(log: Path) -> str:
    """The event loop serve's banner names (in its log)."""
    said = [line for line in log.read_text().splitlines() if "event loop: " in line]
    return said[-1].split("event loop: ", 1)[1] if said else "event loop not said"


async def wait_healthy(base: str) -> None:
    """Until serve answers, its MCP gateway too (at most two minutes)."""
    async with aiohttp.ClientSession() as http:
        for _ in range(1200):
            try:
                async with http.get(f"{base}/healthz") as r:
                    up = r.status == 200
                async with http.post(f"{base}/mcp/bank") as r:  # its server started
                    if up and r.status != 404:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError("serve did not start")


def main() -> int:
    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--db", action="append", default=None,
                   help="a PostgreSQL server's URL (a database is made on it), or `sqlite` "
                        "(a temp file); given twice (`--db sqlite --db postgresql+asyncpg://"
                        "…`), each dialect is run in turn and the runs end with one summary; "
                        "default: a temp SQLite file")
    p.add_argument("--callers", type=int, default=50)
    p.add_argument("--per-kind", type=int, default=300)
    p.add_argument("--mixed", type=int, default=3000)
    p.add_argument("--count", type=int, default=40,
                   help="calls of each face and kind, one at a time, whose statements are "
                        "counted")
    p.add_argument("--rate", type=float, default=TARGET_RATE,
                   help="calls a second offered in the open-loop run (default: the target)")
    p.add_argument("--seconds", type=float, default=5.0,
                   help="how long the open-loop run's arrivals last")
    p.add_argument("--open-faces", default=",".join(FACES),
                   help="faces whose auto decisions load_gen.py sends, open loop then "
                        "closed (empty: none)")
    p.add_argument("--statements", action=argparse.BooleanOptionalAction, default=True,
                   help="print the statements of each face's auto decision")
    p.add_argument("--loop", choices=["auto", "uvloop", "asyncio"], default=None,
                   help="serve's event loop (APPROVALD_EVENT_LOOP; default: serve's own, "
                        "auto)")
    p.add_argument("--probe", action="store_true",
                   help="load a probe into serve (bench_probe.py) and print, for each open "
                        "loop, its collections, the event loop's late wake-ups and the "
                        "stacks sampled meanwhile")
    a = p.parse_args()
    runs = []
    for where in a.db or ["sqlite"]:
        runs.append(asyncio.run(bench(a, None if where == "sqlite" else where)))
    summarize(runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
