"""``serve``'s CPU and Python calls per approval, in one process, on a thread of its own.

    python tests/benchmarks/bench_click_cpu.py [--db URL] [--runs 200] [--concurrency 20]
                                               [--rounds 1] [--profile OUT.prof]
                                               [--lease-ttl S] [--drain-only] [--top N]

Where ``bench_clicks.py`` runs ``serve`` as a separate process (latencies, which a shared
machine makes meaningless), this runs the same ``serve`` (its
:class:`~approvald.bot.serve.Service`, the same agents and Slack settings) on this
process's main thread, and on a second thread, with its own event loop, everything that
plays the rest of the world: the Slack Web API emulator, the engine that pauses the runs,
and the signed Approve clicks (``--concurrency`` at a time, each in flight until its tool
starts). It measures the main thread alone, from the first click until every run has
completed and its card has been updated in Slack:

* its CPU (``time.thread_time``), per approval;
* the Python calls it made, per approval (deterministic whatever the load, but for how
  the work happened to batch), grouped by area (bolt, slack_sdk,
  aiohttp, the Slack face, the runtime, the store, SQLAlchemy, asyncio, ...), and the
  counts that tell the shape of an approval: tasks created, Slack Web API calls, card
  views read and drawn, outbox deliveries and drain rounds, and the transactions opened:
  write transactions (``BEGIN ... COMMIT``), writes sent alone (on PostgreSQL a commit of
  their own with no BEGIN; on SQLite one of the write transactions) and plain reads
  (autocommit, no BEGIN on either), each counted once where it is opened.

``--drain-only`` counts only what runs in the outbox drain's context (from a batch's
claim to its mark: the cards' views read, drawn, sent and marked delivered), ``--top N``
lists the functions called most.

The CPU figure is taken without a profiler (``--rounds`` passes of ``--runs`` clicks),
the calls in one more pass, counted with ``sys.setprofile``; ``--profile OUT.prof`` adds a
pass under cProfile by this thread's CPU time and writes its stats (read with pstats).

On PostgreSQL ``--db`` names a server (``postgresql+asyncpg://postgres@127.0.0.1:5432/test``):
a database of the run's own is made there and dropped afterwards. Default: a temporary
SQLite file.
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import cProfile
import os
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Awaitable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE))

from bench_common import Calls, free_port, setup_database

SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
TOKEN_SECRET = "bench-token-secret-0123456789abcd"
CHANNEL, OPS = "C_APPROVALS", "C_OPS"
T = TypeVar("T")

# areas of the code, first match wins (by file name)
AREAS = [("slack_bolt", "slack_bolt/"), ("slack_sdk", "slack_sdk/"), ("aiohttp", "aiohttp/"),
         ("bot/slack", "/bot/slack/"), ("bot (other)", "/bot/"),
         ("runtime: outbox", "/runtime/record/outbox"), ("runtime: views", "/runtime/views"),
         ("runtime (other)", "/runtime/"), ("store", "/store/"), ("sqlalchemy", "sqlalchemy/"),
         ("drivers", "aiosqlite/|asyncpg/|sqlite3"),
         ("asyncio", "asyncio/|selectors|_weakrefset|contextvars|contextlib"),
         ("json", "json/"), ("pydantic", "pydantic")]
# what tells the shape of an approval: (label, file:function pattern)
SHAPE = [("tasks created", r"base_events\.py:create_task$"),
         # a card's call goes out by private_slack_sdk's JsonCalls, not api_call (which it
         # calls itself only where it cannot: counted twice then)
         ("Slack Web API calls",
          r"(async_base_client\.py:api_call|/bot/slack/private_slack_sdk\.py:call)$"),
         # a card goes out by api_call (bot/slack/delivery.py: _card_update, _card_post)
         ("  chat.update", r"(async_client\.py:chat_update|/bot/slack/delivery\.py:_card_update)$"),
         ("  chat.postMessage",
          r"(async_client\.py:chat_postMessage|/bot/slack/delivery\.py:_card_post)$"),
         ("card views read", r"/runtime/views\.py:card$"),
         ("cards drawn", r"/bot/slack/cards\.py:approval_card$"),
         ("outbox rows delivered (face)", r"/bot/slack/delivery\.py:deliver$"),
         ("drain rounds", r"/runtime/record/outbox\.py:drain_once$"),
         ("thread follower rounds", r"/bot/slack/threads\.py:sync_once$"),
         # each transaction counted once, where it is opened: transact() and, on
         # SQLite, transact_one() and write_one() open theirs through write(). A write
         # sent alone is PostgreSQL's autocommit write (a commit with no BEGIN); on
         # SQLite a write_one() is a BEGIN ... COMMIT, counted in the line above too
         ("write transactions (BEGIN ... COMMIT)", r"/store/db\.py:write$"),
         ("writes sent alone (SQLite: counted above)", r"/store/db\.py:write_one$"),
         ("reads (autocommit)", r"/store/db\.py:read$")]


class World:
    """The second thread: its event loop, the emulator, the pausing engine, the clicks."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    async def call(self, coro: Awaitable[T]) -> T:
        """Run ``coro`` on the world's loop; await it from serve's."""
        fut: Future[T] = asyncio.run_coroutine_threadsafe(coro, self.loop)  # type: ignore
        return await asyncio.wrap_future(fut)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


class Clicks:
    """Lives on the world's loop: pauses runs, waits for their cards, clicks them."""

    def __init__(self, db_url: str, tool_log: Path) -> None:
        self.db_url = db_url
        self.tool_log = tool_log

    async def start(self) -> str:
        from approvald.bot.sandbox import SlackEmulator

        self.emulator = SlackEmulator(bot_token="xoxb-bench", signing_secret=SECRET)
        for ch in (CHANNEL, OPS):
            self.emulator.add_channel(ch)
        self.emulator.add_user("U_ALICE", "alice")
        return str(await self.emulator.start())

    async def open(self) -> None:
        from approvald.runtime.engine import assemble
        from approvald.runtime.runs.agent import Registry
        from approvald.store.db import Database
        from bench_agent import AGENTS

        self.db = Database(self.db_url)
        self.engine = assemble(self.db, Registry(AGENTS))

    async def pause(self, runs: int) -> list[Any]:
        """``runs`` runs paused on their gated call, each card posted by serve."""
        from tests.helpers import Rows

        approvals = []
        for _ in range(runs):
            outcome = await self.engine.run("bench-deploy", "deploy web", requested_by="U_DANA")
            approvals.append(outcome.approval_ids[0])  # type: ignore[attr-defined]
        while True:
            rows = [await Rows.of(self.engine).approval(a) for a in approvals]
            if all(r and r.message_ts for r in rows):
                return rows
            await asyncio.sleep(0.05)

    async def click(self, port: int, rows: list[Any], concurrency: int) -> None:
        """One signed Approve click per row, ``concurrency`` at a time, each in flight
        until its tool starts; then until every run completed and its card was updated."""
        from approvald.bot.slack import cards
        from approvald.runtime.kernel.ids import TokenSigner
        from bench_clicks import ToolLog

        from tests.helpers import Rows

        signer = TokenSigner(TOKEN_SECRET)
        updates0 = len(self.emulator.calls("chat.update"))
        sem = asyncio.Semaphore(concurrency)
        tools = ToolLog(self.tool_log)
        stop = asyncio.Event()
        tailer = asyncio.create_task(tools.follow(stop))
        async with self.emulator.client(f"http://127.0.0.1:{port}/slack/events") as slack:
            async def one(a: Any) -> None:
                value = f"{a.id}:{signer.token(a.id, a.token_nonce, a.effective_digest)}"
                async with sem:
                    r = await slack.click(cards.APPROVE, value, user_id="U_ALICE",
                                          channel_id=CHANNEL, message_ts=a.message_ts)
                    assert r.status == 200, r.body
                    await tools.event(a.run_id).wait()

            try:
                await asyncio.gather(*(one(a) for a in rows))
            finally:
                stop.set()
                await tailer
        want = {a.message_ts for a in rows}
        for _ in range(3000):
            got = {c.params.get("ts") for c in self.emulator.calls("chat.update")[updates0:]}
            if want <= got:
                break
            await asyncio.sleep(0.01)
        else:
            raise RuntimeError("cards not updated within 30 s")
        for _ in range(3000):
            runs = [await Rows.of(self.engine).run(a.run_id) for a in rows]
            if all(r is not None and r.status == "completed" for r in runs):
                break
            await asyncio.sleep(0.01)
        else:
            raise RuntimeError("runs not completed within 30 s")
        await asyncio.sleep(0.3)  # what the run's completion sets off (its thread's line)

    async def close(self) -> None:
        await self.db.close()
        await self.emulator.stop()


# --drain-only: set in the outbox drain's task (and so in the tasks it starts: a row's
# delivery, its HTTP request's body writer) while a round runs, from a batch's claim to
# its mark; callbacks run in another context (a database connection's reads, opened
# elsewhere) are not counted, those of a connection the drain opened are
IN_DRAIN: contextvars.ContextVar[bool] = contextvars.ContextVar("in_drain", default=False)


def count_the_drain_only() -> None:
    """Count only what runs in the outbox drain's context: the card updates' share."""
    from approvald.runtime.record.outbox import OutboxDrain

    plain = OutboxDrain.drain_once

    async def drain_once(self: OutboxDrain) -> int:
        token = IN_DRAIN.set(True)
        try:
            return await plain(self)
        finally:
            IN_DRAIN.reset(token)

    OutboxDrain.drain_once = drain_once  # type: ignore[method-assign]


async def bench(a: argparse.Namespace) -> int:
    tmp = Path(tempfile.mkdtemp())
    db_url, drop = await setup_database(a.db, tmp, "bench_click_cpu")
    tool_log = tmp / "tool-starts.log"
    world = World()
    clicks = Clicks(db_url, tool_log)
    url = await world.call(clicks.start())
    port = free_port()
    for k in [k for k in os.environ if k.startswith(("APPROVALD_", "SLACK_"))]:
        del os.environ[k]
    os.environ.update(
        SLACK_BOT_TOKEN="xoxb-bench", SLACK_SIGNING_SECRET=SECRET, SLACK_API_URL=url,
        APPROVALD_DATABASE_URL=db_url, APPROVALD_CHANNEL=CHANNEL, APPROVALD_OPS_CHANNEL=OPS,
        APPROVALD_PORT=str(port), APPROVALD_HOST="127.0.0.1", APPROVALD_SECRET=TOKEN_SECRET,
        APPROVALD_AGENTS="bench_agent", APPROVALD_LOG_LEVEL="ERROR",
        APPROVALD_METRICS_ADDR="127.0.0.1:0", BENCH_TOOL_LOG=str(tool_log))
    if a.drain_only:
        count_the_drain_only()
    if a.lease_ttl:  # long enough that no renewal fires (under load the runs last longer)
        os.environ["APPROVALD_LEASE_TTL"] = str(a.lease_ttl)
    import logging

    from approvald.bot.config import Settings
    from approvald.bot.serve import Service, settle_heap
    from approvald.bot.wiring import open_database
    from approvald.store import migrate

    logging.basicConfig(level=logging.ERROR)
    settings = Settings()
    db = await open_database(settings, quiet=True)
    await migrate.upgrade(db)
    service = Service(settings, db)
    try:
        await service.start()
        settle_heap()
        await world.call(clicks.open())
        print(f"database: {db.display_url}; {os.cpu_count()} cores, load average "
              f"{os.getloadavg()[0]:.1f}; serve on this process's main thread, the emulator "
              f"and {a.concurrency} clicks at a time on another")
        warm = await world.call(clicks.pause(min(20, a.runs)))
        await world.call(clicks.click(port, warm, a.concurrency))
        cpu: list[float] = []
        for _ in range(a.rounds):
            rows = await world.call(clicks.pause(a.runs))
            t = time.thread_time()
            await world.call(clicks.click(port, rows, a.concurrency))
            cpu.append((time.thread_time() - t) / a.runs * 1000)
        print(f"  serve's CPU per approval, first click until every run completed and its "
              f"card was updated: {' '.join(f'{c:.2f}' for c in cpu)} ms "
              "(indicative only on a busy machine)")
        rows = await world.call(clicks.pause(a.runs))
        counter = Calls(AREAS, SHAPE, only=IN_DRAIN.get if a.drain_only else None,
                        top=a.top, root=HERE.parents[1])
        loop = asyncio.get_running_loop()
        tasks: dict[str, int] = defaultdict(int)
        plain = loop.create_task

        def create_task(coro: Any, **kw: Any) -> Any:
            name = getattr(coro, "__qualname__", type(coro).__name__)
            code = getattr(coro, "cr_code", None)
            if code is not None and "asyncio" in code.co_filename:  # whose wait is it?
                f = sys._getframe(1)
                while f is not None and "asyncio" in f.f_code.co_filename:
                    f = f.f_back  # type: ignore[assignment]
                if f is not None:
                    name += f" (from {f.f_code.co_qualname})"
            tasks[name] += 1
            return plain(coro, **kw)

        loop.create_task = create_task  # type: ignore[method-assign]
        sys.setprofile(counter)
        try:
            await world.call(clicks.click(port, rows, a.concurrency))
        finally:
            sys.setprofile(None)
            del loop.create_task
        counter.report(a.runs, "approval")
        print(f"  tasks created per approval: {sum(tasks.values()) / a.runs:.2f}, by coroutine:")
        for name, n in sorted(tasks.items(), key=lambda kv: -kv[1]):
            if n / a.runs >= 0.05:
                print(f"    {n / a.runs:6.2f}  {name}")
        if a.profile:
            rows = await world.call(clicks.pause(a.runs))
            prof = cProfile.Profile(time.thread_time)
            prof.enable()
            await world.call(clicks.click(port, rows, a.concurrency))
            prof.disable()
            prof.dump_stats(a.profile)
        return 0
    finally:
        service.stop_event.set()
        await service.stop(grace=1.0)
        await db.close()
        await world.call(clicks.close())
        world.stop()
        await drop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--db", default=None, help="a PostgreSQL server's URL (a database is made "
                                              "on it); default: a temp SQLite file")
    p.add_argument("--runs", type=int, default=200)
    p.add_argument("--concurrency", type=int, default=20)
    p.add_argument("--rounds", type=int, default=1, help="rounds of CPU measurement")
    p.add_argument("--profile", default=None, metavar="OUT.prof")
    p.add_argument("--drain-only", action="store_true",
                   help="count only the calls made in the outbox drain's context, from a "
                        "batch's claim to its mark (the card updates' share)")
    p.add_argument("--top", type=int, default=0, metavar="N",
                   help="print the N functions called most, per approval")
    p.add_argument("--lease-ttl", type=float, default=None, metavar="S",
                   help="serve's APPROVALD_LEASE_TTL (default: serve's own)")
    return asyncio.run(bench(p.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
