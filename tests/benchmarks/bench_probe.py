"""What stalls ``serve``'s event loop, seen from inside it (``bench_fleet.py --probe``).

Imported by :mod:`bench_agent` in ``serve`` when ``BENCH_PROBE`` names a file. It notes:

* each **collection** of the cyclic garbage collector (``gc.callbacks``): when it began
  (the wall clock), its generation, how long it took by the wall and by the main thread's
  CPU, and what it collected;
* each **late wake-up** of a task on the event loop that sleeps 2 ms: when the loop ran it
  more than ``BENCH_PROBE_LATE`` ms (default 10) late, how late, and the main thread's CPU
  meanwhile (a stall the main thread spent on a CPU is ``serve``'s own; one it did not is
  the machine's scheduling);
* the **stacks** a thread samples from the main thread every millisecond while the loop is
  that late (the innermost frames of ``serve``'s own code and its libraries).

It writes them as JSON to ``BENCH_PROBE`` every second; :func:`summary` reads them for one
window of wall-clock time. Two knobs, for measurements only: ``BENCH_GC_YOUNG`` sets the
young generation's threshold ``settle_heap`` gives the collector after start-up;
``BENCH_SETTLE_FULL_ONLY=1`` makes ``Settling`` freeze after full collections alone (as
before it looked at younger ones too), to compare.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

LATE = float(os.environ.get("BENCH_PROBE_LATE", "10")) / 1000
TICK = 0.002
STACKS = os.environ.get("BENCH_PROBE_STACKS", "1") == "1"  # 0: no sampling thread waking
CENSUS = os.environ.get("BENCH_PROBE_CENSUS") == "1"  # count what each older collection walks


class Probe:
    def __init__(self, out: Path) -> None:
        self.out = out
        self.main = threading.main_thread().ident or 0
        self.clock = time.pthread_getcpuclockid(self.main)
        self.collections: list[list[Any]] = []  # [wall, gen, wall s, cpu s, collected]
        # [wall, late s, main thread's CPU s, its wait on a run queue s (an upper bound)]
        self.late: list[list[Any]] = []
        self.stacks: list[list[Any]] = []  # [wall, [frames innermost first]]
        # what the first older collections walked: [wall, gen, [objects per gen], top types]
        self.census: list[list[Any]] = []
        self.beat = time.perf_counter()
        self.beat_cpu = time.clock_gettime(self.clock)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.schedstat = Path(f"/proc/self/task/{threading.main_thread().native_id}/schedstat")
        self._gc: tuple[float, float, float] | None = None
        gc.callbacks.append(self._collected)
        threading.Thread(target=self._watch, name="bench-probe", daemon=True).start()

    def _collected(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            if self.loop is None:
                self.loop = asyncio._get_running_loop()
            if CENSUS and info["generation"] >= 1 and len(self.census) < 500:  # what it walks
                gens = [gc.get_objects(g) for g in range(info["generation"] + 1)]
                kinds = Counter(type(o).__name__ for objs in gens for o in objs)
                self.census.append([time.time(), info["generation"],
                                    [len(objs) for objs in gens], kinds.most_common(12)])
                del gens, kinds
            self._gc = (time.time(), time.perf_counter(), time.clock_gettime(self.clock))
            return
        if self._gc is None:
            return
        wall, t0, c0 = self._gc
        self.collections.append([wall, info["generation"], time.perf_counter() - t0,
                                 time.clock_gettime(self.clock) - c0, info["collected"]])
        self._gc = None

    def _queued(self) -> float:
        """Seconds the main thread has waited on a run queue for a CPU so far (schedstat)."""
        try:
            return int(self.schedstat.read_text().split()[1]) / 1e9
        except (OSError, IndexError, ValueError):
            return 0.0

    async def _heartbeat(self) -> None:
        q = self._queued()
        while True:
            t, c = time.perf_counter(), time.clock_gettime(self.clock)
            await asyncio.sleep(TICK)
            now, cpu = time.perf_counter(), time.clock_gettime(self.clock)
            late = now - t - TICK
            if late > LATE:
                q1 = self._queued()
                self.late.append([time.time() - (now - t), late, cpu - c, q1 - q])
                q = q1
            elif late > LATE / 4:
                q = self._queued()
            self.beat, self.beat_cpu = now, cpu

    def _frames(self) -> list[str]:
        """The main thread's innermost frames, then each other thread's innermost (but
        this one's), marked ``[thread]``: a worker thread holding the interpreter holds
        the event loop back too."""
        frames = sys._current_frames()
        out = self._stack(frames.get(self.main), 12)
        for ident, frame in frames.items():
            if ident not in (self.main, threading.get_ident()):
                inner = self._stack(frame, 1)
                if inner and not inner[0].startswith(("threading.py", "concurrent/")):
                    out.append(f"[thread] {inner[0]}")
        return out

    @staticmethod
    def _stack(frame: Any, depth: int) -> list[str]:
        out: list[str] = []
        while frame is not None and len(out) < depth:
            code = frame.f_code
            name = code.co_filename.rsplit("site-packages/", 1)[-1]
            out.append(f"{name.rsplit('/lib/python3.11/', 1)[-1]}:{frame.f_lineno} "
                       f"{code.co_name}")
            frame = frame.f_back
        return out

    def _watch(self) -> None:
        started = False
        written = time.perf_counter()
        while True:
            time.sleep(0.001 if STACKS else 0.1)
            if not started and self.loop is not None:
                self.loop.call_soon_threadsafe(
                    lambda: setattr(self, "_task", asyncio.ensure_future(self._heartbeat())))
                started = True
            now = time.perf_counter()
            if STACKS and started and now - self.beat > LATE:
                self.stacks.append([time.time(), self._frames()])
            if now - written > 1:
                written = now
                data = {"collections": self.collections, "late": self.late,
                        "stacks": self.stacks[-20000:], "census": self.census,
                        "threshold": gc.get_threshold(),
                        "settling": _settling()}
                self.out.with_suffix(".tmp").write_text(json.dumps(data))
                self.out.with_suffix(".tmp").replace(self.out)


def _settling() -> list[list[int]]:
    """``serve``'s :class:`~bot.serve.Settling` freezes left: [after full collections, after
    any]."""
    out = []
    for cb in list(gc.callbacks):
        owner: Any = getattr(cb, "__self__", None)
        if type(owner).__name__ == "Settling":
            out.append([owner.left, owner.more])
    return out


def _chain(obj: Any, depth: int, seen: set[int]) -> list[Any]:
    """Who holds ``obj``: its referrers' types, ``depth`` levels up (the first three each)."""
    if depth == 0:
        return []
    out: list[Any] = []
    for ref in gc.get_referrers(obj)[:3]:
        if id(ref) in seen or (isinstance(ref, list) and len(ref) > 1000):
            continue
        seen.add(id(ref))
        name = type(ref).__name__
        if isinstance(ref, dict):
            name += f"[{len(ref)}]:" + ",".join(map(str, list(ref)[:4]))[:80]
        out.append([name, _chain(ref, depth - 1, seen)])
    return out


def _census(out: Path) -> None:
    """``SIGUSR2``: what each generation holds now (types), and who holds a few samples of
    the commonest of SQLAlchemy's kinds in the young generations."""
    gens = [gc.get_objects(g) for g in range(3)]
    data: dict[str, Any] = {"sizes": [len(g) for g in gens], "frozen": gc.get_freeze_count()}
    data["types"] = [Counter(type(o).__name__ for o in g).most_common(25) for g in gens]
    samples = [o for g in gens for o in g if type(o).__name__ in ("BindParameter", "Label")]
    seen = {id(gens), *map(id, gens), id(samples)}
    data["held"] = [[type(o).__name__, repr(o)[:80], _chain(o, 6, seen)]
                    for o in samples[:: max(1, len(samples) // 4)][:4]]
    del gens, samples
    out.write_text(json.dumps(data, indent=1, default=str))


def install() -> Probe | None:
    import signal
    signal.signal(signal.SIGUSR2, lambda *_: _census(Path(os.environ["BENCH_PROBE"] + ".census")))
    young = os.environ.get("BENCH_GC_YOUNG")
    if young:
        from approvald.bot import serve
        serve.GC_YOUNG = int(young)
    if os.environ.get("BENCH_SETTLE_FULL_ONLY") == "1":  # before 2026-12-07's h71d: A/B
        from approvald.bot import serve

        def full_only(self: Any, phase: str, info: dict[str, int]) -> None:
            if phase != "stop" or info["generation"] != 2:
                return
            if self.left > 0:
                self.left -= 1
                gc.freeze()
            elif self.more > 0 and len(gc.get_objects(2)) >= self.least:
                self.more -= 1
                gc.freeze()
        serve.Settling._collected = full_only  # type: ignore[method-assign]
    return Probe(Path(os.environ["BENCH_PROBE"])) if os.environ.get("BENCH_PROBE") else None


def summary(path: Path, t0: float, t1: float, top: int = 8) -> list[str]:
    """What the probe saw between wall-clock ``t0`` and ``t1``, as lines to print."""
    data = json.loads(path.read_text())
    cols = [c for c in data["collections"] if t0 <= c[0] <= t1]
    late = [x for x in data["late"] if t0 <= x[0] <= t1]
    stacks = [s for s in data["stacks"] if t0 <= s[0] <= t1]
    out = [f"collector thresholds {data.get('threshold')}; Settling's freezes left (after "
           f"full collections, then after any): {data.get('settling')}"]
    for gen in (0, 1, 2):
        mine = [c for c in cols if c[1] == gen]
        if mine:
            walls = sorted(c[2] * 1000 for c in mine)
            out.append(f"gen{gen}: {len(mine)} collections, {sum(walls):.1f} ms wall in all, "
                       f"each {walls[len(walls) // 2]:.2f} ms (median) / {walls[-1]:.1f} ms "
                       f"(max), CPU {sum(c[3] for c in mine) * 1000:.1f} ms, "
                       f"{sum(c[4] for c in mine)} objects collected")
    threads = Counter(f for _, frames in stacks for f in frames if f.startswith("[thread]"))
    for where, n in threads.most_common(3):
        out.append(f"  {n:5d} samples of another thread in any stall  {where}")
    if late:
        worst = sorted(late, key=lambda x: -x[1])[:10]
        own = [x for x in late if x[2] >= x[1] / 2]
        out.append(f"late wake-ups > {LATE * 1000:g} ms: {len(late)}, "
                   f"{sum(x[1] for x in late) * 1000:.0f} ms in all, of which the main thread "
                   f"on a CPU {sum(x[2] for x in late) * 1000:.0f} ms, waiting for one "
                   f"<= {sum(x[3] for x in late) * 1000:.0f} ms; worst (late / CPU / "
                   "queued): " + ", ".join(f"{x[1] * 1000:.0f}/{x[2] * 1000:.0f}/"
                                           f"{x[3] * 1000:.0f}" for x in worst))
        out.append(f"serve's own (on a CPU half the time or more): {len(own)}, "
                   + ", ".join(f"{x[1] * 1000:.0f}/{x[2] * 1000:.0f}" for x in
                               sorted(own, key=lambda x: -x[1])[:12]))
        gcs = [c for c in cols if c[2] > LATE / 2]
        out.append(f"collections longer than {LATE * 500:g} ms: "
                   + ", ".join(f"gen{c[1]} {c[2] * 1000:.1f} ms (CPU {c[3] * 1000:.1f})"
                               for c in gcs[:20]))
        spans = [(x[0], x[0] + x[1] + TICK) for x in own]
        stacks = [st for st in stacks if any(a <= st[0] <= b for a, b in spans)]
    for _, gen, sizes, kinds in [c for c in data.get("census", []) if t0 <= c[0] <= t1]:
        out.append(f"gen{gen} walked {sizes} objects (gen0, gen1, …): "
                   + ", ".join(f"{k} {n}" for k, n in kinds[:8]))
    counts: Counter[str] = Counter()
    for _, frames in stacks:
        frames = [f for f in frames if not f.startswith("[thread]")]
        own = [f for f in frames if "/approvald/" in f or "/work/" in f]
        counts[" < ".join((own or frames)[:3])] += 1
    for where, n in counts.most_common(top):
        out.append(f"  {n:5d} samples in serve's own stalls  {where}")
    return out
