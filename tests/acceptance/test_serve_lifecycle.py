"""``approvald serve`` starting without Slack, refusing a bad token, and stopping on signals.

Real ``serve`` subprocesses against the Slack emulator: the durable parts run while Slack
is away (a decision from the CLI completes its run, a request expires) and the Slack face
connects once Slack is back; a token Slack refuses is one line and exit 2; SIGTERM waits
``APPROVALD_SHUTDOWN_GRACE`` for a tool call and then cuts it off (the next process finds
it outcome unknown and does not run it again); a second signal exits at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import sys
import textwrap
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiohttp
import pytest
from approvald.bot.config import Settings
from approvald.bot.sandbox import SlackEmulator
from approvald.bot.wiring import build_registry
from approvald.runtime.engine import assemble
from approvald.runtime.kernel.clock import FileClock
from approvald.store.db import Database

from tests.acceptance.test_slack_serve import card_messages, free_port, run_cli, setup
from tests.helpers import Cli, InProcessCli, Rows, start_approvald
from tests.integration.slack_harness import APP_TOKEN, wait_for

# every line serve writes is a log record or one of its own messages: a traceback's
# continuation lines match neither
# processes, browsers or hundreds of schedules: out of the inner loop (-m 'not slow')
pytestmark = pytest.mark.slow

ONE_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ [A-Z]+ [\w.]+: |approvald: )")
FAILED_CONNECT = "cannot reach Slack"


@dataclass
class Serve:
    """A running ``approvald serve`` whose stderr is collected line by line."""

    proc: asyncio.subprocess.Process
    lines: list[str]
    reader: asyncio.Task[None]

    @classmethod
    async def spawn(cls, cli: Cli, **extra: str) -> Serve:
        env = cli.env(APPROVALD_HOST="127.0.0.1", APPROVALD_POLL_INTERVAL="0.1", **extra)
        proc = await start_approvald("serve", env=env, cwd=cli.workdir,
                                     stdout=asyncio.subprocess.DEVNULL,
                                     stderr=asyncio.subprocess.PIPE)
        lines: list[str] = []

        async def read() -> None:
            assert proc.stderr is not None
            async for raw in proc.stderr:
                lines.append(raw.decode().rstrip("\n"))
        return cls(proc, lines, asyncio.create_task(read()))

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    async def wait(self, within: float) -> int:
        """The exit code, once the process exited (at most ``within`` seconds from now)."""
        await asyncio.wait_for(self.proc.wait(), within)
        await self.reader
        assert self.proc.returncode is not None
        return self.proc.returncode

    async def kill(self) -> None:
        """Clean up whatever state the process is in (SIGKILL if it is still running)."""
        if self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.reader, 5)


def assert_one_line_each(serve: Serve, containing: str = "") -> None:
    """Every message (or each one ``containing`` the text) is one line: no traceback."""
    lines = serve.lines
    for i, line in enumerate(lines):
        if containing in line:
            for x in lines[i:i + 2]:
                assert ONE_LINE.match(x), f"not a one-line message: {x!r}\n{serve.text}"


# What the tests set up and look at is read and written here, in-process: an `approvald`
# process per look costs a second, and Slack's outage (and so serve's backoff) lasts that
# much longer. What serve is tested on (deciding, recovering) goes through the CLI.

async def pending(cli: Cli, run_id: str) -> str:
    """The pending request of ``run_id``."""
    db = Database(cli.db_url)
    try:
        [a] = await Rows(db).in_one_read(
            lambda tx: tx.approvals.recent(status="pending", run_id=run_id))
    finally:
        await db.close()
    return a.id


async def has_status(cli: Cli, run_id: str, status: str) -> bool:
    db = Database(cli.db_url)
    try:
        run = await Rows(db).run(run_id)
    finally:
        await db.close()
    return run is not None and run.status == status


async def start_run(cli: Cli, agent: str, task: str) -> str:
    """What ``approvald run`` does: start a run and advance it until it waits for approval."""
    registry = build_registry(Settings(APPROVALD_DEMO_LEDGER=str(cli.ledger),
                                       APPROVALD_AGENTS=cli.env_extra.get("APPROVALD_AGENTS")))
    db = Database(cli.db_url)
    try:
        engine = assemble(db, registry, clock=FileClock(str(cli.clock_file)))
        outcome = await engine.run(agent, task, requested_by="U_DANA")
    finally:
        await db.close()
    assert outcome.status == "awaiting_approval", outcome
    return outcome.run_id


async def start_refund(cli: Cli, order: str) -> str:
    return await start_run(cli, "demo-refund", f"Refund order {order}")


async def health(port: int) -> dict | None:
    try:
        async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/healthz") as r:
            return await r.json() if r.status == 200 else None
    except aiohttp.ClientError:
        return None


def use_socket_mode(cli: Cli) -> None:
    cli.env_extra.pop("SLACK_SIGNING_SECRET")
    cli.env_extra["SLACK_APP_TOKEN"] = APP_TOKEN


# -- Slack away at start -------------------------------------------------------------------

@pytest.mark.parametrize("mode,outage", [("socket", "refuse"), ("http", "503")])
async def test_serve_runs_without_slack_and_connects_when_it_is_back(
        sqlite_url: str, tmp_path: Path, mode: str, outage: str) -> None:
    emulator, cli = await setup(tmp_path, sqlite_url)
    if mode == "socket":
        use_socket_mode(cli)
    port = free_port()
    serve: Serve | None = None
    try:
        decided = await start_refund(cli, "A-1001")
        approval = await pending(cli, decided)
        ignored = await start_refund(cli, "B-2002")
        await emulator.down(outage)  # type: ignore[arg-type]
        serve = await Serve.spawn(cli, APPROVALD_PORT=str(port), APPROVALD_LOG_LEVEL="INFO")
        # the durable parts do not wait for Slack: serve is up, and says Slack is not
        await wait_for(lambda: "approvald: serving on" in serve.text, within=30,
                       what="the start-up line")
        assert "not connected yet" in serve.text, serve.text
        if mode == "http":
            assert (await health(port)) == {"ok": True, "mode": f"HTTP on port {port}",
                                            "slack": "connecting"}
        # a decision from the CLI is carried out by serve's worker...
        await run_cli(cli, "approvals", "approve", approval, "--as", "U_ALICE", "--no-resume")
        await wait_for(lambda: has_status(cli, decided, "completed"), within=30,
                       what="serve to complete the decided run")
        # ...its scheduler expires the request nobody answered...
        cli.advance_time(timedelta(minutes=31))
        await wait_for(lambda: has_status(cli, ignored, "completed"), within=30,
                       what="serve to expire the other request")
        refunds = [e for e in cli.ledger_lines() if e["tool"] == "issue_refund"]
        assert [r["idempotency_key"].split(":")[0] for r in refunds] == [decided]
        # ...and a request made now waits in the outbox for Slack
        waiting = await pending(cli, await start_refund(cli, "C-3003"))
        failures = [x for x in serve.lines if FAILED_CONNECT in x]
        assert failures and all(" WARNING approvald.slack: " in x for x in failures)
        assert card_messages(emulator) == []

        await emulator.up()
        if mode == "socket":
            await emulator.wait_connected(timeout=30)
        else:
            async def connected() -> bool:
                return ((await health(port)) or {}).get("slack") == "connected"
            await wait_for(connected, within=30, what="serve to connect to Slack")
            # one WARNING line for each refused auth.test, and none after it succeeded
            tries = emulator.calls("auth.test")
            assert [c.status for c in tries] == [503] * (len(tries) - 1) + [200]
            assert len([x for x in serve.lines if FAILED_CONNECT in x]) == len(tries) - 1
        cli.advance_time(timedelta(minutes=2))  # its failed deliveries are due again

        def posted() -> bool:
            return any(m["metadata"]["event_payload"]["approval_id"] == waiting
                       for m in card_messages(emulator))
        await wait_for(posted, within=30, what="the card to be posted")
        serve.proc.send_signal(signal.SIGTERM)
        assert await serve.wait(30) == 0
        # (in the 503 outage other parts may log more; each failed connect is one line)
        assert_one_line_each(serve, "" if outage == "refuse" else FAILED_CONNECT)
    finally:
        if serve is not None:
            await serve.kill()
        await emulator.stop()


# -- a token Slack refuses -----------------------------------------------------------------

@pytest.mark.parametrize("variable", ["SLACK_BOT_TOKEN", "SLACK_APP_TOKEN"])
async def test_a_refused_token_stops_serve_with_one_line(sqlite_url: str, tmp_path: Path,
                                                         variable: str) -> None:
    emulator, cli = await setup(tmp_path, sqlite_url)
    if variable == "SLACK_APP_TOKEN":
        use_socket_mode(cli)
    cli.env_extra[variable] = cli.env_extra[variable][:5] + "revoked-0000"
    serve = await Serve.spawn(cli, APPROVALD_PORT=str(free_port()))
    try:
        assert await serve.wait(20) == 2, serve.text
    finally:
        await serve.kill()
        await emulator.stop()
    [line] = [x for x in serve.lines if x.strip()]
    assert line == (f"approvald: Slack refused {variable} (invalid_auth): set a valid token "
                    "and restart"), serve.text


# -- stopping --------------------------------------------------------------------------------

SLOW_AGENT = '''
"""An agent whose one gated tool records itself, then takes an hour."""

import asyncio
import os

from approvald.runtime.runs.agent import Agent
from approvald.runtime.runs.demo import DemoLedger
from approvald.runtime.models.scripted import ScriptedModel, assistant_turns, reply
from approvald.runtime.policies.tools import ToolContext, tool

LEDGER = DemoLedger(os.environ.get("APPROVALD_DEMO_LEDGER"))


@tool(permission="execute")
async def wire_money(ctx: ToolContext, amount_cents: int) -> dict:
    """Wire money to a supplier (slowly)."""
    LEDGER.record(ctx, "wire_money", {"amount_cents": amount_cents})
    await asyncio.sleep(3600)
    return {"sent": amount_cents}


def script(messages):
    turn = assistant_turns(messages)
    if turn == 0:
        return reply("Wiring the money.", ("wire_money", {"amount_cents": 500}), turn=turn)
    return reply("Done.", turn=turn)


slow_wire = Agent(name="slow-wire", instructions="Wire money.", model=ScriptedModel(script),
                  tools=[wire_money])
'''


async def hang_a_tool_call(cli: Cli, tmp_path: Path, emulator: SlackEmulator,
                           monkeypatch: pytest.MonkeyPatch, *, grace: float,
                           slack: str) -> tuple[Serve, str]:
    """Serve with a decided run whose tool call hangs; returns once the call started."""
    (tmp_path / "slow_agent.py").write_text(textwrap.dedent(SLOW_AGENT))
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)
    cli.env_extra.update(APPROVALD_AGENTS="slow_agent", PYTHONPATH=path)
    # the agent module is found by serve and the CLI (PYTHONPATH) and by this process
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "slow_agent", raising=False)
    run_id = await start_run(cli, "slow-wire", "Pay the supplier")
    approval = await pending(cli, run_id)
    # Slack makes no difference to stopping: unreachable, or holding a connect attempt open
    use_socket_mode(cli)
    if slack == "down":
        await emulator.down()
    else:
        emulator.delay("auth.test", 10)  # longer than the test takes to send SIGTERM
    serve = await Serve.spawn(cli, APPROVALD_SHUTDOWN_GRACE=str(grace),
                              APPROVALD_LOG_LEVEL="INFO")
    await run_cli(cli, "approvals", "approve", approval, "--as", "U_ALICE", "--no-resume")
    await wait_for(lambda: cli.ledger_lines(), within=30, what="the tool call to start")
    if slack == "slow":
        assert FAILED_CONNECT not in serve.text and "connected to Slack" not in serve.text
    return serve, run_id


async def assert_outcome_unknown(cli: Cli, run_id: str) -> None:
    """The next process does not re-run the cut-off call: it asks a person."""
    proc = await start_approvald("recover", env=cli.env(), cwd=cli.workdir,
                                 stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 3, (out, err)  # 3: a run needs attention
    assert await has_status(cli, run_id, "needs_attention")
    [question] = json.loads(await run_cli(cli, "approvals", "list", "--json"))
    assert question["kind"] == "outcome_unknown" and question["tool"] == "wire_money"
    assert [e["tool"] for e in cli.ledger_lines()] == ["wire_money"]


@pytest.mark.parametrize("slack", ["down", "slow"])
async def test_sigterm_cuts_a_hanging_tool_call_off_after_the_grace(
        sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slack: str) -> None:
    emulator, cli = await setup(tmp_path, sqlite_url)
    grace = 2.0
    serve: Serve | None = None
    try:
        serve, run_id = await hang_a_tool_call(cli, tmp_path, emulator, monkeypatch,
                                               grace=grace, slack=slack)
        started = time.monotonic()
        serve.proc.send_signal(signal.SIGTERM)
        assert await serve.wait(grace + 20) == 0, serve.text
        took = time.monotonic() - started
        assert grace - 0.5 < took < grace + 5, (took, serve.text)
        assert f"stopped mid-step: run(s) {run_id}" in serve.text
        assert serve.lines[-1] == "approvald: stopped"
        assert_one_line_each(serve)
        await assert_outcome_unknown(cli, run_id)
    finally:
        if serve is not None:
            await serve.kill()
        await emulator.stop()


@pytest.mark.parametrize("second", [signal.SIGTERM, signal.SIGINT], ids=["TERM", "INT"])
async def test_a_second_signal_stops_serve_at_once(sqlite_url: str, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   second: signal.Signals) -> None:
    emulator, cli = await setup(tmp_path, sqlite_url)
    serve: Serve | None = None
    try:
        serve, run_id = await hang_a_tool_call(cli, tmp_path, emulator, monkeypatch,
                                               grace=600, slack="slow")
        serve.proc.send_signal(signal.SIGTERM)
        await wait_for(lambda: "stopping: letting runs reach a step boundary" in serve.text,
                       within=10, what="serve to begin stopping")
        started = time.monotonic()
        serve.proc.send_signal(second)
        assert await serve.wait(10) == 128 + second, serve.text
        assert time.monotonic() - started < 3
        assert serve.lines[-1] == f"approvald: {second.name} again: exiting at once"
        await assert_outcome_unknown(cli, run_id)
    finally:
        if serve is not None:
            await serve.kill()
        await emulator.stop()


# -- a policy that mails, on a deployment that cannot ---------------------------------------

def test_a_policy_naming_email_without_mail_stops_serve_and_writes_nothing(
        tmp_path: Path) -> None:
    """channels = ["slack", "email"] with no SMTP server set: serve refuses to start, in one
    line naming what to set, before it creates (or migrates) the database."""
    policy = tmp_path / "policy.toml"
    policy.write_text('[tools.issue_refund]\nchannels = ["slack", "email"]\n')
    db = tmp_path / "never.db"
    cli = Cli(db_url=f"sqlite+aiosqlite:///{db}", workdir=tmp_path,
              env_extra={"APPROVALD_POLICY_FILE": str(policy),
                         "APPROVALD_PUBLIC_URL": "https://approvals.example.com",
                         "APPROVALD_SECRET": "approvald-test-secret-0123456789",
                         "APPROVALD_APPROVER_EMAILS": "U_ALICE=alice@example.com"})
    done = cli("serve", timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        f"approvald: APPROVALD_SMTP_URL: tools.issue_refund in {policy} names the \"email\" "
        "channel, but this deployment cannot send mail: set APPROVALD_SMTP_URL and "
        "APPROVALD_MAIL_FROM"], done.stderr
    assert not db.exists()


# -- a port that cannot be bound ----------------------------------------------------------

@pytest.mark.parametrize("slack", [False, True], ids=["ops-listener", "slack-listener"])
def test_a_port_already_taken_stops_serve_in_one_line(tmp_path: Path, slack: bool) -> None:
    """Issue 48 item 10: a listener that cannot bind its port printed `Future exception was
    never retrieved … ConnectionError` (and, with requests due, the scheduler's cancelled
    jobs' tracebacks) before the clear line. Every listener is bound before any work
    starts: one line, exit 2, and the waiting request is left as it was."""
    import socket

    # serve is a process of its own (OWN_PROCESS); the other commands run in this one
    cli = InProcessCli(db_url=f"sqlite+aiosqlite:///{tmp_path / 'approvald.db'}",
                       workdir=tmp_path)
    cli.set_time(datetime(2026, 12, 1, 9, 0, tzinfo=UTC))
    done = cli("run", "demo-refund", "--task", "Refund order A-1001", "--requested-by",
               "U_DANA")
    assert done.returncode == 0, done.stderr
    cli.advance_time(timedelta(days=2))  # its expiry is due the moment a scheduler starts
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        port = taken.getsockname()[1]
        extra = {"APPROVALD_HOST": "127.0.0.1", "APPROVALD_PORT": str(port)}
        if slack:
            extra |= {"SLACK_BOT_TOKEN": "xoxb-test", "SLACK_SIGNING_SECRET": "s" * 32,
                      "SLACK_API_URL": "http://127.0.0.1:9/api/", "APPROVALD_CHANNEL": "C_APPR"}
        done = cli("serve", timeout=60, **extra)
    finally:
        taken.close()
    assert done.returncode == 2, done.stderr
    assert [line for line in done.stderr.splitlines() if "cannot listen" not in line] == [], \
        done.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr
    assert [a["status"] for a in cli.json("approvals", "list", "--all", "--json")] == \
        ["pending"]
