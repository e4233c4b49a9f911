"""``tests/benchmarks/bench_history.py`` (issue 50's large histories) runs on today's front
door, on both dialects, at a tiny size: a benchmark that no longer runs is found by the
suite, not by the next person who needs its figures. No timing is asserted here (the
benchmark prints its own, against its in-run baseline); only that every operation it
times was run and, on PostgreSQL, that its statements' plans were checked."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

from tests.conftest import PG_ADMIN_URL

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
OPERATIONS = ("Home", "/approvals", "web queue", "approvals list", "expiry sweep", "click")


def _bench_history():  # type: ignore[no-untyped-def]
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    import bench_history

    return bench_history


@pytest.mark.parametrize("dialect", [pytest.param("sqlite", marks=pytest.mark.sqlite),
                                     pytest.param("postgres", marks=pytest.mark.postgres)])
async def test_the_large_history_benchmark_runs_every_operation(
        dialect: str, capsys: pytest.CaptureFixture[str]) -> None:
    db = None if dialect == "sqlite" else PG_ADMIN_URL.replace(
        "postgresql://", "postgresql+asyncpg://", 1)
    args = argparse.Namespace(db=db, waiting=600, entries=2_000, decided=100, repeat=1)
    status = await _bench_history().bench(args)
    out = capsys.readouterr().out
    assert status in (0, 1), out  # 1: a figure or a plan judged FAIL, printed
    for name in OPERATIONS:
        assert any(line.strip().startswith(name) and "large" in line
                   for line in out.splitlines()), (name, out)
    if db is not None:
        assert "the plans (PostgreSQL, EXPLAIN after ANALYZE)" in out, out
