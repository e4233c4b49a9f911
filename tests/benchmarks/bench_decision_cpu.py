"""``serve``'s CPU per auto decision, in one process, deterministically (issue 50).

    python tests/benchmarks/bench_decision_cpu.py [--db URL] [--calls 2000] [--rounds 5]
                                                  [--faces hook,api,mcp] [--profile FACE]
                                                  [--loop auto|uvloop|asyncio]

Where ``bench_fleet.py`` floods a separate ``serve`` from many callers (rates and latency,
which a shared machine makes meaningless), this runs the same ``serve`` (its
:class:`~approvald.bot.serve.Service`, the fleet benchmark's policy, gateway and tokens)
inside this process and makes its calls one at a time over a kept-alive loopback
connection, with a client of a few lines (a request's bytes written, its answer read by
``Content-Length`` or chunks): the CPU this process takes per call
(``time.process_time()`` over ``--calls`` calls, ``--rounds`` times; the median and the
spread printed) is ``serve``'s, plus that small client's, which the baseline carries too.
The MCP gateway's server runs in its own process (not counted: what it costs is its own).

Baselines in the same run: ``GET /healthz`` carrying the same bearer header (a bare
request through the same HTTP app and client, the token not checked), a signed one
(``POST /v1/requests`` with the API face's token, checked from memory as an auto
decision's is, and a body of ``{}``, refused with 422 before the runtime), a bare
``SELECT 1`` write transaction (``Database.transact``, no HTTP: BEGIN, the statement
through SQLAlchemy, COMMIT), and the same ``SELECT 1`` sent as an auto decision's one
statement is (planned, alone: ``Database.write_one``). Then each face's auto
decision (``--faces``):

* ``hook``: ``POST /v1/hooks/claude-code?wait=0``, a ``PreToolUse`` of ``ls …``;
* ``api``: ``POST /v1/requests``, ``read_metrics`` (auto);
* ``mcp``: ``tools/call`` of ``echo`` on ``/mcp/bank`` (auto, forwarded to its server).

Each call has its own arguments (none joins another's request). The figure per face is
printed beside the baseline's, and as the difference (what the decision adds to a bare
request). ``--profile FACE`` runs that face's calls once more under cProfile and prints
the functions by own time and by cumulative time, with their call counts per decision;
``--phases FACE`` counts its Python calls per decision by phase (the request's write, the
result's, the call forwarded, the inbound request: :class:`Phases`). ``--count FACES``
counts each face's calls per decision exactly (each function once per call, a coroutine
resumed not counted again; calls into C by name) by area of the code (:data:`AREAS`),
side by side, then the functions whose counts differ most between the first two faces:
where one face's decision does more than another's.
``--callers N`` (N > 1) makes the calls from N connections at once and prints, per round,
the rate and the audit chain's turn: one process's chainings send their statements one
at a time, each after the one before was answered; the share of the wall time with one
in flight and the time from one's answer to the next one's sending show whether that
turn is what the decisions queue in.

On PostgreSQL ``--db`` names a server (``postgresql+asyncpg://postgres@127.0.0.1:5432/test``):
a database of the run's own is made there and dropped afterwards. Default: a temporary
SQLite file. Figures before and after a change: run this on each checkout, one after the
other (``gc.freeze`` after start-up, as ``serve`` does, so collections do not walk
start-up's objects).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import itertools
import json
import os
import pstats
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE))

from bench_common import Calls, free_port, setup_database
from bench_fleet import MCP_SERVER, POLICY, make_tokens
from sqlalchemy import text

FACES = ("hook", "api", "mcp")


class Client:
    """HTTP/1.1 over one kept-alive connection, one request at a time: as little client
    work as can be, so that the CPU measured is the server's."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()

    async def call(self, method: str, path: str, headers: bytes, body: bytes = b""
                   ) -> tuple[int, bytes]:
        assert self.reader is not None and self.writer is not None
        self.writer.write(b"%s %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n%sContent-Length: %d\r\n"
                          b"\r\n%s" % (method.encode(), path.encode(), self.port, headers,
                                       len(body), body))
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = int(lines[0].split()[1])
        fields = {k.strip().lower(): v.strip() for k, _, v in
                  (line.partition(b":") for line in lines[1:] if line)}
        if b"content-length" in fields:
            return status, await self.reader.readexactly(int(fields[b"content-length"]))
        out = bytearray()  # chunked
        while True:
            size = int((await self.reader.readuntil(b"\r\n")).strip(), 16)
            out += await self.reader.readexactly(size + 2)
            if size == 0:
                return status, bytes(out)
            del out[-2:]


def auth(token: str, extra: str = "") -> bytes:
    return f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n{extra}".encode()


def calls(client: Client, tokens: dict[str, str]) -> dict[str, Callable[[int], Awaitable[None]]]:
    """Each face's auto decision (and the bare request), checked for the answer it must get."""
    hook_h, api_h = auth(tokens["hook"]), auth(tokens["api"])
    mcp_h = auth(tokens["mcp"], "Accept: application/json, text/event-stream\r\n"
                                "MCP-Protocol-Version: 2025-06-18\r\n")

    async def health(i: int) -> None:
        status, body = await client.call("GET", "/healthz", api_h)
        assert status == 200, body

    async def signed(i: int) -> None:
        # the token checked as an auto decision's is (from memory), the body parsed and
        # refused before the runtime: what a decision pays before it is one
        status, body = await client.call("POST", "/v1/requests", api_h, b"{}")
        assert status == 422, body

    async def hook(i: int) -> None:
        event = {"hook_event_name": "PreToolUse", "session_id": "cpu-1", "cwd": "/srv",
                 "tool_name": "Bash", "tool_input": {"command": f"ls -la /srv/{i}"},
                 "tool_use_id": f"toolu_{i}"}
        status, body = await client.call("POST", "/v1/hooks/claude-code?wait=0", hook_h,
                                         json.dumps(event).encode())
        said = json.loads(body)["hookSpecificOutput"]["permissionDecision"]
        assert status == 200 and said == "allow", body

    async def api(i: int) -> None:
        status, body = await client.call("POST", "/v1/requests", api_h, json.dumps(
            {"tool": "read_metrics", "args": {"n": i}}).encode())
        assert status == 201 and json.loads(body)["status"] == "approved", body

    async def mcp(i: int) -> None:
        msg = {"jsonrpc": "2.0", "id": i, "method": "tools/call",
               "params": {"name": "echo", "arguments": {"text": f"hi {i}"}}}
        status, body = await client.call("POST", "/mcp/bank", mcp_h, json.dumps(msg).encode())
        assert status == 200 and b'"isError":false' in body.replace(b" ", b""), body

    return {"healthz": health, "signed": signed, "hook": hook, "api": api, "mcp": mcp}


async def select_one(db: object) -> Callable[[int], Awaitable[None]]:
    from approvald.store.db import Database

    assert isinstance(db, Database)

    async def one(i: int) -> None:
        await db.transact(lambda tx: tx.conn.execute(text("SELECT 1")), what="baseline")
    return one


async def select_one_alone(db: object) -> Callable[[int], Awaitable[None]]:
    """``SELECT 1`` as an auto decision's statement is sent: registered for the plan path
    (``store/fastsql.py``) and written alone (``Database.write_one``: on PostgreSQL one
    statement in autocommit on a kept connection, no BEGIN or COMMIT)."""
    import sqlalchemy as sa
    from approvald.store.db import Database
    from approvald.store.fastsql import fast

    assert isinstance(db, Database)
    stmt = fast(sa.select(sa.literal_column("1")))

    async def one(i: int) -> None:
        async with db.write_one() as tx:
            await tx.conn.execute(stmt, {})
    return one


class Phases:
    """Python calls (and calls of builtins, as cProfile counts them) by the phase of a
    decision they are made in: the innermost function of :data:`MARKS` on the stack of
    frames each call is made from (a coroutine's awaiting chain included; a task's stack
    starts at its coroutine, so what a task of its own runs is in no phase but its
    own)."""

    MARKS = (  # (file, qualified name): phase
        (("runtime/runs/external.py", "ExternalRequests.create"), "the request's write"),
        (("runtime/callers.py", "CallerGate._request"), "the request's write"),
        (("runtime/runs/external.py", "ExternalRequests.record_report"), "the result's write"),
        (("bot/mcp/upstream.py", "Upstream.forward.<locals>.forward"), "the call forwarded"),
        (("bot/mcp/http.py", "HttpGateways.handle"), "the inbound request"),
        (("bot/api/routes.py", ""), "the HTTP API's (and the hook's) handler"),
    )

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self._of: dict[Any, str | None] = {}

    def _phase(self, code: Any) -> str | None:
        found = self._of.get(code, 0)
        if found != 0:
            return found  # type: ignore[return-value]
        phase = next((label for (file, name), label in self.MARKS
                      if code.co_filename.endswith(file)
                      and (not name or code.co_qualname == name)), None)
        self._of[code] = phase
        return phase

    def count(self, frame: Any, event: str, arg: Any) -> None:
        if event not in ("call", "c_call"):
            return
        f, phase = frame, None
        while f is not None and phase is None:
            phase = self._phase(f.f_code)
            f = f.f_back
        label = phase or "the rest (event loop, tasks of their own, the client, serve's timers)"
        self.counts[label] = self.counts.get(label, 0) + 1

    def said(self, n: int) -> list[tuple[str, float]]:
        out = sorted(((k, v / n) for k, v in self.counts.items()), key=lambda kv: -kv[1])
        return [*out, ("in all", sum(self.counts.values()) / n)]


# areas of the code a decision's calls are counted in (first match wins, by file name)
AREAS = [("bot: the hook (claude_code*)", "/bot/claude_code"), ("bot: the API", "/bot/api/"),
         ("bot (other)", "/bot/"), ("runtime: intake", "/runtime/(requests/|callers|runs/ex)"),
         ("runtime: masking", "/runtime/policies/(masking|detectors|sensitive)"),
         ("runtime: policy", "/runtime/policies/"), ("runtime: audit", "/runtime/record/audit"),
         ("runtime (other)", "/runtime/"), ("store", "/store/"), ("sqlalchemy", "sqlalchemy/"),
         ("drivers", "asyncpg/|aiosqlite/|sqlite3"), ("aiohttp", "aiohttp/|multidict|yarl"),
         ("the benchmark's client", "/tests/benchmarks/"),
         ("asyncio", "asyncio/|selectors|_weakrefset|contextvars|contextlib|uvloop"),
         ("json", "json/"), ("pydantic", "pydantic")]
# what tells a decision's shape (per decision; patterns of Calls.by_function's names)
SHAPE = [("tasks created (a Task registered in a WeakSet)", r"\(WeakSet\.add\)$"),
         ("texts searched for secrets (mask_text)", r"detectors\.py:\d+\(mask_text\)$"),
         ("audit details recorded (recorded_text)", r"audit\.py:\d+\(recorded_text\)$"),
         ("  walked value by value (recorded_details)",
          r"audit\.py:\d+\(recorded_details\)$"),
         ("statements sent alone (write_one)", r"store/db\.py:\d+\(Database\.write_one\)$"),
         ("write transactions (write)", r"store/db\.py:\d+\(Database\.write\)$")]


async def count_calls(fns: dict[str, list[Callable[[int], Awaitable[None]]]], faces: list[str],
                      n: int, counter: Counter, top: int, dump: str | None) -> None:
    """Each of ``faces``' Python calls per decision, exactly (:class:`Calls` over ``n``
    calls after the warm-up), by area, side by side; then the functions whose counts per
    decision differ most between the first two (``dump``: every function's count per
    decision, each face's, written there as JSON)."""
    counted: dict[str, Calls] = {}
    for face in faces:
        await cpu_per_call(fns[face], n, 0, counter)  # warm: caches, plans, kept tokens
        calls = counted[face] = Calls(AREAS, SHAPE)
        sys.setprofile(calls)
        try:
            await cpu_per_call(fns[face], n, 1, counter, warm=False)
        finally:
            sys.setprofile(None)
    areas = {f: c.by_area() for f, c in counted.items()}
    names = sorted({a for by in areas.values() for a in by},
                   key=lambda a: -max(by.get(a, 0) for by in areas.values()))
    print(f"--- Python calls per decision ({n} calls each, exact), by area ---")
    print(f"  {'':40}" + "".join(f"{f:>10}" for f in faces))
    print(f"  {'in all':40}" + "".join(f"{sum(areas[f].values()) / n:10.1f}" for f in faces))
    for a in names:
        print(f"  {a:40}" + "".join(f"{areas[f].get(a, 0) / n:10.1f}" for f in faces))
    by_function = {f: c.by_function() for f, c in counted.items()}
    for label, pat in SHAPE:
        per = [sum(k for name, k in by_function[f].items() if re.search(pat, name)) / n
               for f in faces]
        print(f"  {label:40}" + "".join(f"{k:10.2f}" for k in per))
    if dump:
        text = json.dumps({f: {k: v / n for k, v in by.items()}
                           for f, by in by_function.items()}, indent=0)
        await asyncio.to_thread(Path(dump).write_text, text)
    if len(faces) > 1:
        one, two = (by_function[f] for f in faces[:2])
        diff = sorted(((one.get(k, 0) - two.get(k, 0)) / n, k) for k in {*one, *two})
        diff = [d for d in diff if abs(d[0]) >= 0.5]
        print(f"--- {faces[0]} minus {faces[1]}, calls per decision, the largest {top} ---")
        for d, k in sorted(diff, key=lambda d: -abs(d[0]))[:top]:
            print(f"  {d:+7.1f}  {k}")


async def paired(fns: dict[str, list[Callable[[int], Awaitable[None]]]], faces: list[str],
                 n: int, block: int, counter: Counter) -> None:
    """Two faces' CPU per call in blocks of ``block`` calls, alternating ABBA over ``n``
    calls of each: what the machine's other work does to one block it does about as much
    to its neighbour, so the difference between neighbouring blocks is the faces' own."""
    one, two = faces[:2]
    for face in (one, two):
        await cpu_per_call(fns[face], block, 0, counter)  # warm
    got: dict[str, list[float]] = {one: [], two: []}
    for k in range(n // block):
        for face in ((one, two) if k % 2 == 0 else (two, one)):
            got[face] += await cpu_per_call(fns[face], block, 1, counter, warm=False)
    diffs = [b - a for a, b in zip(got[one], got[two], strict=True)]
    print(f"--- paired, {len(diffs)} blocks of {block} calls each, ABBA: CPU per call "
          f"(median of blocks): {one} {statistics.median(got[one]):.3f} ms, {two} "
          f"{statistics.median(got[two]):.3f} ms; {two} minus {one}, neighbouring blocks: "
          f"median {statistics.median(diffs):+.3f} ms, {sum(d < 0 for d in diffs)} of "
          f"{len(diffs)} lower")


class Counter:
    def __init__(self) -> None:
        self.i = 0

    def next(self) -> int:
        self.i += 1
        return self.i


async def cpu_per_call(fns: list[Callable[[int], Awaitable[None]]], n: int, rounds: int,
                       counter: Counter, *, warm: bool = True) -> list[float]:
    """CPU milliseconds per call, one figure per round of ``n`` calls: ``fns``, one per
    connection, each making its calls one after the other (one: sequential calls)."""
    async def run(count: int) -> None:
        async def one(fn: Callable[[int], Awaitable[None]], k: int) -> None:
            for _ in range(k):
                await fn(counter.next())
        per = count // len(fns)
        await asyncio.gather(*(one(fn, per) for fn in fns))

    if warm:  # caches, connections
        await run(min(n, 200))
    out = []
    for _ in range(rounds):
        if TURNS is not None:
            TURNS.spans.clear()
        t, t0, w = time.process_time(), os.times(), time.perf_counter()
        await run(n)
        calls = n // len(fns) * len(fns)
        out.append((time.process_time() - t) / calls * 1000)
        t1 = os.times()
        SYSTEM.append((t1.system - t0.system) / calls * 1000)
        if TURNS is not None and (line := TURNS.said(time.perf_counter() - w, calls)):
            print(line)
    return out


class Turns:
    """With several callers: the audit chain's statements (an auto decision's one, or the
    one of the decisions that arrived while the one before was in flight: group commit,
    ``AuditRepo.append_together``), timed from their sending to their answer. One
    process's chainings send them one at a time (each after the one before was
    answered): the share of the wall time with one in flight, the time from one's answer
    to the next one's sending and the decisions a statement carried say whether that
    turn is what the decisions queue in."""

    def __init__(self) -> None:
        from approvald.store.repos.audit import AuditRepo

        self.spans: list[tuple[float, float]] = []
        self.members: list[int] = []
        original = AuditRepo.append_together
        spans, members = self.spans, self.members

        async def timed(repo: AuditRepo, batch: Any, **kw: Any) -> None:
            t = time.perf_counter()
            members.append(len(batch))
            try:
                await original(repo, batch, **kw)
            finally:
                spans.append((t, time.perf_counter()))
        AuditRepo.append_together = timed  # type: ignore[method-assign]

    def said(self, wall: float, calls: int) -> str:
        spans = sorted(self.spans)
        self.spans.clear()
        carried = sum(self.members) / max(len(self.members), 1)
        self.members.clear()
        if len(spans) < 2:
            return ""
        gaps = [b[0] - a[1] for a, b in itertools.pairwise(spans) if b[0] > a[1]]
        flight = statistics.median(e - t for t, e in spans)
        return (f"    {calls / wall:.0f} a second; the chain's statement in flight "
                f"{sum(e - t for t, e in spans) / wall:.0%} of the wall (median "
                f"{flight * 1000:.2f} ms), from one's answer to the next one's sending "
                f"median {statistics.median(gaps or [0.0]) * 1e6:.0f} us; "
                f"{carried:.1f} decisions a statement")


TURNS: Turns | None = None

# the kernel's share of each round (its sockets: the client's, the server's, the database
# connection's), in milliseconds per call: what fewer round trips save, not less Python
SYSTEM: list[float] = []


def figure(ms: list[float]) -> str:
    system = statistics.median(SYSTEM[-len(ms):])
    return (f"{statistics.median(ms):6.3f} ms  (rounds {min(ms):.3f}-{max(ms):.3f}; "
            f"system {system:.3f})")



async def serve_environment(tmp: Path, db_url: str) -> tuple[int, dict[str, str]]:
    """The environment ``serve`` reads here (``bench_fleet``'s policy, an MCP gateway in
    front of the fixture server, this run's database and a free port), set in this
    process; its port and the callers' tokens."""
    (tmp / "policy.toml").write_text(POLICY)
    (tmp / "gateways.toml").write_text(
        f"[gateways.bank]\ncommand = {json.dumps([sys.executable, str(MCP_SERVER)])}\n"
        "wait = 0\n")
    port = free_port()
    for k in [k for k in os.environ if k.startswith(("APPROVALD_", "SLACK_"))]:
        del os.environ[k]
    os.environ.update(
        APPROVALD_DATABASE_URL=db_url, APPROVALD_POLICY_FILE=str(tmp / "policy.toml"),
        APPROVALD_MCP_GATEWAYS_FILE=str(tmp / "gateways.toml"),
        APPROVALD_SECRET="bench-secret-0123456789abcdef", APPROVALD_PORT=str(port),
        APPROVALD_HOST="127.0.0.1", APPROVALD_LOG_LEVEL="ERROR",
        APPROVALD_METRICS_ADDR="127.0.0.1:0", MCP_FIXTURE_LEDGER=str(tmp / "ledger.jsonl"))
    return port, await asyncio.to_thread(make_tokens, None)


async def bench(a: argparse.Namespace) -> int:
    tmp = Path(tempfile.mkdtemp())
    db_url, drop = await setup_database(a.db, tmp, "bench_decision_cpu")
    port, tokens = await serve_environment(tmp, db_url)

    import logging

    from approvald.bot.config import Settings
    from approvald.bot.serve import Service, running_loop_name, settle_heap
    from approvald.bot.wiring import open_database

    logging.basicConfig(level=logging.ERROR)
    global TURNS
    if a.callers > 1:
        TURNS = Turns()
    settings = Settings()
    db = await open_database(settings, quiet=True)
    service = Service(settings, db)
    clients = [Client(port) for _ in range(a.callers)]
    try:
        await service.start()
        settle_heap()
        for c in clients:
            await c.open()
        per_client = [calls(c, tokens) for c in clients]
        one = await select_one(db)
        fns = {k: [f[k] for f in per_client] for k in per_client[0]}
        fns["select1"] = [one] * a.callers
        fns["select1_alone"] = [await select_one_alone(db)] * a.callers
        counter = Counter()
        faces = [f for f in a.faces.split(",") if f]
        print(f"database: {db.display_url}; {os.cpu_count()} cores, load average "
              f"{os.getloadavg()[0]:.1f}; serve in this process, on {running_loop_name()}; "
              f"{a.callers} "
              f"connection(s), each one call at a time; CPU of this process per call, "
              f"{a.rounds} rounds of {a.calls} calls (median)")
        base = await cpu_per_call(fns["healthz"], a.calls, a.rounds, counter)
        print(f"  {'baseline: GET /healthz (bearer header)':44} {figure(base)}")
        signed = await cpu_per_call(fns["signed"], a.calls, a.rounds, counter)
        print(f"  {'baseline: signed POST /v1/requests, 422':44} {figure(signed)}")
        sel = await cpu_per_call(fns["select1"], a.calls, a.rounds, counter)
        print(f"  {'baseline: bare SELECT 1 write transaction':44} {figure(sel)}")
        alone = await cpu_per_call(fns["select1_alone"], a.calls, a.rounds, counter)
        print(f"  {'baseline: SELECT 1 planned, sent alone':44} {figure(alone)}")
        for face in faces:
            ms = await cpu_per_call(fns[face], a.calls, a.rounds, counter)
            print(f"  {face + ' auto decision':44} {figure(ms)}  (+"
                  f"{statistics.median(ms) - statistics.median(base):.3f} ms over the bare "
                  "request)")
        if a.paired:
            await paired(fns, a.paired.split(","), a.calls, a.block, counter)
        if a.count:
            await count_calls(fns, a.count.split(","), a.calls, counter, a.top,
                              a.dump if not a.profile else None)
        if a.phases:
            n = a.calls
            phases = Phases()
            sys.setprofile(phases.count)
            try:
                await cpu_per_call(fns[a.phases], n, 1, counter, warm=False)
            finally:
                sys.setprofile(None)
            print(f"--- {a.phases}, {n} calls: Python calls per decision, by phase ---")
            for label, count in phases.said(n):
                print(f"  {count:8.1f}  {label}")
        if a.profile:
            n = a.calls
            prof = cProfile.Profile(time.process_time)  # CPU, not waits
            prof.enable()
            await cpu_per_call(fns[a.profile], n, 1, counter, warm=False)
            prof.disable()
            for order in ("tottime", "cumulative"):
                out = io.StringIO()
                pstats.Stats(prof, stream=out).sort_stats(order).print_stats(a.top)
                print(f"--- {a.profile}, {n} calls, by {order} ---")
                print(out.getvalue())
            if a.dump:
                prof.dump_stats(a.dump)
        return 0
    finally:
        await shut_down(clients, service, db, drop)


async def shut_down(clients: list[Client], service: Any, db: Any,
                    drop: Callable[[], Awaitable[None]], *more: Any) -> None:
    """The benchmark's clients closed, ``serve`` stopped, its database closed and dropped
    (``more``: other connections to close before the drop)."""
    for c in clients:
        await c.close()
    service.stop_event.set()
    await service.stop(grace=1.0)
    await db.close()
    for conn in more:
        await conn.close()
    await drop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--db", default=None, help="a PostgreSQL server's URL (a database is made "
                                              "on it); default: a temp SQLite file")
    p.add_argument("--calls", type=int, default=2000, help="calls per round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--faces", default=",".join(FACES))
    p.add_argument("--callers", type=int, default=1, help="connections at once, each making "
                   "its calls one at a time (default 1: the CPU of a call alone); with more "
                   "than one, each round also prints its rate and the audit chain's turn "
                   "(its statements' share of the wall time, and the time from one's answer "
                   "to the next one's sending)")
    p.add_argument("--profile", choices=[*FACES, "healthz", "signed", "select1",
                                             "select1_alone"],
                   default=None)
    p.add_argument("--phases", choices=[*FACES], default=None,
                   help="count that face's Python calls per decision by phase (the request's "
                        "write, the result's, the call forwarded, the inbound request), "
                        "over --calls calls made once more")
    p.add_argument("--paired", default=None, metavar="A,B",
                   help="two faces' CPU per call in alternating blocks (ABBA) of --block "
                        "calls, --calls of each: the difference of neighbouring blocks")
    p.add_argument("--block", type=int, default=50)
    p.add_argument("--count", default=None, metavar="FACES",
                   help="count these faces' (comma-separated) Python calls per decision "
                        "exactly, by area, and the functions whose counts differ most "
                        "between the first two, over --calls calls of each made once more")
    p.add_argument("--top", type=int, default=45, help="functions printed per profile order")
    p.add_argument("--dump", default=None, help="write the profile's stats to this file (with "
                   "--count and no --profile: each face's calls per decision by function, JSON)")
    p.add_argument("--loop", choices=["auto", "uvloop", "asyncio"],
                   default=os.environ.get("APPROVALD_EVENT_LOOP", "auto"),
                   help="the event loop serve (and this process) runs on, as "
                        "APPROVALD_EVENT_LOOP picks serve's (default: that variable, or auto)")
    a = p.parse_args()
    from approvald.bot.serve import event_loop

    with asyncio.Runner(loop_factory=event_loop(a.loop)[1]) as runner:
        return runner.run(bench(a))


if __name__ == "__main__":
    sys.exit(main())
