"""The gated agent ``bench_clicks`` drives (loaded by ``approvald serve`` via APPROVALD_AGENTS).

Its tool appends ``<run id> <wall-clock time>`` to ``BENCH_TOOL_LOG`` the moment it
starts, so the benchmark can measure click -> tool start across processes. With
``BENCH_SQL_COUNT`` set, ``serve`` also counts the statements it sends PostgreSQL
(:mod:`sql_count`).
"""

from __future__ import annotations

import os
import time

from approvald.runtime.agent import Agent
from approvald.runtime.models.scripted import ScriptedModel, reply
from approvald.runtime.tools import ToolContext, tool

if os.environ.get("BENCH_SQL_COUNT"):
    import sql_count

    sql_count.install(os.environ["BENCH_SQL_COUNT"])


@tool(permission="execute")
async def deploy(ctx: ToolContext, service: str) -> str:
    """Deploy a service (the benchmark's gated call)."""
    started = time.time()
    path = os.environ.get("BENCH_TOOL_LOG")
    if path:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{ctx.run_id} {started:.6f}\n".encode())
        finally:
            os.close(fd)
    return f"deployed {service}"


AGENTS = [Agent(name="bench-deploy", instructions="", tools=[deploy],
                model=ScriptedModel.sequence([reply("deploying", ("deploy", {"service": "web"})),
                                              reply("done", turn=1)]))]
