"""``bench_clicks.py --warm N``: N approvals made first and left out of every figure, so
that a process's once-only costs (its statements' compiled forms, the first collections'
freezes) are not spread over the measured clicks (``bench_replicas.py --warm`` passes it on;
docs/performance.md, "Replicas on PostgreSQL")."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

BENCH = Path(__file__).parents[1] / "benchmarks" / "bench_clicks.py"


def test_the_warm_up_approvals_are_made_first_and_counted_nowhere(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH), "--runs", "3", "--warm", "2", "--concurrency", "2"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, check=True).stdout
    assert "paused 5 runs" in out
    assert "warmed up: 2 approvals first, each run completed and its card updated" in out
    assert "3 signed Approve clicks, 2 at a time" in out
    # every measured figure is over the three measured clicks alone
    assert re.search(r"click -> card updated: .*\(3 of 3 cards\)", out), out
    assert re.search(r"click -> run completed: .*\(3 of 3 runs\)", out), out
    calls = re.search(r"chat\.update ([0-9.]+) per approval", out)
    assert calls and float(calls.group(1)) == 1.0, out  # the warm-up's updates not counted
