"""What limits the MCP gateway's rate (issue 50): the server it forwards to, its one stdio
session, or serve's own writes.

    python tests/benchmarks/bench_mcp_upstream.py [--calls 2000] [--at-once 1,50] [--rounds 4]
    python tests/benchmarks/bench_mcp_upstream.py --waits --db URL [--callers 50] [--calls 2000]

Without ``--waits``: ``tools/call`` of ``echo`` forwarded to the fixture server
(``tests/fixtures/mcp_server.py``, the one ``bench_fleet`` puts behind its gateway: an
``MCPServer`` of the SDK over stdio) on one session, as ``serve`` forwards them, through the
SDK's stdio transport and through approvald's (``bot/mcp/stdio.py``), ``--at-once`` calls at
a time: both sessions (each with a server of its own) open at once, ``--rounds`` rounds of
each, their order alternating (paired: a machine's load moves both). Per round: calls a
second, this process's CPU per call (the client's) and the server process's (from
``/proc``), each in cores too; then the medians and each round's difference; then the
Python calls per forwarded call (cProfile, one at a time). The server's cores at a rate
say whether it could keep up with more: it is one event loop, so one core is its ceiling.

``--waits``: ``serve`` in this process (``bench_decision_cpu``'s), ``--callers``
connections at once each making MCP auto calls one after the other, and where a decision's
wall time goes: the forwarded call, the request's write (``open_request``), the result's
(``record_request_report``), and within each write the audit chain's statement and its
turn (``runtime/record/audit.py``: a process sends its chained statements one at a time).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import cProfile
import os
import pstats
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

from bench_fleet import MCP_SERVER


def cpu_of(pid: int) -> float:
    """Seconds of CPU process ``pid`` took (user and system)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


TRANSPORTS = ("SDK's stdio transport", "approvald's (bot/mcp/stdio.py)")


async def upstream(a: argparse.Namespace) -> None:
    import mcp.client.stdio as sdk_stdio
    from approvald.bot.mcp.stdio import stdio_transport
    from mcp import Client, StdioServerParameters

    tmp = Path(tempfile.mkdtemp())
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; {a.calls} calls "
          f"of echo forwarded on one stdio session to {MCP_SERVER.name}, each transport's "
          f"session open at once, {a.rounds} rounds, the transports' order alternating")
    started: list[Any] = []  # the servers' processes, as the transports start them
    spawn = sdk_stdio._create_platform_compatible_process

    async def spawned(*args: Any, **kwargs: Any) -> Any:
        started.append(await spawn(*args, **kwargs))
        return started[-1]

    sdk_stdio._create_platform_compatible_process = spawned
    try:
        async with contextlib.AsyncExitStack() as stack:
            sessions = []
            for name in TRANSPORTS:
                server = StdioServerParameters(command=sys.executable, args=[str(MCP_SERVER)],
                                               env={**os.environ, "MCP_FIXTURE_LEDGER":
                                                    str(tmp / f"ledger-{len(sessions)}.jsonl")})
                target: Any = server if name.startswith("SDK") else stdio_transport(server)
                client = await stack.enter_async_context(Client(target, cache=None))
                await client.list_tools()
                sessions.append((name, client, started[-1].pid))
            await _compare(a, sessions)
    finally:
        sdk_stdio._create_platform_compatible_process = spawn


async def _compare(a: argparse.Namespace, sessions: list[tuple[str, Any, int]]) -> None:
    """Each transport's calls, ``--rounds`` times in alternating order, then each one's
    Python calls per forwarded call."""
    def caller(client: Any) -> Callable[[int], Awaitable[None]]:
        async def call(i: int) -> None:
            result = await client.session.call_tool("echo", {"text": f"x{i}"},
                                                    allow_input_required=True,
                                                    allow_claimed=True)
            assert not getattr(result, "is_error", True), result
        return call

    calls = {name: caller(client) for name, client, _ in sessions}
    for name, _, _ in sessions:
        for i in range(100):
            await calls[name](i)
    for k in a.at_once:
        mine_ms: dict[str, list[float]] = collections.defaultdict(list)
        for r in range(a.rounds):
            for name, _, pid in sessions if r % 2 == 0 else sessions[::-1]:
                gate = asyncio.Semaphore(k)

                async def gated(i: int, gate: asyncio.Semaphore = gate,
                                call: Callable[[int], Awaitable[None]] = calls[name]) -> None:
                    async with gate:
                        await call(i)

                up0, t0, p0 = cpu_of(pid), time.perf_counter(), time.process_time()
                await asyncio.gather(*(gated(i) for i in range(a.calls)))
                wall, mine = time.perf_counter() - t0, time.process_time() - p0
                up = cpu_of(pid) - up0
                mine_ms[name].append(mine / a.calls * 1000)
                print(f"  round {r + 1} {name:32} {k:3} at once: {a.calls / wall:6.0f}/s  "
                      f"client {mine / a.calls * 1000:.3f} ms/call ({mine / wall:.2f} cores)  "
                      f"server {up / a.calls * 1000:.3f} ms/call ({up / wall:.2f} cores)")
        sdk, ours = (mine_ms[name] for name in TRANSPORTS)
        diffs = [o - s for s, o in zip(sdk, ours, strict=True)]
        print(f"  {k} at once, client CPU per call, median of {a.rounds} rounds: SDK's "
              f"{statistics.median(sdk):.3f} ms, approvald's {statistics.median(ours):.3f} ms; "
              f"approvald's minus the SDK's in the same round: "
              f"{', '.join(f'{d:+.3f}' for d in diffs)} ms")
    for name, _, _ in sessions:
        prof = cProfile.Profile(time.process_time)
        prof.enable()
        for i in range(500):
            await calls[name](i)
        prof.disable()
        stats = pstats.Stats(prof)
        turns = sum(v[1] for key, v in stats.stats.items()  # type: ignore[attr-defined]
                    if key[2] == "_run_once")
        print(f"  {name:32} Python calls per forwarded call: "
              f"{stats.total_calls / 500:.0f} "  # type: ignore[attr-defined]
              f"({turns / 500:.1f} event-loop turns)")


async def waits(a: argparse.Namespace) -> None:
    import bench_decision_cpu as cpu
    from bench_common import setup_database

    spent: collections.defaultdict[str, float] = collections.defaultdict(float)
    count: collections.Counter[str] = collections.Counter()

    def timed(owner: Any, name: str, what: str) -> None:
        real = getattr(owner, name)

        async def measured(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            try:
                return await real(*args, **kwargs)
            finally:
                spent[what] += time.perf_counter() - t
                count[what] += 1
        setattr(owner, name, measured)

    tmp = Path(tempfile.mkdtemp())
    db_url, drop = await setup_database(a.db, tmp, "bench_mcp_upstream")
    port, tokens = await cpu.serve_environment(tmp, db_url)
    import logging

    import mcp.client.session as sdk_session
    from approvald.bot.config import Settings
    from approvald.bot.mcp import gateway
    from approvald.bot.serve import Service, settle_heap
    from approvald.bot.wiring import open_database
    from approvald.runtime import engine
    from approvald.runtime.record import audit
    from approvald.store.repos import audit as audit_repo

    timed(gateway.Gateway, "call", "the whole decision (Gateway.call)")
    timed(engine.Engine, "open_request", "the request's write (open_request)")
    timed(sdk_session.ClientSession, "call_tool", "the call forwarded (call_tool)")
    timed(engine.Engine, "record_request_report", "the result's write (record_request_report)")
    timed(audit.AuditTrail, "_chain", "  audit chain: its turn and statement")
    timed(audit_repo.AuditRepo, "append_alone", "  audit chain: the statement alone")
    logging.basicConfig(level=logging.ERROR)
    settings = Settings()
    db = await open_database(settings, quiet=True)
    service = Service(settings, db)
    clients = [cpu.Client(port) for _ in range(a.callers)]
    try:
        await service.start()
        settle_heap()
        for c in clients:
            await c.open()
        fns = [cpu.calls(c, tokens)["mcp"] for c in clients]
        counter = cpu.Counter()

        async def run(n: int) -> int:
            async def one(fn: Callable[[int], Awaitable[None]]) -> None:
                for _ in range(n // len(fns)):
                    await fn(counter.next())
            await asyncio.gather(*(one(f) for f in fns))
            return n // len(fns) * len(fns)

        await run(min(a.calls, 200))
        spent.clear()
        count.clear()
        t0, p0 = time.perf_counter(), time.process_time()
        done = await run(a.calls)
        wall, mine = time.perf_counter() - t0, time.process_time() - p0
        print(f"database: {db.display_url}; {os.cpu_count()} cores, load average "
              f"{os.getloadavg()[0]:.1f}; {a.callers} callers: {done / wall:.0f} MCP auto "
              f"decisions/s, this process {mine / done * 1000:.2f} ms of CPU each "
              f"({mine / wall:.2f} cores)")
        for what in spent:
            print(f"  {what:44} {count[what] / done:4.1f} a decision, "
                  f"{spent[what] / count[what] * 1000:8.2f} ms each")
    finally:
        await cpu.shut_down(clients, service, db, drop)


async def decisions(a: argparse.Namespace) -> None:
    """``serve`` in this process (``bench_decision_cpu``'s), its gateway's one stdio session
    through each transport in turn: MCP auto decisions made one at a time in blocks of
    ``--block``, the blocks alternating between the transports (ABBA...), ``--rounds``
    blocks of each; this process's CPU per decision per block, the medians and the
    differences of neighbouring blocks; then each one's Python calls per decision
    (cProfile, a block)."""
    import bench_decision_cpu as cpu
    from bench_common import setup_database

    tmp = Path(tempfile.mkdtemp())
    db_url, drop = await setup_database(a.db, tmp, "bench_mcp_upstream")
    port, tokens = await cpu.serve_environment(tmp, db_url)
    import logging

    from approvald.bot.config import Settings
    from approvald.bot.mcp.inflight import InFlight
    from approvald.bot.mcp.proxy import server_environment
    from approvald.bot.mcp.stdio import stdio_transport
    from approvald.bot.mcp.upstream import Upstream
    from approvald.bot.serve import Service, settle_heap
    from approvald.bot.wiring import open_database
    from approvald.runtime import Source
    from mcp import Client, StdioServerParameters

    logging.basicConfig(level=logging.ERROR)
    settings = Settings()
    db = await open_database(settings, quiet=True)
    service = Service(settings, db)
    client = cpu.Client(port)
    try:
        async with contextlib.AsyncExitStack() as stack:
            await service.start()
            assert service.mcp is not None
            gateway = service.mcp.gateways["bank"]
            upstreams = {}
            for name in TRANSPORTS:  # each with a server process of its own
                server = StdioServerParameters(command=sys.executable, args=[str(MCP_SERVER)],
                                               env=server_environment())
                target: Any = server if name.startswith("SDK") else stdio_transport(server)
                inflight = InFlight()
                made = await stack.enter_async_context(
                    Client(target, cache=None, **inflight.client_options()))
                upstreams[name] = Upstream(made, "bank", inflight=inflight)
                await upstreams[name].check_rules(Source("mcp", "bank"), gateway.e.policy_file())
            settle_heap()
            await client.open()
            mcp = cpu.calls(client, tokens)["mcp"]
            counter = cpu.Counter()
            per: dict[str, list[float]] = collections.defaultdict(list)
            order = [TRANSPORTS[(r + r // 2) % 2] for r in range(2 * a.rounds + 2)]
            print(f"database: {db.display_url}; {os.cpu_count()} cores, load average "
                  f"{os.getloadavg()[0]:.1f}; {a.rounds} blocks of {a.block} MCP auto "
                  "decisions per transport, one at a time, alternating ABBA (two blocks to "
                  "warm up, not counted)")
            for i, name in enumerate(order):
                gateway.upstream = upstreams[name]
                p0 = time.process_time()
                for _ in range(a.block):
                    await mcp(counter.next())
                if i >= 2:
                    per[name].append((time.process_time() - p0) / a.block * 1000)
            sdk, ours = (per[name] for name in TRANSPORTS)
            diffs = [o - s for s, o in zip(sdk, ours, strict=True)]
            print(f"  CPU per MCP auto decision, median of {a.rounds} blocks: with the "
                  f"SDK's transport {statistics.median(sdk):.3f} ms (blocks "
                  f"{min(sdk):.3f}-{max(sdk):.3f}), with approvald's "
                  f"{statistics.median(ours):.3f} ms ({min(ours):.3f}-{max(ours):.3f}); "
                  f"approvald's minus the SDK's, block by block: median "
                  f"{statistics.median(diffs):+.3f} ms ({sum(d < 0 for d in diffs)} of "
                  f"{len(diffs)} lower), load average now {os.getloadavg()[0]:.1f}")
            for name in TRANSPORTS:
                gateway.upstream = upstreams[name]
                prof = cProfile.Profile(time.process_time)
                prof.enable()
                for _ in range(a.block):
                    await mcp(counter.next())
                prof.disable()
                print(f"  with {name:32} Python calls per MCP auto decision: "
                      f"{pstats.Stats(prof).total_calls / a.block:.0f}")  # type: ignore[attr-defined]
    finally:
        await cpu.shut_down([client], service, db, drop)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--at-once", default="1,50",
                   type=lambda s: [int(x) for x in s.split(",") if x])
    p.add_argument("--waits", action="store_true",
                   help="serve in this process: where an MCP decision's wall time goes")
    p.add_argument("--db", default=None, help="with --waits: a PostgreSQL server's URL (a "
                                              "database is made on it); default: SQLite")
    p.add_argument("--callers", type=int, default=50)
    p.add_argument("--rounds", type=int, default=4, help="without --waits: rounds of each "
                   "transport's calls, their order alternating")
    p.add_argument("--decisions", action="store_true",
                   help="serve in this process: CPU per MCP decision with each transport, "
                   "in alternating blocks")
    p.add_argument("--block", type=int, default=200, help="with --decisions: decisions a block")
    a = p.parse_args()
    asyncio.run(waits(a) if a.waits else decisions(a) if a.decisions else upstream(a))
    return 0


if __name__ == "__main__":
    sys.exit(main())
