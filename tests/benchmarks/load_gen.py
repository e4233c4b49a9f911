"""A cheap HTTP load generator for ``bench_fleet.py`` (issue 50), in a process of its own:
what it costs is printed beside what it measures, so a reader sees the share of the
machine the callers took from ``serve`` and its database.

    python tests/benchmarks/load_gen.py < spec.json > result.json

The spec (JSON on stdin): ``port``; ``connections`` kept-alive HTTP/1.1 connections;
``mode``: ``open`` (``count`` arrivals at ``rate`` a second, Poisson, seeded by ``seed``,
spread over the connections in turn: each call is sent at its arrival, or as soon as
its connection's call before it is answered, and its latency counts from its arrival, so
a server that falls behind shows it) or ``closed`` (each connection sends its next call
as soon as the one before is answered: the most the server answers); ``method``,
``path``, ``headers`` (the header lines, each ending in CRLF) and ``body``, in which
``@I@`` is replaced by the call's number (``first`` on: every call its own arguments);
``status`` and ``expect`` (substrings of the answer, one of which it must hold) say
which answers are right.

Every request's bytes are built before the clock starts. The result (JSON on stdout):
``wall`` (seconds from the first arrival to the last answer), ``span`` (the arrivals'
seconds: ``count / rate``), ``latencies`` (seconds, one per call), ``failed`` and the
``first_failure``, and ``cpu`` (this process's user and system seconds over the run).
Only the standard library is imported.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
from typing import Any


async def _answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    low = head.lower()
    at = low.find(b"\r\ncontent-length:")
    if at >= 0:
        end = low.index(b"\r\n", at + 2)
        return status, await reader.readexactly(int(low[at + 17:end]))
    out = bytearray()  # chunked (a server-sent event stream)
    while True:
        size = int((await reader.readuntil(b"\r\n")).strip(), 16)
        out += await reader.readexactly(size + 2)
        if size == 0:
            return status, bytes(out)
        del out[-2:]


async def run(spec: dict[str, Any]) -> dict[str, Any]:
    port, n, conns = int(spec["port"]), int(spec["count"]), int(spec["connections"])
    head = (f"{spec['method']} {spec['path']} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"{spec['headers']}").encode()
    body = spec["body"].encode()
    first = int(spec["first"])
    requests = []
    for i in range(first, first + n):
        b = body.replace(b"@I@", str(i).encode())
        requests.append(b"%sContent-Length: %d\r\n\r\n%s" % (head, len(b), b))
    status_ok, expect = int(spec["status"]), [e.encode() for e in spec["expect"]]
    open_loop = spec["mode"] == "open"
    rate = float(spec.get("rate") or 0)
    arrivals: list[float] = []
    if open_loop:  # Poisson arrivals, scaled to span count / rate seconds exactly
        rng = random.Random(spec.get("seed", 50))
        t = 0.0
        for _ in range(n):
            arrivals.append(t)
            t += rng.expovariate(1.0)
        scale = (n / rate) / t
        arrivals = [a * scale for a in arrivals]
    streams = [await asyncio.open_connection("127.0.0.1", port) for _ in range(conns)]
    latencies: list[float | None] = [None] * n
    failed: list[str] = []
    loop = asyncio.get_running_loop()
    nxt = 0

    async def one(k: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                  since: float) -> None:
        writer.write(requests[k])
        try:
            status, answer = await _answer(reader)
        except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
            status, answer = 0, repr(exc).encode()
        latencies[k] = loop.time() - since
        if status != status_ok or not any(e in answer for e in expect):
            failed.append(f"{status} {answer[:300]!r}")

    async def connection(c: int) -> None:
        nonlocal nxt
        reader, writer = streams[c]
        if open_loop:
            for k in range(c, n, conns):
                at = t0 + arrivals[k]
                wait = at - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                await one(k, reader, writer, at)
        else:
            while nxt < n:
                k, nxt = nxt, nxt + 1
                await one(k, reader, writer, loop.time())

    cpu0 = os.times()
    t0 = loop.time() + 0.05
    # a server that falls far behind ends the run (two minutes past the arrivals), its
    # calls not answered by then counted as failed (latency: until then)
    try:
        await asyncio.wait_for(asyncio.gather(*(connection(c) for c in range(conns))),
                               (n / rate if open_loop else 0) + 120)
    except TimeoutError:
        pass
    wall = loop.time() - t0
    late = [k for k in range(n) if latencies[k] is None]
    for k in late:
        latencies[k] = wall - (arrivals[k] if open_loop else 0.0)
    if late:
        failed.append(f"{len(late)} calls not answered within {wall:.0f} s")
        failed.extend([""] * (len(late) - 1))
    cpu1 = os.times()
    for _, writer in streams:
        writer.close()
    return {"wall": wall, "span": n / rate if open_loop else wall, "latencies": latencies,
            "failed": len(failed), "first_failure": failed[0] if failed else None,
            "cpu": (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)}


def main() -> int:
    spec = json.load(sys.stdin)
    json.dump(asyncio.run(run(spec)), sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
