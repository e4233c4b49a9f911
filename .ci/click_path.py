"""How many of approvald's modules one Approve click crosses, from the signed HTTP request
reaching ``serve`` to the approved tool starting (issue 47): run it from the top of a
checkout, ``python .ci/click_path.py`` (``--list`` names them, in the order first entered).

An in-process ``serve`` (the test harness: Slack emulator over real HTTP, worker and outbox
drain running) pauses a refund; the profiler then records every call into an
``approvald.*`` module (but the emulator's and its client's: Slack's side) made by the
tasks that carry the click (the HTTP request's, bolt's
listener's, the worker's), leaving out the tasks that only happen to run meanwhile (the
outbox drain, the run-thread follower, the scheduler's jobs), until the refund tool is
entered.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from approvald.bot.slack import cards  # noqa: E402

from tests.integration.slack_harness import CHANNEL, harness, wait_for  # noqa: E402

# tasks that run beside a click without being part of it
BYSTANDERS = ("outbox", "threads", "slack-connect", "wakeups")
# Slack's side of the click, played in this process: the emulator and its signed client
SLACK_SIDE = "approvald.bot.sandbox"
TOOL = "issue_refund"


class Path_:
    """The modules entered, in order, until the tool starts."""

    def __init__(self) -> None:
        self.modules: list[str] = []
        self.started = asyncio.Event()

    def profile(self, frame: FrameType, event: str, _arg: Any) -> None:
        if event != "call" or self.started.is_set():
            return
        name = frame.f_globals.get("__name__", "")
        if not name.startswith("approvald.") or name.startswith(SLACK_SIDE):
            return
        try:
            task = asyncio.current_task()
        except RuntimeError:
            task = None
        if task is not None and task.get_name().startswith(BYSTANDERS):
            return
        if frame.f_code.co_name == TOOL and name.endswith(".demo"):
            self.modules.append(name)
            self.started.set()
            return
        if name not in self.modules:
            self.modules.append(name)


async def measure() -> list[str]:
    with tempfile.TemporaryDirectory() as tmp:
        db_url = f"sqlite+aiosqlite:///{tmp}/click.db"
        async with harness(db_url, Path(tmp), APPROVALD_METRICS_ADDR="off") as h:
            paused = await h.pause_refund()
            [aid] = paused.approval_ids
            await h.card(aid)
            a = await h.approval(aid)
            await asyncio.sleep(0.5)  # the card's own deliveries settle
            value = h.value(a)
            path = Path_()
            sys.setprofile(path.profile)
            try:
                response = await h.slack.click(
                    cards.APPROVE, value, user_id="U_ALICE", channel_id=CHANNEL,
                    message_ts=a.message_ts)
                assert response.status == 200, response.status
                await asyncio.wait_for(path.started.wait(), 30)
            finally:
                sys.setprofile(None)
            await wait_for(lambda: h.refunds(), what="the refund")
            return path.modules


def main(argv: list[str]) -> int:
    modules = asyncio.run(measure())
    by_part = {part: sum(1 for m in modules if m.startswith(f"approvald.{part}."))
               for part in ("bot", "runtime", "store")}
    print(f"modules crossed by one Approve click, HTTP request to tool start: {len(modules)} "
          f"(bot {by_part['bot']}, runtime {by_part['runtime']}, store {by_part['store']})")
    if "--list" in argv:
        for name in modules:
            print(f"  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
