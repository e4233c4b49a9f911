"""``approvald serve`` as a real process against the Slack emulator, killed with SIGKILL."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import aiohttp
import pytest
from approvald.bot.sandbox import SlackEmulator
from approvald.bot.slack import cards
from approvald.runtime.kernel.ids import TokenSigner
from approvald.store.db import Database

from tests.helpers import (
    Cli,
    Rows,
    WarmProcess,
    free_port,
    make_cli,
    run_in_process,
    start_approvald,
)
from tests.integration.slack_harness import APP_TOKEN, BOT_TOKEN, CHANNEL, OPS, SECRET, wait_for

# each test here starts approvald (or a browser) as a process of its own
pytestmark = pytest.mark.slow

TOKEN_SECRET = "approvald-test-secret-0123456789"


async def start_serve(cli: Cli, port: int, **extra: str) -> WarmProcess:
    env = cli.env(APPROVALD_PORT=str(port), APPROVALD_HOST="127.0.0.1",
                  APPROVALD_POLL_INTERVAL="0.1", APPROVALD_LOG_LEVEL="INFO", **extra)
    # its log goes to a file: a pipe nobody reads fills (64 KiB) and blocks the replica
    path = Path(cli.workdir) / f"serve-{port}-{time.monotonic_ns()}.log"
    log = open(path, "wb")  # noqa: ASYNC230
    try:
        proc = await start_approvald("serve", env=env, cwd=cli.workdir,
                                     stdout=asyncio.subprocess.DEVNULL, stderr=log)
    finally:
        log.close()  # the child holds its own descriptor
    proc.log = path

    async def healthy() -> bool:
        if proc.returncode is not None:
            raise AssertionError(f"serve exited with {proc.returncode}")
        try:
            async with aiohttp.ClientSession() as s, \
                    s.get(f"http://127.0.0.1:{port}/healthz") as r:
                return r.status == 200
        except aiohttp.ClientError:
            return False
    async with telling(proc):
        await wait_for(healthy, within=30, what="serve to listen")
    return proc


async def serve_story(proc: WarmProcess, most: int = 60) -> str:
    """What a failed test shows of a ``serve`` (:func:`start_serve`): whether it still
    runs or how it exited, and the last ``most`` records of its log (a record's first
    line: its tracebacks, hundreds of lines while a database is out, are left in the
    file, which is named)."""
    with contextlib.suppress(TimeoutError):  # an exit just now: give the loop time to reap it
        async with asyncio.timeout(1):
            await proc.wait()
    code = proc.returncode
    status = ("still running" if code is None
              else f"exited by signal {signal.Signals(-code).name}" if code < 0
              else f"exited with {code}")
    text = proc.log.read_text(errors="replace") if proc.log else ""
    records = [line for line in text.splitlines()
               if line[:4].isdigit() or line.startswith("approvald:")]
    return "\n".join([f"serve (pid {proc.child_pid}) {status}; the last {min(most, len(records))}"
                      f" of its {len(records)} log records ({proc.log}):", *records[-most:]])


@contextlib.asynccontextmanager
async def telling(proc: WarmProcess) -> AsyncIterator[None]:
    """A failure inside says what became of ``serve`` (:func:`serve_story`): a wait that
    times out, or a request refused because serve is gone, names why."""
    try:
        yield
    except Exception as exc:
        exc.add_note(await serve_story(proc))
        raise


async def run_cli(cli: Cli, *args: str) -> str:
    """``approvald ARGS`` in this process (this loop runs on meanwhile: the emulator
    answers the ``serve`` subprocesses)."""
    done = await asyncio.to_thread(run_in_process, list(args), env=cli.env(), cwd=cli.workdir)
    assert done.returncode == 0, done.stderr
    return done.stdout


async def setup(tmp_path: Path, db_url: str) -> tuple[SlackEmulator, Cli]:
    emulator = SlackEmulator(bot_token=BOT_TOKEN, app_token=APP_TOKEN, signing_secret=SECRET)
    for ch in (CHANNEL, OPS):
        emulator.add_channel(ch)
    emulator.add_user("U_ALICE", "alice")
    url = await emulator.start()
    cli = make_cli(db_url, tmp_path)
    cli.env_extra.update(SLACK_BOT_TOKEN=BOT_TOKEN, SLACK_SIGNING_SECRET=SECRET,
                         SLACK_API_URL=url, APPROVALD_CHANNEL=CHANNEL, APPROVALD_OPS_CHANNEL=OPS,
                         APPROVALD_SECRET=TOKEN_SECRET)
    return emulator, cli


async def stop_all(procs: list[asyncio.subprocess.Process], emulator: SlackEmulator) -> None:
    """SIGTERM every serve still running (a clean stop), then the emulator."""
    for p in procs:
        if p.returncode is None:
            p.send_signal(signal.SIGTERM)
            await p.wait()
    await emulator.stop()


def serve_trouble(cli: Cli, most: int = 40) -> str:
    """The WARNING and ERROR lines the ``serve`` processes of ``cli`` logged (the last
    ``most``): what a failed test shows of them."""
    lines = [line for log in sorted(Path(cli.workdir).glob("serve-*.log"))
             for line in log.read_text(errors="replace").splitlines()
             if " WARNING " in line or " ERROR " in line]
    return "\n".join(lines[-most:])


def card_messages(emulator: SlackEmulator) -> list[dict]:
    return [m for m in emulator.messages(CHANNEL)
            if (m.get("metadata") or {}).get("event_type") == "approvald_card"]


async def approval_row(db_url: str) -> dict:
    db = Database(db_url)
    try:
        async def both(tx):  # type: ignore[no-untyped-def]
            [a] = await tx.approvals.recent()
            return {"a": a, "run": await tx.runs.get(a.run_id)}

        return dict(await Rows(db).in_one_read(both))
    finally:
        await db.close()


async def test_kill_serve_while_a_card_waits_restart_and_click(sqlite_url: str,
                                                               tmp_path: Path) -> None:
    emulator, cli = await setup(tmp_path, sqlite_url)
    port = free_port()
    procs: list[asyncio.subprocess.Process] = []
    try:
        run_id = (await run_cli(cli, "run", "demo-refund", "--task", "Refund order A-1001",
                                "--requested-by", "U_DANA")).strip()
        procs.append(await start_serve(cli, port))
        await wait_for(lambda: card_messages(emulator), within=30, what="the card")
        procs[0].send_signal(signal.SIGKILL)
        assert await procs[0].wait() == -signal.SIGKILL

        procs.append(await start_serve(cli, port))
        row = await approval_row(sqlite_url)
        a = row["a"]
        value = f"{a.id}:{TokenSigner(TOKEN_SECRET).token(a.id, a.token_nonce, a.digest)}"
        async with emulator.client(f"http://127.0.0.1:{port}/slack/events") as slack:
            resp = await slack.click(cards.APPROVE, value, user_id="U_ALICE",
                                     channel_id=CHANNEL, message_ts=a.message_ts)
        assert resp.status == 200

        async def completed() -> bool:
            return (await approval_row(sqlite_url))["run"].status == "completed"
        await wait_for(completed, within=30, what="the run to complete after restart")
        refunds = [e for e in cli.ledger_lines() if e["tool"] == "issue_refund"]
        assert len(refunds) == 1 and refunds[0]["idempotency_key"].startswith(run_id)

        async def card_updated() -> bool:
            [card] = card_messages(emulator)
            return "Approved" in json.dumps(card)
        await wait_for(card_updated, within=30, what="the card update")
    finally:
        await stop_all(procs, emulator)
    assert procs[-1].returncode == 0


async def test_serve_killed_after_posting_before_marking_posts_once(sqlite_url: str,
                                                                    tmp_path: Path) -> None:
    emulator, cli = await setup(tmp_path, sqlite_url)
    port = free_port()
    procs: list[asyncio.subprocess.Process] = []
    try:
        await run_cli(cli, "run", "demo-refund", "--task", "Refund order A-1001",
                      "--requested-by", "U_DANA")
        env = cli.env(APPROVALD_PORT=str(port), APPROVALD_HOST="127.0.0.1",
                      APPROVALD_FAILPOINTS="after_post_before_mark")
        doomed = await start_approvald("serve", env=env, cwd=cli.workdir,
                                       stderr=asyncio.subprocess.DEVNULL)
        assert await asyncio.wait_for(doomed.wait(), 30) == -signal.SIGKILL
        assert len(card_messages(emulator)) == 1
        cli.advance_time(timedelta(minutes=2))  # the dead process's claim on the row lapses
        procs.append(await start_serve(cli, port))

        async def delivered() -> bool:
            db = Database(sqlite_url)
            try:
                rows = await Rows(db).outbox()
            finally:
                await db.close()
            return all(r.status == "delivered" for r in rows)
        await wait_for(delivered, within=30, what="the outbox to drain")
        assert len(card_messages(emulator)) == 1
        assert len([c for c in emulator.calls("chat.postMessage")
                    if c.params.get("channel") == CHANNEL]) == 1
    finally:
        await stop_all(procs, emulator)
