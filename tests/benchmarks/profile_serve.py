"""``approvald serve`` under cProfile by CPU time, for a window the caller picks.

    python tests/benchmarks/profile_serve.py OUT.prof serve

Runs the CLI with a profiler timed by ``time.process_time`` (the machine is shared: wall
time means little) that the first ``SIGUSR2`` turns on and the second turns off, writing
``OUT.prof`` (pstats) and ``OUT.prof.cpu`` (the process CPU seconds between the two);
``{pid}`` in ``OUT`` is replaced by the process id (several replicas, one file each).
``bench_clicks.py --profile OUT.prof`` sends them around its clicks. Only the main
thread is profiled (the event loop, where ``serve``'s work runs).
"""

from __future__ import annotations

import cProfile
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

OUT = Path(sys.argv.pop(1).replace("{pid}", str(os.getpid())))
PROFILER = cProfile.Profile(time.process_time)
STARTED: list[float] = []


def toggle(*_: Any) -> None:
    if not STARTED:
        STARTED.append(time.process_time())
        PROFILER.enable()
        return
    PROFILER.disable()
    PROFILER.dump_stats(str(OUT))
    OUT.with_name(OUT.name + ".cpu").write_text(f"{time.process_time() - STARTED[0]:.6f}\n")


signal.signal(signal.SIGUSR2, toggle)

from approvald.bot.cli import main

sys.exit(main())
