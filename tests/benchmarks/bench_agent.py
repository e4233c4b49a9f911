"""The gated agents ``bench_clicks`` drives (loaded by ``approvald serve`` via APPROVALD_AGENTS).

``bench-deploy`` asks to deploy a service; ``bench-deploy-sensitive`` asks the same with a
card number its tool declares sensitive and an API key nobody declared (found by detection),
so every card, thread line and stored copy of its call is masked (and sealed, under a data
key). Each tool appends ``<run id> <wall-clock time>`` to ``BENCH_TOOL_LOG`` the moment it
starts, so the benchmark can measure click -> tool start across processes. With
``BENCH_SQL_COUNT`` set, ``serve`` also counts the statements it sends PostgreSQL (or,
with ``BENCH_SQL_COUNT_SQLITE=1``, SQLite) (:mod:`sql_count`).
"""

from __future__ import annotations

import os
import time

from approvald.runtime.models.scripted import ScriptedModel, reply
from approvald.runtime.policies.tools import ToolContext, tool
from approvald.runtime.runs.agent import Agent

# bench_fleet.py --probe: what stalls the event loop; and the collector's knobs to compare
if any(os.environ.get(k) for k in ("BENCH_PROBE", "BENCH_GC_YOUNG", "BENCH_SETTLE_FULL_ONLY")):
    import bench_probe

    bench_probe.install()

if os.environ.get("BENCH_SQL_COUNT"):
    import sql_count

    # on SQLite only when asked (BENCH_SQL_COUNT_SQLITE=1): a trace callback per statement
    sql_count.install(os.environ["BENCH_SQL_COUNT"],
                      sqlite=os.environ.get("BENCH_SQL_COUNT_SQLITE") == "1")


def _started(ctx: ToolContext) -> None:
    started = time.time()
    path = os.environ.get("BENCH_TOOL_LOG")
    if path:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{ctx.run_id} {started:.6f}\n".encode())
        finally:
            os.close(fd)


@tool(permission="execute")
async def deploy(ctx: ToolContext, service: str) -> str:
    """Deploy a service (the benchmark's gated call)."""
    _started(ctx)
    return f"deployed {service}"


@tool(permission="execute", sensitive=["card"])
async def deploy_paid(ctx: ToolContext, service: str, card: str, api_key: str) -> str:
    """Deploy a service, paid with a card, with an API key (both sensitive)."""
    _started(ctx)
    return f"deployed {service}"


SENSITIVE_ARGS = {"service": "web", "card": "4242 4242 4242 4242",
                  "api_key": "sk_live_4eC39HqLyjWDarjtT1zdp7dc9f2a"}


AGENTS = [Agent(name="bench-deploy", instructions="", tools=[deploy],
                model=ScriptedModel.sequence([reply("deploying", ("deploy", {"service": "web"})),
                                              reply("done", turn=1)])),
          Agent(name="bench-deploy-sensitive", instructions="", tools=[deploy_paid],
                model=ScriptedModel.sequence([reply("deploying",
                                                    ("deploy_paid", SENSITIVE_ARGS)),
                                              reply("done", turn=1)]))]
