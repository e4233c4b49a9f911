"""A run thread claimed by a process that died on this host is taken over at once, not only
once its claim's 90 s lease runs out (as a dead process's run leases and outbox claims are:
``runtime.kernel.owners``); a live owner's claim, or another host's, is waited out."""

from __future__ import annotations

import os
import socket
from datetime import timedelta
from typing import Any

from approvald.runtime.kernel.clock import ManualClock

from tests.helpers import Rows

TTL = timedelta(seconds=90)


def _dead_pid() -> int:
    """A pid no process of this host has: past Linux's highest ``pid_max`` (2**22)."""
    pid = 2**22 + 1
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return pid
    raise AssertionError(f"pid {pid} is a process")


async def test_a_thread_claimed_by_a_dead_process_here_is_taken_at_once(
        make_engine, db, clock: ManualClock) -> None:
    host = socket.gethostname()
    holders = {"dead": f"{host}:{_dead_pid()}:dead00",
               "live": f"{host}:{os.getpid()}:live00",  # this process: alive
               "elsewhere": f"elsewhere.invalid:{_dead_pid()}:away00"}
    engine = make_engine()
    runs = {name: str((await engine.run("demo-steps", "2", requested_by="U_DANA")).run_id)
            for name in holders}
    now = clock.now()

    async def claimed(tx: Any) -> None:  # each claimed (a turn under way) by its holder
        for name, owner in holders.items():
            assert await tx.threads.open(runs[name], channel="C_OPS", owner=owner,
                                         until=now + TTL) is not None
    await Rows(db).in_one_write(claimed)
    taker = make_engine()  # another process of this host, its own owner id
    behind = {run.id: seen for run, seen in
              await taker.threads.behind(since=now - TTL, limit=10)}
    # the dead holder's thread is behind at once, as its row shows it (claimed_by kept)
    assert list(behind) == [runs["dead"]]
    seen = behind[runs["dead"]]
    assert seen is not None and seen.claimed_by == holders["dead"]
    taken = await taker.threads.claim(runs["dead"], seen, channel="C_OPS", ttl=TTL)
    assert taken is not None and taken.unsure  # it may have posted: look in chat first
    assert taken.thread.claimed_by not in holders.values()
    rows = {}
    for name in ("live", "elsewhere"):  # their claims hold until they lapse
        rows[name] = row = await Rows(db).thread(runs[name])
        assert row is not None and row.claimed_by == holders[name]
        assert await taker.threads.claim(runs[name], row, channel="C_OPS", ttl=TTL) is None
    clock.advance(TTL.total_seconds() + 1)  # lapsed: then anyone's, unsure
    for name, row in rows.items():
        late = await taker.threads.claim(runs[name], row, channel="C_OPS", ttl=TTL)
        assert late is not None and late.unsure, name

