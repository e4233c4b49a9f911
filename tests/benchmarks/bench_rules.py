"""What rules on arguments cost a gated call: choosing the policy with the three refund
bands of the README (CEL conditions, first match wins) against the same tool with no rules.

    python tests/benchmarks/bench_rules.py [--calls 20000]

Prints the median and p99 per call of ``PolicyFile.for_call`` with no rules (the in-run
baseline), with three rules where the last band matches (all three conditions evaluated),
and where none matches; and, for scale, one durable SQLite commit on this machine. No
target of its own: the figure shows that rules are noise beside a step's commits.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from approvald.runtime.policies.policy import PolicyFile
from approvald.runtime.runs.demo import REFUND_POLICY

BANDS = {"tools": {"issue_refund": {"rules": [
    {"when": "args.amount_cents <= 2000", "policy": "auto"},
    {"when": "args.amount_cents > 1000000", "policy": "forbidden", "reason": "finance"},
    {"when": "args.amount_cents > 100000", "approvers": ["S_FINANCE"], "quorum": 2},
]}}}


def per_call(policy: PolicyFile, args: dict[str, object], calls: int) -> list[float]:
    out = []
    for _ in range(calls):
        t = time.perf_counter()
        policy.for_call("issue_refund", "approve_before", REFUND_POLICY, args)
        out.append((time.perf_counter() - t) * 1e6)
    return out


def commit_us(n: int = 200) -> float:
    with tempfile.TemporaryDirectory() as d:
        conn = sqlite3.connect(os.path.join(d, "c.db"), isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("CREATE TABLE t (v TEXT)")
        out = []
        for _ in range(n):
            t = time.perf_counter()
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO t VALUES ('x')")
            conn.execute("COMMIT")
            out.append((time.perf_counter() - t) * 1e6)
        conn.close()
    return statistics.median(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--calls", type=int, default=20000)
    a = p.parse_args()
    args = {"order_id": "A-1", "amount_cents": 200000, "reason": "duplicate charge"}
    plain, banded = PolicyFile(), PolicyFile.model_validate(BANDS)
    per_call(banded, args, 500)  # warm the compiled-condition cache
    rows = [("no rules (baseline)", per_call(plain, args, a.calls)),
            ("3 rules, the last matches", per_call(banded, args, a.calls)),
            ("3 rules, none matches", per_call(banded, {**args, "amount_cents": 50000},
                                               a.calls))]
    print(f"PolicyFile.for_call, {a.calls} calls each")
    for name, xs in rows:
        xs.sort()
        print(f"  {name:<28} median {statistics.median(xs):7.1f} us   "
              f"p99 {xs[int(len(xs) * 0.99)]:7.1f} us")
    extra = statistics.median(rows[1][1]) - statistics.median(rows[0][1])
    print(f"  three rules add {extra:.1f} us per gated call; one durable SQLite commit "
          f"here: {commit_us():.0f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
