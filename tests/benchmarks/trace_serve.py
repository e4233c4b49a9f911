"""``approvald serve`` under tracemalloc, with a snapshot on each ``SIGUSR1``.

    python tests/benchmarks/trace_serve.py DIR serve

Traces allocations from the start (``$TRACE_FRAMES`` frames each, default 10) and writes
``DIR/snap-<n>.pickle`` (a :class:`tracemalloc.Snapshot`, numbered from 1) on every
``SIGUSR1``; ``bench_soak.py --trace DIR`` sends one at each sample (runs 1,000, 2,000, …),
and ``--diff`` compares two of them. The process's resident memory then counts the
tracer's own bookkeeping: measure memory without it.
"""

from __future__ import annotations

import gc
import os
import signal
import sys
import tracemalloc
from pathlib import Path
from typing import Any

OUT = Path(sys.argv.pop(1))
OUT.mkdir(parents=True, exist_ok=True)
if sys.argv[1:2] == ["--diff"]:  # trace_serve.py DIR --diff A B [N]: the top N growths
    old, new = (tracemalloc.Snapshot.load(str(OUT / f"snap-{n}.pickle"))
                for n in sys.argv[2:4])
    filters = [tracemalloc.Filter(False, tracemalloc.__file__)]
    top = int(sys.argv[4]) if len(sys.argv) > 4 else 25
    for key in ("lineno", "traceback"):
        stats = new.filter_traces(filters).compare_to(old.filter_traces(filters), key)
        print(f"-- by {key}: top {top} growths, snap {sys.argv[2]} -> {sys.argv[3]}")
        for s in stats[:top]:
            print(f"{s.size_diff / 1024:+9.1f} KiB {s.count_diff:+7d} blocks  "
                  f"{s.traceback.format()[-1].strip() if key == 'lineno' else ''}")
            if key == "traceback":
                for line in s.traceback.format(limit=8):
                    print("      " + line)
    sys.exit(0)

tracemalloc.start(int(os.environ.get("TRACE_FRAMES", "10")))
TAKEN: list[int] = []


def snapshot(*_: Any) -> None:
    gc.collect()
    TAKEN.append(len(TAKEN) + 1)
    tracemalloc.take_snapshot().dump(str(OUT / f"snap-{TAKEN[-1]}.pickle"))
    (OUT / f"snap-{TAKEN[-1]}.done").touch()


signal.signal(signal.SIGUSR1, snapshot)

from approvald.bot.cli import main

sys.exit(main())
