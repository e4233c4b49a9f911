"""Large histories stay fast: 10,000 waiting requests and 1,000,000 audit entries (issue 50).

    python tests/benchmarks/bench_history.py [--db URL] [--waiting 10000]
                                             [--entries 1000000] [--decided 100000]
                                             [--repeat 20]

What an approver and an operator touch every day, timed first on a small database (the
in-run baseline: ``--waiting``/100 waiting requests, but enough to fill each view's page
of 500, and ``--entries``/1,000 audit entries),
then on the same database filled to ``--waiting`` and ``--entries`` by bulk insert:

* **Home**: an approver's App Home (the requests they may decide, with their buttons'
  tokens; their recent decisions; the standing approvals they may revoke), drawn;
* **/approvals**: the slash command's list, drawn;
* **web queue**: the ``/review`` queue page's requests, drawn;
* **approvals list**: the CLI's oldest 100 pending requests and how many there are;
* **expiry sweep**: one sweep with nothing overdue (what ``serve`` runs every 15 s);
* **click**: one Approve (``Engine.decide``: the decision, its audit entry appended to the
  chain, its card update queued).

Each is run ``--repeat`` times; p50 and the slowest are printed beside the baseline's,
with PASS when the large history's p50 is within 2x the small one's (and 5 ms: a
millisecond's jitter is no regression). On PostgreSQL every statement those operations
send is explained (``EXPLAIN``, with the parameters it was sent with) after ``ANALYZE``:
a sequential scan of a table the history fills (approvals, runs, audit_log, outbox) is a
FAIL, named with its statement.

The history is filled server-side (PostgreSQL's ``generate_series``, SQLite's recursive
CTE): the audit entries are rows of the shape the views read, their chain is not a
verifiable one (``audit verify`` is measured by ``bench_insights.py``); the head is set
after the last, so a click appends to it as in production. The waiting requests are one
per run, each expiring in 2 to 22 hours, their approvers the benchmark's approver; beside
them ``--decided`` requests decided long ago, with their completed runs and their cards'
delivered outbox rows (bulk inserts from this process). On
PostgreSQL the benchmark makes a database of its own on the server ``--db`` names and
drops it afterwards; default: a temporary SQLite file.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE))

from approvald.bot.slack.handlers import Handlers
from approvald.bot.web import pages
from approvald.bot.web.routes import WebRoutes
from approvald.runtime.approvals.decide import Actor
from approvald.runtime.engine import Engine, assemble
from approvald.runtime.kernel.canonical import call_digest
from approvald.runtime.kernel.clock import ManualClock
from approvald.runtime.kernel.ids import new_id, new_nonce
from approvald.runtime.kernel.vocabulary import OutcomeName
from approvald.runtime.record.outbox_kinds import CARD_POST, CARD_UPDATE
from approvald.runtime.runs.agent import Registry
from approvald.runtime.runs.demo import REFUND_POLICY, demo_agents
from approvald.runtime.views import CANDIDATES
from approvald.store import migrate
from approvald.store.db import Database
from approvald.store.models import Approval, Outbox, Run
from bench_common import pct, setup_database
from sqlalchemy import insert, text

from tests.helpers import parts

APPROVER = "U_ALICE"
START = datetime(2026, 11, 1, tzinfo=UTC)
# tables the history fills: a sequential scan of one of them grows with it
FILLED = ("approvals", "runs", "audit_log", "outbox", "run_events", "tool_executions")


class Captured:
    """Every statement (and its arguments) asyncpg is given while ``on``: the plans of
    what an operation sends, checked afterwards."""

    def __init__(self) -> None:
        self.on = False
        self.sent: list[tuple[str, tuple[Any, ...]]] = []

    def install(self) -> None:
        import asyncpg.connection  # type: ignore[import-untyped]
        import asyncpg.prepared_stmt  # type: ignore[import-untyped]

        def wrap(cls: Any, name: str, sql_of: Callable[[Any, tuple[Any, ...]], str],
                 args_of: Callable[[tuple[Any, ...]], tuple[Any, ...]]) -> None:
            original = getattr(cls, name)

            async def call(obj: Any, *args: Any, **kwargs: Any) -> Any:
                if self.on:
                    self.sent.append((sql_of(obj, args), args_of(args)))
                return await original(obj, *args, **kwargs)

            setattr(cls, name, call)

        for name in ("fetch", "fetchrow", "fetchval"):
            wrap(asyncpg.prepared_stmt.PreparedStatement, name,
                 lambda obj, args: obj._query, lambda args: args)
        for name in ("execute", "fetch", "fetchrow", "fetchval"):
            wrap(asyncpg.connection.Connection, name, lambda obj, args: args[0],
                 lambda args: args[1:])


async def fill_waiting(db: Database, now: datetime, first: int, n: int) -> None:
    """``n`` waiting requests, one per run (awaiting approval), by bulk insert."""
    args = {"order_id": "A-1001", "amount_cents": 4200, "reason": "duplicate charge"}
    policy = json.dumps(REFUND_POLICY.snapshot())
    runs, approvals = [], []
    for i in range(first, first + n):
        run_id = new_id()
        runs.append({"id": run_id, "agent": "demo-refund", "status": "awaiting_approval",
                     "step": 1, "next_seq": 3, "task": f"refund {i}", "requested_by": "U_DANA",
                     "instructions_version": "bench", "cancel_requested": False,
                     "created_at": now, "updated_at": now})
        approvals.append({
            "id": new_id(), "run_id": run_id, "call_id": "call_0", "kind": "tool_call",
            "tool": "issue_refund", "args": json.dumps({**args, "order_id": f"A-{i}"}),
            "digest": call_digest("issue_refund", {**args, "order_id": f"A-{i}"}),
            "status": "pending", "rung": 0, "approvers": json.dumps([APPROVER]), "quorum": 1,
            "approve_count": 0, "policy": policy, "packet": "{}", "requested_by": "U_DANA",
            "token_nonce": new_nonce(), "requested_at": now - timedelta(seconds=n - i),
            "expires_at": now + timedelta(hours=2 + i % 20, seconds=i),
            "reminders_sent": 2, "next_reminder_at": None})
    async with db.write() as tx:
        for i in range(0, len(runs), 1000):
            await tx.conn.execute(insert(Run), runs[i:i + 1000])
            await tx.conn.execute(insert(Approval), approvals[i:i + 1000])


async def fill_decided(db: Database, now: datetime, first: int, n: int) -> None:
    """``n`` requests decided long ago, one per completed run, each with its card posted
    and updated (two delivered outbox rows): what a deployment's tables hold beside the
    requests that wait."""
    policy = json.dumps(REFUND_POLICY.snapshot())
    args = json.dumps({"order_id": "A-1", "amount_cents": 4200, "reason": "duplicate charge"})
    digest = call_digest("issue_refund", json.loads(args))
    for lo in range(first, first + n, 2000):
        runs, approvals, outbox = [], [], []
        for i in range(lo, min(first + n, lo + 2000)):
            run_id, aid = new_id(), new_id()
            at = START + timedelta(seconds=i * 10)
            runs.append({"id": run_id, "agent": "demo-refund", "status": "completed",
                         "step": 3, "next_seq": 6, "task": f"refund {i}",
                         "requested_by": "U_DANA", "instructions_version": "bench",
                         "cancel_requested": False, "created_at": at, "updated_at": at})
            approvals.append({
                "id": aid, "run_id": run_id, "call_id": "call_0", "kind": "tool_call",
                "tool": "issue_refund", "args": args, "digest": digest, "status": "approved",
                "rung": 0, "approvers": json.dumps([APPROVER]), "quorum": 1,
                "approve_count": 1, "policy": policy, "packet": "{}", "requested_by": "U_DANA",
                "token_nonce": new_nonce(), "requested_at": at, "expires_at": at
                + timedelta(hours=2), "decided_at": at + timedelta(minutes=1),
                "decided_by": "U_BOB", "decided_via": "slack", "verdict": "approve",
                "reminders_sent": 0, "next_reminder_at": None})
            for kind in (CARD_POST, CARD_UPDATE):
                outbox.append({"kind": kind, "group_key": aid, "payload": json.dumps(
                    {"approval_id": aid}), "status": "delivered", "attempts": 1,
                    "not_before": at, "created_at": at, "delivered_at": at})
        async with db.write() as tx:
            await tx.conn.execute(insert(Run), runs)
            await tx.conn.execute(insert(Approval), approvals)
            await tx.conn.execute(insert(Outbox), outbox)


async def fill_audit(db: Database, n: int) -> None:
    """``n`` audit entries after the head, made by the database itself, a second apart;
    the head moved to the last."""
    async with db.read() as tx:
        first = int((await tx.conn.execute(
            text("SELECT seq FROM audit_head WHERE id = 1"))).scalar() or 0) + 1
    last = first + n - 1
    chunk = 200_000
    for lo in range(first, last + 1, chunk):
        hi = min(last, lo + chunk - 1)
        if db.dialect == "postgresql":
            stmt = text(
                "INSERT INTO audit_log (seq, at, action, actor, via, run_id, approval_id, "
                "digest, details, key_id, prev_hash, hash) "
                "SELECT g, timestamptz '2026-11-01 00:00:00+00' + g * interval '1 second', "
                "(ARRAY['requested','approved','executed','denied','reminded'])[g % 5 + 1], "
                "'U_ALICE', 'slack', md5(g::text)::varchar(32), md5((g + 1)::text)::varchar(32),"
                " md5(g::text) || md5(g::text), '{\"tool\": \"issue_refund\"}', '', "
                "md5((g - 1)::text) || md5((g - 1)::text), md5(g::text) || md5(g::text) "
                "FROM generate_series(CAST(:lo AS integer), CAST(:hi AS integer)) AS g")
        else:
            stmt = text(
                "INSERT INTO audit_log (seq, at, action, actor, via, run_id, approval_id, "
                "digest, details, key_id, prev_hash, hash) "
                "WITH RECURSIVE s(g) AS (SELECT :lo UNION ALL SELECT g + 1 FROM s WHERE g < :hi)"
                " SELECT g, strftime('%Y-%m-%d %H:%M:%S', '2026-11-01', '+' || g || ' seconds')"
                " || '.000000', CASE g % 5 WHEN 0 THEN 'requested' WHEN 1 THEN 'approved' "
                "WHEN 2 THEN 'executed' WHEN 3 THEN 'denied' ELSE 'reminded' END, "
                "'U_ALICE', 'slack', printf('%032x', g), printf('%032x', g + 1), "
                "printf('%064x', g), '{\"tool\": \"issue_refund\"}', '', "
                "printf('%064x', g - 1), printf('%064x', g) FROM s")
        async with db.write() as tx:
            await tx.conn.execute(stmt, {"lo": lo, "hi": hi})
    async with db.write() as tx:
        await tx.audit.lock_head()
        h = (await tx.conn.execute(text("SELECT hash FROM audit_log WHERE seq = :s"),
                                   {"s": last})).scalar_one()
        await tx.conn.execute(text("UPDATE audit_head SET seq = :s, hash = :h WHERE id = 1"),
                              {"s": last, "h": h})


class Fake:
    """Slack's client and ``respond`` for the handlers: what they would send is kept."""

    def __init__(self) -> None:
        self.sent: list[Any] = []

    async def views_publish(self, **kw: Any) -> None:
        self.sent.append(kw)

    async def __call__(self, **kw: Any) -> None:
        self.sent.append(kw)


def operations(engine: Engine, clock: ManualClock, batch: int = 1
               ) -> dict[str, Callable[[], Awaitable[Any]]]:
    slack, fake = Handlers(engine), Fake()
    web = WebRoutes(engine, None, "http://127.0.0.1")  # type: ignore[arg-type]

    async def home() -> None:
        await slack.publish_home(fake, APPROVER)  # type: ignore[arg-type]

    async def slash() -> None:
        await slack._list_for(APPROVER, fake)  # type: ignore[arg-type]

    async def queue() -> None:
        pages.queue(await web.actionable(APPROVER), user=APPROVER, csrf="x", now=clock.now())

    async def listed() -> None:
        rows, total = await engine.oldest_approvals(outcome=OutcomeName.PENDING, limit=100)
        assert rows and total >= len(rows)

    async def sweep() -> None:
        await engine.sweep()

    to_click: list[Any] = []

    async def click() -> None:
        # a click names its request (the button's value): the requests to click are found
        # ``batch`` at a time, in the call :func:`timed` does not time when ``batch`` is
        # its repeat + 1 (the approver's list is Home's and /approvals' read, timed there)
        if not to_click:
            async with parts(engine).db.read() as tx:
                to_click.extend(await tx.approvals.pending_for_actor_candidates(limit=batch))
        a = to_click.pop(0)
        decided = await engine.decide(a.id, actor=Actor(APPROVER, "slack"), verdict="approve",
                                      token=engine.button_token(a))
        assert decided.outcome == "approved", decided.outcome

    return {"Home": home, "/approvals": slash, "web queue": queue, "approvals list": listed,
            "expiry sweep (nothing due)": sweep, "click (Approve)": click}


async def timed(ops: dict[str, Callable[[], Awaitable[Any]]], repeat: int
                ) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for name, op in ops.items():
        await op()  # plans made, caches warm
        samples = []
        for _ in range(repeat):
            t = time.perf_counter()
            await op()
            samples.append(time.perf_counter() - t)
        out[name] = samples
    return out


async def explain(url: str, ops: dict[str, Callable[[], Awaitable[Any]]],
                  captured: Captured) -> int:
    """Each operation's statements explained; the sequential scans of filled tables."""
    import asyncpg
    from sqlalchemy.engine import make_url

    plain = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    conn = await asyncpg.connect(plain)
    bad = 0
    try:
        await conn.execute("ANALYZE")
        for name, op in ops.items():
            captured.sent.clear()
            captured.on = True
            await op()
            captured.on = False
            scans: list[str] = []
            explained = 0
            for sql, args in captured.sent:
                head = sql.lstrip().split(None, 1)[0].upper() if sql.strip() else ""
                if head not in ("SELECT", "UPDATE", "INSERT", "DELETE", "WITH"):
                    continue
                try:
                    plan = await conn.fetchval(f"EXPLAIN (FORMAT JSON) {sql}", *args)
                except asyncpg.PostgresError as exc:
                    print(f"    (not explained: {type(exc).__name__}: {sql[:80]})")
                    continue
                explained += 1
                for node in _nodes(json.loads(plan)[0]["Plan"]):
                    if node.get("Node Type") == "Seq Scan" and \
                            node.get("Relation Name") in FILLED:
                        scans.append(f"{node['Relation Name']}: {' '.join(sql.split())[:150]}")
            bad += bool(scans)
            print(f"  {name}: {explained} statements explained, "
                  + ("every filled table read by an index: PASS" if not scans else
                     f"{len(scans)} sequential scan(s) of a filled table: FAIL"))
            for s in scans:
                print(f"      {s}")
    finally:
        await conn.close()
    return bad


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    out = [plan]
    for child in plan.get("Plans", ()):
        out.extend(_nodes(child))
    return out


async def bench(a: argparse.Namespace) -> int:
    tmp = Path(tempfile.mkdtemp())
    url, drop = await setup_database(a.db, tmp, "bench_history")
    captured = Captured()
    if a.db is not None:
        captured.install()
    db = Database(url)
    try:
        await migrate.upgrade(db)
        clock = ManualClock(START + timedelta(days=40))
        engine = assemble(db, Registry(demo_agents()), clock=clock)
        ops = operations(engine, clock, batch=a.repeat + 1)
        # the baseline holds enough waiting requests to fill every view's page (at most
        # CANDIDATES each), and the clicks' own: the views draw as much in both
        small_w = max(a.waiting // 100, CANDIDATES + 3 * (a.repeat + 1))
        small_e = max(a.entries // 1000, 100)
        small_d = max(a.decided // 1000, 100)
        await fill_waiting(db, clock.now(), 0, small_w)
        await fill_decided(db, clock.now(), 0, small_d)
        await fill_audit(db, small_e)
        print(f"database: {db.display_url.split('?')[0]}; {os.cpu_count()} cores, load "
              f"average {os.getloadavg()[0]:.1f}")
        base = await timed(ops, a.repeat)
        base_rss = rss_mb()
        t0 = time.perf_counter()
        await fill_waiting(db, clock.now(), small_w, a.waiting - small_w)
        filled_w = time.perf_counter() - t0
        t0 = time.perf_counter()
        await fill_decided(db, clock.now(), small_d, a.decided - small_d)
        filled_d = time.perf_counter() - t0
        t0 = time.perf_counter()
        await fill_audit(db, a.entries - small_e)
        filled_e = time.perf_counter() - t0
        if db.dialect == "postgresql":
            async with db.connection() as conn:
                await conn.execute(text("ANALYZE"))
        else:
            async with db.write() as tx:
                await tx.conn.execute(text("ANALYZE"))
        async with db.read() as tx:
            waiting = await tx.approvals.count(status="pending")
            entries = (await tx.conn.execute(text("SELECT count(*) FROM audit_log"))).scalar()
        print(f"filled to {waiting:,} waiting requests in {filled_w:.1f} s, {a.decided:,} "
              f"decided ones (with their cards' outbox rows) in {filled_d:.1f} s and "
              f"{entries:,} audit entries in {filled_e:.1f} s (bulk inserts)")
        big = await timed(ops, a.repeat)
        rss = (rss_mb(), base_rss)
        print(f"each operation {a.repeat} times: p50 / slowest in ms, the baseline (a small "
              f"history: {small_w:,} waiting, {small_d:,} decided, {small_e:,} entries) beside the "
              "large one")
        failed = 0
        for name in ops:
            b50, l50 = pct(base[name], .5), pct(big[name], .5)
            ok = l50 <= max(2 * b50, b50 + 5)
            failed += not ok
            print(f"  {name:28} baseline {b50:8.1f} / {pct(base[name], 1):8.1f}   "
                  f"large {l50:8.1f} / {pct(big[name], 1):8.1f}   "
                  f"{l50 / b50 if b50 else 0:5.2f}x  {'PASS' if ok else 'FAIL'}")
        print(f"this process's memory (VmRSS) after the baseline's operations {rss[1]:.1f} MB, "
              f"after the large history's {rss[0]:.1f} MB ({rss[0] - rss[1]:+.1f} MB)")
        if a.db is not None:
            print("the plans (PostgreSQL, EXPLAIN after ANALYZE), each operation once")
            failed += await explain(url, ops, captured)
        return 1 if failed else 0
    finally:
        await db.close()
        await drop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--db", default=None, help="a PostgreSQL server's URL (a database is made "
                                              "on it); default: a temp SQLite file")
    p.add_argument("--waiting", type=int, default=10_000)
    p.add_argument("--entries", type=int, default=1_000_000)
    p.add_argument("--decided", type=int, default=100_000,
                   help="requests decided long ago (with their runs and outbox rows)")
    p.add_argument("--repeat", type=int, default=20)
    return asyncio.run(bench(p.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
