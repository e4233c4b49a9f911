"""``approvald outbox list`` and ``approvald outbox retry``, run as an operator runs them.

The rows are made by the real ``approvald run`` command and by an outbox drain in this
process (its deliverer stands in for a Slack that refuses the card); the commands then
look at and re-drive them in subprocesses, against the same database (both dialects).
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from approvald.runtime.kernel.clock import ManualClock
from approvald.runtime.record.outbox import DrainConfig
from approvald.runtime.record.outbox_kinds import Undeliverable
from approvald.store.records import OutboxRecord

from tests.helpers import START, Cli, make_cli


@pytest.fixture
def cli(db_url: str, tmp_path: Path) -> Cli:
    """The shared ``cli``, on each dialect's database."""
    return make_cli(db_url, tmp_path, in_process=True)


class Slack:
    """Refuses every delivery while ``broken`` (the bot is not in the channel)."""

    def __init__(self) -> None:
        self.broken = True
        self.delivered: list[tuple[int, str]] = []

    async def deliver(self, row: OutboxRecord) -> dict[str, Any] | None:
        if self.broken:
            raise Undeliverable("Slack said channel_not_found")
        self.delivered.append((row.id, row.kind))
        return {"ok": True}


async def start_refund(cli: Cli, order: str = "A-1001") -> str:
    done = await cli.acall("run", "demo-refund", "--task", f"Refund order {order}, double charged",
                           "--requested-by", "U_DANA")
    assert done.returncode == 0, done.stderr
    listed = await cli.ajson("approvals", "list", "--json")
    [pending] = [p for p in listed if order in str(p["args"])]
    return str(pending["id"])


async def test_list_dead_rows_and_retry_one_delivers_it_exactly_once(
        cli: Cli, make_engine, clock: ManualClock) -> None:
    approval_id = await start_refund(cli)
    listed = await cli.aok("outbox", "list")
    assert "pending" in listed and "approval.requested" in listed
    assert f"approval {approval_id}" in listed and "next try" in listed
    assert "gives up 2026-06-01 09:30:00" in listed  # the card gives up when the request expires
    assert await cli.aok("outbox", "list", "--dead") == "no dead outbox rows\n"

    clock.set(START)
    engine = make_engine()
    slack = Slack()
    drain = engine.drain(slack, DrainConfig(patience=0))
    await drain.drain_once()
    await drain.drain_once()  # the report about the dead card is refused as well

    dead = await cli.aok("outbox", "list", "--dead")
    lines = dead.splitlines()
    assert len(lines) == 2 and all(" dead " in x for x in lines)
    assert "approval.requested" in lines[0] and f"approval {approval_id}" in lines[0]
    assert "last error: Slack said channel_not_found" in lines[0]
    assert "delivery.dead" in lines[1]
    docs = await cli.ajson("outbox", "list", "--dead", "--json")
    card = docs[0]
    assert {k: card[k] for k in ("kind", "status", "attempts", "waits", "last_error")} == {
        "kind": "approval.requested", "status": "dead", "attempts": 1, "waits": 0,
        "last_error": "Slack said channel_not_found"}
    assert card["payload"] == {"approval_id": approval_id}
    assert card["died_at"] == START.isoformat() and card["next_try_at"] is None
    assert docs[1]["payload"]["outbox_id"] == card["id"]
    assert len(await cli.ajson("outbox", "list", "--dead", "--json", "--limit", "1")) == 1

    slack.broken = False  # the bot was invited to the channel
    out = await cli.aok("outbox", "retry", str(card["id"]))
    assert out == (f"outbox {card['id']} (approval.requested, approval {approval_id}): "
                   "dead -> pending, next try now, gives up 2026-06-02 09:00:00\n")
    [again] = [d for d in await cli.ajson("outbox", "list", "--json") if d["id"] == card["id"]]
    assert again["status"] == "pending" and again["next_try_at"] == START.isoformat()
    assert again["last_error"] == "Slack said channel_not_found"  # kept until delivered
    assert await drain.drain_once() == 1
    assert await drain.drain_once() == 0
    assert slack.delivered == [(card["id"], "approval.requested")]  # exactly once
    [done] = (await cli.ajson("outbox", "list", "--all", "--json", "--limit", "2"))[:1]
    assert done["status"] == "delivered" and done["last_error"] is None
    assert f"{card['id']}" in await cli.aok("outbox", "list", "--all")

    refused = await cli.acall("outbox", "retry", str(card["id"]))
    assert refused.returncode == 2 and "was delivered" in refused.stderr
    assert refused.stdout == ""


async def test_retry_all_redrives_every_dead_row(cli: Cli, make_engine,
                                                 clock: ManualClock) -> None:
    first, second = await start_refund(cli, "A-1001"), await start_refund(cli, "A-1002")
    clock.set(START)
    engine = make_engine()
    slack = Slack()
    drain = engine.drain(slack, DrainConfig(patience=0))
    for _ in range(3):
        await drain.drain_once()
    assert len(await cli.ajson("outbox", "list", "--dead", "--json")) == 4  # 2 cards, 2 reports
    slack.broken = False
    out = (await cli.aok("outbox", "retry", "--all")).splitlines()
    assert len(out) == 4 and all("dead -> pending" in x for x in out)
    assert f"approval {first}" in out[0] and f"approval {second}" in out[1]
    assert await cli.aok("outbox", "retry", "--all") == "no dead outbox rows\n"
    waiting = (await cli.ajson("outbox", "list", "--json"))[0]
    cli.advance_time(timedelta(minutes=5))
    said = await cli.aok("outbox", "retry", str(waiting["id"]))
    assert said.endswith(  # a nudge keeps the deadline
        "): pending, next try now, gives up 2026-06-02 09:00:00\n")
    [nudged] = [d for d in await cli.ajson("outbox", "list", "--json") if d["id"] == waiting["id"]]
    assert nudged["next_try_at"] == (START + timedelta(minutes=5)).isoformat()
    clock.advance(timedelta(minutes=5))
    for _ in range(3):
        await drain.drain_once()
    assert sorted(k for _, k in slack.delivered) == ["approval.requested"] * 2 + \
        ["delivery.dead"] * 2
    assert await cli.aok("outbox", "list") == "nothing waiting in the outbox\n"


@pytest.mark.parametrize("args, says", [
    (("outbox", "retry"), "give one outbox ID or --all"),
    (("outbox", "retry", "7", "--all"), "give one outbox ID or --all"),
    (("outbox", "retry", "999"), "no outbox row 999"),
    (("outbox", "retry", "seven"), "invalid int value"),
    (("outbox", "list", "--dead", "--all"), "not allowed with argument"),
])
def test_retry_mistakes_are_one_line_and_exit_2(sqlite_url: str, tmp_path: Path,
                                                args: tuple[str, ...], says: str) -> None:
    done = make_cli(sqlite_url, tmp_path, in_process=True)(*args)
    assert done.returncode == 2 and says in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
