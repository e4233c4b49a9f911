"""Work that is the fleet's, not a process's, is the lead replica's (issue 50).

With several replicas on one PostgreSQL database each replica's thread follower paced a
channel on its own (a post a second per channel, per replica): the runs lagging a burst
were told once per replica, in more, smaller turns. Now only the lead takes thread turns,
so a channel is paced once for the fleet.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from approvald.runtime.kernel import periodic

from tests.integration.test_threads import world


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_a_channel_is_paced_once_across_replicas(db_url: str, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    async with world(db_url, tmp_path, replicas=2) as w:
        w.engines[1].pace.lead(False)  # replica 0 leads
        for f in w.followers:
            f.interval = 60.0  # a post a minute per channel: the fleet's budget
        runs = [await w.steps(1), await w.steps(1)]
        stop = asyncio.Event()

        async def waited(event: asyncio.Event, patience: float) -> bool:
            stop.set()  # one round each
            return True

        monkeypatch.setattr(periodic, "waited", waited)
        for f in w.followers:  # the lead's round, then the follower's
            stop.clear()
            await asyncio.wait_for(f.run(stop), 10)
        posts = [c for c in w.emulator.calls("chat.postMessage") if c.ok]
        # one post in the channel within its interval, whichever runs lag: the lead's
        assert len(posts) == 1, [c.params.get("text") for c in posts]
        assert sum(w.parent_posts(r) for r in runs) == 1
