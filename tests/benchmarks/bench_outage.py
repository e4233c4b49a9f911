"""A model provider that rate-limits everything for a while: runs wait, they do not fail.

    python tests/benchmarks/bench_outage.py [--runs 50] [--outage 30] [--db URL]

A local OpenAI-compatible server answers every chat completion with HTTP 429 and
``Retry-After`` for the first ``--outage`` seconds, then normally. ``approvald serve``
runs as its own process with an agent on ``OpenAIChatModel`` pointed at that server;
``--runs`` runs are queued at once. Targets (issue 9): every run completes, none fails,
and ``serve`` uses under 5% of a core while the runs wait. The in-run baseline is the
same ``serve`` process idle, before any run exists.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from aiohttp import web
from approvald.runtime.engine import assemble
from approvald.runtime.models.openai import OpenAIChatModel
from approvald.runtime.runs.agent import Agent, Registry
from approvald.store import migrate
from approvald.store.db import Database
from bench_clicks import cpu_seconds

AGENT_MODULE = '''
import os
from approvald.runtime.runs.agent import Agent
from approvald.runtime.models.openai import OpenAIChatModel

AGENTS = [Agent(name="bench-outage", instructions="Say hello.",
                model=OpenAIChatModel("bench-model", base_url=os.environ["BENCH_MODEL_URL"],
                                      max_retries=1, backoff=0.1), tools=[])]
'''


class Provider:
    """429 + Retry-After until ``until`` (monotonic), then a one-line final answer."""

    def __init__(self, outage: float) -> None:
        self.until = time.monotonic() + outage
        self.limited = 0
        self.answered = 0

    async def complete(self, request: web.Request) -> web.Response:
        await request.read()
        left = self.until - time.monotonic()
        if left > 0:
            self.limited += 1
            return web.json_response(
                {"error": {"message": "Rate limit reached", "type": "rate_limit"}},
                status=429, headers={"Retry-After": str(max(1, round(left)))})
        self.answered += 1
        return web.json_response({
            "id": "chatcmpl-bench", "object": "chat.completion", "model": "bench-model",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": "hello"}}]})


async def statuses(db: Database, ids: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    async with db.read() as tx:
        for run_id in ids:
            run = await tx.runs.get(run_id)
            assert run is not None
            key = "waiting" if run.status == "running" and run.wait_until else run.status
            out[key] = out.get(key, 0) + 1
    return out


async def bench(runs: int, outage: float, db_url: str | None) -> int:
    tmp = Path(tempfile.mkdtemp())
    (tmp / "outage_agents.py").write_text(AGENT_MODULE)
    db_url = db_url or f"sqlite+aiosqlite:///{tmp / 'outage.db'}"
    db = Database(db_url)
    await migrate.upgrade(db)

    app = web.Application()
    provider = Provider(outage=10_000)  # armed below, once the runs are queued
    app.router.add_post("/v1/chat/completions", provider.complete)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    model_url = f"http://127.0.0.1:{port}/v1"

    env = {k: v for k, v in os.environ.items() if not k.startswith(("APPROVALD_", "SLACK_"))}
    env.update(APPROVALD_DATABASE_URL=db_url, APPROVALD_AGENTS="outage_agents",
               PYTHONPATH=f"{tmp}{os.pathsep}{HERE.parents[1]}", BENCH_MODEL_URL=model_url,
               OPENAI_API_KEY="sk-bench", APPROVALD_LOG_LEVEL="WARNING")
    serve = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "approvald.bot.cli", "serve", env=env, cwd=tmp,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    print(f"database: {db.display_url}; {os.cpu_count()} CPUs; serve pid {serve.pid}; "
          f"model server {model_url}")
    try:
        await asyncio.sleep(3)  # start-up
        idle0 = cpu_seconds(serve.pid)
        await asyncio.sleep(5)
        idle = (cpu_seconds(serve.pid) - idle0) / 5

        os.environ.setdefault("OPENAI_API_KEY", "sk-bench")
        agent = Agent(name="bench-outage", instructions="Say hello.", tools=[],
                      model=OpenAIChatModel("bench-model", base_url=model_url))
        engine = assemble(db, Registry([agent]))
        ids = [await engine.start_run("bench-outage", f"hello {i}", requested_by="U_BENCH")
               for i in range(runs)]
        provider.until = time.monotonic() + outage
        t0 = time.monotonic()
        print(f"queued {runs} runs; the provider answers 429 for {outage:.0f} s")

        await asyncio.sleep(min(5.0, outage / 4))  # every run has met the outage and parked
        c0, w0 = cpu_seconds(serve.pid), time.monotonic()
        waiting_window = max(1.0, provider.until - time.monotonic() - 1.0)
        await asyncio.sleep(waiting_window)
        busy = (cpu_seconds(serve.pid) - c0) / (time.monotonic() - w0)
        during = await statuses(db, ids)
        print(f"while waiting: {during}; provider answered 429 {provider.limited} times")

        deadline = time.monotonic() + outage + 120
        done: dict[str, int] = {}
        while time.monotonic() < deadline:
            done = await statuses(db, ids)
            if done.get("completed", 0) + done.get("failed", 0) == runs:
                break
            await asyncio.sleep(0.5)
        total = time.monotonic() - t0
        print(f"after the outage: {done} in {total:.1f} s from queueing "
              f"({provider.answered} completions served)")
        print(f"serve CPU: idle baseline {idle * 100:.2f}% of a core; while {runs} runs "
              f"waited {busy * 100:.2f}% of a core")
        print("targets")
        ok_all = done.get("completed", 0) == runs
        ok_none = done.get("failed", 0) == 0
        ok_cpu = busy < 0.05
        print(f"  every run completed: {done.get('completed', 0)}/{runs}  "
              f"{'PASS' if ok_all else 'FAIL'}")
        print(f"  none failed: {done.get('failed', 0)}  {'PASS' if ok_none else 'FAIL'}")
        print(f"  serve CPU while waiting < 5% of a core: {busy * 100:.2f}%  "
              f"{'PASS' if ok_cpu else 'FAIL'}")
        return 0 if ok_all and ok_none and ok_cpu else 1
    finally:
        serve.terminate()
        await serve.wait()
        await runner.cleanup()
        await db.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=50)
    p.add_argument("--outage", type=float, default=30.0)
    p.add_argument("--db", default=None)
    a = p.parse_args()
    result: Any = asyncio.run(bench(a.runs, a.outage, a.db))
    return int(result)


if __name__ == "__main__":
    sys.exit(main())
