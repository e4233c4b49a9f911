"""Soak: thousands of runs through approve, deny, edit and expire in one ``serve`` process.

    python tests/benchmarks/bench_soak.py [--runs 10000] [--batch 250] [--db URL]

``approvald serve`` runs as its own process (Slack app over HTTP, worker, outbox drain,
run threads, scheduler) on a temp SQLite file; this process plays Slack (the Web API
emulator the app calls, and the signed requests it sends) and starts the runs through an
in-process engine, as ``bench_clicks`` does. Each run of the agent below makes one
``notify_after`` call (a notice goes to ops) and one gated call, whose card then gets, by
turns: an Approve click; a Deny click and the deny modal submitted with a reason; an Edit
click and the edit modal submitted with new JSON arguments; or nothing, and the request
expires. Both processes read the time from ``APPROVALD_CLOCK_FILE``, which runs with the
wall clock plus an offset: once a batch's clicks are in, the offset jumps past half the
request's TTL (the scheduler's sweep sends reminders) and then past all of it (the sweep
expires the rest; each run then gets ``{status: expired}`` and finishes).

The serve process's resident memory (VmRSS) is sampled right after start (the baseline),
at run 1,000 and every 1,000 runs after; the target (issue 9, item 12) is growth under
+50 MB from run 1,000 to the last sample. Every run must have ended as it was meant to
(counts by outcome are printed), so the benchmark cannot pass by doing nothing.

``--trace DIR`` runs serve under tracemalloc and writes a snapshot at each sample (see
``trace_serve.py``). To trace the serve process otherwise, set ``BENCH_SERVE_CMD`` to a
command that runs ``approvald.bot.cli`` (e.g. ``python -X tracemalloc=10 -m
approvald.bot.cli``); ``serve`` is appended.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from approvald.runtime.models.scripted import ScriptedModel, reply
from approvald.runtime.policies.policy import ApprovalPolicy
from approvald.runtime.policies.tools import ToolContext, tool
from approvald.runtime.runs.agent import Agent
from bench_clicks import serve_command, wait_healthy

from tests.helpers import Rows, free_port

TTL = timedelta(minutes=30)
EDITED = {"service": "web", "version": "2.0.1"}


# -- the agent ``serve`` loads (APPROVALD_AGENTS=bench_soak) --------------------------------

@tool(permission="execute", approval=ApprovalPolicy(ttl=TTL, reminders=["50%"]))
async def deploy(ctx: ToolContext, service: str, version: str) -> str:
    """Deploy a version of a service (the gated call)."""
    return f"deployed {service} {version}"


@tool(permission="execute", policy="notify_after")
async def announce(ctx: ToolContext, text: str) -> dict[str, Any]:
    """Tell the team what is about to happen (runs at once; ops get a notice)."""
    return {"ok": True, "chars": len(text)}


AGENTS = [Agent(name="soak-deploy", instructions="", tools=[announce, deploy],
                model=ScriptedModel.sequence([
                    reply("announcing, then deploying",
                          ("announce", {"text": "deploying web 2.0.0 in a minute"}),
                          ("deploy", {"service": "web", "version": "2.0.0"})),
                    reply("done", turn=1)]))]

OUTCOMES = ("approve", "deny", "edit", "expire")
SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
TOKEN_SECRET = "bench-token-secret-0123456789abcd"
CHANNEL, OPS = "C_APPROVALS", "C_OPS"
APPROVER, REQUESTER = "U_ALICE", "U_DANA"
TARGET_MB = 50.0
ENDED = ("completed", "cancelled", "failed", "needs_attention")


def rss_kb(pid: int) -> int:
    """The process's resident set size in KiB (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def exists(path: Path) -> bool:
    return path.exists()



class MovingClock:
    """The clock file both processes read: the wall clock plus ``offset``, rewritten
    atomically a few times a second so time flows; :meth:`jump` moves it ahead."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = timedelta(0)
        self.write()

    def write(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text((datetime.now(UTC) + self.offset).isoformat())
        os.replace(tmp, self.path)

    def jump(self, delta: timedelta) -> None:
        self.offset += delta
        self.write()

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self.write()
            try:
                await asyncio.wait_for(stop.wait(), 0.1)
            except TimeoutError:
                pass


async def wait_until(check: Any, what: str, within: float = 300.0) -> Any:
    deadline = time.monotonic() + within
    while True:
        got = await check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within:.0f} s waiting for {what}")
        await asyncio.sleep(0.05)


async def bench(runs: int, batch: int, concurrency: int, db_url: str | None,
                trace: str | None = None) -> int:
    from approvald.bot.sandbox import SlackEmulator
    from approvald.bot.slack import cards
    from approvald.runtime.engine import assemble
    from approvald.runtime.kernel.clock import FileClock
    from approvald.runtime.kernel.ids import TokenSigner
    from approvald.runtime.runs.agent import Registry
    from approvald.store import migrate
    from approvald.store.db import Database
    from approvald.store.models import Approval, Outbox, Run, ToolExecution
    from sqlalchemy import func, select

    tmp = Path(tempfile.mkdtemp())
    db_url = db_url or f"sqlite+aiosqlite:///{tmp / 'soak.db'}"
    clock = MovingClock(tmp / "clock")
    emulator = SlackEmulator(bot_token="xoxb-bench", signing_secret=SECRET)
    for ch in (CHANNEL, OPS):
        emulator.add_channel(ch)
    emulator.add_user(APPROVER, "alice")
    emulator.add_user(REQUESTER, "dana")
    url = await emulator.start()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("APPROVALD_", "SLACK_"))}
    env.update(SLACK_BOT_TOKEN="xoxb-bench", SLACK_SIGNING_SECRET=SECRET, SLACK_API_URL=url,
               APPROVALD_DATABASE_URL=db_url, APPROVALD_CHANNEL=CHANNEL,
               APPROVALD_OPS_CHANNEL=OPS, APPROVALD_PORT=str(port),
               APPROVALD_HOST="127.0.0.1", APPROVALD_SECRET=TOKEN_SECRET,
               APPROVALD_AGENTS="bench_soak", APPROVALD_LOG_LEVEL="WARNING",
               APPROVALD_CLOCK_FILE=str(clock.path), APPROVALD_SWEEP_INTERVAL="1",
               PYTHONPATH=os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")]))
    db = Database(db_url)
    await migrate.upgrade(db)
    engine = assemble(db, Registry(AGENTS), clock=FileClock(str(clock.path)))
    signer = TokenSigner(TOKEN_SECRET)
    stop = asyncio.Event()
    ticking = asyncio.create_task(clock.run(stop))
    log = (tmp / "serve.log").open("wb")
    cmd = ([sys.executable, str(HERE / "trace_serve.py"), trace, "serve"] if trace
           else serve_command())
    serve = await asyncio.create_subprocess_exec(*cmd, env=env, stderr=log)
    intended: dict[str, str] = {}  # approval id -> outcome
    run_of: dict[str, str] = {}  # approval id -> run id
    samples: list[tuple[int, int]] = []
    reclicks: list[str] = []  # modals that never opened (trigger expired): clicked again
    try:
        await wait_healthy(port)
        await asyncio.sleep(1.0)  # let start-up settle (first sweep, first polls)
        assert serve.pid is not None
        baseline = rss_kb(serve.pid)
        print(f"database: {db.display_url}; {os.cpu_count()} CPUs; approvald serve pid "
              f"{serve.pid}; serve log: {tmp / 'serve.log'}")
        print(f"baseline: VmRSS right after start {baseline / 1024:.1f} MB")

        async def rows(ids: list[str]) -> list[Any]:
            async with db.read() as tx:
                return list(await tx.conn.execute(
                    select(Approval.id, Approval.status, Approval.message_ts,
                           Approval.reminders_sent).where(Approval.id.in_(ids))))

        async def run_statuses(ids: list[str]) -> Counter[str]:
            async with db.read() as tx:
                got = await tx.conn.execute(select(Run.status).where(Run.id.in_(ids)))
                return Counter(s for (s,) in got)

        async def start_one(i: int, sem: asyncio.Semaphore) -> None:
            async with sem:
                outcome = await engine.run("soak-deploy", f"deploy web 2.0.0 (#{i})",
                                           requested_by=REQUESTER)
            ids = getattr(outcome, "approval_ids", ())
            if not ids:  # serve's worker took the fresh run first: it pauses it there

                async def paused() -> list[str]:
                    async with db.read() as tx:
                        return [a.id for a in await tx.approvals.for_run(outcome.run_id)]
                ids = await wait_until(paused, f"run {outcome.run_id} to pause")
            [aid] = ids
            intended[aid] = OUTCOMES[i % len(OUTCOMES)]
            run_of[aid] = outcome.run_id

        async with emulator.client(f"http://127.0.0.1:{port}/slack/events") as slack:

            async def modal(callback: str, aid: str) -> str:
                """The id of the modal serve opened for ``aid`` (after the click)."""
                key = f'"approval_id":"{aid}"'

                async def find() -> str | None:
                    for vid, v in emulator.state.views.items():
                        if v.get("callback_id") == callback and \
                                key in (v.get("private_metadata") or ""):
                            return vid
                    return None
                return str(await wait_until(find, f"the {callback} modal of {aid}", 10))

            async def decide(aid: str, ts: str, sem: asyncio.Semaphore) -> None:
                how = intended[aid]
                if how == "expire":
                    return
                a = await Rows.of(engine).approval(aid)
                assert a is not None
                value = f"{aid}:{signer.token(aid, a.token_nonce, a.effective_digest)}"
                action = {"approve": cards.APPROVE, "deny": cards.DENY, "edit": cards.EDIT}[how]
                async with sem:
                    for attempt in range(3):
                        r = await slack.click(action, value, user_id=APPROVER,
                                              channel_id=CHANNEL, message_ts=ts)
                        assert r.status == 200, r.body
                        if how == "approve":
                            return
                        callback = cards.DENY_MODAL if how == "deny" else cards.EDIT_MODAL
                        try:
                            vid = await modal(callback, aid)
                            break
                        except AssertionError:  # the trigger expired (3 s): click again
                            if attempt == 2:
                                raise
                            reclicks.append(aid)
                    values = ({cards.REASON_BLOCK: {cards.REASON_INPUT: "soak: not today"}}
                              if how == "deny" else
                              {cards.ARGS_BLOCK: {cards.ARGS_INPUT: json.dumps(EDITED)}})
                    r = await slack.submit_view(callback, values, user_id=APPROVER,
                                                view_id=vid)
                    assert r.status == 200 and r.body in ("", "{}"), r.body
                    emulator.state.views.pop(vid, None)  # Slack closes a submitted modal
                    emulator.state.view_users.pop(vid, None)

            t0 = time.perf_counter()
            done = 0
            next_sample = 1000
            while done < runs:
                n = min(batch, runs - done)
                sem = asyncio.Semaphore(4)
                before = set(intended)
                await asyncio.gather(*(start_one(done + i, sem) for i in range(n)))
                ids = [a for a in intended if a not in before]

                async def posted(ids: list[str] = ids) -> list[Any] | None:
                    got = await rows(ids)
                    return got if all(r.message_ts for r in got) else None
                cards_at = {r.id: r.message_ts for r in await wait_until(posted, "cards")}
                sem = asyncio.Semaphore(concurrency)
                await asyncio.gather(*(decide(a, cards_at[a], sem) for a in ids))
                decided = [run_of[a] for a in ids if intended[a] != "expire"]

                async def finished(runs_: list[str]) -> bool:
                    c = await run_statuses(runs_)
                    return sum(c[s] for s in ENDED) == len(runs_)

                async def quiet() -> bool:  # nothing in flight before time jumps
                    async with db.read() as tx:
                        n_out = (await tx.conn.execute(
                            select(func.count()).select_from(Outbox)
                            .where(Outbox.status == "pending"))).scalar()
                    return n_out == 0
                await wait_until(lambda r=decided: finished(r), "decided runs to end")
                await wait_until(quiet, "the outbox to drain")
                expiring = [a for a in ids if intended[a] == "expire"]

                async def reminded(ids: list[str] = expiring) -> bool:
                    return all(r.reminders_sent >= 1 for r in await rows(ids))

                async def expired(ids: list[str] = expiring) -> bool:
                    return all(r.status == "expired" for r in await rows(ids))
                clock.jump(TTL * 0.6)  # past the 50% reminder
                await wait_until(reminded, "reminders")
                await wait_until(quiet, "the reminders to go out")
                clock.jump(TTL * 0.5)  # past the expiry
                await wait_until(expired, "expiry")
                everyone = [run_of[a] for a in ids]
                await wait_until(lambda r=everyone: finished(r), "every run to end")
                await wait_until(quiet, "the outbox to drain")
                done += n
                # keep this process (the emulator) lean: it is not what is measured
                emulator.reset_calls()
                emulator.state.triggers.clear()
                slack.trigger_ids.clear()
                while done >= next_sample:
                    kb = rss_kb(serve.pid)
                    samples.append((done, kb))
                    if trace:  # a tracemalloc snapshot (trace_serve.py), once written
                        serve.send_signal(signal.SIGUSR1)
                        flag = Path(trace) / f"snap-{len(samples)}.done"

                        async def written(flag: Path = flag) -> bool:
                            return exists(flag)
                        await wait_until(written, "the tracemalloc snapshot", 600)
                    print(f"  run {done:>6,}: VmRSS {kb / 1024:7.1f} MB   "
                          f"({time.perf_counter() - t0:6.0f} s)", flush=True)
                    next_sample += 1000
            wall = time.perf_counter() - t0

        async with db.read() as tx:
            statuses = dict(Counter(s for (s,) in await tx.conn.execute(select(Run.status))))
            got = list(await tx.conn.execute(
                select(Approval.id, Approval.status, Approval.edited_args)))
            executed = (await tx.conn.execute(
                select(func.count()).select_from(ToolExecution)
                .where(ToolExecution.tool == "deploy", ToolExecution.status == "succeeded")
            )).scalar()
            notices = (await tx.conn.execute(
                select(func.count()).select_from(Outbox)
                .where(Outbox.kind == "tool.notice", Outbox.status == "delivered"))).scalar()
            dead = (await tx.conn.execute(select(func.count()).select_from(Outbox)
                                          .where(Outbox.status == "dead"))).scalar()
        expect = {"approve": "approved", "deny": "denied", "edit": "approved",
                  "expire": "expired"}
        outcome = Counter()
        wrong = 0
        for r in got:
            how = intended.get(r.id)
            ok = how is not None and r.status == expect[how] and \
                (r.edited_args is not None) == (how == "edit")
            outcome[how if ok else "wrong"] += 1
            wrong += not ok
        print(f"{runs:,} runs in {wall:.0f} s ({runs / wall:.1f} runs/s), batches of {batch}, "
              f"{concurrency} clicks at a time")
        print(f"  decisions: {outcome['approve']:,} approved, {outcome['deny']:,} denied "
              f"(modal with a reason), {outcome['edit']:,} edited (modal with JSON), "
              f"{outcome['expire']:,} expired after a reminder; {wrong} not as intended"
              f"{f'; {len(reclicks)} clicked twice (no modal in 10 s)' if reclicks else ''}")
        print(f"  runs by status: {statuses}; deploy executed {executed:,} times; "
              f"{notices:,} notices delivered; {dead} dead outbox rows")
        print(f"  Slack emulator: {len(emulator.messages(CHANNEL)):,} messages in the approvals "
              f"channel, {len(emulator.messages(OPS)):,} in ops")
        print(f"  VmRSS: baseline {baseline / 1024:.1f} MB (right after start)")
        for n, kb in samples:
            print(f"    run {n:>6,}: {kb / 1024:7.1f} MB   (+{(kb - baseline) / 1024:.1f} MB "
                  f"over the baseline)")
        all_ended = statuses.get("completed", 0) + statuses.get("cancelled", 0) == runs
        to_run = sum(how in ("approve", "edit") for how in intended.values())
        ok_runs = all_ended and wrong == 0 and executed == to_run and notices == runs
        print("targets")
        print(f"  every run ended as intended: {'PASS' if ok_runs else 'FAIL'}")
        if len(samples) >= 2:
            growth = (samples[-1][1] - samples[0][1]) / 1024
            ok_mem = growth < TARGET_MB
            print(f"  VmRSS growth from run {samples[0][0]:,} to run {samples[-1][0]:,} "
                  f"< +{TARGET_MB:.0f} MB: {growth:+.1f} MB  {'PASS' if ok_mem else 'FAIL'}")
            per_k = growth / ((samples[-1][0] - samples[0][0]) / 1000)
            print(f"    ({per_k * 1024:+.0f} KB per 1,000 runs)")
        else:
            ok_mem = True
            print("  VmRSS growth: fewer than 2 samples (use --runs 2000 or more)")
        return 0 if ok_runs and ok_mem else 1
    finally:
        stop.set()
        await ticking
        serve.terminate()
        await serve.wait()
        await db.close()
        await emulator.stop()
        log.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=10_000)
    p.add_argument("--batch", type=int, default=250, help="runs started, decided and "
                   "expired together (default 250; a divisor of 1,000 samples exactly)")
    p.add_argument("--concurrency", type=int, default=20, help="clicks in flight at once")
    p.add_argument("--db", default=None, help="database URL (default: a temp SQLite file)")
    p.add_argument("--trace", default=None, metavar="DIR", help="run serve under "
                   "tracemalloc (trace_serve.py) and write a snapshot to DIR at each sample; "
                   "compare two with: python tests/benchmarks/trace_serve.py DIR --diff 1 3 "
                   "(its memory figures then include the tracer's)")
    a = p.parse_args()
    return asyncio.run(bench(a.runs, a.batch, a.concurrency, a.db, a.trace))


if __name__ == "__main__":
    sys.exit(main())
