"""``approvald serve`` under tracemalloc, with a snapshot on each ``SIGUSR1``.

    python tests/benchmarks/trace_serve.py DIR serve

Traces allocations from the start (``$TRACE_FRAMES`` frames each, default 10; 0: no
tracing) and writes ``DIR/snap-<n>.pickle`` (a :class:`tracemalloc.Snapshot`, numbered
from 1) and ``DIR/snap-<n>.json`` (live objects by type, exactly; SQLite's own heap, which
tracemalloc does not see; the database files open) on every ``SIGUSR1``;
``bench_soak.py --trace DIR`` sends one at each sample (runs 1,000, 2,000, …), and
``--diff`` compares two of them. The process's resident memory then counts the tracer's
own bookkeeping: measure memory without it (or with ``TRACE_FRAMES=0``).
``TRACE_TRIM=1`` also gives malloc back what it keeps free (``malloc_trim``) at each
snapshot, and records the resident size before and after.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import json
import os
import signal
import sys
import threading
import tracemalloc
import weakref
from collections import Counter
from pathlib import Path
from typing import Any

OUT = Path(sys.argv.pop(1))
OUT.mkdir(parents=True, exist_ok=True)
if sys.argv[1:2] == ["--diff"]:  # trace_serve.py DIR --diff A B [N]: the top N growths
    traced = all((OUT / f"snap-{n}.pickle").exists() for n in sys.argv[2:4])
    filters = [tracemalloc.Filter(False, tracemalloc.__file__)]
    old, new = ([tracemalloc.Snapshot.load(str(OUT / f"snap-{n}.pickle"))
                 .filter_traces(filters) for n in sys.argv[2:4]] if traced else [None, None])
    top = int(sys.argv[4]) if len(sys.argv) > 4 else 25
    for key in ("lineno", "traceback"):
        if old is None or new is None:
            break
        stats = new.compare_to(old, key)
        print(f"-- by {key}: top {top} growths, snap {sys.argv[2]} -> {sys.argv[3]}")
        for s in stats[:top]:
            print(f"{s.size_diff / 1024:+9.1f} KiB {s.count_diff:+7d} blocks  "
                  f"{s.traceback.format()[-1].strip() if key == 'lineno' else ''}")
            if key == "traceback":
                for line in s.traceback.format(limit=8):
                    print("      " + line)
    if not all((OUT / f"snap-{n}.json").exists() for n in sys.argv[2:4]):
        sys.exit(0)
    a, b = (json.loads((OUT / f"snap-{n}.json").read_text()) for n in sys.argv[2:4])
    print(f"-- SQLite's heap {a['sqlite_memory_used'] / 1024:.0f} -> "
          f"{b['sqlite_memory_used'] / 1024:.0f} KiB; database files open "
          f"{a['db_files_open']} -> {b['db_files_open']}; threads {a['threads']} -> "
          f"{b['threads']}; VmRSS (KiB; after malloc_trim with TRACE_TRIM=1) "
          f"{a.get('rss_kb')} -> {b.get('rss_kb')}")
    grown = Counter(b["objects"])
    grown.subtract(a["objects"])
    print("-- live objects by type (gc), the most grown: " + ", ".join(
        f"{k} {v:+d}" for k, v in grown.most_common(top) if v))
    sys.exit(0)

FRAMES = int(os.environ.get("TRACE_FRAMES", "10"))  # 0: no tracing, the counts alone
if FRAMES:
    tracemalloc.start(FRAMES)
TAKEN: list[int] = []


def _sqlite_memory() -> tuple[int, int]:
    """SQLite's own heap in this process (every connection's page cache, schema and
    statements: what tracemalloc does not see), now and at its highest."""
    try:
        lib = ctypes.CDLL(ctypes.util.find_library("sqlite3") or "libsqlite3.so.0")
    except OSError:
        return -1, -1
    lib.sqlite3_memory_used.restype = lib.sqlite3_memory_highwater.restype = ctypes.c_int64
    return int(lib.sqlite3_memory_used()), int(lib.sqlite3_memory_highwater(0))


def _rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return -1


def snapshot(*_: Any) -> None:
    gc.collect()
    TAKEN.append(n := len(TAKEN) + 1)
    if FRAMES:
        tracemalloc.take_snapshot().dump(str(OUT / f"snap-{n}.pickle"))
    # exact counts of live objects by type, SQLite's heap, and the database files open
    live = gc.get_objects()
    types = Counter(f"{type(o).__module__}.{type(o).__qualname__}" for o in live)
    # what the commonest containers hold: tuples by their items' types, weak references
    # by their referents' (what a count of "tuple" alone cannot say)
    types.update(f"tuple({', '.join(type(x).__qualname__ for x in o[:4])})"
                 for o in live if type(o) is tuple)
    types.update(f"weakref->{type(o()).__qualname__}" for o in live
                 if type(o) is weakref.ReferenceType)
    # weak references whose referent is gone and that nothing has pruned
    types["dead weakrefs"] = sum(1 for o in live
                                 if type(o) is weakref.ReferenceType and o() is None)
    del live
    used, high = _sqlite_memory()
    rss = [_rss_kb()]
    if os.environ.get("TRACE_TRIM") == "1":  # how much of it is free memory malloc keeps
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        rss.append(_rss_kb())
    fds = Path("/proc/self/fd")
    files = Counter(str(os.readlink(fds / fd)) for fd in os.listdir(fds)
                    if (fds / fd).is_symlink())
    (OUT / f"snap-{n}.json").write_text(json.dumps({
        "objects": dict(types), "sqlite_memory_used": used, "sqlite_memory_highwater": high,
        "db_files_open": {k: v for k, v in files.items() if ".db" in k},
        "threads": threading.active_count(), "rss_kb": rss}))
    (OUT / f"snap-{n}.done").touch()


signal.signal(signal.SIGUSR1, snapshot)

from approvald.bot.cli import main

sys.exit(main())
